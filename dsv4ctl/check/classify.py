"""Pure classification of one chat-completion turn against DeepSeek-V4 tool-call correctness.

No I/O. The load driver and the smoke checks feed this module what they received on the wire
(an SSE byte stream or a JSON body) and get back a :class:`Verdict`.

What counts as corrupted follows the client-side view of SGLang 0.5.23 with
``--tool-call-parser deepseekv4`` (reference ``sglang-0.5.23-ops.md`` §5.3-5.4, verified there
against deepseek-recipe 0.2.0; SGLang files ``srt/entrypoints/openai/serving_deepseek_recipe.py``
and ``srt/parser/deepseek_recipe_output.py``):

* DSML markup in ``content`` with any bar spelling (U+FF5C as emitted, U+2016, ASCII after
  ``<``, doubled bars; V4, V3.2 ``function_calls`` and V4.1 spaced tags) or V3.1 tool tokens: the
  parser did not turn the block into ``tool_calls`` (field report T1, incident of issue 6); the
  same in ``reasoning_content``;
* raw special tokens (``<｜end▁of▁sentence｜>``, ``<|im_end|>``, bare ``<tool_calls>`` …) and
  ``<think>`` / ``</think>`` in ``content`` (field report T4); markup of these kinds inside
  tool-call argument strings; reasoning merged into content when thinking was requested;
* degenerate generation: exact loops, an empty answer cut at the length limit, a switch of script
  mid-answer (issue 14 item 3; thresholds in the constants and ``docs/check.md``);
* ``finish_reason == "length"`` while a call was required or open (truncated arguments);
* no ``tool_calls`` on a turn that requires one;
* ``arguments`` not JSON, ``{}`` for a tool with required parameters, or arguments that do not
  match the tool's JSON schema (required fields, types, enums), or an undeclared tool name; a
  string argument cut off at a literal DSML closer (an open quote or here-document at its end);
* quoted markup cut out of prose (content ending in an open quote or fence, an empty code span);
* no progress within the stall timeout (stuck, field report P1) and HTTP / protocol errors.

Markup quoted in a Markdown code span, a closed fenced block or ordinary quotes around one tag is
not corruption: it becomes a note on the verdict (SGLang's newer tests keep quoted DSML as text on
purpose). Every check is one linear pass (bounded regex repetitions, patterns compiled once).
"""

from __future__ import annotations

import json
import operator
import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from ..render import clip

# --- markers (U+FF5C FULLWIDTH VERTICAL LINE, U+2581 LOWER ONE EIGHTH BLOCK) -------------------
BAR = "\uff5c"
DSML_MARK = f"{BAR}DSML{BAR}"                  # <｜DSML｜tool_calls>, <｜DSML｜invoke …>, V4.1 "<｜DSML｜ calls>"
LEGACY_TOOL_MARKS = (f"<{BAR}tool\u2581calls\u2581begin{BAR}>", f"<{BAR}tool\u2581call\u2581begin{BAR}>",
                     f"<{BAR}tool\u2581sep{BAR}>")   # V3.1 tokens (field report T1)
THINK_MARKS = ("<think>", "</think>")

# --- classes, in precedence order (the first flag present is the turn's class) -----------------
OK = "ok"
HTTP_ERROR = "http_error"
PD_TRANSFER = "pd_transfer_failed"
PD_BOOTSTRAP = "pd_bootstrap_failed"
STUCK = "stuck"
DSML_IN_CONTENT = "dsml_in_content"
DSML_IN_REASONING = "dsml_in_reasoning"
SPECIAL_TOKEN_LEAK = "special_token_leak"
THINK_IN_CONTENT = "think_in_content"
REASONING_IN_CONTENT = "reasoning_in_content"
MARKUP_IN_ARGS = "markup_in_args"
MARKUP_CUT = "markup_cut"
NGRAM_LOOP = "ngram_loop"
EMPTY_LENGTH = "empty_length"
LANGUAGE_SWITCH = "language_switch"
LANGUAGE_DRIFT = "language_drift"
LENGTH_MID_CALL = "length_mid_call"
NO_TOOL_CALL = "no_tool_call"
ARGS_NOT_JSON = "args_not_json"
EMPTY_ARGS = "empty_args"
ARGS_SCHEMA = "args_schema"
ARGS_CUT = "args_cut"
WRONG_TOOL = "wrong_tool"
MISSING_CALL = "missing_call"
EXTRA_CALL = "extra_call"
WRONG_ARGS = "wrong_args"

CLASSES = (HTTP_ERROR, PD_TRANSFER, PD_BOOTSTRAP, STUCK,
           # markup leaks: the parser (or the template) let model markup through
           DSML_IN_CONTENT, DSML_IN_REASONING, SPECIAL_TOKEN_LEAK, THINK_IN_CONTENT, REASONING_IN_CONTENT,
           MARKUP_IN_ARGS, MARKUP_CUT,
           # degenerate generation: usually the root cause of a call-shape failure on the same turn
           NGRAM_LOOP, EMPTY_LENGTH, LANGUAGE_SWITCH, LANGUAGE_DRIFT,
           # call shape
           LENGTH_MID_CALL, NO_TOOL_CALL, ARGS_NOT_JSON, EMPTY_ARGS, ARGS_CUT, ARGS_SCHEMA,
           # known answer (:mod:`.expect`): well-formed calls that are not the correct ones
           WRONG_TOOL, MISSING_CALL, EXTRA_CALL, WRONG_ARGS)
"""Every corruption class, in precedence order: errors, markup leaks, degenerate generation, call
shape, known answer."""

NO_ANSWER = (HTTP_ERROR, PD_TRANSFER, PD_BOOTSTRAP, STUCK)
"""Classes of turns that got no answer to judge: HTTP/protocol errors (the PD ones split out:
SGLang 0.5.23's decode or prefill aborting a request whose KV transfer or bootstrap failed) and
stalls."""

_PD_FAILURE = re.compile(r"\b(?:Decode|Prefill) (transfer|handshake|bootstrap) failed for request")
"""The abort messages of SGLang 0.5.23 PD (``srt/disaggregation/decode.py``: "Decode transfer
failed for request …", "Decode handshake failed …"; ``prefill.py``: "Prefill transfer failed …",
"Prefill bootstrap failed …"), sent to the client as HTTP 500 (or an SSE error)."""

