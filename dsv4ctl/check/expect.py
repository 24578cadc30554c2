"""Pure comparison of delivered tool calls with a turn's known answer (``check load`` / ``check smoke``).

No I/O. A known-answer turn (:mod:`.workload`) says which calls are correct, in order, with which
arguments; :func:`compare_calls` compares what the server delivered with that list:

* ``wrong_tool``: the call at a position names a different tool than expected there;
* ``missing_call``: fewer calls than expected;
* ``extra_call``: more calls than expected;
* ``wrong_args``: the expected tool, but its parsed arguments are not the expected JSON value.

Arguments are compared as JSON values, exactly: object key order does not matter, but types do
(``true`` is not ``1``, ``40.0`` is not ``40``, ``"40"`` is not ``40``), strings must be equal
character for character, a missing or an extra key is a difference. Arguments that do not parse
as a JSON object are left to :func:`.classify.classify` (``args_not_json`` / ``args_schema``).

Output path (the release that answers): SGLang 0.5.18-0.5.22 parse DeepSeek-V4 calls with the
regex ``DeepSeekV4Detector`` (``srt/function_call/deepseekv32_detector.py``,
``_parse_parameters_from_xml``: a ``string="true"`` parameter's value is ``.strip()``-ed;
``strip_string_param_value = True`` in 0.5.21/0.5.22), so on ``output_path="detector"`` the
top-level string arguments are compared stripped on both sides: a release that strips as it is
written to is not ``wrong_args``. 0.5.23's deepseek-recipe path keeps them verbatim: compared
exactly (``deepseek-recipe``, or None: unknown).

Calls are matched by position (the directive contract asks for them in order). Run this only on
turns that got an answer (not ``http_error`` / ``stuck``); the classes it returns are meant to be
appended after :data:`.classify.CLASSES` (see :data:`CLASSES`).
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Optional, Union

from . import classify as C
from .classify import ToolCall, Verdict

from .classify import EXTRA_CALL, MISSING_CALL, WRONG_ARGS, WRONG_TOOL  # noqa: E402  (names live in classify.CLASSES)

CLASSES = (WRONG_TOOL, MISSING_CALL, EXTRA_CALL, WRONG_ARGS)
"""The known-answer classes, in precedence order (the tail of ``classify.CLASSES``)."""

DESCRIPTIONS = {c: C.DESCRIPTIONS[c] for c in CLASSES}

EXCERPT = 60     # characters of each value shown in a wrong_args reason


def _excerpt(v: Any, n: int = EXCERPT) -> str:
    """``v`` as compact JSON, cut to ``n`` characters with "..." appended."""
    s = json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    return s if len(s) <= n else s[:n] + "..."


def _same(a: Any, b: Any) -> bool:
    """JSON values equal exactly: same JSON type (bool, int, float, str, null, list, object) and value."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def first_difference(expected: dict, got: dict) -> Optional[str]:
    """One line naming the first differing key of two argument objects (expected key order first,
    then keys only ``got`` has), with a short excerpt of both values; None if equal."""
    for k, v in expected.items():
        if k not in got:
            return f"key {k!r} missing (expected {_excerpt(v)})"
        if not _same(v, got[k]):
            return f"key {k!r}: got {_excerpt(got[k])}, expected {_excerpt(v)}"
    for k in got:
        if k not in expected:
            return f"unexpected key {k!r} = {_excerpt(got[k])}"
    return None


STRIPPING_PATHS = frozenset({"detector"})
"""Output paths whose parser strips the string parameters (0.5.18-0.5.22's regex detector)."""


def _stripped(args: dict) -> dict:
    """``args`` with every top-level string value stripped (what the regex detector delivers)."""
    return {k: v.strip() if isinstance(v, str) else v for k, v in args.items()}


