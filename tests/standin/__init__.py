"""STAND-IN for a GPU SGLang 0.5.23 server running DeepSeek-V4 (which cannot run here).

It speaks SGLang's real wire format (OpenAI chat completions, SSE streaming, ``/health``,
``/v1/models``, ``/server_info``, ``/metrics``), writes DeepSeek-V4 DSML tool-call markup and
turns it into ``tool_calls`` the way 0.5.23's deepseek-recipe output parser does, and injects the
incident's corruption as a function of in-flight concurrency and the serve config's HiCache
switch. Run: ``python -m tests.standin.server --config serve.yaml --port 30000`` (docs/check.md).
"""
