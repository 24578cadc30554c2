"""Pure workload for ``dsv4ctl check load``: coding-agent tools and growing multi-turn sessions.

Each session is one agent conversation: a long shared system prompt (the same for every session,
so the prefix is reused across sessions, the HiCache path), a per-session task, then ``turns``
turns. Every turn but the last requires a tool call; the assistant's ``tool_calls`` and a tool
result are appended, so the prompt grows and each request's prefix is the previous request
(prefix reuse within the session). The last turn asks for a long prose answer without tools being
required (field report T4: long outputs are where corruption shows). A turn that fails restarts
the conversation, as an agent would retry its task.

Tool turns are of two kinds, picked deterministically per (session id, turn):

* free-form (``expected_calls`` None): "Next, call the {name} tool." — judged by shape only;
* known-answer (about ``known_share`` of tool turns): the correct calls follow from the
  conversation. The instruction states the facts (a failing test's path and line range, a script,
  a search pattern), then a lead sentence naming the tool(s), then one directive per expected
  call, in order (the contract with the stand-in server, and plain instructions for a model)::

      Call {tool} with exactly these arguments: {json}.
      Also call {tool} with exactly these arguments: {json}.      (second call of the same turn)

  ``{json}`` is ``json.dumps(arguments, ensure_ascii=False, separators=(", ", ": "))`` (one line;
  newlines inside strings are JSON escapes). About :data:`TWO_CALL_SHARE` of known-answer turns
  expect two calls; arguments include long strings with quotes, backslashes, heredocs, code fences
  and markup-like text (``<div class="x">``, ``a < b && c > d``), never DeepSeek special-token or
  DSML spellings (0.5.23 mangles those by design), and the zero-argument tool's ``{}``.

About ``probe_share`` of tool turns also set ``tool_choice`` to ``"required"`` or to the named
turn tool (``{"type": "function", "function": {"name": X}}``) instead of ``"auto"``.

No I/O. The driver sends :meth:`Session.request` bodies and feeds results to :meth:`Session.advance`.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import Optional, Union

from .classify import TurnResult

TOOLS: list[dict] = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a range of lines of a file in the repository.",
        "parameters": {"type": "object", "required": ["path"], "properties": {
            "path": {"type": "string", "description": "Path relative to the repository root."},
            "start_line": {"type": "integer", "minimum": 1},
            "end_line": {"type": "integer", "minimum": 1}}}}},
    {"type": "function", "function": {
        "name": "run_command", "description": "Run a shell command in the sandbox.",
        "parameters": {"type": "object", "required": ["command", "timeout_s"], "properties": {
            "command": {"type": "string"},
            "timeout_s": {"type": "integer", "minimum": 1},
            "shell": {"type": "string", "enum": ["bash", "sh"]}}}}},
    {"type": "function", "function": {
        "name": "search_code", "description": "Search the code base.",
        "parameters": {"type": "object", "required": ["query", "lang"], "properties": {
            "query": {"type": "string"},
            "lang": {"type": "string", "enum": ["python", "rust", "go"]},
            "max_results": {"type": "integer", "minimum": 1}}}}},
    {"type": "function", "function": {
        "name": "list_open_files", "description": "List the files open in the editor.",
        "parameters": {"type": "object", "properties": {}}}},
]
TOOL_NAMES = [t["function"]["name"] for t in TOOLS]

SYSTEM_PROMPT = (
    "You are a careful coding agent working in a large Python and Rust repository. "
    "Use the tools to inspect the code before you change anything; when a step asks for tool calls, make "
    "exactly the calls it asks for, and answer in prose when asked for a summary. "
    + " ".join(f"Rule {i}: keep changes minimal, cite the files you read, never guess file contents."
               for i in range(1, 25)))

TOOL_RESULT = ("{name} returned:\n" + "\n".join(
    f"{i:4d} | def handler_{i}(request):  # routes the request through the scheduler" for i in range(1, 9)))

CALL_INSTRUCTION = "Next, call the {name} tool."
ANSWER_INSTRUCTION = "Now answer in about {words} words: summarise what you found and what to change."

KNOWN_SHARE = 0.5        # share of tool turns with a known answer (Session / sessions() default)
TWO_CALL_SHARE = 0.3     # share of known-answer turns that expect two calls
PROBE_SHARE = 0.1        # share of tool turns sent with tool_choice "required" or named

DIRECTIVE = "Call {tool} with exactly these arguments: {args}."
ALSO_DIRECTIVE = "Also call {tool} with exactly these arguments: {args}."
DIRECTIVE_RE = re.compile(r"(?:Call|Also call) (\w+) with exactly these arguments: ")
KNOWN_LEAD = "Next, call the {name} tool."
KNOWN_LEAD_TWO = "Next, call the {name} tool and then the {second} tool, both in this turn."
KNOWN_LEAD_TWICE = "Next, call the {name} tool twice, both in this turn."

ToolChoice = Union[str, dict]


def directive_json(arguments: dict) -> str:
    """The one-line JSON of a directive: ``json.dumps(arguments, ensure_ascii=False, separators=(", ", ": "))``."""
    return json.dumps(arguments, ensure_ascii=False, separators=(", ", ": "))


def directives(calls: list[dict]) -> str:
    """The directive sentences for ``calls`` (``[{"name", "arguments"}]``), in order."""
    return " ".join((DIRECTIVE if i == 0 else ALSO_DIRECTIVE).format(tool=c["name"], args=directive_json(c["arguments"]))
                    for i, c in enumerate(calls))


def known_instruction(calls: list[dict], facts: str = "") -> str:
    """A known-answer instruction: ``facts`` (the values the arguments come from), a lead sentence
    naming the tool(s) and the directives."""
    if len(calls) == 1:
        lead = KNOWN_LEAD.format(name=calls[0]["name"])
    elif len(calls) == 2 and calls[0]["name"] == calls[1]["name"]:
        lead = KNOWN_LEAD_TWICE.format(name=calls[0]["name"])
    else:
        lead = KNOWN_LEAD_TWO.format(name=calls[0]["name"], second=" tool and then the ".join(c["name"] for c in calls[1:]))
    return (facts + "\n" if facts else "") + lead + " " + directives(calls)


def parse_directives(text: str) -> list[dict]:
    """The expected calls stated by the directives in ``text`` (``[{"name", "arguments"}]``, in
    order); the inverse of :func:`directives` (a reference for servers that follow the contract)."""
    out, pos, dec = [], 0, json.JSONDecoder()
    while (m := DIRECTIVE_RE.search(text, pos)) is not None:
        try:
            args, end = dec.raw_decode(text, m.end())
        except ValueError:
            pos = m.end()
            continue
        out.append({"name": m.group(1), "arguments": args})
        pos = end
    return out


# --- known-answer scenarios: (rng, sid) -> (fact sentence(s), arguments) ----------------------
FILES = ("tests/test_sched.py", "src/scheduler/batch.rs", "python/router/handlers.py", "src/cache/radix_tree.rs",
         "python/router/prefix_cache.py", "cmd/gateway/main.go")

REPRO_PY = r"""cat <<'EOF' > /tmp/repro_@SID@.py
import json, re
PATTERN = re.compile(r"handler_(\d+)\s*\(")
print(json.dumps({"path": "C:\\work\\req_@N@.log", "note": 'it\'s "slow"', "tab": "a\tb"}))
EOF
python3 /tmp/repro_@SID@.py"""

NOTES_MD = """cat <<'EOF' > NOTES_@SID@.md
## Finding @N@
```python
if a < b and c > d:
    return handler_@N@(request)
```
<div class="x">slow path: a < b && c > d</div>
EOF"""


def _read_range(rng: random.Random, sid: int) -> tuple[str, dict]:
    path, a = rng.choice(FILES), rng.randint(1, 400)
    b = a + rng.randint(5, 60)
    return f"The failing test is {path}, lines {a}-{b}.", {"path": path, "start_line": a, "end_line": b}


def _read_whole(rng: random.Random, sid: int) -> tuple[str, dict]:
    path = rng.choice(FILES)
    return f"The settings are loaded in {path}; read that whole file.", {"path": path}


def _read_quoted(rng: random.Random, sid: int) -> tuple[str, dict]:
    path, a = f'docs/notes on "slow" request {sid}.md', rng.randint(1, 200)
    return f"The notes are in the file {path}, from line {a} on.", {"path": path, "start_line": a}


def _run_pytest(rng: random.Random, sid: int) -> tuple[str, dict]:
    cmd, to = f"pytest -x tests/test_sched.py -k 'slow and not gpu_{rng.randint(1, 99)}'", rng.choice((60, 120, 300))
    return f"To reproduce, run the command {cmd} with a timeout of {to} seconds.", {"command": cmd, "timeout_s": to}


def _run_repro_script(rng: random.Random, sid: int) -> tuple[str, dict]:
    cmd = REPRO_PY.replace("@SID@", str(sid)).replace("@N@", str(rng.randint(1, 999)))
    to = rng.choice((30, 60, 90))
    return (f"Write and run this reproduction script with bash and a timeout of {to} seconds; the exact command "
            f"is between the BEGIN and END lines:\nBEGIN\n{cmd}\nEND"), {"command": cmd, "timeout_s": to, "shell": "bash"}


def _run_notes(rng: random.Random, sid: int) -> tuple[str, dict]:
    cmd = NOTES_MD.replace("@SID@", str(sid)).replace("@N@", str(rng.randint(1, 999)))
    return (f"Record the finding with sh and a timeout of 30 seconds; the exact command is between the BEGIN "
            f"and END lines:\nBEGIN\n{cmd}\nEND"), {"command": cmd, "timeout_s": 30, "shell": "sh"}


def _run_grep(rng: random.Random, sid: int) -> tuple[str, dict]:
    k = rng.randint(3, 20)
    cmd = f"grep -rn '<div class=\"x\">' templates/ | head -n {k}"
    return (f"List the templates that contain the markup <div class=\"x\"> with the command {cmd} "
            f"and a timeout of 30 seconds."), {"command": cmd, "timeout_s": 30}


def _search_def(rng: random.Random, sid: int) -> tuple[str, dict]:
    q = f"def handler_{rng.randint(1, 99)}"
    return f"The slow path goes through {q} in the Python code.", {"query": q, "lang": "python"}


def _search_regex(rng: random.Random, sid: int) -> tuple[str, dict]:
    q, k = r"fn\s+schedule_\w+\(", rng.randint(5, 50)
    return (f"Search the Rust code for the regular expression {q} and keep at most {k} results.",
            {"query": q, "lang": "rust", "max_results": k})


def _search_markup(rng: random.Random, sid: int) -> tuple[str, dict]:
    q, k = "a < b && c > d", rng.randint(1, 10)
    return f"Find the Go code with the condition {q} (at most {k} results).", {"query": q, "lang": "go", "max_results": k}


def _search_unicode(rng: random.Random, sid: int) -> tuple[str, dict]:
    q = f"naïve_cache_{rng.randint(1, 99)} → evict"
    return f"The comment to find in the Python code reads {q}.", {"query": q, "lang": "python"}


def _list_open(rng: random.Random, sid: int) -> tuple[str, dict]:
    return "Check which files are open in the editor; that tool takes no arguments.", {}


SCENARIOS = {
    "read_file": (_read_range, _read_whole, _read_quoted),
    "run_command": (_run_pytest, _run_repro_script, _run_notes, _run_grep),
    "search_code": (_search_def, _search_regex, _search_markup, _search_unicode),
    "list_open_files": (_list_open,),
}


@dataclass
class TurnSpec:
    """One turn: ``tool`` is the tool the instruction names first (None on the answer turn);
    ``expected_calls`` the known answer (``[{"name", "arguments"}]``, None on free-form turns);
    ``tool_choice`` what the request sends; ``instruction`` the text that asks for the turn."""

    index: int
    tool: Optional[str]
    max_tokens: int
    expected_calls: Optional[list[dict]] = None
    tool_choice: ToolChoice = "auto"
    instruction: str = ""

    @property
    def requires_tool(self) -> bool:
        return self.tool is not None

    @property
    def known_answer(self) -> bool:
        return self.expected_calls is not None


@dataclass
class Session:
    """One agent session. ``sid`` numbers sessions within a run; ``stream`` picks SSE or JSON.
    ``known_share`` / ``probe_share``: shares of tool turns that are known-answer / probe turns
    (deterministic per ``sid`` and turn)."""

    sid: int
    turns: int
    stream: bool
    answer_words: int = 150
    tool_max_tokens: int = 512
    answer_max_tokens: int = 1024
    known_share: float = KNOWN_SHARE
    probe_share: float = PROBE_SHARE
    thinking: bool = False
    turn: int = 0
    restarts: int = 0
    messages: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.turns < 1:
            raise ValueError("a session needs at least one turn")
        for name in ("known_share", "probe_share"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1")
        self._specs: dict[int, TurnSpec] = {}
        self._reset(0)

    def _reset(self, t: int, note: str = "") -> None:
        self.messages = [{"role": "system", "content": SYSTEM_PROMPT},
                         {"role": "user", "content": f"Task {self.sid}: find why request {self.sid} is slow. "
                                                     + note + self._instruction(t)}]

    def spec(self, turn: int | None = None) -> TurnSpec:
        """The spec of ``turn`` (default: the current turn); the same for the same (sid, turn)."""
        t = self.turn if turn is None else turn
        s = self._specs.get(t)
        if s is None:
            s = self._specs[t] = self._make_spec(t)
        return s

    def _make_spec(self, t: int) -> TurnSpec:
        if t == self.turns - 1 and self.turns > 1:
            return TurnSpec(t, None, self.answer_max_tokens, instruction=ANSWER_INSTRUCTION.format(words=self.answer_words))
        tool = TOOL_NAMES[(self.sid + t) % len(TOOL_NAMES)]
        rng = random.Random(f"dsv4ctl-known-{self.sid}-{t}")
        expected, text = None, CALL_INSTRUCTION.format(name=tool)
        if rng.random() < self.known_share:
            tools = [tool] + ([rng.choice(TOOL_NAMES)] if rng.random() < TWO_CALL_SHARE else [])
            facts, expected = [], []
            for name in tools:
                fact, args = rng.choice(SCENARIOS[name])(rng, self.sid)
                facts.append(fact)
                expected.append({"name": name, "arguments": args})
            text = known_instruction(expected, "\n".join(facts))
        choice: ToolChoice = "auto"
        prng = random.Random(f"dsv4ctl-probe-{self.sid}-{t}")
        if prng.random() < self.probe_share:
            # a named choice forces one call of that tool (OpenAI semantics; SGLang's grammar),
            # so only turns with at most one expected call get it
            named = prng.random() < 0.5 and len(expected or ()) <= 1 and all(e["name"] == tool for e in expected or ())
            choice = {"type": "function", "function": {"name": tool}} if named else "required"
        return TurnSpec(t, tool, self.tool_max_tokens, expected, choice, text)

    def _instruction(self, t: int) -> str:
        return self.spec(t).instruction

    @property
    def done(self) -> bool:
        return self.turn >= self.turns

    def request(self, model: str, rid: str) -> dict:
        """The ``/v1/chat/completions`` body of the current turn (tools always declared).
        ``chat_template_kwargs.thinking`` is always sent (SGLang serving_chat._thinking_requested
        reads it; unset is off there, but the smg gateway sets it to true for DeepSeek-V4 when
        the client does not say, and then refuses a forced tool_choice with HTTP 400)."""
        s = self.spec()
        return {"model": model, "messages": self.messages, "tools": TOOLS, "tool_choice": s.tool_choice,
                "max_tokens": s.max_tokens, "temperature": 0.0, "stream": self.stream, "rid": rid,
                "chat_template_kwargs": {"thinking": self.thinking}}

    def advance(self, result: Optional[TurnResult], ok: bool) -> None:
        """Move to the next turn. On an ok tool turn the assistant's calls (the expected ones on a
        known-answer turn, with the delivered ids) and one tool result per call are appended with
        the next instruction; a failed turn restarts the conversation with the next instruction."""
        s = self.spec()
        self.turn += 1
        if self.done:
            return
        if not ok or result is None:
            self.restarts += 1
            self._reset(self.turn, f"(retry {self.restarts}) ")
            return
        if s.requires_tool:
            got = result.tool_calls
            if s.expected_calls is not None:
                calls = [{"id": (got[i].id if i < len(got) and got[i].id else f"call_{self.sid}_{s.index}_{i}"),
                          "type": "function",
                          "function": {"name": e["name"], "arguments": json.dumps(e["arguments"], ensure_ascii=False)}}
                         for i, e in enumerate(s.expected_calls)]
            else:
                calls = [{"id": c.id or f"call_{self.sid}_{s.index}_{c.index}", "type": "function",
                          "function": {"name": c.name, "arguments": c.arguments}} for c in got]
            self.messages = self.messages + [{"role": "assistant", "content": result.content or "", "tool_calls": calls}]
            for i, c in enumerate(calls):
                text = TOOL_RESULT.format(name=c["function"]["name"])
                if i == len(calls) - 1:
                    text += "\n" + self._instruction(self.turn)
                self.messages.append({"role": "tool", "tool_call_id": c["id"], "content": text})
        else:
            self.messages = self.messages + [{"role": "assistant", "content": result.content},
                                             {"role": "user", "content": self._instruction(self.turn)}]


def sessions(concurrency: int, turns: int, stream: str = "mixed", answer_words: int = 150,
             known_share: float = KNOWN_SHARE, probe_share: float = PROBE_SHARE) -> list[Session]:
    """``concurrency`` sessions; ``stream`` is ``on``, ``off`` or ``mixed`` (even sids stream);
    ``known_share`` / ``probe_share``: see :class:`Session`."""
    if stream not in ("on", "off", "mixed"):
        raise ValueError("stream must be on, off or mixed")
    return [Session(sid=i, turns=turns, answer_words=answer_words, known_share=known_share, probe_share=probe_share,
                    stream=stream == "on" or (stream == "mixed" and i % 2 == 0))
            for i in range(concurrency)]


def body_bytes(body: dict) -> bytes:
    """Compact JSON bytes of a request body."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
