"""The wire: SSE decoding, assembly of streamed ``chat.completion.chunk`` objects and parsing of a
non-streaming ``chat.completion`` into one :class:`~.classes.TurnResult`, with the size limits that
keep a hostile or broken server from exhausting the client (every violation a
:class:`ProtocolError`)."""

from __future__ import annotations

import json
from typing import Any, Optional

from ...render import clip
from .classes import ToolCall, TurnResult

_raw_decode = json.JSONDecoder().raw_decode


class ProtocolError(ValueError):
    """The bytes on the wire are not a valid OpenAI chat completion / SSE stream (also: a response
    over one of the size limits below)."""


# Size limits (bytes / characters) that keep a hostile or broken server from exhausting the
# client's memory; a response over a limit is a protocol error for its turn (docs/check.md).
MAX_JSON_BODY = 16 << 20     # one non-streaming response body or GET document, bytes
MAX_SSE_LINE = 1 << 20       # one SSE line, and one event's joined ``data`` payload, bytes
MAX_CONTENT = 8 << 20        # assembled content + reasoning + tool-call arguments of one turn, characters
MAX_PIECES = 1 << 20         # content-bearing SSE chunks of one turn (each is a kept string and an ITL gap)


def _opt_str(v: Any, what: str) -> Optional[str]:
    """``v`` if it is a str or None, else ProtocolError naming the field."""
    if v is None or isinstance(v, str):
        return v
    raise ProtocolError(f"{what} is {type(v).__name__}, not a string")


def _opt_dict(v: Any, what: str) -> dict:
    """``v`` if it is a dict, {} for None/absent, else ProtocolError naming the field."""
    if v is None:
        return {}
    if isinstance(v, dict):
        return v
    raise ProtocolError(f"{what} is {type(v).__name__}, not an object")


def _obj(v: Any, what: str) -> dict:
    """``v`` if it is a dict, else ProtocolError naming the field (null included)."""
    if isinstance(v, dict):
        return v
    raise ProtocolError(f"{what} is {type(v).__name__}, not an object")


def _opt_list(v: Any, what: str) -> list:
    """``v`` if it is a list, [] for None/absent, else ProtocolError naming the field."""
    if v is None:
        return []
    if isinstance(v, list):
        return v
    raise ProtocolError(f"{what} is {type(v).__name__}, not a list")


# --- SSE -------------------------------------------------------------------------------------
class SSEDecoder:
    """Incremental Server-Sent-Events decoder: bytes in, ``data`` payload strings out.

    Follows the WHATWG event-stream rules that matter for SGLang's ``/v1/chat/completions``:
    events end at a blank line; lines end with LF, CRLF or CR; ``data:`` lines of one event are
    joined with LF; one optional space after the colon is dropped; ``:`` comment lines and other
    fields are ignored. Bytes may be split anywhere (also inside a UTF-8 sequence)."""

    def __init__(self) -> None:
        self._buf = b""           # an incomplete last line
        self._after_cr = False    # the previous chunk ended in CR: a leading LF is its CRLF half
        self._data: list[str] = []
        self._data_len = 0

    def feed(self, chunk: bytes) -> list[str]:
        """Feed raw bytes; return the payloads of the events completed by them. ProtocolError if
        a line or an event's payload exceeds :data:`MAX_SSE_LINE` bytes or is not UTF-8."""
        if not chunk:
            return []
        if self._after_cr:
            self._after_cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if b"\r" in chunk:
            self._after_cr = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = (self._buf + chunk).split(b"\n") if self._buf else chunk.split(b"\n")
        self._buf = lines.pop()
        if len(self._buf) > MAX_SSE_LINE:
            raise ProtocolError(f"SSE line longer than {MAX_SSE_LINE} bytes")
        out: list[str] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    out.append("\n".join(data))
                    data.clear()
                    self._data_len = 0
            elif line.startswith(b"data: "):    # the usual spelling: one slice, one decode
                self._data_len += len(line) - 5
                if self._data_len > MAX_SSE_LINE:
                    raise ProtocolError(f"SSE event data longer than {MAX_SSE_LINE} bytes")
                try:
                    data.append(line[6:].decode("utf-8"))
                except UnicodeDecodeError:
                    raise ProtocolError("SSE data is not UTF-8") from None
            elif line[:4] == b"data" and (len(line) == 4 or line[4:5] == b":"):
                v = line[5:]
                self._data_len += len(v)
                if self._data_len > MAX_SSE_LINE:
                    raise ProtocolError(f"SSE event data longer than {MAX_SSE_LINE} bytes")
                try:
                    data.append((v[1:] if v[:1] == b" " else v).decode("utf-8"))
                except UnicodeDecodeError:
                    raise ProtocolError("SSE data is not UTF-8") from None
            # comment lines (":...") and other fields (event:, id:, retry:) are ignored
        return out

    def close(self) -> list[str]:
        """End of stream: an event without its final blank line is still delivered."""
        out = self.feed(b"\n\n") if self._buf else []
        if self._data:
            out.append("\n".join(self._data))
            self._data = []
            self._data_len = 0
        return out


