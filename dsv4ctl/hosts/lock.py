"""The host lock ``<root>/.lock`` (a folder: ``mkdir`` is atomic) with ``holder.json``.

One implementation for every command that changes a host: :func:`take_cmd` (deploy, rollback,
promote) takes it in the same round trip as the facts; :func:`held_cmd` (hicache --remote, a
runbook restart) checks it. A held lock is :class:`LockHeld` (exit 3) with one message."""

from __future__ import annotations

import json
import os
import shlex
import socket
import time

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
    matches on; it is not a secret but says nothing about the operator), and where the pid is
    meaningful (:func:`machine_identity`: ``hostname``, ``machine``, ``boot``, ``pidns``) with the
    process's start (``pid_start``, defeats pid reuse): what :func:`holder_liveness` checks."""
    here = {k: v for k, v in machine_identity().items() if k != "booted"}    # booted: this machine's, not the record's
    return {"who": who(), "what": what, "pid": os.getpid(), "since": now_iso(), "token": token,
            **here, "pid_start": process_start(os.getpid())}


def _first_line(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.readline(256).strip() or None
    except OSError:
        return None


def machine_identity() -> dict:
    """Where a pid of this process means something: ``hostname``, ``machine``
    (``/etc/machine-id``), ``boot`` (the kernel's boot id: a restart ends every process) and
    ``pidns`` (this process's pid namespace: a container has its own pids). None where unreadable."""
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = None
    booted = None
    try:
        with open("/proc/stat") as f:
            booted = next((int(ln.split()[1]) for ln in f if ln.startswith("btime ")), None)
    except (OSError, ValueError, IndexError):
        pass
    return {"hostname": socket.gethostname(),
            "machine": _first_line("/etc/machine-id") or _first_line("/var/lib/dbus/machine-id"),
            "boot": _first_line("/proc/sys/kernel/random/boot_id"), "pidns": pidns, "booted": booted}


def process_start(pid: int) -> str | None:
    """When process ``pid`` of this machine started (``/proc/PID/stat`` starttime, clock ticks
    after boot, as text); None when no such process runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            fields = f.read().rsplit(b") ", 1)[1].split()
    except (OSError, IndexError, ValueError):
        return None
    if not fields or fields[0] in (b"Z", b"X"):
        return None
    return fields[19].decode() if len(fields) > 19 else None


def holder_liveness(h: dict | None, here: dict | None = None) -> tuple[str, str]:
    """(``alive`` | ``dead`` | ``unknown``, why) of the process that holds a run's lock, checked on
    this machine when the holder ran here (same host name and machine id): a restart since, no
    such pid, or a pid now started at another time (reused) is ``dead``. A holder on another
    machine, in another container, or written without this record (an older dsv4ctl, an
    unreadable holder.json) is ``unknown``: only the operator can say it is gone."""
    h = h or {}
    pid = h.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return "unknown", "the holder record names no process"
    here = here or machine_identity()
    if not h.get("hostname") or not (h.get("machine") or h.get("boot")):
        return "unknown", f"the holder record does not say which machine runs pid {pid}"
    same_kernel = h["hostname"] == here["hostname"] and h.get("boot") and h.get("boot") == here["boot"]
    if not same_kernel:
        if h["hostname"] == here["hostname"] and h.get("machine") and h["machine"] == here["machine"] and here["boot"]:
            # another boot of this machine — or another machine cloned from one image (same name
            # and machine id): only a boot after the lock was taken proves its process gone
            age, booted = age_s(h), here.get("booted")
            if age is not None and booted is not None and booted > time.time() - age:
                return "dead", f"this machine restarted since pid {pid} took it"
            return "unknown", (f"pid {pid} ran under another boot of a machine with this name and machine id, and "
                               "this one has not restarted since (a cloned machine?): it cannot be checked from here")
        return "unknown", f"pid {pid} runs on {h['hostname']}, which this machine cannot check"
    if not h.get("pidns") or h["pidns"] != here["pidns"]:
        return "unknown", f"pid {pid} runs in another container of this machine, which this one cannot check"
    start = process_start(pid)
    if start is None:
        return "dead", f"no process {pid} runs on this machine"
    if h.get("pid_start") and str(h["pid_start"]) != start:
        return "dead", f"pid {pid} is another process now (started later)"
    return "alive", f"pid {pid} still runs on this machine ({h['hostname']})"


def release_hint(profile: str, *, dead_override: bool = False) -> str:
    """The exact command that frees a run's lock: ``dsv4ctl lock release PROFILE --force`` (with
    ``--yes-it-is-dead`` where the holder's death cannot be checked); ``profile`` as given."""
    return f"dsv4ctl lock release {shlex.quote(str(profile))} --force" + (" --yes-it-is-dead" if dead_override else "")


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


def held_error(host: str, lock: str, holder_json: str | None, *, can_break: bool,
               profile: str = "PROFILE") -> LockHeld:
    """The one error for a held lock: the holder (who, what — a manual lock's message —, pid,
    since), its age, and what to do: a run's process that still runs is waited for; one that is
    gone (:func:`holder_liveness`) is named dead with the command that frees its lock
    (``profile`` as the user gave it); one that cannot be checked says so. A holder that is this
    very process took the lock through another host whose deploy root is the same folder (a
    shared filesystem): said so, since waiting would never free it."""
    h = parse_holder(holder_json)
    hint = ("wait for it, or break a stale lock with --break-lock" if can_break else "try again when it is done")
    if is_manual(h):
        hint = f"it was taken by hand: dsv4ctl lock release {shlex.quote(str(profile))} when the work it names is done"
    else:
        state, why = holder_liveness(h)
        if state == "dead":
            hint = f"that run is dead ({why}): free the lock with {release_hint(profile)}"
        elif state == "alive" and h.get("pid") == os.getpid():
            hint = ("that is this run's own lock, taken through another host: this host's deploy root is the "
                    "same folder as that host's (a shared filesystem, or one machine); each host needs its own "
                    "deploy root, or, on a Slurm cluster's shared filesystem, deploy.slurm.shared_root: true (docs/slurm.md)")
        elif state == "alive":
            hint = f"that run is still going ({why}): try again when it is done"
        else:
            hint += f" (if that run is gone: {release_hint(profile, dead_override=True)}; {why})"
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


def check_unlocked(t, root: str, profile: str = "PROFILE") -> None:
    """LockHeld (exit 3) when a run holds ``<root>/.lock`` on the host behind ``t``."""
    lock = f"{root}/.lock"
    res = t.run(held_cmd(lock), check=False, timeout=30)
    if res.code == LOCK_HELD_CODE:
        raise held_error(t.name, lock, res.out, can_break=False, profile=profile)
