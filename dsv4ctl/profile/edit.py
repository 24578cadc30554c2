"""Round-trip editing of YAML files: only the edited lines change.

Two layers:

* Line primitives shared by every round-trip editor (:mod:`dsv4ctl.serve.edit` for serve configs
  uses them too): the ruamel.yaml round-trip loader used to *compose* a document (every key and
  value with its exact start/end position), one-line value rendering, line endings, comment
  alignment and ``file:line`` syntax errors.
* :func:`set_value`: set one nested value of a profile, e.g. ``("groups", 1, "memory",
  "free_gib_before_load")`` (what ``dsv4ctl facts --write`` writes). The value's own text is
  replaced; a missing key (or a whole missing block such as ``memory:``) is inserted after the
  last entry of its mapping with that mapping's indentation. Every other byte is kept: comments,
  blank lines, key order, quoting, CRLF line ends. A full ruamel ``dump`` is not used on purpose
  (it re-indents sequences and normalises spacing and comments).

After the edit the new text is parsed again (PyYAML's ``safe_load``, as the profile loader does)
and must equal the old data with exactly the requested change; otherwise the edit is refused.

Pure: text in, text out. Reading and writing files is the caller's job."""

from __future__ import annotations

import copy
import io
import re
from typing import Any, Optional, Sequence

from ..errors import InputError

INDENT_STEP = 2
"""Indentation of a new nested block when the file shows none to copy."""


def yaml_rt():
    """A ruamel.yaml round-trip instance (no line wrapping, block style) for composing documents
    and rendering values."""
    from ruamel.yaml import YAML
    y = YAML(typ="rt")
    y.width = 1 << 16
    y.default_flow_style = False
    return y


def syntax_error(label: str, e: Exception) -> InputError:
    """InputError ``label:line: YAML syntax error: what`` for a ruamel.yaml or PyYAML error."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    line = mark.line + 1 if mark is not None else 1
    what = getattr(e, "problem", None) or getattr(e, "context", None) or str(e).splitlines()[0]
    return InputError(f"{label}:{line}: YAML syntax error: {what}")


def render_value(value: Any) -> str:
    """``value`` as ruamel.yaml writes it on one line (``2.0``, ``'true'``, ``[a, b]``).

    Raises InputError when the value cannot be written on one line."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    if value is None:
        return "null"
    y = yaml_rt()
    if isinstance(value, list):
        v = CommentedSeq(value)
        v.fa.set_flow_style()
    elif isinstance(value, dict):
        v = CommentedMap(value)
        v.fa.set_flow_style()
    else:
        v = value
    buf = io.StringIO()
    y.dump({"k": v}, buf)
    out = buf.getvalue()
    assert out.startswith("k:"), out
    body = out[2:].strip()
    if "\n" in body:
        raise InputError(f"value {value!r} cannot be written on one line")
    if body.endswith("..."):
        body = body[:-3].rstrip()
    return body


def line_ending(line: str) -> str:
    """The line's own ending (``"\\n"``, ``"\\r\\n"``, ``"\\r"`` or ``""`` on a last line without one)."""
    body = line.rstrip("\r\n")
    return line[len(body):]


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def yaml_lines(text: str) -> list[str]:
    """``text`` split into lines with their endings the way YAML (and ruamel.yaml's marks) count
    them: at ``\n``, ``\r\n`` and ``\r`` only (``str.splitlines`` also splits at U+2028, U+2029,
    U+0085 and form feeds, which a YAML value may hold)."""
    return _LINE.findall(text)


def compose_lines(text: str, label: str) -> tuple[Any, list[str], str]:
    """``(root node, lines with their endings, the file's line end)`` of ``text``: the root is
    ruamel.yaml's composed node (None for an empty document), every node with its start/end marks.
    Raises InputError (``label:line``) for a YAML syntax error."""
    from ruamel.yaml.error import YAMLError
    try:
        node = yaml_rt().compose(text)
    except YAMLError as e:
        raise syntax_error(label, e) from None
    lines = yaml_lines(text)
    return node, lines, next((line_ending(l) for l in lines if line_ending(l)), "\n")


def aligned_comment(before: str, comment: str, col: int) -> str:
    """``before`` then ``comment`` (``# ...``) starting at column ``col`` when it fits, else one
    space after ``before`` (so a comment keeps its column when the value before it changes length)."""
    return before + " " * max(1, col - len(before)) + comment


def _is_trailer(line: str) -> bool:
    s = line.strip()
    return not s or s.startswith("#")


