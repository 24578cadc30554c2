"""``dsv4ctl check``: tool-call correctness of a DeepSeek-V4 SGLang 0.5.23 deployment under load.

Modules:

* :mod:`.classify` — pure per-turn classifier (SSE decoding, streaming tool-call assembly,
  corruption classes); no I/O.
* :mod:`.stats` — Wilson score interval, Fisher's exact test, Newcombe difference interval,
  percentiles; no I/O.
* :mod:`.workload` — pure: the tools, their JSON schemas and the multi-turn agent sessions
  (free-form and known-answer tool turns, tool_choice probe turns).
* :mod:`.expect` — pure: delivered tool calls against a turn's known answer (wrong_tool,
  missing_call, extra_call, wrong_args).
* :mod:`.driver` — the async load driver (aiohttp): sessions, stall timeout, per-turn records.
* :mod:`.smoke` — the smoke checks (health, models, server_info, one chat and one tool call, the
  tool_choice / over-length / prompt_tokens probes).
* :mod:`.report` — turns records into the ``dsv4ctl.check.load/1`` document and the gate verdict.
"""
