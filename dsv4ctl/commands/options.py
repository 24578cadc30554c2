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


def seconds(value: Optional[float], option: str, *, hi: float = MAX_SECONDS, lo: float = 0.0) -> Optional[float]:
    """``value`` (None passes: the default applies) if it is a finite number of seconds > ``lo``
    (0: any positive number) and <= ``hi``; else InputError naming ``option``."""
    if value is None:
        return None
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        raise InputError(f"{option} {value!r}: expected a finite number of seconds > 0")
    if value < lo or value > hi:
        raise InputError(f"{option} {value!r}: expected seconds in {lo:g}..{hi:g}")
    return float(value)


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration(text: Optional[str], option: str, *, lo: float = 0.0, hi: float = MAX_SECONDS) -> Optional[float]:
    """Seconds of a duration option: ``500ms``, ``90s``, ``15m``, ``2h``, ``1d`` or a plain number
    of seconds (``2.5``); None passes. InputError (exit 2) naming ``option`` for anything else, or
    a value outside ``lo``..``hi`` seconds (stated in the option's own unit style)."""
    import re
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*", str(text))
    if not m:
        raise InputError(f"{option} {text!r}: expected a duration such as 500ms, 90s, 15m, 2h or 1d")
    secs = float(m[1]) * _UNITS[m[2] or "s"]
    if not math.isfinite(secs) or secs <= 0 or secs < lo or secs > hi:
        raise InputError(f"{option} {text!r}: expected {_span(lo)}..{_span(hi)}")
    return secs


def _span(s: float) -> str:
    for unit, k in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= k and s % k == 0:
            return f"{s / k:g}{unit}"
    return f"{s:g}s"


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