def _load(text: str, label: str) -> Any:
    import yaml
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        raise syntax_error(label, e) from None
    except yaml.YAMLError as e:
        raise InputError(f"{label}: YAML error: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def _dotted(path: Sequence) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _end_line(node) -> int:
    """The line (0-based) of ``node``'s last character: a block collection's end mark is the next
    token's start, so it ends where its last item ends."""
    from ruamel.yaml.nodes import MappingNode, SequenceNode
    if isinstance(node, (MappingNode, SequenceNode)) and not node.flow_style and node.value:
        last = node.value[-1]
        return _end_line(last[1] if isinstance(node, MappingNode) else last)
    return node.end_mark.line if node.end_mark.column > 0 else node.end_mark.line - 1


def _last_line(lines: list[str], first: int, node) -> int:
    """The last line (0-based) holding ``node``'s text, not counting comment or blank lines after it."""
    end = _end_line(node)
    last = min(max(first, end), len(lines) - 1)
    while last > first and _is_trailer(lines[last]):
        last -= 1
    return last


def _empty(node) -> bool:
    """True for a value written as nothing at all (``key:`` then a line end or a comment)."""
    return node.start_mark.index == node.end_mark.index


def _child_indent(mapping) -> int:
    """Indentation of a nested block under ``mapping``'s keys, copied from an existing one."""
    from ruamel.yaml.nodes import MappingNode
    for k, v in mapping.value:
        if isinstance(v, MappingNode) and not v.flow_style and v.value:
            step = v.value[0][0].start_mark.column - k.start_mark.column
            if step > 0:
                return step
    return INDENT_STEP


def _new_block(keys: Sequence[str], rendered: str, indent: int, step: int, comment: Optional[str],
               nl: str) -> list[str]:
    out = []
    for d, key in enumerate(keys):
        pad = " " * (indent + d * step)
        if d < len(keys) - 1:
            out.append(f"{pad}{key}:{nl}")
        else:
            out.append(f"{pad}{key}: {rendered}" + (f"  {comment}" if comment else "") + nl)
    return out


def _insert_block(lines: list[str], at: int, block: list[str], newline: str) -> None:
    """Insert ``block`` (lines with their ends) before line ``at``; a file that ends without a line
    end still does after the insertion at its end."""
    if at == len(lines) and lines and not line_ending(lines[-1]):
        lines[-1] += newline
        block = block[:-1] + [block[-1].rstrip("\r\n")]
    lines[at:at] = block


def set_value(text: str, path: Sequence[str | int], value: Any, label: str, comment: Optional[str] = None) -> str:
    """``text`` (a YAML document whose root is a mapping) with the value at ``path`` set to
    ``value``, rendered on one line (a list as a flow list ``[a, b]``); every other line is kept
    byte for byte.

    ``path`` is a tuple of mapping keys (str) and sequence indices (int), e.g. ``("groups", 1,
    "memory", "free_gib_before_load")``. Sequences and the mappings on the path must exist up to
    the first missing mapping key; from there the rest of the path (keys only) is inserted as a
    new block after the last entry of that mapping, indented as its keys (nested levels by the
    file's own step, else :data:`INDENT_STEP`). A key written with no value at all (``memory:``,
    maybe with a comment) gets the block under its line; an empty leaf (``key:``) gets the value.

    ``comment`` (``"# ..."``): the edited line's comment. It replaces a trailing comment on the
    value's line (kept at its column when the new value fits before it) and is added to an
    inserted line; None keeps an existing comment. A value spread over several lines (a block
    sequence) becomes one line; comments inside it go with it.

    Raises InputError (``label:line``): a YAML syntax error, a path that does not exist where it
    must (a sequence index out of range, a key under something that is not a mapping), a value
    that is an alias, anchored or tagged, a flow mapping (``{...}``) that would need a new key, a
    ``null``/``~`` written where a mapping is needed, or a result that does not parse to exactly
    the old data with ``path`` set to ``value``."""
    from ruamel.yaml.nodes import MappingNode, ScalarNode, SequenceNode
    before = _load(text, label)
    if not isinstance(before, dict):
        raise InputError(f"{label}:1: the document must be a mapping")
    node, lines, newline = compose_lines(text, label)
    rendered = render_value(value)
    path = tuple(path)

    def where(n) -> str:
        return f"{label}:{n.start_mark.line + 1}"

    parent = None       # (mapping, key) whose value ``node`` is
    in_flow = False     # a ``{...}``/``[...]`` on the path: no comment can go on the value's line
    for depth, part in enumerate(path):
        in_flow = in_flow or bool(getattr(node, "flow_style", False))
        if isinstance(part, int):
            if not isinstance(node, SequenceNode) or not 0 <= part < len(node.value):
                raise InputError(f"{where(node)}: {_dotted(path[:depth + 1])}: no such item")
            node, parent = node.value[part], None
            continue
        if isinstance(node, ScalarNode) and str(node.tag).endswith(":null") and node.value in ("", "~", "null"):
            rest = path[depth:]
            if not (_empty(node) and parent and all(isinstance(p, str) for p in rest)):
                raise InputError(f"{where(node)}: {_dotted(path[:depth])} is null: give it a value by hand")
            _insert_under_key(lines, parent, rest, rendered, comment, newline)
            break
        if not isinstance(node, MappingNode):
            raise InputError(f"{where(node)}: {_dotted(path[:depth])} is not a mapping")
        found = next(((k, v) for k, v in node.value if isinstance(k, ScalarNode) and k.value == part), None)
        if found is None:
            rest = path[depth:]
            if any(not isinstance(p, str) for p in rest):
                raise InputError(f"{where(node)}: {_dotted(path[:depth + 1])}: missing, and the path below it "
                                 "needs a sequence")
            if node.flow_style or not node.value:
                raise InputError(f"{where(node)}: {_dotted(path[:depth]) or '(root)'} is a flow mapping: "
                                 f"add {_dotted(path)} by hand")
            _insert_after_last(lines, node, rest, rendered, comment, newline)
            break
        parent = (node, found[0])
        key, node = found
        if depth < len(path) - 1:
            if node.start_mark.index < key.end_mark.index or getattr(node, "anchor", None):
                # ``memory: *mem`` / ``memory: &mem {...}``: shared with another part of the file,
                # an edit here would change the other one too
                raise InputError(f"{label}:{key.start_mark.line + 1}: {_dotted(path[:depth + 1])} is an alias or "
                                 "anchored (shared with another part of the file); refusing to edit it (set it by hand)")
            continue
        _replace(lines, key, node, rendered, None if in_flow else comment, label, _dotted(path))
    out = "".join(lines)
    _check_result(before, out, path, value, label)
    return out


def _insert_under_key(lines: list[str], parent: tuple, rest: tuple, rendered: str, comment: Optional[str],
                      newline: str) -> None:
    """A key written with no value (``memory:``, maybe with a comment; ``parent``: (its mapping
    node, its key node)): the new block of keys ``rest`` goes under the key's line, one step in."""
    pmap, pkey = parent
    step, at = _child_indent(pmap), pkey.start_mark.line + 1
    nl = line_ending(lines[at - 1]) or newline
    _insert_block(lines, at, _new_block(rest, rendered, pkey.start_mark.column + step, step, comment, nl), newline)


def _insert_after_last(lines: list[str], mapping, rest: tuple, rendered: str, comment: Optional[str],
                       newline: str) -> None:
    """The first missing key of the path is in block mapping ``mapping``: the new block of keys
    ``rest`` goes after the mapping's last entry (its trailing lines of the entry included),
    indented as the mapping's keys."""
    last_k, last_v = mapping.value[-1]
    at = _last_line(lines, last_k.start_mark.line, last_v) + 1
    nl = line_ending(lines[at - 1]) or newline
    _insert_block(lines, at, _new_block(rest, rendered, mapping.value[0][0].start_mark.column,
                                        _child_indent(mapping), comment, nl), newline)


def _check_result(before: dict, out: str, path: tuple, value: Any, label: str) -> None:
    """InputError unless ``out`` parses to exactly ``before`` with ``path`` set to ``value`` (the
    mappings the edit inserted included)."""
    expected = copy.deepcopy(before)
    cur = expected
    for part in path[:-1]:
        if isinstance(part, str) and cur.get(part) is None:
            cur[part] = {}
        cur = cur[part]
    cur[path[-1]] = value
    if _load(out, label) != expected:
        raise InputError(f"{label}: refusing the edit: the result would not parse to the intended values")


def _replace(lines: list[str], key, node, rendered: str, comment: Optional[str], label: str, name: str) -> None:
    """Replace ``node``'s text (the value of ``key``) in ``lines`` by ``rendered`` (see :func:`set_value`)."""
    first = key.start_mark.line
    if node.start_mark.index < key.end_mark.index:
        raise InputError(f"{label}:{first + 1}: {name} is an alias; refusing to edit it (set it by hand)")
    if getattr(node, "anchor", None) or not str(node.tag).startswith("tag:yaml.org,2002:") \
            or lines[node.start_mark.line][node.start_mark.column:node.start_mark.column + 1] in ("&", "!"):
        raise InputError(f"{label}:{first + 1}: {name} is anchored or tagged; refusing to edit it (set it by hand)")
    if _empty(node):        # ``key:`` and nothing (its marks point past the key's line)
        last = vl = first
        same_line = False
    else:
        last = _last_line(lines, first, node)
        vl = node.start_mark.line
        same_line = node.end_mark.line == vl and last == vl
    if same_line:
        body = lines[vl].rstrip("\r\n")
        nl = line_ending(lines[vl])
        head, rest = body[:node.start_mark.column], body[node.end_mark.column:]
        col = node.end_mark.column + (len(rest) - len(rest.lstrip(" ")))
    else:       # a block value (or a flow one over several lines): one line from the key's line on
        body = lines[first].rstrip("\r\n")
        nl = line_ending(lines[last]) or line_ending(lines[first])
        colon = body.index(":", key.end_mark.column)
        head, rest = body[:colon + 1] + " ", body[colon + 1:]
        col = colon + 1 + (len(rest) - len(rest.lstrip(" ")))
        if not rest.strip().startswith("#"):
            rest = ""           # the value began on the key's line: it is replaced as a whole
    old_comment = rest.lstrip(" ")
    old_comment = old_comment if old_comment.startswith("#") else ""
    new_comment = comment if comment is not None else old_comment
    if new_comment and old_comment:
        new = aligned_comment(head + rendered, new_comment, col)
    elif new_comment:
        new = f"{head}{rendered}  {new_comment}"
    else:
        new = head + rendered + (rest if not old_comment else "")
    lines[vl if same_line else first:last + 1] = [new + nl]
