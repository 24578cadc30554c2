"""Markup and leaks: DSML, V3.1 tool tokens, special tokens and think tags in ``content``,
``reasoning_content`` and tool-call arguments, with the quoting rules (code spans, closed fenced
blocks, one tag in quotes) that make quoted markup a note instead of a leak; quoted markup cut out
of content (an answer ending in an open quote or fence, an empty code span); reasoning merged into
content. Every scan is one linear pass (bounded regex repetitions, patterns compiled once)."""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from typing import Any, Optional

from .classes import (DSML_IN_CONTENT, DSML_IN_REASONING, MARKUP_CUT, REASONING_IN_CONTENT, SPECIAL_TOKEN_LEAK,
                      THINK_IN_CONTENT, Judging)

# --- markers (U+FF5C FULLWIDTH VERTICAL LINE, U+2581 LOWER ONE EIGHTH BLOCK) -------------------
BAR = "\uff5c"
DSML_MARK = f"{BAR}DSML{BAR}"                  # <｜DSML｜tool_calls>, <｜DSML｜invoke …>, V4.1 "<｜DSML｜ calls>"
LEGACY_TOOL_MARKS = (f"<{BAR}tool\u2581calls\u2581begin{BAR}>", f"<{BAR}tool\u2581call\u2581begin{BAR}>",
                     f"<{BAR}tool\u2581sep{BAR}>")   # V3.1 tokens (field report T1)
THINK_MARKS = ("<think>", "</think>")

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


def _cut(text: str, ranges: list[tuple[int, int, str]], sep: str) -> str:
    """``text`` without the sorted, disjoint ``(start, end, _)`` ranges, the pieces joined by ``sep``."""
    parts, prev = [], 0
    for a, b, _ in ranges:
        parts.append(text[prev:a])
        prev = b
    parts.append(text[prev:])
    return sep.join(parts)



# --- the checks (classifier table) ---------------------------------------------------------------
def content_markup(j: Judging) -> None:
    """``dsml_in_content`` (DSML, else a V3.1 tool token), ``special_token_leak``,
    ``think_in_content``: markup outside code spans, fenced blocks and quotes in ``content``;
    quoted markup becomes a note."""
    content = j.turn.content
    found, quoted = _scan_markup(content) if content else ({}, {})
    if "dsml" in found:
        j.flags[DSML_IN_CONTENT] = f"DSML {found['dsml']!r} in content"
    elif "v31" in found:
        j.flags[DSML_IN_CONTENT] = f"V3.1 tool token {found['v31']!r} in content"
    if "special" in found:
        j.flags[SPECIAL_TOKEN_LEAK] = f"special token {found['special']!r} in content"
    if "think" in found:
        j.flags[THINK_IN_CONTENT] = f"{found['think']!r} in content"
    j.notes += [f"quoted {_MARKUP_LABELS[k]} {x!r} in {where}" for k, (x, where) in quoted.items() if k not in found]


def markup_cut(j: Judging) -> None:
    """``markup_cut``: :func:`find_markup_cut` of ``content`` (its end only when the answer ended
    on its own)."""
    content = j.turn.content
    cut = find_markup_cut(content, at_end=j.at_end) if content else None
    if cut:
        j.flags[MARKUP_CUT] = cut


def reasoning_markup(j: Judging) -> None:
    """``dsml_in_reasoning``: DSML or a V3.1 tool token outside quotes in ``reasoning_content``;
    quoted ones become notes."""
    reasoning = j.turn.reasoning
    if not reasoning:
        return
    rfound, rquoted = _scan_markup(reasoning)
    x = rfound.get("dsml") or rfound.get("v31")
    if x:
        j.flags[DSML_IN_REASONING] = f"{'DSML' if 'dsml' in rfound else 'V3.1 tool token'} {x!r} in reasoning_content"
    j.notes += [f"quoted {_MARKUP_LABELS[k]} {x!r} in {where} of reasoning_content"
                for k, (x, where) in rquoted.items() if k in ("dsml", "v31") and k not in rfound]


def reasoning_merged(j: Judging) -> None:
    """``reasoning_in_content``: thinking was requested, ``reasoning_content`` is empty and
    ``content`` is not (no reasoning parser)."""
    if j.thinking_requested and j.turn.content.strip() and not j.turn.reasoning.strip():
        j.flags[REASONING_IN_CONTENT] = ("thinking requested but reasoning_content is empty and content is not "
                                         "(no reasoning parser?)")
