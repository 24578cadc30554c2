"""Loops and language: degenerate generation (an exact repetition reaching the end of the text,
an empty answer cut at the length limit) and answers in the wrong script (a switch of script
mid-answer, or a whole answer in another script than the prompt's). Thresholds in the constants
and ``docs/check.md``; every scan is bounded on hostile input."""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Optional

from .classes import EMPTY_LENGTH, LANGUAGE_DRIFT, LANGUAGE_MIX, LANGUAGE_SWITCH, NGRAM_LOOP, Judging
from .markup import _cut, _fences, code_ranges

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
    English answer do not count; fewer than :data:`DRIFT_MIN_LETTERS` letters: no verdict.
    Expecting Latin, a text with no letter of another script (:data:`_NON_LATIN_RE`, a superset
    of the other scripts' ranges; the cuts only remove letters) is cleared after one scan: every
    ``check load`` answer turn asks for Latin, and most are ASCII."""
    if expected == "Latin" and (text.isascii() or _NON_LATIN_RE.search(text, 0, LOOP_MAX_CHARS) is None):
        return None
    return _drift(text, expected)


def _drift(text: str, expected: str) -> Optional[tuple[str, float]]:
    """:func:`find_language_drift` without its fast path: the letters counted by script."""
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


# --- language mixing -----------------------------------------------------------------------------
MIX_MIN_WORDS = 2          # mixing: at least 2 separate words of another script …
MIX_MIN_BASE = 40          # … in prose with at least 40 letters of the answer's script …
MIX_MIN_ALPHA = 3          # … a word of an alphabetic script (Cyrillic, Greek, …) from 3 letters (α, Ω, λ: symbols)
# a parenthesised gloss in another script ("Beijing (北京)"), and a token holding a path, key or
# unit separator between word characters ("docs/用户指南.md", "配置.超时", "км/ч", "数据_id")
_GLOSS_RE = re.compile(r"[(\uff08][^()\uff08\uff09A-Za-z\n]{1,40}[)\uff09]")
_JOINED_RE = re.compile(r"\S*\w[./\\:_@#=]\w\S*")


@dataclass(frozen=True)
class Mix:
    """Scattered words of another script found by :func:`find_language_mix`: the answer's
    script, the other scripts seen, the number of words and the first few, each with a word of
    context on either side."""

    base: str
    scripts: tuple[str, ...]
    words: int
    examples: tuple[str, ...]


def _prose_only(text: str) -> str:
    """``text`` with what is not prose blanked (same length): code spans and closed fenced blocks,
    URLs, quoted words and phrases, parenthesised glosses, tokens joined by path, key or unit
    separators, identifiers."""
    ranges = code_ranges(text)
    if ranges:
        text = _cut(text, ranges, " ")
    blank = (lambda m: " " * (m.end() - m.start()))
    for rx in (_SKIP_RE, _GLOSS_RE, _JOINED_RE, _IDENT_RE):
        text = rx.sub(blank, text)
    return text


def find_language_mix(text: str, expected: Optional[str] = None) -> Optional[Mix]:
    """Single words of another script scattered through prose in one script (a known DeepSeek
    failure: "the scheduler keeps 请求 in the queue until 足够 pages are free"), or None.

    Prose only (:func:`_prose_only`: code, URLs, quoted words, glosses in parentheses, paths,
    keys, units and identifiers are not language). The answer's script is ``expected`` (the
    prompt's), else the script of >= 90 % of the letters. A mixed word is a run of letters of a
    script other than the answer's and other than Latin (English terms in other languages' prose
    are ordinary), shorter than a switch (:data:`SWITCH_RUN` letters), with a word of the answer's
    script right before and right after it on the same line (inside a sentence, not a heading, a
    table cell or a list of translations); an alphabetic script's word counts from
    :data:`MIX_MIN_ALPHA` letters (``α``, ``Ω`` and ``λ`` are symbols). Mixing is
    :data:`MIX_MIN_WORDS` such words or more in an answer with at least :data:`MIX_MIN_BASE`
    letters of its own script. Linear in the text (its first :data:`LOOP_MAX_CHARS` characters)."""
    if text.isascii():
        return None
    text = _prose_only(text[:LOOP_MAX_CHARS])
    toks = [(m.lastgroup or "", m.start(), m.end()) for m in _SCRIPT_RE.finditer(text)]
    counts: dict[str, int] = {}
    for s, a, b in toks:
        counts[s] = counts.get(s, 0) + b - a
    total = sum(counts.values())
    base = expected or _dominant(counts, total)
    if base is None or counts.get(base, 0) < MIX_MIN_BASE:
        return None
    found: list[tuple[str, int, int, int]] = []      # (script, first token, last token, letters)
    i = 0
    while i < len(toks):
        if toks[i][0] in (base, "Latin"):
            i += 1
            continue
        j, n = i, 0
        while j < len(toks) and toks[j][0] not in (base, "Latin"):
            n += toks[j][2] - toks[j][1]
            j += 1
        before, after = (toks[i - 1] if i else None), (toks[j] if j < len(toks) else None)
        inside = (before is not None and before[0] == base and "\n" not in text[before[2]:toks[i][1]]
                  and after is not None and after[0] == base and "\n" not in text[toks[j - 1][2]:after[1]])
        short = n < SWITCH_RUN and (toks[i][0] == "CJK" or n >= MIX_MIN_ALPHA)
        if inside and short:
            found.append((toks[i][0], i, j - 1, n))
        i = j
    if len(found) < MIX_MIN_WORDS:
        return None
    examples = tuple(" ".join(text[toks[a - 1][1]:toks[b + 1][2]].split()) for _, a, b, _ in found[:3])
    return Mix(base, tuple(sorted({f[0] for f in found})), len(found), examples)


# --- the checks (classifier table) ---------------------------------------------------------------
def loops(j: Judging) -> None:
    """``ngram_loop``: ``content``, then ``reasoning_content``, repeats itself (:func:`find_loop`;
    the loop must reach the end unless the answer was cut at the length limit)."""
    for where, text in (("content", j.turn.content), ("reasoning_content", j.turn.reasoning)):
        loop = find_loop(text, at_end=j.at_end) if text else None
        if loop:
            j.flags.setdefault(NGRAM_LOOP, f"{where}: a {loop.period}-word unit repeated over {loop.span} of "
                                           f"{loop.words} words: {loop.unit!r}")


def empty_length(j: Judging) -> None:
    """``empty_length``: an answer turn (no tool required, no calls) cut at the length limit with
    empty content (it thought until the cap)."""
    t = j.turn
    if t.finish_reason == "length" and not j.requires_tool and not t.tool_calls and not t.content.strip():
        j.flags[EMPTY_LENGTH] = (f"finish_reason length with empty content and {len(t.reasoning)} characters "
                                 "of reasoning (thinks until the cap)")


def script(j: Judging) -> None:
    """``language_drift`` (with an expected script: content mostly in another one), else
    ``language_switch`` (content switches script mid-answer), else ``language_mix`` (single words
    of another script scattered through the prose, :func:`find_language_mix`)."""
    content = j.turn.content
    drift = find_language_drift(content, j.expected_script) if content and j.expected_script else None
    if drift:
        j.flags[LANGUAGE_DRIFT] = (f"content is {drift[1]:.0%} {drift[0]} letters; the prompt asked for "
                                   f"{j.expected_script}: {' '.join(content[:60].split())!r}")
    switch = find_language_switch(content) if content and not drift else None
    if switch:
        j.flags[LANGUAGE_SWITCH] = (f"content switches from {switch.base} to {switch.to} after {switch.after} "
                                    f"letters: {switch.excerpt!r}")
    mix = find_language_mix(content, j.expected_script) if content and not drift and not switch else None
    if mix:
        j.flags[LANGUAGE_MIX] = (f"{mix.words} words of {', '.join(mix.scripts)} scattered through {mix.base} prose: "
                                 + "; ".join(repr(e) for e in mix.examples))
