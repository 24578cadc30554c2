#!/usr/bin/env python3
"""Start-up benchmark: CPU time of ``dsv4ctl --help`` and ``dsv4ctl plan`` against the baseline
``python -c "import typer"`` (same interpreter), measured in this one process run, printed as ratios.

Rows and targets (issue 48.1; the ratio is the median over interleaved pairs of one baseline run
and one command run, each pair under the same conditions):

* ``dsv4ctl --help`` <= 1.3 (warm: the command list kept in the cache by an earlier ``--help``,
  :mod:`dsv4ctl.commands.listing`); the same with an empty cache every run (the list drawn by
  typer and kept): no target, it says what the kept list buys;
* ``dsv4ctl plan`` (the embedded default profile), warm: bytecode cached, the profile's parsed YAML
  and the dataclass code in dsv4ctl's cache (an operator's second ``plan``) <= 1.3;
* the same, cold: no bytecode at all for either side of the pair (an empty ``PYTHONPYCACHEPREFIX``
  and ``PYTHONDONTWRITEBYTECODE``: every module, typer's and the standard library's included, is
  compiled from source, as after an install without compiled files), dsv4ctl's cache warm <= 1.6;
* ``dsv4ctl plan`` of the multi-node Pro profile (``dsv4-pro-4xh200-pd``: two servers over two
  hosts each, weights from the published inventory), warm <= 1.6;
* a profile not seen before (every run an empty ``DSV4CTL_CACHE``: PyYAML imported and run, the
  dataclass code compiled and written) <= 2.0;
* ``dsv4ctl plan`` warm without the dataclass code cache (:mod:`dsv4ctl.codecache` replaced by a
  no-op for the run): no target, it says what the cache buys (its row against ``dsv4ctl plan``).

CPU time (user+sys of the child), not wall time, decides: the machine is shared with other
engineers running tests, and their load moves wall time far more than the CPU a run takes; the
median wall ratio is printed beside it. Every run is a fresh interpreter with stdout to /dev/null.

Warm conditions are those of an installed dsv4ctl: bytecode caching on (a ``PYTHONDONTWRITEBYTECODE``
in the environment is dropped; .pyc files go to a throw-away ``PYTHONPYCACHEPREFIX``, so nothing
is written into the checkout).

    .venv/bin/python benchmarks/startup.py              # 15 pairs per row; exit 1 when a ratio misses its target
    .venv/bin/python benchmarks/startup.py --report-only  # always exit 0 (just the numbers)
    .venv/bin/python benchmarks/startup.py --imports    # + what the plan run imports (-X importtime)
    .venv/bin/python benchmarks/startup.py --before DIR  # + each row run from the checkout DIR, same pairs

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

BASELINE = "python -c 'import typer'"
REPO = Path(__file__).resolve().parent.parent
# label -> (arguments after the CLI, conditions, target CPU ratio)
ROWS = {
    "dsv4ctl --help": (["--help"], "warm", 1.3),
    "dsv4ctl --help, list not kept": (["--help"], "new-profile", None),
    "dsv4ctl plan": (["plan"], "warm", 1.3),
    "dsv4ctl plan, cold (no bytecode)": (["plan"], "cold", 1.6),
    "dsv4ctl plan dsv4-pro-4xh200-pd": (["plan", "dsv4-pro-4xh200-pd"], "warm", 1.6),
    "dsv4ctl plan, profile not seen before": (["plan"], "new-profile", 2.0),
    "dsv4ctl plan, no dataclass code cache": (["plan"], "no-code-cache", None),
}
TARGETS = {label: t for label, (_, _, t) in ROWS.items()}
# The plan run of the no-code-cache row: the CLI with dataclass_code_cache() a no-op.
NO_CODE_CACHE = ("import contextlib, sys; import dsv4ctl.codecache as c; c.dataclass_code_cache = contextlib.nullcontext; "
                 "from dsv4ctl.cli import main; sys.argv[0] = 'dsv4ctl'; sys.exit(main())")
# Modules whose cumulative import time --imports reports for the plan run.
WATCH = ("typer", "rich.console", "rich.table", "yaml", "jsonschema", "pydantic", "typer._adapters",
         "typer.rich_utils", "dsv4ctl.profile.model", "dsv4ctl.plan.plan", "dsv4ctl.plan.capacity",
         "dsv4ctl.plan.weights")


def cli_argv(python: str) -> list[str]:
    """argv prefix that runs dsv4ctl with ``python``: its console script, else ``-m dsv4ctl.cli``."""
    script = Path(python).parent / "dsv4ctl"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [python, "-m", "dsv4ctl.cli"]


def run_once(argv: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds user+sys) of one run; RuntimeError when it exits non-zero (a
    broken CLI is no benchmark)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=REPO)
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {p.returncode}: {p.stderr.decode()[-500:]}")
    return dt, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def environment(kind: str, tmp: Path, i: int) -> dict:
    """The environment of both runs of a pair under conditions ``kind`` (``warm``, ``cold``,
    ``new-profile``; ``i`` numbers the pair: a new empty folder per cold or new-profile run)."""
    env = dict(os.environ, COLUMNS="120", NO_COLOR="1", PYTHONPYCACHEPREFIX=str(tmp / "pyc"),
               DSV4CTL_CACHE=str(tmp / "cache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if kind == "cold":
        env.update(PYTHONPYCACHEPREFIX=str(tmp / f"no-pyc-{i}"), PYTHONDONTWRITEBYTECODE="1")
    elif kind == "new-profile":
        env["DSV4CTL_CACHE"] = str(tmp / f"new-{i}")
    return env


def measure(python: str, runs: int, tmp: Path, before: Path | None = None) -> dict[str, list[tuple[float, float, float, float]]]:
    """Interleaved pairs (one warm-up pair per row, not counted): label -> per pair (baseline wall,
    baseline CPU, command wall, command CPU) seconds. ``before``: a checkout whose dsv4ctl runs
    each row too, right after this tree's, against the same baseline run (label + " [before]")."""
    cli = cli_argv(python)
    base = [python, "-c", "import typer"]

    def argv(args: list[str], kind: str, tree: Path | None = None) -> list[str]:
        if tree is not None:        # the checkout's dsv4ctl first on sys.path
            prefix = f"import sys; sys.path.insert(0, {str(tree)!r}); "
            code = NO_CODE_CACHE if kind == "no-code-cache" else "from dsv4ctl.cli import main; sys.argv[0] = 'dsv4ctl'; sys.exit(main())"
            return [python, "-c", prefix + code] + args
        return [python, "-c", NO_CODE_CACHE] + args if kind == "no-code-cache" else cli + args
    for label, (args, kind, _) in ROWS.items():
        run_once(argv(args, kind, REPO if before is not None else None), environment(kind, tmp, -1))
        if before is not None:
            run_once(argv(args, kind, before), environment(kind, tmp, -1))
    times: dict[str, list[tuple[float, float, float, float]]] = {}
    for i in range(runs):
        for label, (args, kind, _) in ROWS.items():
            env = environment(kind, tmp, i)
            bw, bc = run_once(base, env)
            # beside a checkout, both run the same way (python -c, their tree first on sys.path)
            cw, cc = run_once(argv(args, kind, REPO if before is not None else None), env)
            times.setdefault(label, []).append((bw, bc, cw, cc))
            if before is not None:
                if kind in ("cold", "new-profile"):
                    env = environment(kind, tmp, runs + i)     # its own empty folders
                cw, cc = run_once(argv(args, kind, before), env)
                times.setdefault(f"{label} [before]", []).append((bw, bc, cw, cc))
    return times


