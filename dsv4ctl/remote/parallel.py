"""All hosts at once: per-host timeout, per-host result or error."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import DsvError, RemoteError
from ..signals import STOPPING, terminate_as_interrupt_while
from .transport import cancel_event


@dataclass
class HostResult:
    """One host's outcome: ``value`` when ``ok``, else ``error`` (one line, starts with the host)."""

    host: str
    ok: bool
    value: Any = None
    error: str | None = None
    seconds: float = 0.0


@contextlib.contextmanager
def interrupts_deferred():
    """Hold SIGINT/SIGTERM/SIGHUP back (main thread only) until the block ends, then act on the first
    one as its handler would (KeyboardInterrupt for Ctrl-C). Blocking the signal mask is not
    enough: another thread may take the signal, and Python still raises in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old = {s: signal.getsignal(s) for s in STOPPING}
    for s in old:
        signal.signal(s, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if got:
            h = old[got[0]]
            if callable(h):
                h(got[0], None)
            elif h == signal.SIG_DFL:
                os.kill(os.getpid(), got[0])


STOP_WAIT_S = 15.0
"""After an interrupt: at most this many seconds for the hosts' commands to be stopped (every
transport is closed at once, in parallel, which stops its running commands) before the
interrupt goes on."""


def _work(fut: cf.Future, fn: Callable[[Any], Any], t, cancel: threading.Event, slots: threading.Semaphore) -> None:
    """One host's call in its own (daemon) thread, its transport commands tied to ``cancel``."""
    cancel_event(cancel)
    with slots:
        if not fut.set_running_or_notify_cancel():
            return
        if cancel.is_set():
            fut.set_exception(RemoteError(f"{t.name}: interrupted"))
            return
        try:
            fut.set_result(fn(t))
        except BaseException as e:        # noqa: BLE001 — reported as that host's error
            fut.set_exception(e)


def stop_hosts(transports: dict, cancels: list[threading.Event], wait: float = STOP_WAIT_S) -> None:
    """Give up on running host calls: set their cancel events (a worker can start no command any
    more; one waiting on a command stops it and returns), then close every transport in
    parallel, which stops each command still running over it (its process group on the host:
    SIGTERM, then SIGKILL) — at most ``wait`` s in all. The workers are daemon threads and are
    not waited for. SIGINT/SIGTERM are held meanwhile."""
    from .transport import signals_held
    with signals_held():
        for ev in cancels:
            ev.set()
        deadline = time.monotonic() + wait
        closers = [threading.Thread(target=_close_quietly, args=(t,), daemon=True) for t in transports.values()]
        for c in closers:
            c.start()
        for c in closers:
            c.join(max(0.0, deadline - time.monotonic()))


def _close_quietly(t) -> None:
    try:
        t.close()
    except Exception:
        pass


def run_parallel(transports: dict, fn: Callable[[Any], Any], *, timeout: float | None = None,
                 max_workers: int | None = None, finish_on_interrupt: bool = False) -> dict[str, HostResult]:
    """``fn(transport)`` on every host in parallel threads; returns {host: HostResult} in input order.

    ``timeout`` (s) is per host: a host that has not finished is reported as timed out, its
    call is cancelled and its transport closed (which stops its command on the host). A
    DsvError/exception on one host never stops the others.

    SIGTERM counts as Ctrl-C while this runs (unless the command handles SIGTERM itself). On an
    interrupt every host's command is stopped on its host (its process group), the transports
    are closed and KeyboardInterrupt propagates (:func:`stop_hosts`) — no worker goes on
    running commands after that. With ``finish_on_interrupt`` (short steps whose outcome the
    caller must know, such as taking a lock or switching a host) every host's ``fn`` is first
    waited for; a second interrupt then stops them as above."""
    names = list(transports)
    results: dict[str, HostResult] = {}
    if not names:
        return results
    slots = threading.Semaphore(max_workers or len(names))
    cancels = {n: threading.Event() for n in names}
    t0 = time.monotonic()
    futs: dict = {}
    threads: list[threading.Thread] = []
    with terminate_as_interrupt_while():
        try:
            # SIGINT/SIGTERM wait until every thread is started: a KeyboardInterrupt inside
            # Thread.start() can leave a started thread unknown here, or its lock held for good
            with interrupts_deferred():
                for n in names:
                    f: cf.Future = cf.Future()
                    futs[f] = n
                    th = threading.Thread(target=_work, args=(f, fn, transports[n], cancels[n], slots),
                                          daemon=True, name=f"dsv4ctl-host-{n}")
                    th.start()
                    threads.append(th)
            deadline = None if timeout is None else t0 + timeout
            pending = set(futs)
            while pending:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                done, pending = cf.wait(pending, timeout=min(left, 0.5) if left is not None else 0.5,
                                        return_when=cf.FIRST_COMPLETED)
                for f in done:
                    n = futs[f]
                    try:
                        results[n] = HostResult(n, True, f.result(), seconds=time.monotonic() - t0)
                    except DsvError as e:
                        msg = str(e)
                        results[n] = HostResult(n, False, error=msg if msg.startswith(n) else f"{n}: {msg}",
                                                seconds=time.monotonic() - t0)
                    except Exception as e:
                        results[n] = HostResult(n, False, error=f"{n}: {type(e).__name__}: {e}",
                                                seconds=time.monotonic() - t0)
                if deadline is not None and time.monotonic() >= deadline and pending:
                    late = [futs[f] for f in pending]
                    for n in late:
                        results[n] = HostResult(n, False, error=f"{n}: timed out after {timeout:g} s",
                                                seconds=time.monotonic() - t0)
                    stop_hosts({n: transports[n] for n in late}, [cancels[n] for n in late])
                    break
        except KeyboardInterrupt:
            if finish_on_interrupt:
                try:   # every started call
                    for th in threads:
                        th.join()
                except KeyboardInterrupt:
                    pass            # a second interrupt: stop them below
                else:
                    raise
            stop_hosts(transports, list(cancels.values()))
            raise
    return {n: results[n] for n in names}
