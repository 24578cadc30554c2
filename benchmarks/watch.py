"""Benchmark: what ``dsv4ctl watch`` costs the server it probes and the machine it runs on (issue 30).

Against one stand-in SGLang server (tests/standin: SGLang 0.5.23's real DeepSeek-V4 output path,
HiCache off; ``--ttft-ms 1 --itl-ms 0`` by default, so a request costs the server its CPU only and
the closed loop below measures what the stand-in can serve, not its simulated latency):

1. **Probe load as a share of the server's capacity.** Baseline: a minimal raw aiohttp closed
   loop in this process sends the same probe requests (:func:`dsv4ctl.watch.model.probe_session`,
   streaming and not in turn, bodies read to the end, no parsing) at concurrency 8 for
   ``--load-s`` seconds, ``--rounds`` times: the stand-in's sustainable requests/s (median).
   Candidate: a real :class:`~dsv4ctl.watch.run.Watcher` at the default interval (10 s) for
   ``--rate-s`` seconds, its probe rate per target measured from the probes' start times.
   Printed: rate ÷ capacity.
2. **Watch's own CPU and memory over a simulated day.** A day at the default rate is 8,640 probes
   per target. The day runs in compressed time: a Watcher in this process with every period
   divided by ``--compress`` (probe interval 10 s, stand-in scrape 15 s, alert window 1 h), and
   its ``/metrics`` listener on; every 500 probes the target's active release changes
   (``Watcher._set_release``: 17 releases a day, so the bounded label history drops series).
   Every 250 probes garbage is collected (that CPU is left out) and VmRSS of this process
   (``/proc/self/status``), its CPU seconds and Python's allocated blocks (live objects) are sampled.
   Printed: RSS at the start and the end, the RSS slope (KiB per 1,000 probes, least squares over
   the second half: the warm-up allocations are done by then), CPU per probe and its ratio to the
   raw loop's client CPU per request of part 1, and the probe series left on /metrics.
   ``--fraction F`` runs F of the day (under 1: the RSS of a whole day is extrapolated from the
   slope, and the line says so).

Exit 0 unless a probe is not ok (the stand-in answers correctly, so that is a bug). Usage::

    .venv/bin/python benchmarks/watch.py [--compress 200] [--fraction 1.0] [--load-s 10]
        [--rounds 3] [--rate-s 41] [--ttft-ms 1] [--itl-ms 0]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402

from dsv4ctl.check.workload import body_bytes  # noqa: E402
from dsv4ctl.profile.deployment import load_deployment  # noqa: E402
from dsv4ctl.watch import model as M  # noqa: E402
from dsv4ctl.watch.metrics import RELEASE_KEEP  # noqa: E402
from dsv4ctl.watch.run import Watcher, WatchOptions  # noqa: E402
from tests.standin.harness import free_port, standin, write_config  # noqa: E402

DAY_PROBES = int(86400 / M.DEFAULT_INTERVAL)        # 8,640 per target at the default interval
RELEASE_EVERY = 500                                 # probes between release changes
SAMPLE_EVERY = 250                                  # probes between RSS/CPU samples
MODEL = "deepseek-v4-flash"


def rss_kib() -> int:
    """VmRSS of this process in KiB (``/proc/self/status``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def write_profile(d: Path, port: int) -> Path:
    """A colocated profile (one group, one probed target) whose server is the stand-in at
    127.0.0.1:``port``."""
    write_config(d / "c.yaml", port=port, enable_metrics=True, tp_size=8)
    p = d / "watch-bench.yaml"
    p.write_text(textwrap.dedent("""\
        version: 1
        name: watch-bench
        model: deepseek-v4-flash
        hosts:
          - name: local
            address: 127.0.0.1
            gpus: {model: NVIDIA B200, count: 8, memory_mib: 183359}
        groups:
          - {name: one, role: colocated, host: local, gpus: [0, 1, 2, 3, 4, 5, 6, 7], tp: 8, serve_config: c.yaml}
        """))
    return p


async def raw_loop(url: str, concurrency: int, seconds: float) -> tuple[int, float, float]:
    """(requests, wall seconds, client CPU seconds) of a closed loop of probe requests: each worker
    posts the next probe body, reads the whole answer, and posts again until ``seconds`` pass."""
    n = 0
    bodies = [body_bytes(M.probe_session(i).request(MODEL, f"raw-{i}")) for i in range(64)]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency + 8)) as http:
        end = time.monotonic() + seconds

        async def worker(w: int) -> None:
            nonlocal n
            i = w
            while time.monotonic() < end:
                async with http.post(url + "/v1/chat/completions", data=bodies[i % len(bodies)],
                                     headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    if r.status != 200:
                        raise SystemExit(f"raw loop: HTTP {r.status}")
                n += 1
                i += concurrency
        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        return n, time.perf_counter() - t0, time.process_time() - c0


class TimedWatcher(Watcher):
    """A Watcher that records each probe's start time and stops after ``limit`` probes; with
    ``day`` it records no start times (nothing of its own grows), changes the active release every
    :data:`RELEASE_EVERY` probes and, every :data:`SAMPLE_EVERY`, collects garbage (its CPU kept
    apart in ``gc_cpu``) and samples (probes, RSS KiB, CPU seconds, Python's allocated blocks)."""

    def __init__(self, dep, opts: WatchOptions, limit: int, day: bool = False):
        super().__init__(dep, opts)
        self.limit, self.day = limit, day
        self.starts: list[float] = []
        self.samples: list[tuple[int, int, float, int]] = []
        self.bad: list[dict] = []
        self.releases = 0
        self.gc_cpu = 0.0

    async def probe(self, http, t):
        """One probe (:meth:`Watcher.probe`), with the bookkeeping of the benchmark around it."""
        if not self.day:
            self.starts.append(time.monotonic())
        rec = await super().probe(http, t)
        if rec["outcome"] != "ok":
            self.bad.append(rec)
        n = self.n
        if self.day and n % RELEASE_EVERY == 0:
            self.releases += 1
            self._set_release(t, t.host, f"r{self.releases:03d}", "active")
        if self.day and n % SAMPLE_EVERY == 0:      # live objects only: garbage collected first (its CPU not counted)
            c0 = time.process_time()
            gc.collect()
            self.gc_cpu += time.process_time() - c0
            self.samples.append((n, rss_kib(), time.process_time(), sys.getallocatedblocks()))
        if n >= self.limit:
            self.stop.set()
        return rec


def slope(points: list[tuple[int, int]]) -> float:
    """Least-squares slope of (x, y) points (y per x)."""
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


def probe_series(w: Watcher) -> tuple[int, int]:
    """(series of the probe counters on the watcher's /metrics now, distinct releases they carry)."""
    import re

    from prometheus_client import generate_latest
    text = generate_latest(w.m.registry).decode()
    lines = [ln for ln in text.splitlines() if ln.startswith(("dsv4ctl_watch_probes_total{",
                                                               "dsv4ctl_watch_probes_corrupted_total{",
                                                               "dsv4ctl_watch_probes_failed_total{"))]
    return len(lines), len({m.group(1) for ln in lines if (m := re.search(r'release="([^"]*)"', ln))})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compress", type=float, default=200.0, help="time compression of the simulated day")
    ap.add_argument("--fraction", type=float, default=1.0, help="share of the day's 8,640 probes to run")
    ap.add_argument("--load-s", type=float, default=10.0, help="seconds of the closed-loop baseline")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the closed-loop baseline (median)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rate-s", type=float, default=41.0, help="seconds of watch at the default interval")
    ap.add_argument("--ttft-ms", default="1")
    ap.add_argument("--itl-ms", default="0")
    a = ap.parse_args()
    import signal
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # stop the stand-in on kill, too
    with tempfile.TemporaryDirectory() as d:
        port = free_port()
        prof = write_profile(Path(d), port)
        dep = load_deployment(prof)
        with standin(Path(d) / "c.yaml", "--ttft-ms", a.ttft_ms, "--itl-ms", a.itl_ms, port=port) as url:
            print(f"stand-in {url} (ttft {a.ttft_ms} ms, itl {a.itl_ms} ms); load average "
                  f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
            # 1. capacity (baseline) and the probe rate at the default interval
            asyncio.run(raw_loop(url, a.concurrency, 2.0))                   # warm-up
            runs = [asyncio.run(raw_loop(url, a.concurrency, a.load_s)) for _ in range(a.rounds)]
            for i, (n, secs, raw_cpu) in enumerate(runs):
                print(f"baseline round {i + 1}: {n / secs:.1f} req/s ({n} requests in {secs:.1f} s; "
                      f"client CPU {1e3 * raw_cpu / n:.2f} ms/request)", flush=True)
            cap = statistics.median(n / secs for n, secs, _ in runs)
            n, raw_cpu = sum(r[0] for r in runs), sum(r[2] for r in runs)
            print(f"baseline: raw aiohttp closed loop of probe requests, concurrency {a.concurrency}: {cap:.1f} req/s "
                  f"(median of {a.rounds} rounds of {a.load_s:g} s; client CPU {1e3 * raw_cpu / n:.2f} ms/request)",
                  flush=True)
            w = TimedWatcher(dep, WatchOptions(interval=M.DEFAULT_INTERVAL, read_releases=False), limit=10 ** 9)

            async def rate_run():
                asyncio.get_running_loop().call_later(a.rate_s, w.stop.set)
                await w.run()
            asyncio.run(rate_run())
            k = len(w.starts)
            rate = (k - 1) / (w.starts[-1] - w.starts[0]) if k > 1 else 0.0
            print(f"watch at the default interval ({M.DEFAULT_INTERVAL:g} s): {rate:.4f} probes/s per target "
                  f"({k} probes in {a.rate_s:g} s)")
            print(f"probe load / stand-in capacity: {rate / cap:.2e} ({100 * rate / cap:.4f} % of its requests/s "
                  f"per probed target)", flush=True)
            if w.bad:
                raise SystemExit(f"a probe was not ok: {w.bad[0]}")

            # 2. a simulated day
            probes = max(int(DAY_PROBES * a.fraction), 2 * SAMPLE_EVERY)
            c = a.compress
            opts = WatchOptions(interval=M.DEFAULT_INTERVAL / c, scrape_every=15.0 / c, alert_window=3600.0 / c,
                                read_releases=False, listen=("127.0.0.1", free_port()))
            w = TimedWatcher(dep, opts, limit=probes, day=True)
            r0, c0, t0 = rss_kib(), time.process_time(), time.monotonic()
            asyncio.run(w.run())
            wall, r1 = time.monotonic() - t0, rss_kib()
            cpu = time.process_time() - c0 - w.gc_cpu
            if w.bad:
                raise SystemExit(f"{len(w.bad)} probes not ok, the first: {w.bad[0]}")
            late = [x for x in w.samples if x[0] >= probes / 2]
            late = late if len(late) >= 3 else w.samples            # a short run: the whole of it
            s_half, s_all = 1000 * slope([(x[0], x[1]) for x in late]), 1000 * slope([(x[0], x[1]) for x in w.samples])
            blocks = 1000 * slope([(x[0], x[3]) for x in late])
            print(f"simulated day: {w.n} probes ({w.n / DAY_PROBES:.0%} of a day at the default rate) in "
                  f"{wall:.0f} s ({c:g}x compressed: interval {opts.interval * 1e3:.0f} ms, scrape "
                  f"{opts.scrape_every * 1e3:.0f} ms), {w.releases} release changes")
            print(f"RSS: {r0 / 1024:.1f} MiB before the watcher, {w.samples[0][1] / 1024:.1f} MiB at probe "
                  f"{w.samples[0][0]}, {r1 / 1024:.1f} MiB at the end")
            day_end = (w.samples[-1][1] + s_half * (DAY_PROBES - w.n) / 1000) / 1024
            print(f"RSS slope: {s_half:+.1f} KiB per 1,000 probes (second half; {s_all:+.1f} over the whole run), "
                  f"{s_half * DAY_PROBES / 1000 / 1024:+.2f} MiB per day per target at the default rate"
                  + (f"; a whole day extrapolated from it: {day_end:.1f} MiB" if w.n < DAY_PROBES else ""))
            print(f"live Python objects: {blocks:+.0f} allocated blocks per 1,000 probes (second half, after "
                  f"gc.collect(); {w.samples[-1][3]} at the end)")
            per = cpu / w.n
            print(f"watch CPU: {1e3 * per:.2f} ms per probe (probe, judge, stand-in scrapes, ticker); raw aiohttp "
                  f"client: {1e3 * raw_cpu / n:.2f} ms per request; ratio {per / (raw_cpu / n):.2f}")
            print(f"watch CPU at the default rate: {100 * per / M.DEFAULT_INTERVAL:.4f} % of one core per target "
                  f"({per * DAY_PROBES:.1f} CPU-s a day)")
            series, kept = probe_series(w)
            print(f"probe series on /metrics at the end: {series}, of {kept} releases ({w.releases} release changes; "
                  f"the history keeps the active release and {RELEASE_KEEP} before it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
