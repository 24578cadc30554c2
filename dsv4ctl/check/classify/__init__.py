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

The package is split by what it judges: :mod:`.protocol` (the wire: SSE, stream assembly, size
limits), :mod:`.markup` (markup and leaks), :mod:`.arguments` (arguments and schema),
:mod:`.language` (loops and language), :mod:`.pd` (SGLang's PD abort messages, shared with
``diagnose``); :mod:`.classes` holds the classes, the turn and the
verdict. :func:`classify` runs the table :data:`CHECKS`.
"""

from __future__ import annotations

from typing import Iterable, Optional

from . import arguments, language, markup
from .arguments import DuplicateKey, ToolSpec, find_cut_string, loads_arguments, tool_specs
from .classes import (ARGS_CUT, ARGS_NOT_JSON, ARGS_SCHEMA, CLASSES, DESCRIPTIONS, DSML_IN_CONTENT, DSML_IN_REASONING,
                      EMPTY_ARGS, EMPTY_LENGTH, EXTRA_CALL, HTTP_ERROR, LANGUAGE_DRIFT, LANGUAGE_MIX, LANGUAGE_SWITCH,
                      LENGTH_MID_CALL, MARKUP_CUT, MARKUP_IN_ARGS, MISSING_CALL, NGRAM_LOOP, NO_ANSWER, NO_TOOL_CALL,
                      OK, PD_ABORTED, PD_BOOTSTRAP, PD_TRANSFER, REASONING_IN_CONTENT, SPECIAL_TOKEN_LEAK, STUCK, THINK_IN_CONTENT,
                      WRONG_ARGS, WRONG_TOOL, Judging, ToolCall, TurnResult, Verdict)
from .language import (DRIFT_MIN_LETTERS, DRIFT_SHARE, LOOP_GRAM, LOOP_MAX_CHARS, LOOP_MAX_WORDS, LOOP_MIN_COPIES,
                       LOOP_MIN_SHARE, LOOP_MIN_SPAN, LOOP_MIN_WORDS, SWITCH_BASE_LETTERS, SWITCH_BASE_SHARE,
                       SWITCH_MAX_GAP_WORDS, SWITCH_MIN_BASE, SWITCH_RUN, SWITCH_RUN_LATIN, Loop, Mix, Switch,
                       find_language_drift, find_language_mix, find_language_switch, find_loop)
from .markup import (BAR, CODE_SPAN, DSML_MARK, FENCED_BLOCK, LEGACY_TOOL_MARKS, QUOTES, THINK_MARKS, code_ranges,
                     find_markup_cut, quoted_tag_ranges)
from .pd import PD_ABORTS, no_answer, pd_abort_class
from .protocol import (MAX_CONTENT, MAX_JSON_BODY, MAX_PIECES, MAX_SSE_LINE, ProtocolError, SSEDecoder,
                       StreamAssembler, parse_completion)

__all__ = [
    "ARGS_CUT", "ARGS_NOT_JSON", "ARGS_SCHEMA", "BAR", "CHECKS", "CLASSES", "CODE_SPAN", "DESCRIPTIONS",
    "DRIFT_MIN_LETTERS", "DRIFT_SHARE", "DSML_IN_CONTENT", "DSML_IN_REASONING", "DSML_MARK", "DuplicateKey",
    "EMPTY_ARGS", "EMPTY_LENGTH", "EXTRA_CALL", "FENCED_BLOCK", "HTTP_ERROR", "LANGUAGE_DRIFT", "LANGUAGE_MIX", "LANGUAGE_SWITCH",
    "LEGACY_TOOL_MARKS", "LENGTH_MID_CALL", "LOOP_GRAM", "LOOP_MAX_CHARS", "LOOP_MAX_WORDS", "LOOP_MIN_COPIES",
    "LOOP_MIN_SHARE", "LOOP_MIN_SPAN", "LOOP_MIN_WORDS", "Loop", "Mix", "MARKUP_CUT", "MARKUP_IN_ARGS", "MAX_CONTENT",
    "MAX_JSON_BODY", "MAX_PIECES", "MAX_SSE_LINE", "MISSING_CALL", "NGRAM_LOOP", "NO_ANSWER", "NO_TOOL_CALL", "OK",
    "PD_ABORTED", "PD_ABORTS", "PD_BOOTSTRAP", "PD_TRANSFER", "ProtocolError", "QUOTES", "REASONING_IN_CONTENT", "SPECIAL_TOKEN_LEAK",
    "SSEDecoder", "STUCK", "SWITCH_BASE_LETTERS", "SWITCH_BASE_SHARE", "SWITCH_MAX_GAP_WORDS", "SWITCH_MIN_BASE",
    "SWITCH_RUN", "SWITCH_RUN_LATIN", "StreamAssembler", "Switch", "THINK_IN_CONTENT", "THINK_MARKS", "ToolCall",
    "ToolSpec", "TurnResult", "Verdict", "WRONG_ARGS", "WRONG_TOOL", "classify", "code_ranges", "find_cut_string",
    "find_language_drift", "find_language_mix", "find_language_switch", "find_loop", "find_markup_cut", "loads_arguments",
    "parse_completion", "pd_abort_class", "quoted_tag_ranges", "tool_specs",
]

CHECKS = (
    markup.content_markup,       # dsml_in_content, special_token_leak, think_in_content; quoted markup: notes
    markup.markup_cut,           # quoted markup cut out of content
    markup.reasoning_markup,     # dsml_in_reasoning
    markup.reasoning_merged,     # reasoning_in_content (thinking requested)
    language.loops,              # ngram_loop (content, then reasoning_content)
    language.empty_length,       # empty_length
    language.script,             # language_drift, else language_switch, else language_mix
    arguments.length_mid_call,   # length_mid_call (after content_markup: DSML in content counts as a call)
    arguments.no_tool_call,      # no_tool_call
    arguments.call_arguments,    # args_not_json, markup_in_args, args_schema, empty_args, args_cut
)
"""The checks of an answered turn, in the order they run; each adds flags and notes to a
:class:`~.classes.Judging` (the first reason given for a class stays)."""


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
    answer and they match (:func:`dsv4ctl.check.expect.judge`), so literal markup inside arguments that parse as
    JSON is what the agent asked for (a heredoc, code that prints DSML), not a leak, and a string
    that ends in an open quote or here-document is not cut (``args_cut``); arguments that are not
    JSON are still scanned.

    Returns a Verdict whose ``flags`` lists every class that applies, in :data:`CLASSES` order,
    and whose ``cls`` is the first (``ok`` if none); ``notes`` lists markup quoted in code spans or
    fenced blocks, which is not corruption. An HTTP/protocol error or a stall short-circuits (the
    body is not judged)."""
    stopped = no_answer(turn)
    if stopped is not None:
        return stopped
    allowed = (allowed_markup,) if isinstance(allowed_markup, str) else tuple(a for a in allowed_markup if a)
    j = Judging(turn, requires_tool, tools, thinking_requested, allowed, expected_script, calls_match_known_answer)
    for check in CHECKS:
        check(j)
    return j.verdict()