def import_costs(python: str, tmp: Path) -> list[tuple[str, float]]:
    """Cumulative import time (ms) of WATCH modules in one ``dsv4ctl plan`` run
    (-X importtime; bytecode already cached by :func:`measure`)."""
    argv = [python, "-X", "importtime", "-m", "dsv4ctl.cli", "plan"]
    env = environment("warm", tmp, 0)
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
    ap.add_argument("-n", "--runs", type=int, default=15, help="measured pairs per row (default 15)")
    ap.add_argument("--python", default=sys.executable, help="interpreter of the dsv4ctl install")
    ap.add_argument("--check", action="store_true", help="(the default) exit 1 when a ratio misses its target")
    ap.add_argument("--report-only", action="store_true", help="print the numbers; exit 0 even when a target is missed")
    ap.add_argument("--imports", action="store_true", help="also print import costs of the plan run")
    ap.add_argument("--before", type=Path, metavar="DIR",
                    help="also run every row with the dsv4ctl of the checkout DIR (the code before a change), "
                         "against the same baseline runs; its rows are marked [before] and have no target")
    a = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="dsv4ctl-startup-") as tmp:
        return report(a, Path(tmp))


def report(a: argparse.Namespace, tmp: Path) -> int:
    """Measure, print the table and the verdict; exit code 1 when a target is missed (unless
    ``--report-only``)."""
    times = measure(a.python, a.runs, tmp, getattr(a, "before", None))
    med = statistics.median
    print(f"start-up, {a.runs} interleaved pairs per row ({a.python}); load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs; ratio = median over pairs of command CPU / baseline CPU "
          f"({BASELINE}, same conditions, run just before)")
    print(f"{'command':49} {'base CPU ms':>11} {'CPU ms':>7} {'CPU ratio':>10} {'target':>7} {'wall ratio':>11}")
    missed = []
    for label, pairs in times.items():
        ratio = med([cc / bc for _, bc, _, cc in pairs])
        wall = med([cw / bw for bw, _, cw, _ in pairs])
        goal = TARGETS.get(label)
        if goal is not None and ratio > goal:
            missed.append(label)
        target = "-" if goal is None else f"{goal:.1f}"
        print(f"{label:49} {med([p[1] for p in pairs]) * 1000:11.1f} {med([p[3] for p in pairs]) * 1000:7.1f} "
              f"{ratio:10.2f} {target:>7} {wall:11.2f}")
    print("targets (CPU ratio): " + ("ok" if not missed else "MISSED " + ", ".join(missed)))
    if a.imports:
        print("cumulative import ms, one `dsv4ctl plan` run (-X importtime; absent = not imported):")
        for mod, ms in import_costs(a.python, tmp):
            print(f"  {mod:24} {ms:8.1f}")
    return 1 if missed and not getattr(a, "report_only", False) else 0


if __name__ == "__main__":
    sys.exit(main())
