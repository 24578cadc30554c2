"""A host's clock against this machine's, measured in a round trip dsv4ctl makes anyway.

Host-side times (SGLang's log stamps, the audit log's ``ts``) are the host's clock. A host 40
minutes behind made ``diagnose --since 30m`` miss a fresh CUDA OOM; 3 hours behind made
``audit --since`` drop the host. :func:`clocked` wraps a read-only host command between two
readings of the host's clock (on stderr: the command's stdout is untouched);
:func:`read_offset` compares them with this machine's clock before and after the round trip:

    offset = (host_start + host_end) / 2 - (sent + answered) / 2

(the host's midpoint against the round trip's; with one reading, that reading against the
midpoint). The error is at most half the time the round trip spent outside the command, so an
offset within that (or within a second: stamps are whole seconds) counts as none
(:attr:`ClockReading.applied`). ``--since`` cutoffs are then converted to each host's time
(:func:`host_cutoff`), and an offset over :data:`SKEW_WARN_S` is one warning line naming the
host (:func:`skew_warning`)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Optional

#: The stderr line a clock reading is printed on: ``@dsv4ctl-clock <seconds since the epoch>``.
CLOCK_MARK = "@dsv4ctl-clock"
#: |offset| above which a command warns that the host's clock is off.
SKEW_WARN_S = 60.0

_STAMP = f'echo "{CLOCK_MARK} $(date +%s.%N)" >&2'
_LINE = re.compile(re.escape(CLOCK_MARK) + r" (\d+)(?:\.(\d*)\S*)?\s*$")


@dataclass(frozen=True)
class ClockReading:
    """The host's clock minus this machine's (``offset_s``) and how far off that may be
    (``uncertainty_s``: half the round trip's time outside the command)."""

    offset_s: float
    uncertainty_s: float

    @property
    def applied(self) -> float:
        """The offset cut-offs are moved by: 0 when it is within the measurement's error or a
        second (log and audit stamps are whole seconds), else ``offset_s``."""
        return self.offset_s if abs(self.offset_s) > max(self.uncertainty_s, 1.0) else 0.0


def clocked(cmd: str) -> str:
    """Shell: ``cmd`` between two readings of the host's clock printed on stderr (POSIX ``date``;
    ``%N`` where supported); exits with ``cmd``'s status."""
    return f"{_STAMP}\n{cmd}\nrc=$?; {_STAMP}; exit $rc"


def host_stamps(stderr: str) -> list[float]:
    """The clock readings in a :func:`clocked` command's stderr (pure; a ``%N`` that ``date`` did
    not expand is read as whole seconds)."""
    out = []
    for ln in stderr.splitlines():
        m = _LINE.search(ln)
        if m:
            out.append(float(f"{m[1]}.{m[2] or 0}"))
    return out


#: An offset beyond this (10 years) or not a finite number is no clock reading: a ``date`` that
#: prints nonsense. It is reported, never applied.
MAX_SKEW_S = 10 * 366 * 86400.0


def usable(offset_s: Optional[float]) -> bool:
    """True for an offset that can be a clock's (finite, within :data:`MAX_SKEW_S`)."""
    import math
    return offset_s is not None and math.isfinite(offset_s) and abs(offset_s) <= MAX_SKEW_S


def read_offset(stderr: str, sent: float, answered: float) -> Optional[ClockReading]:
    """The host's clock against this machine's (pure): ``stderr`` of a :func:`clocked` command
    sent at ``sent`` and answered at ``answered`` (this machine's ``time.time()``). None when the
    host printed no reading; a reading that is no clock's (:func:`usable`) has an infinite
    uncertainty, so it is never applied."""
    stamps = host_stamps(stderr)
    if not stamps:
        return None
    mid = (sent + answered) / 2
    if len(stamps) >= 2:
        first, last = stamps[0], stamps[-1]
        offset = (first + last) / 2 - mid
        outside = (answered - sent) - max(0.0, last - first)
    else:
        offset = stamps[0] - mid
        outside = answered - sent
    if not usable(offset):
        return ClockReading(offset, float("inf"))
    return ClockReading(offset, max(0.0, outside) / 2)


def run_clocked(t, cmd: str, *, timeout: float | None = None, clock=time.time):
    """Run ``cmd`` with :func:`clocked` on transport ``t``: (CmdResult, ClockReading or None)."""
    sent = clock()
    res = t.run(clocked(cmd), timeout=timeout)
    return res, read_offset(res.err, sent, clock())


def host_cutoff(since: datetime, offset_s: float) -> datetime:
    """``since`` (this machine's clock) as the host's clock shows that moment (pure); ``since``
    itself for an offset that is no clock's (:func:`usable`)."""
    if not usable(offset_s):
        return since
    try:
        return since + timedelta(seconds=offset_s)
    except OverflowError:
        return since


def host_cutoff_iso(since: str, offset_s: float) -> str:
    """An audit ``--since`` or ``ts`` (``2026-12-01T16:00:00Z``; the ``Z`` may be missing) moved by
    ``offset_s`` (rounded to whole seconds), spelt ``2026-12-01T16:00:00Z`` (pure). Text that is
    no such time comes back unchanged."""
    m = re.fullmatch(r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})Z?", since)
    if not m:
        return since
    if not usable(offset_s):
        return since
    try:
        t = datetime.strptime(m[1], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
        return (t + timedelta(seconds=round(offset_s))).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (ValueError, OverflowError):
        return since


def skew_text(offset_s: float) -> str:
    """``40 min 3 s behind`` / ``3 h 0 min ahead of`` / ``75 s ahead of`` (pure)."""
    s = round(abs(offset_s))
    if s >= 3600:
        size = f"{s // 3600} h {s % 3600 // 60} min"
    elif s >= 120:
        size = f"{s // 60} min {s % 60} s"
    else:
        size = f"{s} s"
    return f"{size} {'behind' if offset_s < 0 else 'ahead of'}"


def skew_warning(host: str, offset_s: Optional[float]) -> Optional[str]:
    """The one warning line for a host whose clock is more than :data:`SKEW_WARN_S` off this
    machine's (``offset_s``: :attr:`ClockReading.offset_s`), else None (pure)."""
    if offset_s is None:
        return None
    if not usable(offset_s):
        return (f"warning: {host}: its clock reads no usable time ({offset_s!r:.40} s off this machine's); "
                f"--since is taken in this machine's time for {host}")
    if abs(offset_s) <= SKEW_WARN_S:
        return None
    return (f"warning: {host}: its clock is {skew_text(offset_s)} this machine's ({offset_s:+.0f} s); "
            f"--since is taken in {host}'s time")
