#!/usr/bin/env python3
"""Checkpoint-header benchmark (issue 48.2): ``dsv4ctl plan --json`` of the multi-node Pro profile
whose model is a local checkpoint folder with DeepSeek-V4-Pro's full tensor list, against the same
plan of the shipped model name (no checkpoint read), measured in this one process run.

The folder is synthetic but real to the reader: 64 ``.safetensors`` shards whose headers hold the
published checkpoint's 145,116 tensors (:func:`dsv4ctl.plan.weights.published_inventory`, FP4
experts; names, dtypes, shapes and data offsets as the real files have them) and whose data is a
hole (the files are sparse: 805 GiB apparent, a few MB on disk), its index and ``config.json``.

Rows (median over interleaved pairs of one baseline run and one checkpoint run; CPU time user+sys
of the child, since the machine is shared with other engineers running tests and wall time moves
with their load; RSS the child's peak, ``ru_maxrss``):

* re-plan, the header cache warm (an operator's second ``plan``/``lint``/preflight on the same
  checkpoint): target CPU <= 1.3x and RSS <= 2x the plan without a checkpoint;
* first read, every run an empty header cache (every header parsed; no target, for the record).

    .venv/bin/python benchmarks/checkpoint.py              # 9 pairs per row; exit 1 when a target is missed
    .venv/bin/python benchmarks/checkpoint.py --report-only"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PROFILE = "dsv4-pro-4xh200-pd"
SHARDS = 64
TARGETS = {"re-plan, header cache warm": (1.3, 2.0)}


def write_checkpoint(folder: Path) -> int:
    """The synthetic Pro checkpoint in ``folder`` (see the module docstring); returns its tensor count."""
    from dsv4ctl.plan.weights import published_inventory
    from dsv4ctl.resources import MODELS_DIR
    cfg_text = (MODELS_DIR / "deepseek-v4-pro.json").read_text()
    inv = published_inventory(json.loads(cfg_text), "fp4")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(cfg_text)
    wmap: dict[str, str] = {}
    per = -(-len(inv) // SHARDS)
    for i in range(SHARDS):
        name = f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors"
        header: dict = {"__metadata__": {"format": "pt"}}
        off = 0
        for t in inv[i * per:(i + 1) * per]:
            header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [off, off + t.nbytes]}
            off += t.nbytes
            wmap[t.name] = name
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with open(folder / name, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + off)          # the data: a hole
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
    return len(inv)


def profiles(tmp: Path, ckpt: Path) -> tuple[Path, Path]:
    """(the Pro profile as shipped, a copy whose model is the checkpoint folder)."""
    from dsv4ctl.resources import shipped_dir
    src = shipped_dir("profiles")
    shutil.copytree(src / PROFILE, tmp / PROFILE)
    text = (src / f"{PROFILE}.yaml").read_text()
    shipped = tmp / f"{PROFILE}.yaml"
    shipped.write_text(text)
    local = tmp / f"{PROFILE}-ckpt.yaml"
    assert "\nmodel: deepseek-v4-pro\n" in text
    local.write_text(text.replace("\nmodel: deepseek-v4-pro\n", f"\nmodel: {ckpt}\n"))
    shutil.copytree(src / PROFILE, tmp / f"{PROFILE}-ckpt")
    return shipped, local


def run_once(argv: list[str], env: dict) -> tuple[float, float, int]:
    """(wall s, CPU s user+sys, peak RSS KiB) of one run; RuntimeError unless it exits 0 or 1 (a
    plan that does not fit is still a plan)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=REPO)
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    dt = time.perf_counter() - t0
    if p.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(argv)} exited {p.returncode}: {err.decode()[-500:]}")
    return dt, ru.ru_utime + ru.ru_stime, ru.ru_maxrss


