"""Slurm benchmark (issue 43): a release swap on Slurm with dsv4ctl beside the same swap done by
hand with SGLang's documented sbatch script, as ratios measured in one run.

The world is the test suite's (tests/test_slurm_deploy.py): four real sshd hosts that are also
the four nodes of a real Slurm cluster (tests/slurm/lab.py), a prefill server over h0+h1 and a
decode server over h2+h3 (SGLang ``--nnodes 2``; the multi-node stand-in), a router on h0.

Per round (``--rounds``, default 3), back to back:

- **dsv4ctl deploy** of a changed serve config (build, push, verify, cancel both jobs, submit the
  new scripts, the health gate through the router): wall time until the command returns
  (healthy), and **dsv4ctl rollback** to the previous release likewise;
- **by hand**: ``scancel`` of both groups' jobs, ``sbatch`` of SGLang's documented script (one
  ``srun`` in the background, a fixed dist-init port, a TCP wait, a bare ``wait``) for each group,
  then polling both servers' ``/health`` until 200 — the same swap without a release, a gate or
  a rollback, done twice (forward and back).

Printed: the medians and ranges, and deploy / by-hand and rollback / by-hand (what dsv4ctl's
release, verification and gate cost on top of the job swap itself)::

    .venv/bin/python benchmarks/slurm.py [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.conftest import worker_index  # noqa: E402
from tests.slurm.lab import SlurmLab, missing  # noqa: E402
from tests.sshd import harness  # noqa: E402
from tests.standin.harness import wait_health as healthy  # noqa: E402
from tests.test_slurm_deploy import SlurmWorld  # noqa: E402

STANDIN = f"{sys.executable} -m tests.sshd.standin_sglang"


def docs_script(w: SlurmWorld, group: str, nodes: list[str], logs: Path) -> str:
    """SGLang's documented multi-node script for ``group`` (docs/references/multi_node_deployment)."""
    cfg = w.cfgdir / f"{group}.yaml"
    return f"""#!/bin/bash
#SBATCH --job-name=byhand-{group}
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --nodelist={','.join(nodes)}
#SBATCH --chdir={REPO}
#SBATCH --output={logs}/{group}-%j.out
HEAD_NODE=$(scontrol show hostname "$SLURM_NODELIST" | head -n 1)
HEAD_ADDR=$(scontrol show node -o "$HEAD_NODE" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')
srun --ntasks=2 --nodes=2 bash -c 'ADDR=$(scontrol show node -o "$SLURMD_NODENAME" | tr " " "\\n" | sed -n "s/^NodeAddr=//p"); \\
  exec {STANDIN} --config {cfg} --host "$ADDR" --port {w.ports[group]} --dist-init-addr '"$HEAD_ADDR:{w.dist[group]}"' \\
  --nnodes 2 --node-rank "$SLURM_NODEID"' &
while ! (exec 3<>/dev/tcp/$HEAD_ADDR/{w.ports[group]}) 2>/dev/null; do sleep 0.2; done
wait
"""


def by_hand_swap(w: SlurmWorld, lab: SlurmLab, logs: Path) -> float:
    """scancel every job, sbatch the documented script for both groups, wait for both /health."""
    t0 = time.monotonic()
    lab.run("scancel", "--partition", lab.partition)
    while lab.run("squeue", "-h", "-p", lab.partition, "-o", "%i").stdout.strip():
        time.sleep(0.05)
    for g, nodes in (("prefill", ["h0", "h1"]), ("decode", ["h2", "h3"])):
        f = logs / f"{g}.sh"
        f.write_text(docs_script(w, g, nodes, logs))
        r = lab.run("sbatch", "--parsable", str(f))
        assert r.returncode == 0, r.stderr
    healthy(f"http://{w.hosts[0].address}:{w.ports['prefill']}")
    healthy(f"http://{w.hosts[2].address}:{w.ports['decode']}")
    return time.monotonic() - t0


def dsv4ctl(w: SlurmWorld, *argv: str) -> float:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "dsv4ctl.cli", *argv], cwd=REPO, capture_output=True, text=True,
                       env={**__import__("os").environ, **w.env()}, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"dsv4ctl {' '.join(argv)}: exit {r.returncode}: {r.stderr[-2000:]}")
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    for why in (missing(), harness.available()):
        if why:
            print(f"benchmarks/slurm.py: {why}", file=sys.stderr)
            return 2
    base = Path(tempfile.mkdtemp(prefix="dsv4ctl-slurm-bench-"))
    cluster = harness.start_cluster(base / "sshd", n=4)
    lab = SlurmLab.start(base / "lab", net=worker_index(), nodes={h.name: h.address for h in cluster.hosts})
    try:
        SlurmWorld.lab = lab
        w = SlurmWorld(cluster, base / "world")
        deploy = ["deploy", str(w.profile), "--tree", str(w.tree), "--base", "v0.5.23", "--accept-new-host-keys", "-q"]
        dsv4ctl(w, *deploy)                                   # the first release (not measured)
        rows: dict[str, list[float]] = {"deploy": [], "rollback": [], "by hand": []}
        logs = base / "byhand"
        logs.mkdir()
        for i in range(a.rounds):
            w.extra["decode"] = {"watchdog-timeout": 900 + i + 1}
            w.write()
            rows["deploy"].append(dsv4ctl(w, *deploy))
            rows["rollback"].append(dsv4ctl(w, "rollback", str(w.profile), "-q"))
            rows["by hand"].append(by_hand_swap(w, lab, logs))
            rows["by hand"].append(by_hand_swap(w, lab, logs))
            lab.run("scancel", "--partition", lab.partition)
            while lab.run("squeue", "-h", "-p", lab.partition, "-o", "%i").stdout.strip():
                time.sleep(0.05)
            dsv4ctl(w, "start", str(w.profile), "-q")         # dsv4ctl's jobs again for the next round
        med = {k: statistics.median(v) for k, v in rows.items()}
        for k, v in rows.items():
            print(f"{k:>9}: median {med[k]:.2f} s (range {min(v):.2f}-{max(v):.2f}, n={len(v)})")
        print(f"deploy-to-healthy   / by-hand swap: {med['deploy'] / med['by hand']:.2f}")
        print(f"rollback-to-healthy / by-hand swap: {med['rollback'] / med['by hand']:.2f}")
        return 0
    finally:
        lab.run("scancel", "--partition", lab.partition)
        lab.stop()
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