DESCRIPTIONS = {
    OK: "valid",
    WRONG_TOOL: "a call names a different tool than the known answer",
    MISSING_CALL: "fewer tool calls than the known answer",
    EXTRA_CALL: "more tool calls than the known answer",
    WRONG_ARGS: "arguments differ from the known answer",
    HTTP_ERROR: "HTTP or protocol error",
    PD_TRANSFER: "PD KV transfer failed (SGLang aborted the request: HTTP 500)",
    PD_BOOTSTRAP: "PD bootstrap or handshake failed (SGLang aborted the request: HTTP 500)",
    STUCK: "no progress within the stall timeout",
    DSML_IN_CONTENT: "DSML tool-call markup in content",
    DSML_IN_REASONING: "DSML tool-call markup in reasoning_content",
    SPECIAL_TOKEN_LEAK: "raw special tokens in content",
    THINK_IN_CONTENT: "reasoning tags in content",
    REASONING_IN_CONTENT: "thinking requested but reasoning merged into content",
    MARKUP_IN_ARGS: "DSML, think tags or special tokens inside tool-call arguments",
    MARKUP_CUT: "quoted markup cut out of content (it ends in an open quote, code span or fence, or holds an empty code span)",
    NGRAM_LOOP: "the output repeats itself (a loop)",
    EMPTY_LENGTH: "answer turn cut at the length limit with empty content",
    LANGUAGE_SWITCH: "the answer switches script mid-answer",
    LANGUAGE_DRIFT: "the whole answer is in another script than the prompt asked for",
    LENGTH_MID_CALL: "finish_reason length mid-call",
    NO_TOOL_CALL: "no tool_calls where the turn requires one",
    ARGS_NOT_JSON: "arguments not JSON",
    EMPTY_ARGS: "{} for a tool with required parameters",
    ARGS_SCHEMA: "arguments do not match the tool's schema",
    ARGS_CUT: "a string argument ends cut off: in an open quote, code fence or here-document",
}


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


@dataclass
class ToolCall:
    """One assembled tool call: ``arguments`` is the raw JSON string the server sent."""

    index: int
    id: Optional[str]
    name: Optional[str]
    arguments: str = ""


@dataclass
class TurnResult:
    """What a client received for one turn (the input of :func:`classify`).

    ``http_status`` is None when no response arrived (connection error, stall); ``error`` a
    one-line description of a transport or protocol failure; ``stalled`` True when the driver gave
    up after the stall timeout."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: Optional[str] = None
    http_status: Optional[int] = 200
    error: Optional[str] = None
    stalled: bool = False
    response_id: Optional[str] = None
    usage: Optional[dict] = None


@dataclass(frozen=True)
class Verdict:
    """``cls`` = the first class of ``flags`` in :data:`CLASSES` order (``ok`` when none);
    ``reason`` is one line for humans; ``notes`` are findings that are not corruption (markup
    quoted in a code span or a fenced code block), one line each, whatever the class."""

    cls: str
    flags: tuple[str, ...]
    reason: str
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.cls == OK


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
        for ch in _opt_list(choices, "choices"):
            ch = _obj(ch, "choices[]")
            if ch.get("index", 0) != 0:
                continue
            delta = _opt_dict(ch.get("delta"), "delta")
            if delta:
                content = _opt_str(delta.get("content"), "delta.content")
                reasoning = _opt_str(delta.get("reasoning_content"), "delta.reasoning_content")
                tcs = _opt_list(delta.get("tool_calls"), "delta.tool_calls")
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
            fr = _opt_str(ch.get("finish_reason"), "finish_reason")
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
                      usage=_opt_dict(usage, "usage") if usage else None)


class DuplicateKey(ValueError):
    """A JSON object in tool-call arguments names one key twice (parsers disagree on which wins)."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKey(f"duplicate key {k!r} in the arguments (parsers disagree on which value wins)")
        out[k] = v
    return out


def loads_arguments(text: str) -> Any:
    """Tool-call ``arguments`` text -> JSON value. ValueError if not JSON (:class:`DuplicateKey`
    when an object repeats a key), RecursionError when nested too deep for the parser."""
    return json.loads(text, object_pairs_hook=_no_duplicates)


# --- schema checks ----------------------------------------------------------------------------
class ToolSpec:
    """A declared tool: ``name`` and its JSON-schema ``parameters`` (validator compiled once)."""

    def __init__(self, name: str, parameters: Optional[dict]):
        import jsonschema
        self.name = name
        self.parameters = parameters or {"type": "object", "properties": {}}
        self.required = tuple(self.parameters.get("required") or ())
        self._validator = jsonschema.Draft202012Validator(self.parameters)

    def first_error(self, value: Any) -> Optional[str]:
        """The first schema violation of ``value`` as one line, or None. Parts of the schema that
        cannot be checked here (a ``$ref`` to a document that is not inline: nothing is fetched; an
        unknown ``type``) are not judged."""
        import jsonschema
        import referencing.exceptions
        try:
            for err in self._validator.iter_errors(value):
                where = ".".join(str(p) for p in err.absolute_path)
                return clip(f"{where + ': ' if where else ''}{err.message}", 160)
        except (referencing.exceptions.Unresolvable, jsonschema.exceptions.UnknownType,
                jsonschema.exceptions.SchemaError):
            return None
        return None


def tool_specs(tools: Iterable[dict]) -> dict[str, ToolSpec]:
    """OpenAI ``tools`` (``[{"type": "function", "function": {name, parameters}}]``) → specs by name."""
    out = {}
    for t in tools:
        fn = t.get("function", t)
        out[fn["name"]] = ToolSpec(fn["name"], fn.get("parameters"))
    return out


