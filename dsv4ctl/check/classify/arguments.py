"""Arguments and schema: tool-call ``arguments`` parsed as JSON (a repeated key is an error),
checked against the declared tool's JSON schema, scanned for markup and for a string cut off at a
literal DSML closer (an open quote, fence or here-document at its end); the call-shape checks
(``length_mid_call``, ``no_tool_call``)."""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Optional

from ...render import clip
from .classes import (ARGS_CUT, ARGS_NOT_JSON, ARGS_SCHEMA, DSML_IN_CONTENT, EMPTY_ARGS, LENGTH_MID_CALL,
                      MARKUP_IN_ARGS, NO_TOOL_CALL, Judging, ToolCall)
from .markup import _markup_in, _markup_in_value, _open_end

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


_HEREDOC_RE = re.compile(r"(?<!\S)<<(-?)(?:[ \t]*(['\"])([A-Za-z_]\w{0,40})\2|([A-Za-z_]\w{0,40}))(?![\w'\"])")


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



# --- the checks (classifier table) ---------------------------------------------------------------
def length_mid_call(j: Judging) -> None:
    """``length_mid_call``: ``finish_reason`` length with tool calls, on a turn that requires one,
    or with DSML in content (run after :func:`.markup.content_markup`)."""
    t = j.turn
    if t.finish_reason == "length" and (t.tool_calls or j.requires_tool or DSML_IN_CONTENT in j.flags):
        j.flags[LENGTH_MID_CALL] = ("finish_reason length with "
                                    + (f"{len(t.tool_calls)} tool call(s)" if t.tool_calls else "no tool call"))


def no_tool_call(j: Judging) -> None:
    """``no_tool_call``: the turn requires a call and got none."""
    if j.requires_tool and not j.turn.tool_calls:
        j.flags[NO_TOOL_CALL] = f"no tool_calls (finish_reason {j.turn.finish_reason})"


def call_arguments(j: Judging) -> None:
    """Every call's arguments: ``args_not_json``, ``markup_in_args``, ``args_schema``,
    ``empty_args``, ``args_cut`` (the first reason of each class stays)."""
    for c in j.turn.tool_calls:
        _judge_call(j, c)


def _judge_call(j: Judging, c: ToolCall) -> None:
    flags, known = j.flags, j.calls_match_known_answer
    label = f"call {c.index} {c.name!r}"
    try:
        args = loads_arguments(c.arguments) if c.arguments.strip() else None
    except (ValueError, RecursionError) as e:
        why = str(e) if isinstance(e, DuplicateKey) else f"arguments not JSON: {c.arguments[:60]!r}"
        flags.setdefault(ARGS_NOT_JSON, f"{label}: {why}")
        if MARKUP_IN_ARGS not in flags:
            hit = _markup_in(c.arguments, j.allowed)
            if hit:
                flags[MARKUP_IN_ARGS] = f"{label}: {hit!r} in the raw arguments"
        return
    if args is not None and MARKUP_IN_ARGS not in flags and not known:
        at = _markup_in_value(args, j.allowed)
        if at:
            flags[MARKUP_IN_ARGS] = f"{label}: {at[1]!r} in argument {at[0]}"
    spec = j.tools.get(c.name or "")
    if args is None:
        flags.setdefault(ARGS_NOT_JSON, f"{label}: empty arguments string")
        return
    if not isinstance(args, dict):
        flags.setdefault(ARGS_SCHEMA, f"{label}: arguments are {type(args).__name__}, not an object")
        return
    if spec is None:
        flags.setdefault(ARGS_SCHEMA, f"{label}: tool not declared in the request")
        return
    if not args and spec.required:
        flags.setdefault(EMPTY_ARGS, f"{label}: {{}} but requires {', '.join(spec.required)}")
        return
    if ARGS_CUT not in flags and not known and j.at_end:
        cut = _cut_in_value(args)        # the root cause when later parameters are missing too
        if cut:
            flags[ARGS_CUT] = f"{label}: argument {cut[0]} {cut[1]}"
    err = spec.first_error(args)
    if err:
        flags.setdefault(ARGS_SCHEMA, f"{label}: {err}")
