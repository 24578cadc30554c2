"""All hosts at once: per-host timeout, per-host result or error."""

from __future__ import annotations

import concurrent.futures as cf
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


def run_parallel(transports: dict, fn: Callable[[Any], Any], *, timeout: float | None = None,
                 max_workers: int | None = None) -> dict[str, HostResult]:
    """``fn(transport)`` on every host in parallel threads; returns {host: HostResult} in input order.

    ``timeout`` (s) is per host: a host that has not finished is reported as timed out and its
    transport is closed (which unblocks SSH I/O). A DsvError/exception on one host never stops
    the others. KeyboardInterrupt propagates after closing every transport."""
    names = list(transports)
    results: dict[str, HostResult] = {}
    if not names:
        return results
    pool = cf.ThreadPoolExecutor(max_workers=max_workers or len(names))
    t0 = time.monotonic()
    futs = {pool.submit(fn, transports[n]): n for n in names}
    try:
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
        for t in transports.values():
            try:
                t.close()
            except Exception:
                pass
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=False, cancel_futures=True)
    return {n: results[n] for n in names}
