"""The one checker of number and timeout options (issue 13, "Inputs"): every count, fraction and
number of seconds a command takes is finite and in range, or the command stops with one
``dsv4ctl: error: OPTION VALUE: ...`` line and exit 2 before anything is read or changed.

A typo must fail at once: ``--health-timeout nan`` used to wait forever holding every host's lock,
``-5`` was accepted, ``-c 60000`` would open tens of thousands of sockets. The limits are listed in
docs/input-limits.md; the commands call these functions right after parsing."""

from __future__ import annotations

import math
from typing import Optional

from ..errors import InputError

MAX_SECONDS = 86_400.0
"""Upper bound of any timeout or wait option (a day): larger is a typo, not a wish."""
MAX_CONCURRENCY = 4096
MAX_LEVELS = 64
MAX_TURNS = 10_000
MAX_MIN_REQUESTS = 10_000_000
MAX_ANSWER_WORDS = 100_000


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DURATION_SPELLINGS = "500ms, 90s, 15m, 2h or 1d"
MAX_SINCE = 366 * 86400.0
"""How far back ``--since`` may reach (a year)."""
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"


def duration(value, option: str, *, lo: float = 0.0, hi: float = MAX_SECONDS, zero: bool = False) -> Optional[float]:
    """Seconds of a duration or timeout option, the one rule of every command (issue 31):
    ``500ms``, ``90s``, ``15m``, ``2h``, ``1d`` or a plain number of seconds (``2.5``, as options
    took before); a number (a default, a profile value) passes as seconds; None passes. InputError
    (exit 2) naming ``option`` for anything else (``nan``, ``inf``, ``-5``), for 0 (unless
    ``zero``) and for a value outside ``lo``..``hi`` seconds, stated in units."""
    import re
    if value is None:
        return None
    shown = repr(value)
    if _is_number(value):
        secs = float(value)
        if not math.isfinite(secs) or secs < 0:
            raise InputError(f"{option} {shown}: expected a duration such as {DURATION_SPELLINGS}")
    else:
        m = re.fullmatch(rf"\s*{_NUMBER}\s*(ms|s|m|h|d)?\s*", str(value))
        if not m:
            raise InputError(f"{option} {shown}: expected a duration such as {DURATION_SPELLINGS}")
        secs = float(m[1]) * _UNITS[m[2] or "s"]
    if not math.isfinite(secs) or (secs == 0 and not zero) or secs < lo or secs > hi:
        raise InputError(f"{option} {shown}: expected {_range(lo, hi, zero)}")
    return secs


def _range(lo: float, hi: float, zero: bool) -> str:
    if lo > 0 or zero:
        return f"{_span(lo)}..{_span(hi)}"
    return f"more than 0s, at most {_span(hi)}"


def _span(s: float) -> str:
    if s == 0:
        return "0s"
    for unit, k in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= k and s % k == 0:
            return f"{s / k:g}{unit}"
    return f"{s * 1000:g}ms" if s < 1 else f"{s:g}s"


class Duration:
    """The typer ``parser=`` of every duration option (:func:`duration_option`): parses at
    click's parse time, so a bad value stops the command before anything is read (InputError is
    no ValueError: click passes it on to cli.main's one error line, exit 2)."""

    def __init__(self, option: str, lo: float = 0.0, hi: float = MAX_SECONDS, zero: bool = False,
                 keep_text: bool = False):
        self.option, self.lo, self.hi, self.zero, self.keep_text = option, lo, hi, zero, keep_text
        self.__name__ = "DURATION"          # click's FuncParamType is named after its function

    def __call__(self, value):
        secs = duration(value, self.option, lo=self.lo, hi=self.hi, zero=self.zero)
        return value if self.keep_text else secs


class Since:
    """The typer ``parser=`` of every ``--since``: checked at parse time by :func:`since`; the
    command gets the text back (it is taken in each host's time later)."""

    def __init__(self, option: str = "--since"):
        self.option = option
        self.__name__ = "WHEN"

    def __call__(self, value):
        if value is not None:
            since(value, option=self.option)
        return value


def duration_option(default, *names: str, help: str, lo: float = 0.0, hi: float = MAX_SECONDS,
                    zero: bool = False, keep_text: bool = False, **kw):
    """A typer option taking a duration (:func:`duration`): metavar DURATION, parsed through
    :class:`Duration` (tests/test_grammar.py finds every such option by it); the command gets
    seconds, or with ``keep_text`` the text as given, checked (``watch --print unit`` repeats it)."""
    import typer
    long = next(n for n in names if n.startswith("--"))
    return typer.Option(default, *names, parser=Duration(long, lo, hi, zero, keep_text), metavar="DURATION",
                        help=help, **kw)


