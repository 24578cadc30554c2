"""The transport interface and the local implementation."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

from ..errors import RemoteError
from ..signals import STOPPING

STOP_GRACE_S = 10.0
"""Seconds a stopped command's process group gets to end after SIGTERM before SIGKILL (git
removes its lock files on SIGTERM)."""

#: ``group_running PGID``: exit 0 while a non-zombie process of process group PGID exists
#: (reads ``/proc/*/stat``: state and pgrp follow the last ``") "``; without /proc, any member
#: counts). POSIX sh, no forks.
GROUP_RUNNING_FN = (  # "kill -SIG -PGID": dash has no "kill --"
    'group_running() { kill -0 -"$1" 2>/dev/null || return 1; [ -r /proc/self/stat ] || return 0; '
    'for s in /proc/[0-9]*/stat; do read -r l 2>/dev/null <"$s" || continue; l=${l##*") "}; '
    'set -- "$1" $l; [ "$4" = "$1" ] && [ "$2" != Z ] && return 0; done; return 1; };')


_worker = threading.local()


def cancel_event(event: "threading.Event | None") -> None:
    """Tie this thread's transport commands to ``event`` (None: untie). Once it is set, a
    command running in this thread is stopped on its host (its process group: SIGTERM, then
    SIGKILL) and raises RemoteError; a new command raises at once. :func:`.parallel.run_parallel`
    sets this in its worker threads, so an interrupt stops every host's command."""
    _worker.cancel = event


def cancelled() -> bool:
    """True when this thread's :func:`cancel_event` is set."""
    ev = getattr(_worker, "cancel", None)
    return ev is not None and ev.is_set()


class signals_held:
    """While stopping a command: SIGINT/SIGTERM/SIGHUP are ignored in the main thread (a second Ctrl-C
    must not leave a half-stopped command); outside the main thread this does nothing."""

    def __enter__(self):
        self.old = {}
        if threading.current_thread() is threading.main_thread():
            self.old = {s: signal.signal(s, signal.SIG_IGN) for s in STOPPING}
        return self

    def __exit__(self, *exc):
        for s, h in self.old.items():
            signal.signal(s, h)
        return False


def stop_group_cmd(pgid: int, grace: float = STOP_GRACE_S) -> str:
    """The host command that stops process group ``pgid`` (a remote command's own group: sshd
    starts each command in a new session): SIGTERM, wait up to ``grace`` s while a member runs
    (zombies do not count, :data:`GROUP_RUNNING_FN`), SIGKILL; exit 0 once it is gone. When
    ``pgid`` is no group (a server that does not start a session per command) the process and
    its children are signalled. POSIX sh (dash's ``kill`` has no ``--``)."""
    n = max(1, int(grace * 10))
    return (f"{GROUP_RUNNING_FN} P={int(pgid)}; "
            f"if kill -0 -$P 2>/dev/null; then kill -TERM -$P 2>/dev/null; i=0; "
            f"while group_running $P; do i=$((i+1)); if [ $i -eq {n} ]; then kill -KILL -$P 2>/dev/null; fi; "
            f"if [ $i -gt {n + 50} ]; then exit 1; fi; sleep 0.1; done; "
            f"else pkill -TERM -P $P 2>/dev/null; kill -TERM $P 2>/dev/null; i=0; "
            f"while kill -0 $P 2>/dev/null && [ \"$(sed 's/.*) //' /proc/$P/stat 2>/dev/null | cut -c1)\" != Z ]; do i=$((i+1)); if [ $i -eq {n} ]; then pkill -KILL -P $P 2>/dev/null; "
            f"kill -KILL $P 2>/dev/null; fi; if [ $i -gt {n + 50} ]; then exit 1; fi; sleep 0.1; done; fi; exit 0")


def q(s) -> str:
    """Shell-quote one word for a remote ``sh`` command line."""
    return shlex.quote(str(s))


