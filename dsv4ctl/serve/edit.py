"""Round-trip editing of SGLang ``--config`` serve configs: only the edited lines change.

A serve config is a flat YAML mapping of dashed server-argument keys (ops reference §1.2).
ruamel.yaml composes the document and gives every key and value its exact start/end position;
an edit rewrites only the lines of the keys it sets, removes or adds, and every other byte of
the file (comments, blank lines, key order, quoting, ``---``, CRLF line ends) is kept as it was.
New values are rendered by ruamel.yaml's emitter (quoting, floats, flow lists). A full ruamel
``dump`` is not used on purpose: it re-indents sequences, drops ``---``, normalises flow spacing,
``~``/``null`` and CRLF, and moves comment lines that follow a deleted key.

After every edit the new text is parsed again (PyYAML, the parser sglang 0.5.23 uses) and must
equal the old mapping with exactly the requested changes; otherwise the edit is refused.

Pure: text in, text out. Reading and writing files is the caller's job."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ..errors import InputError
from ..profile.edit import aligned_comment, compose_lines, line_ending as _ending, render_value, yaml_lines
from ..profile.edit import syntax_error as _syntax_error
from ..profile.secrets import is_secret_key


class _Remove:
    def __repr__(self) -> str:
        return "REMOVE"


REMOVE = _Remove()
"""Sentinel value of a :class:`Change` that deletes the key."""


@dataclass(frozen=True)
class Change:
    """Set ``key`` to ``value`` (or delete it with :data:`REMOVE`).

    ``key`` is a canonical dashed name; ``spellings`` are the names the file may use for it
    (aliases, e.g. ``enable-hicache``); an existing spelling is edited in place. A new key is
    inserted after the last entry whose key is in ``after`` (else after the last entry)."""

    key: str
    value: Any
    spellings: tuple[str, ...] = ()
    after: tuple[str, ...] = ()


@dataclass
class Entry:
    """One top-level ``key: value`` of the file. Lines are 0-based; ``last`` is inclusive."""

    key: str
    first: int
    last: int
    value_line: int
    value_col: int
    value_end_line: int
    value_end_col: int
    key_end_col: int = 0
    empty: bool = False
    alias: bool = False       # the value is an alias (``*name``): its node is the anchored one


@dataclass
class Doc:
    """Composed view of a serve config text."""

    lines: list[str] = field(default_factory=list)   # with their line ends
    entries: list[Entry] = field(default_factory=list)
    indent: int = 0
    newline: str = "\n"


def compose(text: str, label: str) -> Doc:
    """Positions of the top-level entries of ``text``.

    Raises InputError (``label:line``) for a YAML syntax error or a root that is not a mapping."""
    from ruamel.yaml.nodes import MappingNode
    node, lines, newline = compose_lines(text, label)
    doc = Doc(lines=lines, newline=newline)
    if node is None:
        return doc
    if not isinstance(node, MappingNode):
        raise InputError(f"{label}:{node.start_mark.line + 1}: a serve config must be a mapping of server arguments")
    for i, (k, v) in enumerate(node.value):
        first = k.start_mark.line
        end_line = v.end_mark.line if v.end_mark.column > 0 else v.end_mark.line - 1
        last = min(max(first, end_line), len(lines) - 1)
        while last > first and _is_trailer(lines, last):
            last -= 1
        doc.entries.append(Entry(key=str(k.value), first=first, last=last, value_line=v.start_mark.line,
                                 value_col=v.start_mark.column, value_end_line=v.end_mark.line,
                                 value_end_col=v.end_mark.column, key_end_col=k.end_mark.column,
                                 empty=(getattr(v, "tag", None) is not None and str(getattr(v.tag, "value", v.tag)).endswith(":null")
                                        and v.value in ("", None) and v.start_mark.index == v.end_mark.index),
                                 alias=v.start_mark.index < k.end_mark.index))
        if i == 0:
            doc.indent = k.start_mark.column
    return doc


def _is_trailer(lines: list[str], i: int) -> bool:
    s = lines[i].strip() if 0 <= i < len(lines) else ""
    return not s or s.startswith("#")


def _find(doc: Doc, names: Sequence[str]) -> Optional[int]:
    for i, e in enumerate(doc.entries):
        if e.key in names:
            return i
    return None


_BOOL_FAMILIES = {w: fam for fam in (("true", "false"), ("True", "False"), ("TRUE", "FALSE"), ("yes", "no"),
                                      ("Yes", "No"), ("YES", "NO"), ("on", "off"), ("On", "Off"), ("ON", "OFF"))
                  for w in fam}
"""YAML 1.1 booleans as PyYAML (sglang 0.5.23's ``--config`` reader) resolves them; a toggle keeps
the family the file uses (``yes`` → ``no`` → ``yes``), so off then on restores the bytes."""


def _replace_value(doc: Doc, e: Entry, key: str, text: str, value: Any = None, label: str = "") -> list[str]:
    """The new lines of entry ``e`` with its value replaced by ``text``.

    A one-line value (on the key's line or on the next line) is replaced in place: the key, its
    quoting, anchors/tags before the value, the comment and the line's own ending stay. A boolean
    keeps the spelling family of the old one (``True``/``False``, ``yes``/``no``) and the gap before
    a comment (so toggles are reversible); other values keep the comment's column where they fit.
    Raises InputError for an alias value (``*name``: the edit could not be undone byte for byte)."""
    line = doc.lines[e.first]
    if e.alias:
        raw = line.rstrip("\r\n")[e.key_end_col:].lstrip(" \t:").split(" ")[0]
        raise InputError(f"{label}:{e.first + 1}: {key} is an alias ({raw}); "
                         f"refusing to edit it (set the value on that line by hand)")
    if e.empty and e.last == e.first:       # "key:" with no value, maybe a comment after it
        body = line.rstrip("\r\n")
        nl = _ending(line) or doc.newline
        colon = body.index(":", e.key_end_col)
        head, rest = body[:colon + 1], body[colon + 1:]
        comment = rest.lstrip(" ")
        if comment.startswith("#"):
            return [aligned_comment(f"{head} {text}", comment, colon + 1 + (len(rest) - len(comment))) + nl]
        return [f"{head} {text}{nl}"]
    vl = e.value_line
    one_line = e.last == vl and (e.value_end_line == vl or (e.value_end_line == vl + 1 and e.value_end_col == 0))
    if one_line and vl < len(doc.lines):
        cur = doc.lines[vl]
        body = cur.rstrip("\r\n")
        nl = _ending(cur)
        end_col = e.value_end_col if e.value_end_line == vl else len(body)
        raw = body[e.value_col:end_col]
        pre_len = 0
        while raw[pre_len:pre_len + 1] in ("&", "!"):          # anchor / tag: keep them
            sp = raw.find(" ", pre_len)
            if sp < 0:
                break
            pre_len = sp + 1
            while raw[pre_len:pre_len + 1] == " ":
                pre_len += 1
        start = e.value_col + pre_len
        token = body[start:end_col]
        if isinstance(value, bool) and token in _BOOL_FAMILIES:
            text = _BOOL_FAMILIES[token][0 if value else 1]
        head, rest = body[:start], body[end_col:]
        if rest.strip().startswith("#") and not isinstance(value, bool):
            comment = rest.lstrip(" ")
            new = aligned_comment(head + text, comment, end_col + (len(rest) - len(comment))) + nl
        else:
            new = head + text + rest + nl
        if vl == e.first:
            return [new]
        return list(doc.lines[e.first:vl]) + [new]
    nl = _ending(doc.lines[e.last]) or doc.newline
    indent = " " * doc.indent
    return [f"{indent}{key}: {text}{nl}"]


def apply_change(text: str, change: Change, label: str) -> str:
    """Apply one change to ``text``; see :func:`apply_changes`."""
    doc = compose(text, label)
    names = (change.key,) + tuple(s for s in change.spellings if s != change.key)
    idx = _find(doc, names)
    lines = list(doc.lines)
    if change.value is REMOVE:
        if idx is None:
            if _find(doc, ("<<",)) is not None:
                from ..profile.yamlpos import parse_yaml
                _data, pos = parse_yaml(text, label)
                hit = next((k for k in names if (k,) in pos.merged), None)
                if hit is not None:
                    raise InputError(f"{pos.where((hit,))}: {hit} comes from a YAML merge key (<<): edit the "
                                     "merged mapping by hand, or set the key instead")
            return text
        e = doc.entries[idx]
        del lines[e.first:e.last + 1]
        return "".join(lines)
    rendered = render_value(change.value)
    if idx is not None:
        e = doc.entries[idx]
        lines[e.first:e.last + 1] = _replace_value(doc, e, e.key, rendered, change.value, label)
        return "".join(lines)
    new_line = f"{' ' * doc.indent}{change.key}: {rendered}{doc.newline}"
    anchor = None
    for i, e in enumerate(doc.entries):
        if e.key in change.after:
            anchor = i
    if anchor is None and doc.entries:
        anchor = len(doc.entries) - 1
    if anchor is None:
        at = len(lines)
    else:
        at = doc.entries[anchor].last + 1
    if at > 0 and at == len(lines) and lines and not lines[-1].endswith(("\n", "\r")):
        lines[-1] += doc.newline
    lines.insert(at, new_line)
    return "".join(lines)


def _safe_load(text: str, label: str) -> dict:
    import yaml
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        raise _syntax_error(label, e) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"{label}:1: a serve config must be a mapping of server arguments")
    return data


def apply_changes(text: str, changes: Sequence[Change], label: str) -> str:
    """``text`` with ``changes`` applied in order; every line not edited is kept byte for byte.

    Raises InputError (``label:line``) for a YAML syntax error or a non-mapping root, and when the
    result would not parse to exactly the old mapping plus the changes."""
    before = _safe_load(text, label)
    expected = dict(before)
    out = text
    for ch in changes:
        out = apply_change(out, ch, label)
        names = (ch.key,) + tuple(ch.spellings)
        present = [k for k in expected if k in names]
        if ch.value is REMOVE:
            for k in present:
                expected.pop(k)
        elif present:
            expected[present[0]] = ch.value
        else:
            expected[ch.key] = ch.value
    after = _safe_load(out, label)
    if after != expected:
        raise InputError(f"{label}: refusing the edit: the result would not parse to the intended values")
    return out


def unified_diff(old: str, new: str, path: str, mask: bool = True) -> str:
    """A unified diff ``a/path`` → ``b/path`` (empty when nothing changed).

    With ``mask`` (the default) the values of secret-looking keys are shown as ``***``
    (:func:`redact`); the files themselves keep the real values."""
    out = "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                       fromfile=f"a/{path}", tofile=f"b/{path}"))
    return redact(out, diff=True) if mask else out


_LINE = re.compile(r"^(?P<pre>\s*)(?P<q>[\"']?)(?P<key>[A-Za-z0-9_.-]+)(?P=q)(?P<sep>[ \t]*:)(?P<val>(?:[ \t].*)?)$")
_INNER = re.compile(r"(?P<q>\\?[\"']?)(?P<key>[A-Za-z0-9_.-]+)(?P=q)(?P<sep>\s*:\s*)"
                    r"(?P<val>\\\"(?:[^\\]|\\[^\"])*?\\\"|\"(?:[^\"\\]|\\.)*\"|'[^']*'|[^,}\]\s]+)")
MASK = "***"


def _mask_inner(val: str) -> str:
    def sub(m: re.Match) -> str:
        if not is_secret_key(m.group("key")):
            return m.group(0)
        v = m.group("val")
        q = '\\"' if v.startswith('\\"') else (v[0] if v[0] in "\"'" else "")
        return f"{m.group('q')}{m.group('key')}{m.group('q')}{m.group('sep')}{q}{MASK}{q}"
    return _INNER.sub(sub, val)


def redact(text: str, diff: bool = False) -> str:
    """``text`` (YAML lines, or a unified diff of them with ``diff``) with the values of secret keys
    replaced by ``***``: top-level ``api-key: X`` → ``api-key: ***`` (a block value on the following
    more-indented lines is masked too) and secret keys inside inline JSON/flow mappings
    (``hicache-storage-backend-extra-config: '{"secret_key": "X"}'`` → ``"secret_key": "***"``)."""
    out = []
    block = None      # indent of a secret key whose value continues on the next lines
    for raw in yaml_lines(text):
        body = raw.rstrip("\r\n")
        nl = raw[len(body):]
        pre = ""
        if diff and body[:1] in ("-", "+", " ") and not body.startswith(("--- ", "+++ ")):
            pre, body = body[0], body[1:]
        elif diff:
            out.append(raw)
            block = None
            continue
        if block is not None:
            ind = len(body) - len(body.lstrip(" "))
            if body.strip() and ind > block:
                out.append(pre + " " * ind + MASK + nl)
                continue
            if body.strip():
                block = None
        m = _LINE.match(body)
        if m and is_secret_key(m.group("key")):
            val = m.group("val").strip()
            if not val or val[0] in "|>" or val.startswith("#"):
                block = len(m.group("pre"))
                out.append(pre + body + nl)
            else:
                out.append(pre + body[:m.start("val")] + " " + MASK + nl)
            continue
        if m and m.group("val").strip():
            # skip the value's first character (a YAML quote or "{"): the inner pairs are masked
            cut = m.start("val") + (len(m.group("val")) - len(m.group("val").lstrip())) + 1
            out.append(pre + body[:cut] + _mask_inner(body[cut:]) + nl)
            continue
        out.append(pre + _mask_inner(body) + nl)
    return "".join(out)


def secret_values(data: Any) -> set[str]:
    """The values of secret keys in a parsed serve config (:func:`dsv4ctl.profile.secrets.secret_strings`,
    JSON-string values such as ``hicache-storage-backend-extra-config`` included); used to scrub any
    output that could echo them (:func:`scrub`)."""
    from ..profile.secrets import secret_strings
    return secret_strings(data)


SCRUB_PREFIX = 8
"""A secret of at least 12 characters is also masked where only its first 8 or more are left and
the text goes on with no more of it at a token's end (an error text cut short by a length limit
before it was masked: ``...&token=sk-proj-A1b2C3…``)."""


def _token_char(c: str) -> bool:
    return c.isalnum() or c in "-_"


def scrub(text: str, secrets: set[str]) -> str:
    """``text`` with every occurrence of the given secret values replaced by ``***``, and every
    cut-off start of one (see :data:`SCRUB_PREFIX`) as well. Linear in ``len(text)`` per secret."""
    for v in sorted(secrets, key=len, reverse=True):
        text = text.replace(v, MASK)
    for v in sorted(secrets, key=len, reverse=True):
        if len(v) < 12:
            continue
        head, out, pos = v[:SCRUB_PREFIX], [], 0
        i = text.find(head)
        while i >= 0:
            n = SCRUB_PREFIX
            while i + n < len(text) and n < len(v) and text[i + n] == v[n]:
                n += 1
            if i + n == len(text) or not _token_char(text[i + n]):      # the secret stops here: cut
                out += [text[pos:i], MASK]
                pos = i + n
            i = text.find(head, i + n)
        text = "".join(out) + text[pos:]
    return text
