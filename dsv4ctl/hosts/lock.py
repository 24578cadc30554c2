"""The host lock ``<root>/.lock`` (a folder: ``mkdir`` is atomic) with ``holder.json``.

One implementation for every command that changes a host: :func:`take_cmd` (deploy, rollback,
promote) takes it in the same round trip as the facts; :func:`held_cmd` (hicache --remote, a
runbook restart) checks it. A held lock is :class:`LockHeld` (exit 3) with one message."""

from __future__ import annotations

import json
import os

from ..errors import RemoteError
from ..remote import q, who
from .audit import now_iso, stamped_json_cmd

LOCK_HELD_CODE = 75     # exit status of the lock commands when another run holds the lock

MANUAL_PREFIX = "lock acquire: "
"""The ``what`` of a lock taken by hand (``dsv4ctl lock acquire -m MSG``) starts with this."""


def is_manual(h: dict | None) -> bool:
    """The holder is a lock taken by hand (never removed by ``--break-lock``: ``lock release``)."""
    return bool(h) and str(h.get("what", "")).startswith(MANUAL_PREFIX)


class LockHeld(RemoteError):
    """Another run holds the host's lock (exit 3)."""


def holder(what: str, token: str) -> dict:
    """The ``holder.json`` of this run: who, what, pid, since, token (the token is what release
    matches on; it is not a secret but says nothing about the operator)."""
    return {"who": who(), "what": what, "pid": os.getpid(), "since": now_iso(), "token": token}


def holder_text(h: dict | None) -> str:
    """``who (what, pid N, since T)`` of a holder, or why it is unknown."""
    if not h:
        return "unknown holder"
    if "who" not in h:
        return "unknown holder (holder.json unreadable)"
    return f"{h.get('who')} ({h.get('what', '?')}, pid {h.get('pid', '?')}, since {h.get('since', '?')})"


def parse_holder(text: str | None) -> dict:
    """``holder.json`` text → dict ({} when unreadable)."""
    try:
        h = json.loads(text or "{}")
    except ValueError:
        return {}
    return h if isinstance(h, dict) else {}


def age_s(h: dict, now: float | None = None) -> float | None:
    """Seconds since the holder's ``since`` (ISO 8601 UTC, the host's clock) on this machine's
    clock; None when unreadable."""
    import calendar
    import time
    try:
        t = calendar.timegm(time.strptime(h["since"], "%Y-%m-%dT%H:%M:%SZ"))
    except (KeyError, TypeError, ValueError):
        return None
    return max(0.0, (time.time() if now is None else now) - t)


def age_text(s: float | None) -> str:
    """``0 min``, ``3 min``, ``2.5 h``, ``4.0 d`` (``?`` for None)."""
    if s is None:
        return "?"
    if s < 3600:
        return f"{int(s // 60)} min"
    return f"{s / 3600:.1f} h" if s < 86400 else f"{s / 86400:.1f} d"


def held_error(host: str, lock: str, holder_json: str | None, *, can_break: bool) -> LockHeld:
    """The one error for a held lock: the holder (who, what — a manual lock's message —, pid,
    since) and its age."""
    h = parse_holder(holder_json)
    hint = ("wait for it, or break a stale lock with --break-lock" if can_break else "try again when it is done")
    if is_manual(h):
        hint = "it was taken by hand: dsv4ctl lock release PROFILE when the work it names is done"
    return LockHeld(f"{host}: deploy lock {lock} held by {holder_text(h)}, {age_text(age_s(h))} old; {hint}")


def take_cmd(lock: str, holder_doc: dict, then: str = "") -> str:
    """Shell: take ``lock`` (write ``holder.json``; its ``since`` is the host's clock) and run
    ``then``; when held, print the holder and exit LOCK_HELD_CODE; when ``holder.json`` cannot be
    written, remove the lock again and exit 1; when the lock folder cannot be made for another
    reason than an existing lock, exit 1 with mkdir's error."""
    # a holder.json that cannot be written (full disk) gives the lock back at once: a lock
    # without its token could never be released by this run
    # a mkdir that fails for another reason than an existing lock folder (no inodes, a read-only
    # root, a file in the way) is that error (exit 1), never "held"
    return (f"if mkdir {q(lock)} 2>/dev/null; then {stamped_json_cmd(holder_doc, key='since')} > "
            f"{q(lock + '/holder.json')} || {{ rm -rf {q(lock)}; exit 1; }}; "
            f"elif [ -d {q(lock)} ] && [ ! -L {q(lock)} ]; then cat {q(lock + '/holder.json')} 2>/dev/null || echo '{{}}'; "
            f"exit {LOCK_HELD_CODE}; else mkdir {q(lock)}; exit 1; fi" + (f"; {then}" if then else ""))


def held_cmd(lock: str) -> str:
    """Shell: when ``lock`` is held print its holder and exit LOCK_HELD_CODE; else exit 0."""
    return (f"if [ -d {q(lock)} ]; then cat {q(lock + '/holder.json')} 2>/dev/null || echo '{{}}'; "
            f"exit {LOCK_HELD_CODE}; fi")


def release_cmd(lock: str, token: str) -> str:
    """Shell: remove ``lock`` only when its holder carries ``token`` (never another run's lock)."""
    return f"grep -q {q(token)} {q(lock + '/holder.json')} 2>/dev/null && rm -rf {q(lock)} || true"


def check_unlocked(t, root: str) -> None:
    """LockHeld (exit 3) when a run holds ``<root>/.lock`` on the host behind ``t``."""
    lock = f"{root}/.lock"
    res = t.run(held_cmd(lock), check=False, timeout=30)
    if res.code == LOCK_HELD_CODE:
        raise held_error(t.name, lock, res.out, can_break=False)
