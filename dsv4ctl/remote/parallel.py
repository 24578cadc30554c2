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

from ..errors import DsvError


@dataclass
class HostResult:
    """One host's outcome: ``value`` when ``ok``, else ``error`` (one line, starts with the host)."""

    host: str
    ok: bool
    value: Any = None
    error: str | None = None
    seconds: float = 0.0


@contextlib.contextmanager
def _interrupts_deferred():
    """Hold SIGINT/SIGTERM back (main thread only) until the block ends, then act on the first
    one as its handler would (KeyboardInterrupt for Ctrl-C). Blocking the signal mask is not
    enough: another thread may take the signal, and Python still raises in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
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


def run_parallel(transports: dict, fn: Callable[[Any], Any], *, timeout: float | None = None,
                 max_workers: int | None = None, finish_on_interrupt: bool = False) -> dict[str, HostResult]:
    """``fn(transport)`` on every host in parallel threads; returns {host: HostResult} in input order.

    ``timeout`` (s) is per host: a host that has not finished is reported as timed out and its
    transport is closed (which unblocks SSH I/O). A DsvError/exception on one host never stops
    the others. KeyboardInterrupt propagates after closing every transport — or, with
    ``finish_on_interrupt`` (short steps whose outcome the caller must know, such as taking a
    lock or switching a host), after every host's ``fn`` has returned; a second interrupt
    then closes the transports."""
    names = list(transports)
    results: dict[str, HostResult] = {}
    if not names:
        return results
    pool = cf.ThreadPoolExecutor(max_workers=max_workers or len(names))
    t0 = time.monotonic()
    futs: dict = {}
    try:
        # SIGINT/SIGTERM wait until every call is submitted: an interrupt inside submit() can
        # leave a started thread the pool does not know of, or wedge it for good (a
        # KeyboardInterrupt inside Thread.start()'s "with lock" leaves the lock held, and the
        # process then hangs at exit waiting for that thread)
        with _interrupts_deferred():
            for n in names:
                futs[pool.submit(fn, transports[n])] = n
        deadline = None if timeout is None else t0 + timeout
        pending = set(futs)
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, pending = cf.wait(pending, timeout=left if left is not None else 0.5,
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
                for f in pending:
                    n = futs[f]
                    results[n] = HostResult(n, False, error=f"{n}: timed out after {timeout:g} s",
                                            seconds=time.monotonic() - t0)
                    try:
                        transports[n].close()
                    except Exception:
                        pass
                break
    except KeyboardInterrupt:
        if finish_on_interrupt:
            try:   # every submitted call, including one whose submit() the interrupt cut short
                pool.shutdown(wait=True)
            except KeyboardInterrupt:
                pass            # a second interrupt: stop waiting, close the transports below
            else:
                raise
        for t in transports.values():
            try:
                t.close()
            except Exception:
                pass
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=False, cancel_futures=True)
    return {n: results[n] for n in names}