class StreamAssembler:
    """Assembles OpenAI ``chat.completion.chunk`` objects into one :class:`TurnResult`.

    Tool calls are assembled per ``index`` (SGLang 0.5.23 streams the first piece of a call with
    ``id``, ``index``, ``function.name`` and ``arguments: ""``, later pieces carry argument
    fragments for the same index; ``chat_encoding_adapters.token_output_sse_chunks``). Content
    and reasoning are concatenated, so markup split across chunks is seen whole."""

    def __init__(self) -> None:
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, ToolCall] = {}
        self._args: dict[int, list[str]] = {}
        self.finish_reason: Optional[str] = None
        self.done = False
        self.response_id: Optional[str] = None
        self.usage: Optional[dict] = None
        self.chunks = 0
        self.pieces = 0          # deltas that carried content, reasoning or a tool-call piece
        self.size = 0            # characters assembled so far (content, reasoning, arguments; 64 per call)

    def _grow(self, n: int) -> None:
        self.size += n
        if self.size > MAX_CONTENT:
            raise ProtocolError(f"assembled response longer than {MAX_CONTENT} characters")

    def feed_payload(self, payload: str) -> None:
        """One SSE ``data`` payload (a JSON chunk or ``[DONE]``). ProtocolError if malformed."""
        try:
            obj, end = _raw_decode(payload)
        except ValueError as e:
            if payload.strip() == "[DONE]":
                self.done = True
                return
            raise ProtocolError(f"SSE data is not JSON: {payload[:80]!r}") from e
        if end != len(payload) and payload[end:].strip():
            raise ProtocolError(f"SSE data is not JSON: {payload[:80]!r}")
        self.feed_chunk(obj)

    def feed_payloads(self, payloads: list[str]) -> None:
        """Several payloads at once (one network read): parsed with a single ``json.loads`` of
        ``[p1,p2,...]`` when that gives exactly one value per payload (a trailing ``[DONE]`` is
        taken off first); otherwise each payload is parsed alone, so errors are exactly those of
        :meth:`feed_payload`."""
        if len(payloads) < 2:
            for p in payloads:
                self.feed_payload(p)
            return
        ps, done = payloads, False
        if ps[-1].strip() == "[DONE]":
            ps, done = ps[:-1], True
        try:
            objs = json.loads("[" + ",".join(ps) + "]")
            batched = len(objs) == len(ps)
        except ValueError:
            batched = False
        if not batched:
            for p in payloads:
                self.feed_payload(p)
            return
        for obj in objs:
            self.feed_chunk(obj)
        if done:
            self.done = True

    def feed_chunk(self, obj: Any) -> None:
        """One decoded chunk object. An ``error`` object, a field of the wrong JSON type, or the
        assembled turn growing past :data:`MAX_CONTENT` raises ProtocolError."""
        try:
            choices = obj["choices"]
        except (KeyError, TypeError):
            if not isinstance(obj, dict):
                raise ProtocolError("SSE chunk is not a JSON object") from None
            if "error" in obj:
                err = obj["error"]
                msg = err.get("message") if isinstance(err, dict) else err
                raise ProtocolError(f"server error in stream: {clip(msg, 120)}") from None
            choices = None
        self.chunks += 1
        if self.response_id is None:
            self.response_id = _opt_str(obj.get("id"), "id")
        usage = obj.get("usage")
        if usage:
            self.usage = _opt_dict(usage, "usage")
        # per streamed chunk, so the checks of _opt_str/_opt_dict/_opt_list/_obj are inlined for the
        # exact JSON types (check load's client CPU, benchmarks/check_load.py); any other value
        # goes through them, which accept or refuse it as before
        if choices.__class__ is not list:
            choices = _opt_list(choices, "choices")
        for ch in choices:
            if ch.__class__ is not dict:
                ch = _obj(ch, "choices[]")
            if ch.get("index", 0) != 0:
                continue
            delta = ch.get("delta")
            if delta is not None and delta.__class__ is not dict:
                delta = _opt_dict(delta, "delta")
            if delta:
                content = delta.get("content")
                if content is not None and content.__class__ is not str:
                    content = _opt_str(content, "delta.content")
                reasoning = delta.get("reasoning_content")
                if reasoning is not None and reasoning.__class__ is not str:
                    reasoning = _opt_str(reasoning, "delta.reasoning_content")
                tcs = delta.get("tool_calls")
                if tcs is not None and tcs.__class__ is not list:
                    tcs = _opt_list(tcs, "delta.tool_calls")
                if content or reasoning or tcs:
                    self.pieces += 1
                    if self.pieces > MAX_PIECES:
                        raise ProtocolError(f"more than {MAX_PIECES} content chunks in one response")
                    if content:
                        self._grow(len(content))
                        self._content.append(content)
                    if reasoning:
                        self._grow(len(reasoning))
                        self._reasoning.append(reasoning)
                    if tcs:
                        self._feed_tool_calls(tcs)
            fr = ch.get("finish_reason")
            if fr is not None and fr.__class__ is not str:
                fr = _opt_str(fr, "finish_reason")
            if fr:
                self.finish_reason = fr

    def _feed_tool_calls(self, tcs: list) -> None:
        for tc in tcs:
            tc = _obj(tc, "tool_calls[]")
            idx = tc.get("index")
            if not isinstance(idx, int) or isinstance(idx, bool):
                raise ProtocolError("tool_calls delta without an integer index")
            fn = _opt_dict(tc.get("function"), "function")
            cid, name = _opt_str(tc.get("id"), "tool_calls[].id"), _opt_str(fn.get("name"), "function.name")
            call = self._calls.get(idx)
            if call is None:
                self._grow(64 + len(cid or "") + len(name or ""))
                call = self._calls[idx] = ToolCall(index=idx, id=cid, name=name)
                self._args[idx] = []
            else:
                if cid and not call.id:
                    call.id = cid
                if name and not call.name:
                    call.name = name
            a = fn.get("arguments")
            if a:
                a = a if isinstance(a, str) else json.dumps(a)
                self._grow(len(a))
                self._args[idx].append(a)

    def result(self, *, require_done: bool = True) -> TurnResult:
        """The assembled turn. ProtocolError if the stream ended without ``data: [DONE]``."""
        if require_done and not self.done:
            raise ProtocolError("stream ended without data: [DONE]")
        calls = []
        for idx in sorted(self._calls):
            c = self._calls[idx]
            c.arguments = "".join(self._args[idx])
            calls.append(c)
        return TurnResult(content="".join(self._content), reasoning="".join(self._reasoning),
                          tool_calls=calls, finish_reason=self.finish_reason,
                          response_id=self.response_id, usage=self.usage)


