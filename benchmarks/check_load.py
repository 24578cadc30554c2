"""Benchmark: is ``dsv4ctl check load`` the bottleneck? (issue 6, target ratio >= 0.9)

Against the stand-in SGLang server (tests/standin, HiCache off so every turn is valid and both
clients send identical conversations), 256 concurrent streaming sessions with no think time:

* baseline — a minimal raw aiohttp loop in this process: the same sessions and request bodies
  (dsv4ctl.check.workload), each response read to the end and discarded, no parsing;
* candidate — the real CLI, ``dsv4ctl check load URL -c 256 --stream on --json`` in a subprocess
  (SSE decoding, tool-call assembly, classification, records, progress bar), whose reported
  ``requests_per_s`` covers the load phase of the level.

Each round runs both back to back against the same server process (the order alternates between
rounds, so drifting background load on a shared machine hits both alike); the verdict is the
median over rounds of candidate req/s ÷ baseline req/s (the ratio of medians is printed too), and
the median over rounds of client CPU per request, check load's load phase ÷ the raw loop's (target
<= 1.1 at 64 and 256 sessions, issue 48.4). Usage::

    .venv/bin/python benchmarks/check_load.py [--sessions 256] [--turns 2] [--rounds 11]
        [--ttft-ms 20] [--itl-ms 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402

from dsv4ctl.check.classify import ToolCall, TurnResult  # noqa: E402
from dsv4ctl.check.workload import Session, body_bytes  # noqa: E402
from tests.standin.harness import standin, write_config  # noqa: E402


async def raw_loop(url: str, sessions: int, turns: int, model: str) -> tuple[int, float]:
    """(requests, seconds) for the minimal client: post, read the whole body, next turn."""
    conn = aiohttp.TCPConnector(limit=sessions + 8)
    n = 0
    async with aiohttp.ClientSession(connector=conn) as http:
        async def worker(sid: int) -> None:
            nonlocal n
            s = Session(sid=sid, turns=turns, stream=True, answer_words=150)
            while not s.done:
                spec = s.spec()
                async with http.post(url + "/v1/chat/completions", data=body_bytes(s.request(model, f"raw-{sid}-{spec.index}")),
                                     headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                n += 1
                fake = TurnResult(content="", finish_reason="tool_calls",
                                  tool_calls=[ToolCall(0, f"call_{sid}", spec.tool, "{}")] if spec.tool else [])
                s.advance(fake, True)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(sessions)))
        return n, time.perf_counter() - t0


def check_load(url: str, sessions: int, turns: int, tree: Path = REPO) -> tuple[int, float, int, float]:
    """(requests, req/s, corrupted, client CPU seconds of the load phase) reported by the real CLI
    of the checkout ``tree`` (``client_cpu_ms_per_request``: ``time.process_time`` around the
    level, start-up excluded)."""
    p = subprocess.run([sys.executable, "-m", "dsv4ctl.cli", "check", "load", url, "-c", str(sessions),
                        "--turns", str(turns), "--min-requests", "0", "--stream", "on", "--max-corruption", "0.5",
                        "--json"], cwd=tree, capture_output=True, text=True, timeout=900)
    if p.returncode not in (0, 1):
        raise SystemExit(f"check load failed ({p.returncode}): {p.stderr.strip()}")
    lv = json.loads(p.stdout)["levels"][0]
    return lv["turns"], lv["requests_per_s"], lv["corrupted"], lv["client_cpu_ms_per_request"] * lv["turns"] / 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=256)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--ttft-ms", default="20")
    ap.add_argument("--itl-ms", default="2")
    ap.add_argument("--before", type=Path, metavar="DIR",
                    help="also run the check load of the checkout DIR (the code before a change) in every round, "
                         "right after this tree's: its CPU ratio to the same raw loop is printed beside")
    a = ap.parse_args()
    import signal
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # stop the stand-in on kill, too
    with tempfile.TemporaryDirectory() as d:
        cfg = write_config(Path(d) / "serve.yaml", enable_metrics=True)
        with standin(cfg, "--ttft-ms", a.ttft_ms, "--itl-ms", a.itl_ms) as url:
            base, cand = [], []
            asyncio.run(raw_loop(url, 16, 2, "deepseek-v4-flash"))      # warm-up of both clients
            check_load(url, 16, 2)
            ratios, cpu_ratios, before_ratios = [], [], []
            for r in range(a.rounds):
                def run_raw():
                    c0 = time.process_time()
                    n, secs = asyncio.run(raw_loop(url, a.sessions, a.turns, "deepseek-v4-flash"))
                    return n, secs, time.process_time() - c0
                if r % 2 == 0:      # alternate the order so drifting background load hits both alike
                    n, secs, raw_cpu = run_raw()
                    m, rps, bad, cli_cpu = check_load(url, a.sessions, a.turns)
                else:
                    m, rps, bad, cli_cpu = check_load(url, a.sessions, a.turns)
                    n, secs, raw_cpu = run_raw()
                if a.before:
                    bm, _, _, bcpu = check_load(url, a.sessions, a.turns, a.before)
                    before_ratios.append((bcpu / bm) / (raw_cpu / n))
                if m != n or bad:
                    raise SystemExit(f"round {r}: check load ran {m} turns ({bad} corrupted), baseline {n}")
                base.append(n / secs)
                cand.append(rps)
                ratios.append(rps / (n / secs))
                cpu_ratios.append((cli_cpu / m) / (raw_cpu / n))
                print(f"round {r + 1}: raw aiohttp {n / secs:8.1f} req/s   check load {rps:8.1f} req/s   "
                      f"ratio {ratios[-1]:.3f}   ({n} streaming requests, {a.sessions} sessions; client CPU per "
                      f"request: raw {1e3 * raw_cpu / n:.2f} ms, check load {1e3 * cli_cpu / m:.2f} ms, ratio {cpu_ratios[-1]:.2f}"
                      + (f"; before: ratio {before_ratios[-1]:.2f})" if a.before else ")"), flush=True)
    ratio = statistics.median(ratios)
    print(f"ratio of medians (check load / raw): {statistics.median(cand) / statistics.median(base):.3f}")
    print(f"check load / raw aiohttp requests/s (median of {a.rounds} paired rounds): {ratio:.3f}  "
          f"(target >= 0.9: {'met' if ratio >= 0.9 else 'NOT met'})")
    cpu = statistics.median(cpu_ratios)
    print(f"client CPU per request, check load / raw aiohttp (median of {a.rounds} rounds, load phase only; "
          f"the stand-in server's CPU is not counted): {cpu:.3f}  (target <= 1.1, issue 48.4: {'met' if cpu <= 1.1 else 'NOT met'})")
    if a.before:
        print(f"client CPU per request of {a.before} / raw aiohttp (median of {a.rounds} rounds, same rounds): "
              f"{statistics.median(before_ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
