"""What a judged turn is and what it can be: the corruption classes in precedence order, the
turn a client received (:class:`TurnResult`), the :class:`Verdict`, and :class:`Judging`, the
state one turn's checks share while :func:`dsv4ctl.check.classify.classify` runs them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# --- classes, in precedence order (the first flag present is the turn's class) -----------------
OK = "ok"
HTTP_ERROR = "http_error"
PD_TRANSFER = "pd_transfer_failed"
PD_BOOTSTRAP = "pd_bootstrap_failed"
PD_ABORTED = "pd_aborted"
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
LANGUAGE_MIX = "language_mix"
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

CLASSES = (HTTP_ERROR, PD_TRANSFER, PD_BOOTSTRAP, PD_ABORTED, STUCK,
           # markup leaks: the parser (or the template) let model markup through
           DSML_IN_CONTENT, DSML_IN_REASONING, SPECIAL_TOKEN_LEAK, THINK_IN_CONTENT, REASONING_IN_CONTENT,
           MARKUP_IN_ARGS, MARKUP_CUT,
           # degenerate generation: usually the root cause of a call-shape failure on the same turn
           NGRAM_LOOP, EMPTY_LENGTH, LANGUAGE_SWITCH, LANGUAGE_DRIFT, LANGUAGE_MIX,
           # call shape
           LENGTH_MID_CALL, NO_TOOL_CALL, ARGS_NOT_JSON, EMPTY_ARGS, ARGS_CUT, ARGS_SCHEMA,
           # known answer (:mod:`.expect`): well-formed calls that are not the correct ones
           WRONG_TOOL, MISSING_CALL, EXTRA_CALL, WRONG_ARGS)
"""Every corruption class, in precedence order: errors, markup leaks, degenerate generation, call
shape, known answer."""

NO_ANSWER = (HTTP_ERROR, PD_TRANSFER, PD_BOOTSTRAP, PD_ABORTED, STUCK)
"""Classes of turns that got no answer to judge: HTTP/protocol errors (the PD ones split out by
:mod:`.pd`: SGLang's decode or prefill aborting a request whose KV transfer or bootstrap failed,
or one aborted elsewhere, ``AbortReq``) and stalls."""

DESCRIPTIONS = {
    OK: "valid",
    WRONG_TOOL: "a call names a different tool than the known answer",
    MISSING_CALL: "fewer tool calls than the known answer",
    EXTRA_CALL: "more tool calls than the known answer",
    WRONG_ARGS: "arguments differ from the known answer",
    HTTP_ERROR: "HTTP or protocol error",
    PD_TRANSFER: "PD KV transfer failed (SGLang aborted the request: HTTP 500)",
    PD_BOOTSTRAP: "PD bootstrap or handshake failed (SGLang aborted the request: HTTP 500)",
    PD_ABORTED: "PD request aborted by an AbortReq (the client, the router or the peer cancelled it: HTTP 500)",
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
    LANGUAGE_MIX: "single words of another script scattered through the prose (e.g. Chinese words in an English answer)",
    LENGTH_MID_CALL: "finish_reason length mid-call",
    NO_TOOL_CALL: "no tool_calls where the turn requires one",
    ARGS_NOT_JSON: "arguments not JSON",
    EMPTY_ARGS: "{} for a tool with required parameters",
    ARGS_SCHEMA: "arguments do not match the tool's schema",
    ARGS_CUT: "a string argument ends cut off: in an open quote, code fence or here-document",
}


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
    sglext: Optional[dict] = None     # SGLang's ``sglext`` object (``cached_tokens_details`` …), when sent


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


@dataclass
class Judging:
    """One answered turn under judgement: the turn, what the caller said about it (see
    :func:`dsv4ctl.check.classify.classify` for each argument), and what the checks found so far:
    ``flags`` (class -> one-line reason; the first reason given for a class stays) and ``notes``
    (findings that are not corruption). Each check of the classifier's table reads it and adds to
    ``flags`` / ``notes``."""

    turn: TurnResult
    requires_tool: bool
    tools: dict
    thinking_requested: bool = False
    allowed: tuple[str, ...] = ()
    expected_script: Optional[str] = None
    calls_match_known_answer: bool = False
    flags: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def at_end(self) -> bool:
        """The answer ended on its own (not at ``finish_reason`` length): signs at its end count."""
        return self.turn.finish_reason != "length"

    def verdict(self) -> Verdict:
        """The Verdict of the flags found: every class in :data:`CLASSES` order, the first is the
        turn's class (``ok`` when none)."""
        if not self.flags:
            return Verdict(OK, (), "ok", tuple(self.notes))
        ordered = tuple(c for c in CLASSES if c in self.flags)
        return Verdict(ordered[0], ordered, self.flags[ordered[0]], tuple(self.notes))