@dataclass
class CmdResult:
    """Outcome of one command: exit ``code``, ``stdout``/``stderr`` as bytes."""

    host: str
    cmd: str
    code: int
    stdout: bytes
    stderr: bytes

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    def error_text(self) -> str:
        """The last non-empty stderr (else stdout) line, for one-line errors."""
        for text in (self.err, self.out):
            lines = [ln for ln in text.strip().splitlines() if ln.strip()]
            if lines:
                return lines[-1].strip()
        return f"exit {self.code}"


class Transport(ABC):
    """Runs shell commands on one host. ``name`` is the profile host name (used in every error)."""

    name: str
    #: True when files can be reached directly on this machine (no network hop).
    is_local: bool = False

    @abstractmethod
    def run(self, cmd: str, *, input: bytes | None = None, timeout: float | None = None,
            check: bool = True) -> CmdResult:
        """Run ``cmd`` with ``sh -c`` semantics on the host; ``input`` is fed to stdin.

        ``timeout`` (s) bounds the whole command. With ``check`` a non-zero exit raises
        RemoteError ``host: message``; a lost connection or timeout always raises RemoteError."""

    @abstractmethod
    def rsync_dest(self, path: str, bulk: bool = False) -> tuple[list[str], str]:
        """``(extra rsync args, destination)`` to push into ``path`` on the host with rsync:
        for SSH ``["-e", BRIDGE]`` and ``host:path`` (rsync's remote side runs over this
        transport's connection, :mod:`dsv4ctl.remote.rsync_bridge`), or with ``bulk`` an
        OpenSSH connection of its own; locally ``[]`` and ``path``."""

    def close(self) -> None:
        """Drop the connection (safe to call twice)."""

    def fail(self, res: CmdResult, what: str) -> RemoteError:
        """A RemoteError ``host: what: <last stderr line>``."""
        return RemoteError(f"{self.name}: {what}: {res.error_text()}")


class LocalTransport(Transport):
    """This machine, through ``bash -c``: the same operations as over SSH, for ``local: true``."""

    is_local = True

    def __init__(self, name: str = "local"):
        self.name = name
        self._procs: set = set()           # running commands (close() stops them)
        self._plock = threading.Lock()

    def close(self) -> None:
        """Stop every command still running (from other threads): its process group gets
        SIGTERM, then SIGKILL after :data:`STOP_GRACE_S` s."""
        with self._plock:
            procs = list(self._procs)
        for p in procs:
            stop_process_group(p, close_pipes=False)

    def run(self, cmd, *, input=None, timeout=None, check=True):
        """As :meth:`Transport.run`; the command runs in its own process group, which is stopped
        (SIGTERM, then SIGKILL) on a timeout, an interrupt or a :func:`cancel_event`."""
        if cancelled():
            raise RemoteError(f"{self.name}: interrupted")
        p = subprocess.Popen(["bash", "-c", cmd], stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, process_group=0)
        deadline = None if timeout is None else time.monotonic() + timeout
        feed = input
        with self._plock:
            self._procs.add(p)
        try:
            while True:
                try:
                    out, err = p.communicate(feed, timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    feed = None
                    if cancelled():
                        raise RemoteError(f"{self.name}: interrupted: {cmd.splitlines()[0][:80]}")
                    if deadline is not None and time.monotonic() > deadline:
                        raise RemoteError(f"{self.name}: timed out after {timeout:g} s: {cmd.splitlines()[0][:80]}")
        except BaseException:
            with signals_held():
                stop_process_group(p)
            raise
        finally:
            with self._plock:
                self._procs.discard(p)
        res = CmdResult(self.name, cmd, p.returncode, out, err)
        if check and res.code != 0:
            raise self.fail(res, cmd.splitlines()[0][:80])
        return res

    def rsync_dest(self, path, bulk=False):
        return [], path


def stop_process_group(p: subprocess.Popen, grace: float = STOP_GRACE_S, close_pipes: bool = True) -> None:
    """SIGTERM ``p``'s own process group, SIGKILL it after ``grace`` s; reaps ``p`` (and closes
    its pipes unless another thread still reads them: ``close_pipes`` False)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    for f in (p.stdin, p.stdout, p.stderr) if close_pipes else ():
        if f is not None:
            try:
                f.close()
            except OSError:
                pass