# --- markup leaks -----------------------------------------------------------------------------
# One pattern for every markup spelling, one linear scan per text (every repetition is bounded).
_BARS = "|\uff5c\u2016\u2223\uffe8\u01c0"  # ASCII |, U+FF5C ｜ (what the model emits), U+2016 ‖ (seen in the
_WIDE_BARS = "\uff5c\u2016\u2223\uffe8\u01c0"  # wild), U+2223 ∣, U+FFE8 ￨, U+01C0 ǀ (look-alikes)
_ZW = "[\u200b\u200c\u200d\u2060\ufeff]*"  # zero-width characters a renderer or a corrupt sampler may insert
_DSML_WORD = _ZW + _ZW.join(("[Dd]", "[Ss]", "[Mm]", "[Ll]")) + _ZW   # DSML in any case
_DSML_TAGS = r"(?:(?:tool_calls|function_calls|invoke|parameter| calls| invoke| parameter)>?)"
_MARKUP_RE = re.compile(
    # Every alternative starts with one of a few literal characters (<, &, a wide bar), so the
    # regex engine skips ordinary text quickly.
    r"<(?:"
    # DSML, one or two bars each side, any of the bar characters; with ASCII bars only right after
    # "<" or "</" (so a Markdown table cell "| DSML |" or "|DSML|" is not markup). The tag name that
    # follows (V4 tool_calls, V3.2 function_calls, V4.1 " calls"/" invoke"/" parameter") is part
    # of the spelling reported.
    rf"(?P<dsml>/?{_ZW}[{_BARS}]{{1,2}}{_DSML_WORD}[{_BARS}]{{1,2}}{_DSML_TAGS}?)"
    # V3.1 tool-call tokens: <｜tool▁calls▁begin｜> … <｜tool▁sep｜> (also the outputs family)
    r"|(?P<v31>[|\uff5c]tool[\u2581_](?:(?:calls?|outputs?)[\u2581_](?:begin|end)|sep)[|\uff5c]>)"
    # special tokens: any <｜name｜> with wide bars (<｜end▁of▁sentence｜>, <｜User｜>,
    # <｜place▁holder▁no▁7｜>, …); the ASCII-bar chat tokens of other templates by name, or with a
    # U+2581 or "_" joining the parts of the name (<|end_of_sentence|>); bare <tool_call(s)> /
    # </tool_call(s)>
    rf"|(?P<special>[{_WIDE_BARS}][A-Za-z][\w\u2581]{{0,40}}[{_WIDE_BARS}]>"
    r"|\|(?:im_start|im_end|im_sep|EOT|endoftext|eot_id|begin_of_text|end_of_text|User|Assistant"
    r"|[A-Za-z]+(?:[\u2581_][A-Za-z0-9]+)+)\|>"
    r"|/?tool_calls?>)"
    r"|(?P<think>/?think>))"
    # DSML written with HTML-escaped angle brackets (a client or proxy escaped the markup)
    rf"|&lt;(?P<dsml___>/?[{_BARS}]{{1,2}}{_DSML_WORD}[{_BARS}]{{1,2}}{_DSML_TAGS}?)"
    # DSML without its "<" (the "<" lost or written apart): wide bars only
    rf"|[{_WIDE_BARS}](?P<dsml_>[{_WIDE_BARS}]?{_DSML_WORD}[{_WIDE_BARS}]{{1,2}}{_DSML_TAGS}?)")
_MARKUP_LABELS = {"dsml": "DSML", "v31": "V3.1 tool token", "special": "special token", "think": "think tag"}

_FENCE_RE = re.compile(r"^[ ]{0,3}(`{3,}|~{3,})([^\n]*)", re.M)
_TICKS_RE = re.compile(r"`+")
_BLANK_LINE_RE = re.compile(r"\n[ \t]*\n")
CODE_SPAN = "a code span"
FENCED_BLOCK = "a fenced code block"
QUOTES = "quotes"
_QUOTE_PAIRS = {"'": "'", '"': '"', "\u201c": "\u201d", "\u2018": "\u2019", "\u00ab": "\u00bb",
                "\u300c": "\u300d", "\u300e": "\u300f"}
# one tag quoted in prose: an opening quote, one <...> on one line, the matching closing quote
_QUOTED_TAG_RE = re.compile("|".join(f"{re.escape(a)}<[^<>\n]{{1,200}}>{re.escape(b)}" for a, b in _QUOTE_PAIRS.items()))


def _fences(text: str) -> list[tuple[int, int, str]]:
    """Closed fenced code blocks (CommonMark: a line of >= 3 backticks or tildes, indented at most
    3 spaces, closed by a line of the same character at least as long with nothing after it). An
    unclosed fence quotes nothing: a leak after a stray fence is still a leak."""
    if "```" not in text and "~~~" not in text:
        return []
    out, open_ = [], None
    for m in _FENCE_RE.finditer(text):
        f, info = m.group(1), m.group(2)
        if open_ is None:
            if f[0] == "`" and "`" in info:      # ```x``` on one line is an inline span, not a fence
                continue
            open_ = (m.start(), f[0], len(f))
        elif f[0] == open_[1] and len(f) >= open_[2] and not info.strip():
            out.append((open_[0], m.end(), FENCED_BLOCK))
            open_ = None
    return out


def code_ranges(text: str) -> list[tuple[int, int, str]]:
    """Sorted, disjoint ``(start, end, where)`` of the closed fenced code blocks and the inline code
    spans of ``text`` (CommonMark: a run of n backticks up to the next run of exactly n backticks;
    an unmatched run is literal). Stricter than CommonMark: a span opened by a single backtick must
    close on its own line, so a stray backtick before a leaked multi-line DSML block cannot turn the
    block into a "quote" (longer delimiters, as in ```` ``…`` ````, may span lines).
    Linear apart from a log factor."""
    fences = _fences(text)
    if "`" not in text:
        return fences
    spans: list[tuple[int, int, str]] = []
    blanks = [m.start() for m in _BLANK_LINE_RE.finditer(text)]
    newlines = [m.start() for m in re.finditer("\n", text)]
    gaps, prev = [], 0
    for a, b, _ in fences:
        gaps.append((prev, a))
        prev = b
    gaps.append((prev, len(text)))
    for a, b in gaps:
        runs = [(m.start(), m.end()) for m in _TICKS_RE.finditer(text, a, b)]
        by_len: dict[int, list[int]] = {}
        for k, (s, e) in enumerate(runs):
            by_len.setdefault(e - s, []).append(k)
        k = 0
        while k < len(runs):
            s, e = runs[k]
            same = by_len[e - s]
            p = bisect_right(same, k)
            if p < len(same):
                j = same[p]
                q = bisect_left(blanks, e)
                r = bisect_left(newlines, e)
                one_line = (e - s > 1 or r == len(newlines) or newlines[r] >= runs[j][0]
                            or (text[e:e + 1] == "<" and text[runs[j][0] - 1:runs[j][0]] == ">"))
                if one_line and (q == len(blanks) or blanks[q] >= runs[j][0]):   # a quote stays on its line
                    spans.append((s, runs[j][1], CODE_SPAN))
                    k = j + 1
                    continue
            k += 1
    return sorted(fences + spans)


