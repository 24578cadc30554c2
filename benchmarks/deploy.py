"""Deploy benchmark: the real SGLang 0.5.23 Python tree (the PyPI wheel's ``sglang/`` package in
``.venv-oracle``, ~5.8k files, ~117 MiB) deployed with ``dsv4ctl deploy`` to real OpenSSH sshd
hosts on 127.0.0.2-5 (tests/sshd/harness.py), each with its own deploy root, one colocated SGLang
stand-in group started and health-checked on h0. Baselines run in the same process.

Each round (``--rounds``, default 3) uses fresh deploy roots and a cold build cache, and runs:
``rsync -a`` of the tree to 4 hosts and to 1 host (in parallel, fresh folders), a first deploy to
4 hosts, a one-file-change deploy to them (a patch in the series), then the same two deploys to
1 host. Printed (medians over the rounds, with the range):

  1. first deploy wall time vs ``rsync -a`` of the same tree to the same 4 hosts;
  2. after a one-file change: bytes sent per host as a fraction of the tree (target < 1 %) and
     wall time as a fraction of the first deploy (target < 15 %);
  3. 4 hosts vs 1 host wall time (target <= 1.5), for the first deploy and for the one-file
     change, next to ``rsync -a``'s own 4-vs-1 ratio: the simulated hosts share this machine's
     cores, so a CPU-bound full transfer cannot scale better than rsync alone does here.

    bash scripts/oracle-env.sh          # builds .venv-oracle (the sglang 0.5.23 wheel) if missing
    .venv/bin/python benchmarks/deploy.py [--rounds N] [--keep]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.sshd import harness  # noqa: E402
from tests.sshd.world import STANDIN, git  # noqa: E402

SGLANG = REPO / ".venv-oracle" / "lib" / "python3.11" / "site-packages" / "sglang"
CHANGED = "python/sglang/srt/server_args.py"


def make_repo(dst: Path) -> tuple[Path, Path, int, int]:
    """A git checkout with the wheel's sglang package at python/sglang, tagged v0.5.23, and a
    one-file patch. Returns (tree, patch, files, bytes)."""
    shutil.copytree(SGLANG, dst / "python" / "sglang", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    git(dst, "init", "-q")
    git(dst, "add", "-A")
    git(dst, "commit", "-q", "-m", "sglang 0.5.23 (PyPI wheel)")
    git(dst, "tag", "v0.5.23")
    f = dst / CHANGED
    old = f.read_text()
    f.write_text(old.replace("mem_fraction_static: Optional[float] = None",
                             "mem_fraction_static: Optional[float] = None  # dsv4ctl benchmark", 1)
                 if "mem_fraction_static: Optional[float] = None" in old else old + "\n# dsv4ctl benchmark\n")
    patch = dst.parent / "0001-one-file.patch"
    patch.write_text(git(dst, "diff"))
    f.write_text(old)
    files = int(git(dst, "ls-files", "-z").count("\0"))
    nbytes = sum((dst / p).stat().st_size for p in git(dst, "ls-files", "-z").split("\0") if p)
    return dst, patch, files, nbytes


def write_profile(path: Path, c, hosts, roots: dict, tree: Path, port: int) -> Path:
    import yaml
    (path.parent / "colocated.yaml").write_text(yaml.safe_dump({"model-path": "deepseek-ai/DeepSeek-V4-Flash",
                                                                 "served-model-name": "deepseek-v4-flash",
                                                                 "port": port, "tp-size": 1}))
    prof = {"version": 1, "name": "bench", "model": "deepseek-v4-flash",
            "sglang": {"tree": str(tree), "base_ref": "v0.5.23", "series": None},
            "deploy": {"root": "/nonexistent", "keep_releases": 5, "health_timeout_s": 60, "python": sys.executable,
                       "launch": {"server": STANDIN + " --config {config} --host {address} --port {port}"}},
            "hosts": [c.host_yaml(h, roots[h.name]) for h in hosts],
            "groups": [{"name": "colocated", "role": "colocated", "host": hosts[0].name, "gpus": [0], "tp": 1,
                        "serve_config": "colocated.yaml"}]}
    path.write_text(yaml.safe_dump(prof, sort_keys=False))
    return path


def deploy(profile: Path, patches=None) -> tuple[float, dict]:
    from dsv4ctl.deploy import engine
    from dsv4ctl.profile.model import load_profile
    t0 = time.perf_counter()
    rep = engine.deploy(load_profile(profile), engine.Options(), patches=patches)
    return time.perf_counter() - t0, rep


def rsync_baseline(c, hosts, src: Path, dst_of) -> float:
    """``rsync -a`` of the tree to every host in parallel, over the same SSH settings."""
    def one(h):
        ssh = (f"ssh -p {h.port} -i {c.user_key} -o BatchMode=yes -o StrictHostKeyChecking=yes "
               f"-o UserKnownHostsFile={c.known_hosts}")
        subprocess.run(["rsync", "-a", "-e", ssh, f"{src}/", f"{c.user}@{h.address}:{dst_of(h)}/"], check=True)
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(len(hosts)) as ex:
        list(ex.map(one, hosts))
    return time.perf_counter() - t0


def stop_services(roots: dict) -> None:
    import signal
    for r in roots.values():
        for pf in (Path(r) / "run").glob("*.pid"):
            try:
                os.killpg(int(pf.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass


def one_round(work: Path, c, tree: Path, patch: Path, port: int, r: int) -> dict:
    """One round (see the module docstring); every deploy starts with a cold build cache."""
    hosts = c.hosts
    out = {}
    for n in (4, 1):
        d = work / f"round{r}-rsync{n}"
        d.mkdir()
        out[f"rsync{n}"] = rsync_baseline(c, hosts[:n], tree / "python" / "sglang", lambda h, d=d: d / h.name)
    for n in (4, 1):
        os.environ["DSV4CTL_CACHE"] = str(work / f"round{r}-cache{n}")
        roots = {h.name: work / f"round{r}-roots{n}" / h.name for h in hosts[:n]}
        (work / f"round{r}-p{n}").mkdir()
        prof = write_profile(work / f"round{r}-p{n}" / "profile.yaml", c, hosts[:n], roots, tree, port)
        try:
            out[f"first{n}"], rep1 = deploy(prof)
            out[f"delta{n}"], rep2 = deploy(prof, [str(patch)])
        finally:
            stop_services(roots)
        out[f"phases_first{n}"], out[f"phases_delta{n}"] = phases(rep1), phases(rep2)
        out[f"sent{n}"] = max(rep2["hosts"][h]["push"]["bytes_sent"] for h in roots)
        out["tree_bytes"] = rep1["bytes"]
    return out


def phases(rep: dict) -> str:
    return (f"build {rep['build_seconds']:.2f} s, push+verify {rep['push_seconds']:.2f} s, "
            f"switch+restart+gate {rep['activate_seconds']:.2f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds (fresh roots, cold build cache); default 3")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    a = ap.parse_args()
    if not SGLANG.is_dir():
        print(f"benchmark: {SGLANG} missing; run: bash scripts/oracle-env.sh", file=sys.stderr)
        return 2
    why = harness.available()
    if why:
        print(f"benchmark: {why}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="dsv4ctl-bench-"))
    c = None
    try:
        t0 = time.perf_counter()
        tree, patch, files, nbytes = make_repo(work / "sglang")
        print(f"tree: {files} files, {nbytes / 2**20:.1f} MiB (sglang 0.5.23 wheel); git repo in {time.perf_counter() - t0:.1f} s")
        c = harness.start_cluster(work / "sshd", 4)
        port = harness.free_port("127.0.0.2")
        rounds = []
        for r in range(a.rounds):
            rounds.append(one_round(work, c, tree, patch, port, r))
            x = rounds[-1]
            print(f"round {r + 1}: rsync -a 4/1 host(s) {x['rsync4']:.2f}/{x['rsync1']:.2f} s; first deploy 4/1 "
                  f"{x['first4']:.2f}/{x['first1']:.2f} s; one-file change 4/1 {x['delta4']:.2f}/{x['delta1']:.2f} s")
            print(f"         first, 4 hosts: {x['phases_first4']}; one-file change: {x['phases_delta4']}")

        def med(f):
            v = [f(x) for x in rounds]
            return statistics.median(v), min(v), max(v)

        def show(label, f, fmt="{:.2f}", target=""):
            m, lo, hi = med(f)
            rng = f"  (range {fmt.format(lo)}..{fmt.format(hi)})" if len(rounds) > 1 else ""
            print(f"{label:44s} {fmt.format(m):>8s}{target}{rng}")
            return m

        print()
        print(f"medians over {len(rounds)} round(s):")
        show("rsync -a, 4 hosts (s)", lambda x: x["rsync4"])
        show("first deploy, 4 hosts (s)", lambda x: x["first4"])
        show("one-file change, 4 hosts (s)", lambda x: x["delta4"])
        r1 = show("first deploy / rsync -a, 4 hosts", lambda x: x["first4"] / x["rsync4"])
        r2 = show("one-file change / first deploy", lambda x: x["delta4"] / x["first4"], "{:.1%}", "  target < 15 %")
        r3 = show("bytes sent per host / tree, one-file change", lambda x: x["sent4"] / x["tree_bytes"], "{:.3%}",
                  "  target < 1 %")
        r4 = show("4 hosts / 1 host, first deploy", lambda x: x["first4"] / x["first1"], "{:.2f}", "  target <= 1.5")
        r5 = show("4 hosts / 1 host, one-file change", lambda x: x["delta4"] / x["delta1"], "{:.2f}", "  target <= 1.5")
        r6 = show("4 hosts / 1 host, rsync -a (this machine)", lambda x: x["rsync4"] / x["rsync1"])
        print(json.dumps({"rounds": len(rounds), "first_vs_rsync": round(r1, 3), "delta_vs_first": round(r2, 4),
                          "bytes_fraction": round(r3, 6), "hosts4_vs_1_first": round(r4, 3),
                          "hosts4_vs_1_delta": round(r5, 3), "rsync_hosts4_vs_1": round(r6, 3),
                          "raw": [{k: v for k, v in x.items() if not k.startswith("phases")} for x in rounds],
                          "cpus": os.cpu_count(), "load": os.getloadavg()[0]}))
        return 0
    finally:
        if c:
            c.stop()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
