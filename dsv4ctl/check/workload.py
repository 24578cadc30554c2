"""Pure workload for ``dsv4ctl check load``: coding-agent tools and growing multi-turn sessions.

Each session is one agent conversation: a long shared system prompt (the same for every session,
so the prefix is reused across sessions, the HiCache path), a per-session task, then ``turns``
turns. Every turn but the last requires a tool call (the instruction names the tool); the
assistant's ``tool_calls`` and a tool result are appended, so the prompt grows and each request's
prefix is the previous request (prefix reuse within the session). The last turn asks for a long
prose answer without tools being required (field report T4: long outputs are where corruption
shows). A turn that fails restarts the conversation, as an agent would retry its task.

No I/O: the driver sends :meth:`Session.request` bodies and feeds results to :meth:`Session.advance`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional

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
    "Use the tools to inspect the code before you change anything; call exactly one tool per step "
    "when asked to, and answer in prose when asked for a summary. "
    + " ".join(f"Rule {i}: keep changes minimal, cite the files you read, never guess file contents."
               for i in range(1, 25)))

TOOL_RESULT = ("{name} returned:\n" + "\n".join(
    f"{i:4d} | def handler_{i}(request):  # routes the request through the scheduler" for i in range(1, 9)))

CALL_INSTRUCTION = "Next, call the {name} tool."
ANSWER_INSTRUCTION = "Now answer in about {words} words: summarise what you found and what to change."


@dataclass
class TurnSpec:
    """One turn: ``tool`` is the tool the instruction names (None on the answer turn)."""

    index: int
    tool: Optional[str]
    max_tokens: int

    @property
    def requires_tool(self) -> bool:
        return self.tool is not None


@dataclass
class Session:
    """One agent session. ``sid`` numbers sessions within a run; ``stream`` picks SSE or JSON."""

    sid: int
    turns: int
    stream: bool
    answer_words: int = 150
    tool_max_tokens: int = 512
    answer_max_tokens: int = 1024
    turn: int = 0
    restarts: int = 0
    messages: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.turns < 1:
            raise ValueError("a session needs at least one turn")
        self._reset()

    def _reset(self) -> None:
        self.messages = [{"role": "system", "content": SYSTEM_PROMPT},
                         {"role": "user", "content": f"Task {self.sid}: find why request {self.sid} is slow. "
                                                     + self._instruction(0)}]

    def spec(self, turn: int | None = None) -> TurnSpec:
        """The spec of ``turn`` (default: the current turn)."""
        t = self.turn if turn is None else turn
        if t == self.turns - 1 and self.turns > 1:
            return TurnSpec(t, None, self.answer_max_tokens)
        return TurnSpec(t, TOOL_NAMES[(self.sid + t) % len(TOOL_NAMES)], self.tool_max_tokens)

    def _instruction(self, t: int) -> str:
        s = self.spec(t)
        return CALL_INSTRUCTION.format(name=s.tool) if s.tool else ANSWER_INSTRUCTION.format(words=self.answer_words)

    @property
    def done(self) -> bool:
        return self.turn >= self.turns

    def request(self, model: str, rid: str) -> dict:
        """The ``/v1/chat/completions`` body of the current turn (tools always declared)."""
        s = self.spec()
        body = {"model": model, "messages": self.messages, "tools": TOOLS, "tool_choice": "auto",
                "max_tokens": s.max_tokens, "temperature": 0.0, "stream": self.stream, "rid": rid}
        return body

    def advance(self, result: Optional[TurnResult], ok: bool) -> None:
        """Move to the next turn. On an ok tool turn the assistant's calls and one tool result per
        call are appended with the next instruction; a failed turn restarts the conversation."""
        s = self.spec()
        self.turn += 1
        if self.done:
            return
        if not ok or result is None:
            self.restarts += 1
            self._reset()
            self.messages[-1]["content"] += f" (retry {self.restarts}) " + self._instruction(self.turn)
            return
        if s.requires_tool:
            calls = [{"id": c.id or f"call_{self.sid}_{s.index}_{c.index}", "type": "function",
                      "function": {"name": c.name, "arguments": c.arguments}} for c in result.tool_calls]
            self.messages = self.messages + [{"role": "assistant", "content": result.content or "", "tool_calls": calls}]
            for i, c in enumerate(calls):
                text = TOOL_RESULT.format(name=c["function"]["name"])
                if i == len(calls) - 1:
                    text += "\n" + self._instruction(self.turn)
                self.messages.append({"role": "tool", "tool_call_id": c["id"], "content": text})
        else:
            self.messages = self.messages + [{"role": "assistant", "content": result.content},
                                             {"role": "user", "content": self._instruction(self.turn)}]


def sessions(concurrency: int, turns: int, stream: str = "mixed", answer_words: int = 150) -> list[Session]:
    """``concurrency`` sessions; ``stream`` is ``on``, ``off`` or ``mixed`` (even sids stream)."""
    if stream not in ("on", "off", "mixed"):
        raise ValueError("stream must be on, off or mixed")
    return [Session(sid=i, turns=turns, answer_words=answer_words,
                    stream=stream == "on" or (stream == "mixed" and i % 2 == 0))
            for i in range(concurrency)]


def body_bytes(body: dict) -> bytes:
    """Compact JSON bytes of a request body."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