def quoted_tag_ranges(text: str, code: Optional[list[tuple[int, int, str]]] = None) -> list[tuple[int, int, str]]:
    """``(start, end, QUOTES)`` of single tags quoted in prose: an opening quote (``'``, ``"``,
    ``“``, ``‘``, ``«``, ``「``, ``『``) directly before one ``<…>`` on one line and the matching
    closing quote directly after it (``'<｜DSML｜tool_calls>'``), outside the ``code`` ranges (default
    :func:`code_ranges`). A leaked block is never one quoted tag: it has several tags over several
    lines."""
    if "<" not in text:
        return []
    code = code_ranges(text) if code is None else code
    starts = [r[0] for r in code]
    out = []
    for m in _QUOTED_TAG_RE.finditer(text):
        i = bisect_right(starts, m.start()) - 1
        if (i >= 0 and code[i][1] > m.start()) or (i + 1 < len(code) and code[i + 1][0] < m.end()):
            continue                      # overlaps a code range: that range decides
        out.append((m.start(), m.end(), QUOTES))
    return out


def _quoting_ranges(text: str) -> list[tuple[int, int, str]]:
    """Sorted, disjoint ranges that quote markup: code spans, closed fenced blocks and single tags
    in quotes."""
    code = code_ranges(text)
    tags = quoted_tag_ranges(text, code)
    return sorted(code + tags) if tags else code


def _scan_markup(text: str) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """``(found, quoted)``: per kind (dsml, v31, special, think) the first spelling outside code
    spans and fenced blocks, and the first quoted one with where it is quoted."""
    found: dict[str, str] = {}
    quoted: dict[str, tuple[str, str]] = {}
    ranges: Optional[list[tuple[int, int, str]]] = None
    starts: list[int] = []
    for m in _MARKUP_RE.finditer(text):
        kind = (m.lastgroup or "").rstrip("_")
        if kind in found:
            continue
        if ranges is None:
            ranges = _quoting_ranges(text)
            starts = [r[0] for r in ranges]
        i = bisect_right(starts, m.start()) - 1
        if i >= 0 and ranges[i][1] >= m.end():
            quoted.setdefault(kind, (m.group(), ranges[i][2]))
        else:
            found[kind] = m.group()
            if len(found) == len(_MARKUP_LABELS):
                break
    return found, quoted


def _markup_in(text: str, allowed: tuple[str, ...]) -> Optional[str]:
    """The first markup spelling in an argument string (no quoting rule: arguments are not
    Markdown), after removing every ``allowed`` substring."""
    for a in allowed:
        if a in text:
            text = text.replace(a, "\0")
    m = _MARKUP_RE.search(text)
    return m.group() if m else None


