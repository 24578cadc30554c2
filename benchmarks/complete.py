#!/usr/bin/env python3
"""Completion benchmark: wall time of one ``dsv4ctl __complete`` call (what the shell completions
run when TAB completes a group, host or release), against ``python -c pass`` measured in the same
run, and of one whole bash completion that runs it.

Measured, interleaved so that load from other processes hits all alike (median and minimum wall
time, median CPU time user+sys of the child):

* baseline: ``python -c pass`` (the interpreter's start-up: the floor of any call)
* ``__complete groups PROFILE``: a profile read before (its parsed YAML in the cache: no PyYAML)
* the same, profile not seen before (every run an empty ``DSV4CTL_CACHE``: PyYAML imported)
* ``__complete releases PROFILE`` with a run log of ``--runs`` records
* ``dsv4ctl --version`` (for comparison: a command through typer)
* bash: ``dsv4ctl plan PROFILE -g <TAB>`` through completions/dsv4ctl.bash (tests/completion/drive.bash)

Target: a ``__complete`` call well under 200 ms. Every run is a fresh interpreter with stdout to
/dev/null and bytecode caching on (``.pyc`` to a throw-away ``PYTHONPYCACHEPREFIX``).

    .venv/bin/python benchmarks/complete.py           # 15 runs each
    .venv/bin/python benchmarks/complete.py -n 30"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROFILE = REPO / "profiles" / "dsv4-flash-8xb200-pd.yaml"


def _run(argv: list[str], env: dict, before=None) -> tuple[float, float]:
    """(wall, cpu) seconds of one run of ``argv``; ``before()`` runs first, outside the timing."""
    if before is not None:
        before()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.decode()[-500:]}")
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=15, help="runs of each command (default 15)")
    ap.add_argument("--runs", type=int, default=2000, help="records in the run log (default 2000)")
    a = ap.parse_args(argv)
    python = sys.executable
    script = Path(python).parent / "dsv4ctl"
    cli = [str(script)] if script.is_file() else [python, "-m", "dsv4ctl"]
    tmp = Path(tempfile.mkdtemp(prefix="dsv4ctl-complete-bench-"))
    try:
        state, cache, cold = tmp / "state", tmp / "cache", tmp / "cold"
        state.mkdir()
        with open(state / "runs.jsonl", "w") as f:
            for i in range(a.runs):
                f.write(json.dumps({"command": "deploy", "profile": str(PROFILE), "release": f"r{i % 40:012x}",
                                    "steps": [{"host": "h", "phase": "push", "duration_s": 1.0}] * 8}) + "\n")
        bindir = tmp / "bin"
        bindir.mkdir()
        if len(cli) == 1:
            (bindir / "dsv4ctl").symlink_to(cli[0])     # for the bash completion's `command dsv4ctl`
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "DSV4CTL_PROFILE")}
        env.update(DSV4CTL_CACHE=str(cache), DSV4CTL_STATE_DIR=str(state), PYTHONPYCACHEPREFIX=str(tmp / "pyc"),
                   PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}")
        cold_env = dict(env, DSV4CTL_CACHE=str(cold))
        subprocess.run(cli + ["__complete", "groups", str(PROFILE)], env=env, stdout=subprocess.DEVNULL)  # warm
        line = f"dsv4ctl plan {PROFILE} -g "
        cmds = {
            "baseline: python -c pass": ([python, "-c", "pass"], env, None),
            "__complete groups (profile read before)": (cli + ["__complete", "groups", str(PROFILE)], env, None),
            "__complete groups (profile not seen before)": (cli + ["__complete", "groups", str(PROFILE)], cold_env,
                                                            lambda: shutil.rmtree(cold, ignore_errors=True)),
            f"__complete releases ({a.runs}-record run log)": (cli + ["__complete", "releases", str(PROFILE)], env, None),
            "dsv4ctl --version (through typer)": (cli + ["--version"], env, None),
            "bash: plan PROFILE -g <TAB> (whole completion)": (
                ["bash", str(REPO / "tests" / "completion" / "drive.bash"), str(REPO / "completions" / "dsv4ctl.bash"),
                 line], env, None),
        }
        if len(cli) != 1:
            del cmds["bash: plan PROFILE -g <TAB> (whole completion)"]   # no console script to put on PATH
        res: dict[str, list[tuple[float, float]]] = {k: [] for k in cmds}
        for _ in range(a.n):
            for label, (argv_, env_, before) in cmds.items():
                res[label].append(_run(argv_, env_, before))
        load = os.getloadavg()[0]
        print(f"{a.n} interleaved runs each; load average {load:.1f} on {os.cpu_count()} cores")
        print(f"{'':52} {'median':>8} {'min':>8} {'cpu med':>8}")
        for label, rs in res.items():
            walls, cpus = [w for w, _ in rs], [c for _, c in rs]
            print(f"{label:52} {statistics.median(walls) * 1000:6.0f}ms {min(walls) * 1000:6.0f}ms "
                  f"{statistics.median(cpus) * 1000:6.0f}ms")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