def compare_calls(expected: list[dict], got: list[ToolCall], output_path: Optional[str] = None) -> dict[str, str]:
    """``{class: reason}`` for every known-answer class that applies ({} when the delivered calls
    are the expected ones). ``expected``: ``[{"name": str, "arguments": dict}, ...]`` in order;
    ``got``: the delivered calls in index order; an expected ``arguments`` of None checks the tool
    name only. ``output_path``: the answering release's (module docstring; ``detector``: string
    arguments compared stripped). The reason of a class is that of its first occurrence."""
    out: dict[str, str] = {}
    strip = output_path in STRIPPING_PATHS
    for i, (e, c) in enumerate(zip(expected, got)):
        label = f"call {c.index}"
        if c.name != e["name"]:
            out.setdefault(WRONG_TOOL, f"{label}: {c.name!r}, expected {e['name']!r}")
            continue
        try:
            args = C.loads_arguments(c.arguments) if c.arguments.strip() else None
        except (ValueError, RecursionError):
            continue                      # args_not_json: the classifier's
        if not isinstance(args, dict) or e.get("arguments") is None:
            continue                      # args_not_json / args_schema: the classifier's; name-only
        diff = first_difference(_stripped(e["arguments"]), _stripped(args)) if strip else \
            first_difference(e["arguments"], args)
        if diff:
            out.setdefault(WRONG_ARGS, f"{label} {c.name!r}: {diff}")
    if len(got) < len(expected):
        missing = ", ".join(e["name"] for e in expected[len(got):])
        out[MISSING_CALL] = f"{len(got)} call(s), expected {len(expected)} (missing {missing})"
    elif len(got) > len(expected):
        extra = ", ".join(repr(c.name) for c in got[len(expected):])
        out[EXTRA_CALL] = f"{len(got)} call(s), expected {len(expected)} (extra {extra})"
    return out


ToolChoice = Union[str, dict]


def named_tool(tool_choice: Optional[ToolChoice]) -> Optional[str]:
    """The tool a named ``tool_choice`` (``{"type": "function", "function": {"name": X}}``) forces,
    else None."""
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return fn["name"]
    return None


def check_turn(expected: Optional[list[dict]], tool_choice: Optional[ToolChoice],
               got: list[ToolCall], output_path: Optional[str] = None) -> dict[str, str]:
    """Known-answer and tool-choice classes of one answered turn: :func:`compare_calls` when the
    turn has a known answer, and for a named ``tool_choice`` a ``wrong_tool`` for any delivered
    call naming another tool (a required choice with no call is the classifier's
    ``no_tool_call``); ``output_path`` as :func:`compare_calls`."""
    out = compare_calls(expected, got, output_path) if expected is not None else {}
    forced = named_tool(tool_choice)
    if forced is not None and WRONG_TOOL not in out:
        for c in got:
            if c.name != forced:
                out[WRONG_TOOL] = f"call {c.index}: {c.name!r}, but tool_choice names {forced!r}"
                break
    return out


def merge_verdict(v: Verdict, extra: dict[str, str], order: Optional[Iterable[str]] = None) -> Verdict:
    """``v`` with the classes of ``extra`` ({class: reason}, from :func:`check_turn`) added: flags
    in ``order`` (default ``classify.CLASSES`` followed by :data:`CLASSES` not already in it), the
    class is the first flag, the reason that of that class. An ``http_error`` / ``stuck`` verdict
    is returned as is (the body was not judged)."""
    if not extra or v.cls in C.NO_ANSWER:
        return v
    order = tuple(order) if order is not None else C.CLASSES + tuple(c for c in CLASSES if c not in C.CLASSES)
    present = set(v.flags) | set(extra)
    flags = tuple(c for c in order if c in present)
    if not flags:
        return v
    cls = flags[0]
    return C.Verdict(cls, flags, v.reason if cls == v.cls else extra[cls])


def judge(turn: C.TurnResult, *, requires_tool: bool, tools: dict[str, C.ToolSpec],
          expected: Optional[list[dict]] = None, tool_choice: Optional[ToolChoice] = None,
          thinking_requested: bool = False, expected_script: Optional[str] = None,
          output_path: Optional[str] = None) -> Verdict:
    """The full verdict on one turn: :func:`.classify.classify` (shape and leaks) merged with
    :func:`check_turn` (known answer and named ``tool_choice``). ``expected`` None: a free-form turn,
    judged by shape only. Argument strings of the known answer may hold markup-like text; what the
    known answer itself contains is allowed in the delivered arguments (``allowed_markup``), and when
    the delivered calls match the known answer (names, count, and arguments where it gives them),
    literal markup inside well-formed JSON arguments is legitimate (``calls_match_known_answer``):
    schema and duplicate-key checks still apply. ``output_path``: the answering release's output
    path (:func:`compare_calls`; None: unknown, compared exactly)."""
    allowed = tuple(_strings(expected)) if expected else ()
    extra = check_turn(expected, tool_choice, turn.tool_calls, output_path)
    v = C.classify(turn, requires_tool=requires_tool, tools=tools, thinking_requested=thinking_requested,
                   allowed_markup=allowed, expected_script=expected_script,
                   calls_match_known_answer=expected is not None and not extra)
    return merge_verdict(v, extra)


def _strings(v: Any) -> Iterable[str]:
    """Every string inside a JSON value (keys and values)."""
    if isinstance(v, str):
        yield v
    elif isinstance(v, dict):
        for k, x in v.items():
            yield k
            yield from _strings(x)
    elif isinstance(v, list):
        for x in v:
            yield from _strings(x)
