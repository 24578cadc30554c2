#!/usr/bin/env python3
"""The suite's ``run_cli``: a new ``python -m dsv4ctl.cli`` per run (the baseline) against a child
forked from the pre-imported test server (``tests/cliserver.py``), measured in this one process
and printed as ratios (wall and CPU, the CPU of the children included).

Commands: ``--version``, ``plan --json`` on the embedded default profile, a usage error, and
``config lint`` of a serve config. Runs are interleaved (new process, fork, new process, ...) so
load from other processes hits both alike; the ratio is of the medians.

    .venv/bin/python benchmarks/cli_fork.py          # 15 rounds
    .venv/bin/python benchmarks/cli_fork.py -n 40
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=15, help="rounds (default 15)")
    a = ap.parse_args()
    import tests.conftest as c
    from tests.cliserver import Server
    tmp = Path(tempfile.mkdtemp(prefix="dsv4ctl-bench-"))
    cfg = tmp / "decode.yaml"
    cfg.write_text("model-path: deepseek-ai/DeepSeek-V4-Flash\ntp-size: 4\nenable-hierarchical-cache: true\n")
    cmds = {"--version": ["--version"], "plan --json": ["plan", "--json"], "usage error": ["plan", "--nope"],
            "config lint": ["config", "lint", str(cfg)]}
    srv = Server(str(tmp / "sock"), str(REPO), str(tmp / "server.log"))
    srv.run(["--version"], dict(os.environ), str(REPO), None, 60)     # started and warm
    env = {"DSV4CTL_CACHE": str(tmp / "cache")}
    res: dict[str, dict[str, list[float]]] = {k: {"new": [], "fork": [], "new_cpu": [], "fork_cpu": []} for k in cmds}
    server_cpu0 = _proc_cpu(srv.proc.pid)
    for _ in range(a.n):
        for name, argv in cmds.items():
            for how in ("new", "fork"):
                os.environ["DSV4CTL_TEST_FORK"] = "0" if how == "new" else "1"
                c._SERVER[:] = [] if how == "new" else [srv]
                t0, u0 = time.perf_counter(), cpu_children()
                r = c.run_cli(*argv, env=env)
                t1, u1 = time.perf_counter(), cpu_children()
                assert r.code in (0, 1, 2), (name, how, r)
                res[name][how].append(t1 - t0)
                res[name][how + "_cpu"].append(u1 - u0)
    fork_children_cpu = _proc_cpu(srv.proc.pid, children=True)
    srv.close()
    print(f"{'command':14} {'new (ms)':>9} {'fork (ms)':>10} {'wall ratio':>11}")
    for name, r in res.items():
        n, f = statistics.median(r["new"]) * 1e3, statistics.median(r["fork"]) * 1e3
        print(f"{name:14} {n:9.1f} {f:10.1f} {f / n:11.2f}")
    new_cpu = sum(sum(r["new_cpu"]) for r in res.values())
    runs = a.n * len(cmds)
    print(f"CPU of the CLI runs (user+sys): new process {new_cpu / runs * 1e3:.1f} ms/run; forked children "
          f"{fork_children_cpu / runs * 1e3:.1f} ms/run (server: {server_cpu0:.2f} s once); ratio "
          f"{fork_children_cpu / new_cpu:.2f}")
    return 0


def _proc_cpu(pid: int, children: bool = False) -> float:
    """CPU seconds of process ``pid`` (or of its reaped children) from /proc/PID/stat."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(f[11]) + int(f[12])) / tick if not children else (int(f[13]) + int(f[14])) / tick


if __name__ == "__main__":
    sys.exit(main())