def since_option(help: str):
    """``--since``: a duration back from now or an ISO date or time (:func:`since`)."""
    import typer
    return typer.Option(None, "--since", parser=Since("--since"), metavar="WHEN", help=help)


def since(text: str, now=None, option: str = "--since"):
    """``--since`` of every command that takes it (``audit``, ``diagnose``) as a UTC datetime: a
    duration back from ``now`` in :func:`duration`'s spellings (``90s``, ``15m``, ``2h``, ``1d``;
    at most a year) or an ISO date or time (``2026-12-01``, ``20261201``, ``2026-12-01T21``,
    ``2026-12-01 21:00``, ``2026-12-01T21:00:00Z``; UTC when no zone). InputError otherwise (a
    bare number that is no ISO date: a unit is needed, ``90`` is neither)."""
    import re
    from datetime import datetime, timedelta, timezone
    now = now or datetime.now(timezone.utc)
    s = str(text or "").strip()
    if re.fullmatch(rf"{_NUMBER}\s*(ms|s|m|h|d)", s):
        secs = duration(s, option, hi=float("inf"))
        if secs > MAX_SINCE:
            raise InputError(f"{option} {text!r}: at most a year back")
        return now - timedelta(seconds=secs)
    try:
        t = datetime.fromisoformat(s.replace("Z", "+00:00"))
        t = t if t.tzinfo else t.replace(tzinfo=timezone.utc)
        t.astimezone(timezone.utc)          # a zone that moves it out of years 1-9999: OverflowError
    except (ValueError, OverflowError):
        hint = " (a plain number needs a unit: 90s, 15m)" if re.fullmatch(_NUMBER, s) and len(s) < 8 else ""
        raise InputError(f"{option} {text!r}: expected a duration (15m, 2h) or an ISO time "
                         f"(2026-12-01T21:00:00Z){hint}") from None
    return t


def integer(value: Optional[int], option: str, lo: int, hi: int) -> Optional[int]:
    """``value`` (None passes) if it is an integer in ``lo..hi``; else InputError."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise InputError(f"{option} must be in {lo:,}..{hi:,}" if hi >= 100_000 else f"{option} must be in {lo}..{hi}")
    return value


def fraction(value: Optional[float], option: str) -> Optional[float]:
    """``value`` (None passes) if it is a finite number in [0, 1); else InputError."""
    if value is None:
        return None
    if not _is_number(value) or not math.isfinite(value) or not 0 <= value < 1:
        raise InputError(f"{option} must be in [0, 1)")
    return float(value)


def positive(value: Optional[float], option: str, hi: float) -> Optional[float]:
    """``value`` (None passes) if it is a finite number > 0 and <= ``hi``; else InputError."""
    if value is None:
        return None
    if not _is_number(value) or not math.isfinite(value) or not 0 < value <= hi:
        raise InputError(f"{option} {value!r}: expected a finite number > 0 and <= {hi:g}")
    return float(value)


def concurrency_levels(text: Optional[str], option: str = "--concurrency") -> Optional[list[int]]:
    """``N`` or ``N,N,...`` -> the levels (None passes): positive integers, at most
    :data:`MAX_LEVELS` levels of at most :data:`MAX_CONCURRENCY` sessions; else InputError."""
    if text is None:
        return None
    try:
        levels = [int(x) for x in str(text).replace(" ", "").split(",") if x]
    except ValueError:
        raise InputError(f"{option} {text!r}: expected N or N,N,... (positive integers)") from None
    if not levels or any(x < 1 for x in levels):
        raise InputError(f"{option} {text!r}: expected N or N,N,... (positive integers)")
    if max(levels) > MAX_CONCURRENCY or len(levels) > MAX_LEVELS:
        raise InputError(f"{option} {text!r}: at most {MAX_LEVELS} levels of at most {MAX_CONCURRENCY} sessions")
    return levels


MAX_MESSAGE = 500


def message(value: Optional[str], option: str = "--message") -> Optional[str]:
    """``value`` stripped (None passes) when it is one line of 1..MAX_MESSAGE printable
    characters; InputError otherwise. Printable: no control character (C0, C1, DEL), no line or
    paragraph separator, no format character (bidi overrides): the message is shown to other
    operators in error lines and tables."""
    if value is None:
        return None
    import unicodedata
    v = value.strip()
    if not v or len(v) > MAX_MESSAGE or any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs") for c in v):
        raise InputError(f"{option} must be one line of 1-{MAX_MESSAGE} printable characters")
    return v