def measure(python: str, runs: int, tmp: Path) -> dict:
    """label -> per pair ((baseline wall, CPU, RSS), (checkpoint wall, CPU, RSS))."""
    ckpt = tmp / "DeepSeek-V4-Pro"
    # written by a child: this process stays small, so the runs it forks start small (ru_maxrss)
    w = subprocess.run([python, __file__, "--write", str(ckpt)], capture_output=True, text=True, cwd=REPO)
    if w.returncode != 0:
        raise RuntimeError(w.stderr[-500:])
    n = int(w.stdout)
    shipped, local = profiles(tmp, ckpt)
    script = Path(python).parent / "dsv4ctl"
    cli = [str(script)] if script.is_file() else [python, "-m", "dsv4ctl.cli"]
    env = dict(os.environ, COLUMNS="120", NO_COLOR="1", PYTHONPYCACHEPREFIX=str(tmp / "pyc"),
               DSV4CTL_CACHE=str(tmp / "cache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    base, mine = cli + ["plan", str(shipped), "--json"], cli + ["plan", str(local), "--json"]
    run_once(base, env)
    run_once(mine, env)                               # fills the header cache
    rows: dict = {"re-plan, header cache warm": [], "first read, header cache empty": []}
    for i in range(runs):
        rows["re-plan, header cache warm"].append((run_once(base, env), run_once(mine, env)))
        cold = dict(env)
        shutil.rmtree(tmp / "cache" / "headers", ignore_errors=True)
        rows["first read, header cache empty"].append((run_once(base, cold), run_once(mine, cold)))
    print(f"checkpoint headers: {n:,} tensors in {SHARDS} shards (data sparse), profile {PROFILE}; {runs} "
          f"interleaved pairs per row; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return rows


def report(a: argparse.Namespace, tmp: Path) -> int:
    """Measure, print the table and the verdict; 1 when a target is missed (unless --report-only)."""
    rows = measure(a.python, a.runs, tmp)
    med = statistics.median
    print("ratio = median over pairs of (plan of the checkpoint folder) / (plan of the shipped model name), same run")
    print(f"{'row':34} {'base CPU ms':>11} {'CPU ms':>8} {'CPU ratio':>10} {'base RSS MB':>11} {'RSS MB':>7} "
          f"{'RSS ratio':>10} {'wall ratio':>11}")
    missed = []
    for label, pairs in rows.items():
        cpu = med([m[1] / b[1] for b, m in pairs])
        rss = med([m[2] / b[2] for b, m in pairs])
        wall = med([m[0] / b[0] for b, m in pairs])
        if label in TARGETS and (cpu > TARGETS[label][0] or rss > TARGETS[label][1]):
            missed.append(label)
        print(f"{label:34} {med([b[1] for b, _ in pairs]) * 1000:11.1f} {med([m[1] for _, m in pairs]) * 1000:8.1f} "
              f"{cpu:10.2f} {med([b[2] for b, _ in pairs]) / 1024:11.1f} {med([m[2] for _, m in pairs]) / 1024:7.1f} "
              f"{rss:10.2f} {wall:11.2f}")
    print("targets: " + ", ".join(f"{k}: CPU <= {c}, RSS <= {r}" for k, (c, r) in TARGETS.items()) + ": "
          + ("ok" if not missed else "MISSED " + ", ".join(missed)))
    return 1 if missed and not a.report_only else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--runs", type=int, default=9, help="measured pairs per row (default 9)")
    ap.add_argument("--python", default=sys.executable, help="interpreter of the dsv4ctl install")
    ap.add_argument("--report-only", action="store_true", help="print the numbers; exit 0 even when a target is missed")
    ap.add_argument("--write", metavar="FOLDER", help="only write the synthetic checkpoint into FOLDER")
    a = ap.parse_args(argv)
    if a.write:
        print(write_checkpoint(Path(a.write)))
        return 0
    with tempfile.TemporaryDirectory(prefix="dsv4ctl-checkpoint-") as tmp:
        return report(a, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