def parse_completion(body: Any) -> TurnResult:
    """A non-streaming ``chat.completion`` JSON object → TurnResult (ProtocolError if malformed,
    including any field of the wrong JSON type).

    ``message.tool_calls[].function.arguments`` is kept as sent (a string; an object is
    re-serialised)."""
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list) or not body["choices"]:
        if isinstance(body, dict) and "error" in body:
            err = body["error"]
            raise ProtocolError(f"server error: {clip(err.get('message') if isinstance(err, dict) else err, 120)}")
        raise ProtocolError("response has no choices")
    ch = _obj(body["choices"][0], "choices[0]")
    msg = _opt_dict(ch.get("message"), "message")
    calls = []
    for i, tc in enumerate(_opt_list(msg.get("tool_calls"), "message.tool_calls")):
        tc = _obj(tc, "tool_calls[]")
        fn = _opt_dict(tc.get("function"), "function")
        a = fn.get("arguments")
        idx = tc.get("index", i)
        calls.append(ToolCall(index=idx if isinstance(idx, int) and not isinstance(idx, bool) else i,
                              id=_opt_str(tc.get("id"), "tool_calls[].id"),
                              name=_opt_str(fn.get("name"), "function.name"),
                              arguments=a if isinstance(a, str) else ("" if a is None else json.dumps(a))))
    usage = body.get("usage")
    return TurnResult(content=_opt_str(msg.get("content"), "message.content") or "",
                      reasoning=_opt_str(msg.get("reasoning_content"), "message.reasoning_content") or "",
                      tool_calls=calls, finish_reason=_opt_str(ch.get("finish_reason"), "finish_reason"),
                      response_id=_opt_str(body.get("id"), "id"),
                      usage=_opt_dict(usage, "usage") if usage else None,
                      sglext=body["sglext"] if isinstance(body.get("sglext"), dict) else None)
