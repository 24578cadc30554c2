#!/usr/bin/env python3
"""Start-up benchmark: wall time of ``dsv4ctl --help`` and ``dsv4ctl plan`` against the
baseline ``python -c "import typer"``, measured in this one process run, printed as ratios.

Targets: ``--help`` <= 2.0; ``plan`` <= 1.6 with the profile's parsed YAML in the cache (an
operator's second ``plan``), <= 2.0 for a profile not seen before (every run an empty
``DSV4CTL_CACHE``: PyYAML imported and run). A valid profile never imports jsonschema
(``dsv4ctl.profile.model.conforms``) and the plan table is drawn without rich. Runs are interleaved (baseline, help, plan, baseline, ...)
so that load from other processes hits all alike; the verdict uses the ratio of median wall
times (the ratio of minima and of median CPU time, user+sys, are printed too: on a busy machine
CPU time is the steadier signal). Every run is a fresh interpreter with stdout to /dev/null.

Conditions are those of an installed dsv4ctl: bytecode caching on (a ``PYTHONDONTWRITEBYTECODE``
in the environment is dropped; .pyc files go to a throw-away ``PYTHONPYCACHEPREFIX``, so nothing
is written into the checkout).

    .venv/bin/python benchmarks/startup.py              # 15 runs each; exit 1 when a median ratio misses its target
    .venv/bin/python benchmarks/startup.py --report-only  # always exit 0 (just the numbers)
    .venv/bin/python benchmarks/startup.py --imports    # + what the plan run imports (-X importtime)

The CLI is run the way a user runs it: the ``dsv4ctl`` console script next to the interpreter
(``python -m dsv4ctl.cli`` when there is none)."""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COLD = "dsv4ctl plan, profile not seen before"
TARGETS = {"dsv4ctl --help": 2.0, "dsv4ctl plan": 1.6, COLD: 2.0}
REPO = Path(__file__).resolve().parent.parent
# Modules whose cumulative import time --imports reports for the plan run.
WATCH = ("typer", "rich.console", "rich.table", "yaml", "jsonschema", "pydantic", "typer._adapters",
         "typer.rich_utils", "dsv4ctl.profile.model", "dsv4ctl.plan.plan", "dsv4ctl.plan.capacity")


def cli_argv(python: str) -> list[str]:
    """argv prefix that runs dsv4ctl with ``python``: its console script, else ``-m dsv4ctl.cli``."""
    script = Path(python).parent / "dsv4ctl"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [python, "-m", "dsv4ctl.cli"]


def commands(python: str) -> dict[str, list[str]]:
    """The measured commands, by label (the first is the baseline)."""
    cli = cli_argv(python)
    return {
        "baseline: python -c 'import typer'": [python, "-c", "import typer"],
        "dsv4ctl --help": cli + ["--help"],
        "dsv4ctl plan": cli + ["plan"],
        COLD: cli + ["plan"],
    }


def run_once(argv: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds user+sys) of one run; RuntimeError when it exits non-zero (a
    broken CLI is no benchmark). CPU time is less disturbed by other load on the machine."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=REPO)
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {p.returncode}: {p.stderr.decode()[-500:]}")
    return dt, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def measure(python: str, runs: int, tmp: Path) -> dict[str, list[tuple[float, float]]]:
    """Interleaved runs (one warm-up each, not counted): label -> (wall, CPU) seconds per run."""
    env = dict(os.environ, COLUMNS="120", NO_COLOR="1", PYTHONPYCACHEPREFIX=str(tmp / "pyc"), DSV4CTL_CACHE=str(tmp / "cache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cmds = commands(python)

    def env_for(label: str, i: int) -> dict:     # the cold row: an empty cache every run (YAML parsed)
        return dict(env, DSV4CTL_CACHE=str(tmp / f"cold-{i}")) if label == COLD else env

    for label, argv in cmds.items():
        run_once(argv, env_for(label, -1))
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in cmds}
    for i in range(runs):
        for label, argv in cmds.items():
            times[label].append(run_once(argv, env_for(label, i)))
    return times


def import_costs(python: str, tmp: Path) -> list[tuple[str, float]]:
    """Cumulative import time (ms) of WATCH modules in one ``dsv4ctl plan`` run
    (-X importtime; bytecode already cached by :func:`measure`)."""
    argv = [python, "-X", "importtime", "-m", "dsv4ctl.cli", "plan"]
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(tmp / "pyc"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    cum: dict[str, float] = {}
    for line in p.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, c, name = line.split("|")
        name = name.strip()
        if name in WATCH and c.strip().isdigit():
            cum[name] = int(c) / 1000
    return [(m, cum[m]) for m in WATCH if m in cum]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--runs", type=int, default=15, help="measured runs per command (default 15)")
    ap.add_argument("--python", default=sys.executable, help="interpreter of the dsv4ctl install")
    ap.add_argument("--check", action="store_true", help="(the default) exit 1 when a median ratio misses its target")
    ap.add_argument("--report-only", action="store_true", help="print the numbers; exit 0 even when a target is missed")
    ap.add_argument("--imports", action="store_true", help="also print import costs of the plan run")
    a = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="dsv4ctl-startup-") as tmp:
        return report(a, Path(tmp))


def report(a: argparse.Namespace, tmp: Path) -> int:
    """Measure, print the table and the verdict; exit code 1 when a target is missed (unless
    ``--report-only``)."""
    times = measure(a.python, a.runs, tmp)
    labels = list(times)
    base = labels[0]

    def stats(label: str) -> tuple[float, float, float]:
        wall = [w for w, _ in times[label]]
        return statistics.median(wall), min(wall), statistics.median([c for _, c in times[label]])

    bmed, bmin, bcpu = stats(base)
    print(f"start-up, {a.runs} interleaved runs each ({a.python}); load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")
    print(f"{'command':40} {'median ms':>10} {'min ms':>8} {'ratio (median)':>15} {'ratio (min)':>12} "
          f"{'CPU ms':>7} {'CPU ratio':>10}")
    missed = []
    for label in labels:
        med, mn, cpu = stats(label)
        r = med / bmed
        if label in TARGETS and r > TARGETS[label]:
            missed.append(label)
        print(f"{label:40} {med * 1000:10.1f} {mn * 1000:8.1f} {r:15.2f} {mn / bmin:12.2f} "
              f"{cpu * 1000:7.1f} {cpu / bcpu:10.2f}")
    print("targets (median ratio): " + ", ".join(f"{k} <= {v}" for k, v in TARGETS.items()) + ": "
          + ("ok" if not missed else "MISSED " + ", ".join(missed)))
    if a.imports:
        print("cumulative import ms, one `dsv4ctl plan` run (-X importtime; absent = not imported):")
        for mod, ms in import_costs(a.python, tmp):
            print(f"  {mod:24} {ms:8.1f}")
    return 1 if missed and not getattr(a, "report_only", False) else 0


if __name__ == "__main__":
    sys.exit(main())