def _markup_in_value(value: Any, allowed: tuple[str, ...]) -> Optional[tuple[str, str]]:
    """``(path, spelling)`` of the first markup in any string (key or value) of a parsed JSON
    value, walked iteratively in document order."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            hit = _markup_in(v, allowed)
            if hit:
                return path or "(the whole value)", hit
        elif isinstance(v, dict):
            items = []
            for k, x in v.items():
                p = f"{path}.{k}" if path else str(k)
                items += [(p + " (name)", k), (p, x)]
            stack.extend(reversed(items))
        elif isinstance(v, list):
            stack.extend(reversed([(f"{path}[{i}]", x) for i, x in enumerate(v)]))
    return None


# --- quoted markup cut out of content ------------------------------------------------------------
_OPENERS = "`'\"\u201c\u2018\u00ab\u300c\u300e"    # ` ' " “ ‘ « 「 『
_EMPTY_SPAN_RE = re.compile(r"(?<![`\S])``(?![`\w])")


def find_markup_cut(text: str, *, at_end: bool = True) -> Optional[str]:
    """Why ``text`` (a turn's ``content``) looks like quoted markup was cut out of it, or None.

    SGLang 0.5.23's served path recognises DSML and ``</think>`` by token id, also when the model
    only quotes them in prose: the parser cuts the content at the quoted tag (and may execute a
    quoted example as the call) or drops the tag, and the client gets prose that opens a quote and
    never closes it. Signs, outside code spans and closed fenced blocks: with ``at_end`` (pass False
    when the turn ended with ``finish_reason`` length), the text ends with a fence opener line
    (```` ```xml ````, ``~~~``) that nothing closes, or with an opening quote or backtick (a
    backtick, ``'`` or ``"`` after a space, a line start, ``:``, ``(`` or ``=``; ``“``, ``‘``, ``«``,
    ``「``, ``『`` anywhere) that nothing closes; anywhere, a lone empty code span (````` `` `````
    between spaces: the quoted tag was removed)."""
    if at_end:
        end = _open_end(text)
        if end is not None:
            return f"content ends with {end}"
    if "``" in text:
        ranges = code_ranges(text)
        starts = [r[0] for r in ranges]
        for m in _EMPTY_SPAN_RE.finditer(text):
            i = bisect_right(starts, m.start()) - 1
            if i >= 0 and ranges[i][1] > m.start():
                continue
            a = max(0, m.start() - 20)
            return f"content holds an empty code span {text[a:m.end() + 20]!r}"
    return None


# a here-document operator: whitespace before, no space before the delimiter unless it is quoted
_HEREDOC_RE = re.compile(r"(?<!\S)<<(-?)(?:[ \t]*(['\"])([A-Za-z_]\w{0,40})\2|([A-Za-z_]\w{0,40}))(?![\w'\"])")


def _open_end(text: str) -> Optional[str]:
    """The sign that ``text`` ends inside something it opened: an unclosed fence opener line, or an
    opening backtick or quote (a backtick, ``'`` or ``"`` after a space, a line start, ``:``, ``(``
    or ``=``; ``“``, ``‘``, ``«``, ``「``, ``『`` anywhere) as its last character; else None."""
    body = text.rstrip()
    if not body:
        return None
    opener = _open_fence_at_end(body)
    if opener is not None:
        return f"an open fence {opener!r}"
    last = body[-1]
    if last not in _OPENERS:
        return None
    before = body[-2] if len(body) > 1 else "\n"
    if last in "`'\"" and not (before.isspace() or before in ":(="):
        return None
    if last == "`":
        ranges = code_ranges(body)
        if ranges and ranges[-1][1] == len(body):
            return None                   # it closes a span
    return f"an open quote {body[-20:]!r}"


def find_cut_string(value: str) -> Optional[str]:
    """Why a tool-call string argument looks cut off, or None: SGLang 0.5.23's served path ends a
    string parameter at a literal ``</｜DSML｜parameter`` inside it (a heredoc or code that prints
    DSML), and the value then stops inside what it opened. Signs: a here-document
    (``cat <<EOF``, ``<<-'EOF'``) whose delimiter never comes back on a line of its own, or the
    text ends in an open fence or quote (as :func:`find_markup_cut` judges a content's end;
    a value that is only the quote character, e.g. ``{"sep": "'"}``, is not cut)."""
    if len(value.strip()) > 1:
        end = _open_end(value)
        if end is not None:
            return f"ends in {end}"
    if "<<" in value:
        last: dict[str, int] = {}       # line -> start of its last occurrence (one pass: linear time)
        last_tabs: dict[str, int] = {}  # the same with leading tabs removed (``<<-``)
        pos = 0
        for line in value.split("\n"):
            last[line] = last_tabs[line.lstrip("\t")] = pos
            pos += len(line) + 1
        for m in _HEREDOC_RE.finditer(value):
            delim = m.group(3) or m.group(4)
            if (last_tabs if m.group(1) else last).get(delim, -1) <= m.start():
                return f"here-document <<{delim} never closed"
    return None


def _cut_in_value(value: Any) -> Optional[tuple[str, str]]:
    """``(path, why)`` of the first string of a parsed JSON value that :func:`find_cut_string`
    finds cut off, in document order (values only: keys are names)."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            why = find_cut_string(v)
            if why:
                return path or "(the whole value)", why
        elif isinstance(v, dict):
            stack.extend(reversed([(f"{path}.{k}" if path else str(k), x) for k, x in v.items()]))
        elif isinstance(v, list):
            stack.extend(reversed([(f"{path}[{i}]", x) for i, x in enumerate(v)]))
    return None


def _open_fence_at_end(text: str) -> Optional[str]:
    """The fence opener line that ends ``text`` when no fence closes it (CommonMark pairing as in
    :func:`_fences`), else None. A bare opener (no info string such as ``xml``) after other fences
    does not count: a Markdown listing with a nested fence written with the same backticks leaves
    one, and the quoted examples SGLang's served path cuts carry a language."""
    if "```" not in text and "~~~" not in text:
        return None
    open_, fences = None, 0
    for m in _FENCE_RE.finditer(text):
        fences += 1
        f, info = m.group(1), m.group(2)
        if open_ is None:
            if f[0] == "`" and "`" in info:
                continue
            open_ = (m, f[0], len(f))
        elif f[0] == open_[1] and len(f) >= open_[2] and not info.strip():
            open_ = None
    if open_ is not None and open_[0].end() >= len(text) and (open_[0].group(2).strip() or fences == 1):
        return open_[0].group().strip()
    return None


# --- loops --------------------------------------------------------------------------------------
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"   # kana, Han, Hangul
_TOKEN_RE = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+")     # a word, or one CJK character
_ONES_RE = re.compile(b"\x01+")
LOOP_GRAM = 8            # candidate periods come from repeated word 8-grams
LOOP_MIN_WORDS = 60      # shorter texts are never a loop
LOOP_MIN_COPIES = 4      # the repeated unit occurs at least 4 times back to back
LOOP_MIN_SHARE = 0.30    # … and the repeating stretch covers >= 30 % of the words
LOOP_MIN_SPAN = 400      # … or >= 400 words (long texts)
LOOP_MAX_CHARS = 200_000  # a longer text is judged by its last 200 000 characters …
LOOP_MAX_WORDS = 20_000   # … and at most its last 20 000 words


@dataclass(frozen=True)
class Loop:
    """A loop found by :func:`find_loop`: a unit of ``period`` words repeated over ``span`` words
    of a text of ``words`` words; ``unit`` is its start."""

    period: int
    span: int
    words: int
    unit: str


def _cut(text: str, ranges: list[tuple[int, int, str]], sep: str) -> str:
    """``text`` without the sorted, disjoint ``(start, end, _)`` ranges, the pieces joined by ``sep``."""
    parts, prev = [], 0
    for a, b, _ in ranges:
        parts.append(text[prev:a])
        prev = b
    parts.append(text[prev:])
    return sep.join(parts)


def _repeated_fences(text: str, fences: list[tuple[int, int, str]], at_end: bool) -> Optional[Loop]:
    """A loop made of whole fenced blocks: >= :data:`LOOP_MIN_COPIES` identical closed blocks back
    to back (only whitespace between), covering >= :data:`LOOP_MIN_SHARE` of the text's words;
    with ``at_end``, followed by at most one block's worth of words."""
    total = len(_TOKEN_RE.findall(text))
    run, best = 1, None
    for k in range(1, len(fences) + 1):
        same = (k < len(fences) and text[fences[k][0]:fences[k][1]] == text[fences[k - 1][0]:fences[k - 1][1]]
                and not text[fences[k - 1][1]:fences[k][0]].strip())
        if same:
            run += 1
            continue
        if run >= LOOP_MIN_COPIES:
            a, b = fences[k - run][0], fences[k - 1][1]
            span = len(_TOKEN_RE.findall(text, a, b))
            unit = text[fences[k - 1][0]:fences[k - 1][1]]
            period = max(1, len(_TOKEN_RE.findall(unit)))
            tail = len(_TOKEN_RE.findall(text, b))
            if total >= LOOP_MIN_WORDS and span >= LOOP_MIN_SHARE * total and (not at_end or tail <= period):
                if best is None or span > best.span:
                    best = Loop(period, span, total, unit[:80])
        run = 1
    return best


def find_loop(text: str, at_end: bool = True) -> Optional[Loop]:
    """The longest qualifying exact repetition of ``text``, or None.

    With ``at_end`` (the default; pass False when the turn ended with ``finish_reason`` length)
    the repeating stretch must reach the end of the text, apart from a tail of at most one unit:
    a degenerate loop does not recover, while a quoted log with identical lines or a JSON array of
    identical objects is followed by more of the answer.

    Words are runs of letters, digits and ``_``, and each CJK character is a word of its own
    (punctuation, whitespace and symbols such as ``}`` are ignored; case matters). Text inside
    *closed* fenced code blocks is left out (listings repeat legitimately), except that
    :data:`LOOP_MIN_COPIES` or more identical blocks back to back are a loop of their own. A loop is a stretch in which the same unit of
    ``d`` words repeats back to back, word for word (the last copy may be partial), at least
    :data:`LOOP_MIN_COPIES` times, covering at least :data:`LOOP_MIN_SHARE` of the words or
    :data:`LOOP_MIN_SPAN` words, in a text of at least :data:`LOOP_MIN_WORDS` words. Boilerplate
    that varies a word in every copy (numbered lines, ``handler_1``, ``handler_2`` …) is not a
    loop. Candidate periods are the distances between repeated word 8-grams, so a text without a
    repeated 8-gram (nearly all prose) is cleared after one tokenisation and one set."""
    if len(text) < LOOP_MIN_WORDS:
        return None
    if len(text) > LOOP_MAX_CHARS:
        text = text[-LOOP_MAX_CHARS:]
    fences = _fences(text)
    if fences:
        rep = _repeated_fences(text, fences, at_end)
        if rep is not None:
            return rep
        text = _cut(text, fences, "\n")
    toks = _TOKEN_RE.findall(text)
    if len(toks) > LOOP_MAX_WORDS:
        toks = toks[-LOOP_MAX_WORDS:]
    n = len(toks)
    if n < LOOP_MIN_WORDS:
        return None
    grams = list(zip(*(toks[k:] for k in range(LOOP_GRAM))))
    if len(set(grams)) == len(grams):
        return None
    last: dict[tuple, int] = {}
    dist: dict[int, int] = {}
    for i, g in enumerate(grams):
        j = last.get(g)
        if j is not None:
            dist[i - j] = dist.get(i - j, 0) + 1
        last[g] = i
    need = min(LOOP_MIN_SPAN, -(-LOOP_MIN_SHARE * n // 1))
    # a stretch of L words with period d holds L - d - 7 grams repeated at distance d
    cands = sorted((d for d, c in dist.items()
                    if c >= max(need, LOOP_MIN_COPIES * d) - d - LOOP_GRAM + 1), key=lambda d: -dist[d])
    best: Optional[Loop] = None
    for d in cands[:8]:
        eq = bytes(map(operator.eq, toks, toks[d:]))
        run = max((m for m in _ONES_RE.finditer(eq) if not at_end or n - (m.end() + d) <= d),
                  key=lambda m: m.end() - m.start(), default=None)
        if run is None:
            continue
        span = run.end() - run.start() + d
        if span >= LOOP_MIN_COPIES * d and span >= need and (best is None or span > best.span):
            unit = " ".join(toks[run.start():run.start() + min(d, 12)])
            best = Loop(d, span, n, unit[:80] + (" …" if d > 12 or len(unit) > 80 else ""))
    return best


# --- language switch ----------------------------------------------------------------------------
_SCRIPT_RE = re.compile(
    r"(?P<Latin>[A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff]+)"
    rf"|(?P<CJK>[{_CJK}]+)"
    r"|(?P<Cyrillic>[\u0400-\u04ff]+)|(?P<Greek>[\u0370-\u03ff\u1f00-\u1fff]+)"
    r"|(?P<Arabic>[\u0600-\u06ff]+)|(?P<Hebrew>[\u05d0-\u05ea]+)"
    r"|(?P<Devanagari>[\u0900-\u097f]+)|(?P<Thai>[\u0e00-\u0e7f]+)")
_NON_LATIN_RE = re.compile(rf"[{_CJK}\u0370-\u03ff\u1f00-\u1fff\u0400-\u04ff\u0590-\u06ff\u0900-\u097f\u0e00-\u0e7f]+")
# URLs and short quoted stretches (a quoted word or phrase, up to 80 characters on one line)
_SKIP_RE = re.compile(
    r"(?:https?|ftp)://\S+|www\.\S+"
    r"|\"[^\"\n]{0,80}\"|\u201c[^\u201d\n]{0,80}\u201d|\u2018[^\u2019\n]{0,80}\u2019"
    r"|\u00ab[^\u00bb\n]{0,80}\u00bb|\u300c[^\u300d\n]{0,80}\u300d|\u300e[^\u300f\n]{0,80}\u300f"
    r"|(?<!\w)'[^'\n]{1,80}'(?!\w)")
# identifiers and paths are not language: snake_case, dotted.names, a/path, Class::member, camelCase,
# CamelCase (two or more capitalised parts), words with digits
_IDENT_RE = re.compile(
    r"[A-Za-z0-9]*(?:(?:_|::|\.|/|\\)+[A-Za-z0-9]+)+[/\\]?"
    r"|[a-z]+[A-Z][A-Za-z0-9]*|[A-Z]+[a-z0-9]+(?:[A-Z][a-z0-9]*)+|[A-Za-z]+[0-9][A-Za-z0-9]*")
SWITCH_BASE_LETTERS = 200  # the answer's script is judged on its first 200 letters …
SWITCH_MIN_BASE = 50       # … of which at least 50 come before the switch …
SWITCH_BASE_SHARE = 0.90   # … and >= 90 % of them are one script
SWITCH_RUN = 20            # a switch: >= 20 letters of another script …
SWITCH_RUN_LATIN = 60      # … (>= 60 when switching into Latin: English terms in CJK prose are common)
SWITCH_MAX_GAP_WORDS = 2   # … interrupted by at most 2 words of the answer's script at a time


@dataclass(frozen=True)
class Switch:
    """A language switch found by :func:`find_language_switch`."""

    base: str
    to: str
    after: int        # letters of the answer before the switch
    excerpt: str


def _dominant(counts: dict[str, int], seen: int) -> Optional[str]:
    if seen < SWITCH_MIN_BASE:
        return None
    s, c = max(counts.items(), key=lambda kv: kv[1])
    return s if c >= SWITCH_BASE_SHARE * seen else None


DRIFT_MIN_LETTERS = 20     # a drift is judged on at least 20 letters …
DRIFT_SHARE = 0.5          # … of which more than half are of one script other than the expected one


def find_language_drift(text: str, expected: str = "Latin") -> Optional[tuple[str, float]]:
    """(script, share of letters) when the answer is mostly in another script than ``expected``
    (one of the scripts of :func:`find_language_switch`), else None. Judged on the letters left
    after the same cuts as :func:`find_language_switch` (code, URLs, identifiers and paths, quoted
    phrases), so English identifiers in another language's prose and quoted foreign text in an
    English answer do not count; fewer than :data:`DRIFT_MIN_LETTERS` letters: no verdict."""
    text = text[:LOOP_MAX_CHARS]
    ranges = code_ranges(text)
    if ranges:
        text = _cut(text, ranges, " ")
    text = _IDENT_RE.sub(" ", _SKIP_RE.sub(" ", text))
    counts: dict[str, int] = {}
    for m in _SCRIPT_RE.finditer(text):
        counts[m.lastgroup or ""] = counts.get(m.lastgroup or "", 0) + m.end() - m.start()
    total = sum(counts.values())
    if total < DRIFT_MIN_LETTERS:
        return None
    script, n = max(counts.items(), key=lambda kv: kv[1])
    if script != expected and n / total > DRIFT_SHARE:
        return script, n / total
    return None


def find_language_switch(text: str) -> Optional[Switch]:
    """An answer that opened in one script and later switches to another, or None.

    Scripts: Latin, CJK (Han, kana and Hangul together), Cyrillic, Greek, Arabic, Hebrew,
    Devanagari, Thai (letters only; digits, punctuation and other characters are ignored). Code
    spans, closed fenced blocks, URLs, identifiers and paths (``snake_case``, ``a.b``, ``a/b``,
    ``A::b``, ``camelCase``, ``CamelCase``, words with digits) and quoted words or phrases (``"…"``, ``“…”``, ``‘…’``,
    ``'…'``, ``«…»``, ``「…」``, ``『…』``, up to 80 characters) are ignored. The answer's script is
    the one with >= 90 % of the letters among the first 200 letters seen before a candidate switch
    (at least 50 of them); a switch is a stretch of >= 20 letters of other scripts (>= 60 when it
    is Latin), interrupted by at most two words of the answer's script at a time. An ASCII-only
    text, or one with fewer than 20 letters outside Latin, is cleared after one fast scan. Only
    the first :data:`LOOP_MAX_CHARS` characters are judged (bounded time on hostile input)."""
    if text.isascii() or sum(map(len, _NON_LATIN_RE.findall(text, 0, LOOP_MAX_CHARS))) < SWITCH_RUN:
        return None     # no switch into another script, and too few letters for a non-Latin answer
    text = text[:LOOP_MAX_CHARS]     # a switch shows early; longer answers are judged on their start
    ranges = code_ranges(text)
    if ranges:
        text = _cut(text, ranges, " ")
    text = _IDENT_RE.sub(" ", _SKIP_RE.sub(" ", text))
    counts: dict[str, int] = {}
    seen = total = 0
    base: Optional[str] = None
    foreign = gap = after = fstart = 0
    fscript = ""
    for m in _SCRIPT_RE.finditer(text):
        s, n = m.lastgroup or "", m.end() - m.start()
        if foreign and s == base:
            gap += 1
            if gap > SWITCH_MAX_GAP_WORDS:
                foreign = 0
        elif foreign:
            foreign, gap = foreign + n, 0
        else:
            b = _dominant(counts, seen)
            if b is not None and s != b:
                base, foreign, gap, fscript, fstart, after = b, n, 0, s, m.start(), total
        if foreign >= (SWITCH_RUN_LATIN if fscript == "Latin" else SWITCH_RUN):
            excerpt = " ".join(text[fstart:fstart + 60].split())
            return Switch(base or "", fscript, after, excerpt)
        if seen < SWITCH_BASE_LETTERS:
            take = min(n, SWITCH_BASE_LETTERS - seen)
            counts[s] = counts.get(s, 0) + take
            seen += take
        total += n
    return None


# --- the classifier -----------------------------------------------------------------------------
def classify(turn: TurnResult, *, requires_tool: bool, tools: dict[str, ToolSpec],
             thinking_requested: bool = False, allowed_markup: Iterable[str] = (),
             expected_script: Optional[str] = None, calls_match_known_answer: bool = False) -> Verdict:
    """Classify one turn. ``requires_tool``: the workload required at least one tool call.

    ``thinking_requested``: the request asked for thinking (``chat_template_kwargs.thinking`` or a
    ``reasoning_effort``), so an empty ``reasoning_content`` next to non-empty content means the
    reasoning was merged into content (``reasoning_in_content``). ``allowed_markup``: substrings the
    workload expects inside tool-call argument strings (e.g. the ``<think>`` of a file the agent is
    told to write); every occurrence is removed before the arguments are scanned for markup.
    ``expected_script``: the script the prompt asked the answer in (``Latin`` for an English
    prompt); content mostly in another one is ``language_drift`` (None: not judged).
    ``calls_match_known_answer``: the caller compared the delivered calls with the turn's known
    answer and they match (:func:`.expect.judge`), so literal markup inside arguments that parse as
    JSON is what the agent asked for (a heredoc, code that prints DSML), not a leak, and a string
    that ends in an open quote or here-document is not cut (``args_cut``); arguments that are not
    JSON are still scanned.

    Returns a Verdict whose ``flags`` lists every class that applies, in :data:`CLASSES` order,
    and whose ``cls`` is the first (``ok`` if none); ``notes`` lists markup quoted in code spans or
    fenced blocks, which is not corruption. An HTTP/protocol error or a stall short-circuits (the
    body is not judged)."""
    if turn.stalled:
        return Verdict(STUCK, (STUCK,), turn.error or "no progress within the stall timeout")
    if turn.error or turn.http_status != 200:
        why = turn.error or f"HTTP {turn.http_status}"
        pd = _PD_FAILURE.search(why)
        cls = HTTP_ERROR if pd is None else PD_TRANSFER if pd.group(1) == "transfer" else PD_BOOTSTRAP
        return Verdict(cls, (cls,), why)
    allowed = (allowed_markup,) if isinstance(allowed_markup, str) else tuple(a for a in allowed_markup if a)

    flags: dict[str, str] = {}
    notes: list[str] = []
    content, reasoning = turn.content, turn.reasoning
    found, quoted = _scan_markup(content) if content else ({}, {})
    if "dsml" in found:
        flags[DSML_IN_CONTENT] = f"DSML {found['dsml']!r} in content"
    elif "v31" in found:
        flags[DSML_IN_CONTENT] = f"V3.1 tool token {found['v31']!r} in content"
    if "special" in found:
        flags[SPECIAL_TOKEN_LEAK] = f"special token {found['special']!r} in content"
    if "think" in found:
        flags[THINK_IN_CONTENT] = f"{found['think']!r} in content"
    notes += [f"quoted {_MARKUP_LABELS[k]} {x!r} in {where}" for k, (x, where) in quoted.items() if k not in found]
    cut = find_markup_cut(content, at_end=turn.finish_reason != "length") if content else None
    if cut:
        flags[MARKUP_CUT] = cut
    if reasoning:
        rfound, rquoted = _scan_markup(reasoning)
        x = rfound.get("dsml") or rfound.get("v31")
        if x:
            flags[DSML_IN_REASONING] = f"{'DSML' if 'dsml' in rfound else 'V3.1 tool token'} {x!r} in reasoning_content"
        notes += [f"quoted {_MARKUP_LABELS[k]} {x!r} in {where} of reasoning_content"
                  for k, (x, where) in rquoted.items() if k in ("dsml", "v31") and k not in rfound]
    if thinking_requested and content.strip() and not reasoning.strip():
        flags[REASONING_IN_CONTENT] = ("thinking requested but reasoning_content is empty and content is not "
                                       "(no reasoning parser?)")
    for where, text in (("content", content), ("reasoning_content", reasoning)):
        loop = find_loop(text, at_end=turn.finish_reason != "length") if text else None
        if loop:
            flags.setdefault(NGRAM_LOOP, f"{where}: a {loop.period}-word unit repeated over {loop.span} of "
                                         f"{loop.words} words: {loop.unit!r}")
    if (turn.finish_reason == "length" and not requires_tool and not turn.tool_calls
            and not content.strip()):
        flags[EMPTY_LENGTH] = (f"finish_reason length with empty content and {len(reasoning)} characters "
                               "of reasoning (thinks until the cap)")
    drift = find_language_drift(content, expected_script) if content and expected_script else None
    if drift:
        flags[LANGUAGE_DRIFT] = (f"content is {drift[1]:.0%} {drift[0]} letters; the prompt asked for "
                                 f"{expected_script}: {' '.join(content[:60].split())!r}")
    switch = find_language_switch(content) if content and not drift else None
    if switch:
        flags[LANGUAGE_SWITCH] = (f"content switches from {switch.base} to {switch.to} after {switch.after} "
                                  f"letters: {switch.excerpt!r}")
    dsml = DSML_IN_CONTENT in flags
    if turn.finish_reason == "length" and (turn.tool_calls or requires_tool or dsml):
        flags[LENGTH_MID_CALL] = ("finish_reason length with "
                                  + (f"{len(turn.tool_calls)} tool call(s)" if turn.tool_calls else "no tool call"))
    if requires_tool and not turn.tool_calls:
        flags[NO_TOOL_CALL] = f"no tool_calls (finish_reason {turn.finish_reason})"
    for c in turn.tool_calls:
        label = f"call {c.index} {c.name!r}"
        try:
            args = loads_arguments(c.arguments) if c.arguments.strip() else None
        except (ValueError, RecursionError) as e:
            why = str(e) if isinstance(e, DuplicateKey) else f"arguments not JSON: {c.arguments[:60]!r}"
            flags.setdefault(ARGS_NOT_JSON, f"{label}: {why}")
            if MARKUP_IN_ARGS not in flags:
                hit = _markup_in(c.arguments, allowed)
                if hit:
                    flags[MARKUP_IN_ARGS] = f"{label}: {hit!r} in the raw arguments"
            continue
        if args is not None and MARKUP_IN_ARGS not in flags and not calls_match_known_answer:
            at = _markup_in_value(args, allowed)
            if at:
                flags[MARKUP_IN_ARGS] = f"{label}: {at[1]!r} in argument {at[0]}"
        spec = tools.get(c.name or "")
        if args is None:
            flags.setdefault(ARGS_NOT_JSON, f"{label}: empty arguments string")
            continue
        if not isinstance(args, dict):
            flags.setdefault(ARGS_SCHEMA, f"{label}: arguments are {type(args).__name__}, not an object")
            continue
        if spec is None:
            flags.setdefault(ARGS_SCHEMA, f"{label}: tool not declared in the request")
            continue
        if not args and spec.required:
            flags.setdefault(EMPTY_ARGS, f"{label}: {{}} but requires {', '.join(spec.required)}")
            continue
        if ARGS_CUT not in flags and not calls_match_known_answer and turn.finish_reason != "length":
            cut = _cut_in_value(args)        # the root cause when later parameters are missing too
            if cut:
                flags[ARGS_CUT] = f"{label}: argument {cut[0]} {cut[1]}"
        err = spec.first_error(args)
        if err:
            flags.setdefault(ARGS_SCHEMA, f"{label}: {err}")
    if not flags:
        return Verdict(OK, (), "ok", tuple(notes))
    ordered = tuple(c for c in CLASSES if c in flags)
    return Verdict(ordered[0], ordered, flags[ordered[0]], tuple(notes))
