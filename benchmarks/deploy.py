"""Deploy benchmark: the real SGLang 0.5.23 Python tree (the PyPI wheel's ``sglang/`` package in
``.venv-oracle``, ~10k files) deployed with ``dsv4ctl deploy`` to 4 real OpenSSH sshd hosts on
127.0.0.2-5 (tests/sshd/harness.py), each with its own deploy root, one colocated SGLang
stand-in group started and health-checked on h0. Baselines run in the same process.

Prints:
  1. first deploy wall time vs ``rsync -a`` of the same tree to the same 4 hosts (in parallel);
  2. after a one-file change (a patch in the series): bytes sent per host as a fraction of the
     tree (target < 1 %) and wall time as a fraction of the first deploy (target < 15 %);
  3. 4 hosts vs 1 host wall time (target <= 1.5), for a fresh deploy and for the one-file delta.

    bash scripts/oracle-env.sh          # builds .venv-oracle (the sglang 0.5.23 wheel) if missing
    .venv/bin/python benchmarks/deploy.py [--keep]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shutil
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
    from dsv4ctl.profile import load_profile
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    os.environ["DSV4CTL_CACHE"] = str(work / "cache")
    c = None
    try:
        t0 = time.perf_counter()
        tree, patch, files, nbytes = make_repo(work / "sglang")
        print(f"tree: {files} files, {nbytes / 2**20:.1f} MiB (sglang 0.5.23 wheel); git repo in {time.perf_counter() - t0:.1f} s")
        c = harness.start_cluster(work / "sshd", 4)
        hosts = c.hosts
        port = harness.free_port("127.0.0.2")

        # 1. baseline: rsync -a of the same tree to the same 4 hosts
        (work / "rsync").mkdir()
        t_rsync = rsync_baseline(c, hosts, tree / "python" / "sglang", lambda h: work / "rsync" / h.name)

        # first deploy (cold local cache: export + hashes + push + verify + switch + start + gate)
        roots = {h.name: work / "roots4" / h.name for h in hosts}
        (work / "p4").mkdir()
        p4 = write_profile(work / "p4" / "profile.yaml", c, hosts, roots, tree, port)
        t_first, rep1 = deploy(p4)
        # one-file change
        t_delta, rep2 = deploy(p4, [str(patch)])
        sent = [rep2["hosts"][h]["push"]["bytes_sent"] for h in roots]
        stop_services(roots)

        # 3. scaling: fresh roots, warm build cache; 1 host vs 4 hosts, fresh and delta
        res = {}
        for n in (1, 4):
            r = {h.name: work / f"scale{n}" / h.name for h in hosts[:n]}
            (work / f"ps{n}").mkdir()
            prof = write_profile(work / f"ps{n}" / "profile.yaml", c, hosts[:n], r, tree, port)
            tf, _ = deploy(prof)
            stop_services(r)
            td, _ = deploy(prof, [str(patch)])
            stop_services(r)
            res[n] = (tf, td)

        rel_bytes = rep1["bytes"]
        print()
        print(f"rsync -a, 4 hosts:                    {t_rsync:7.2f} s")
        ph = lambda r: (f"build {r['build_seconds']:.2f} s, push+verify {r['push_seconds']:.2f} s, "  # noqa: E731
                        f"switch+restart+gate {r['activate_seconds']:.2f} s")
        print(f"first deploy, 4 hosts:                {t_first:7.2f} s   = {t_first / t_rsync:.2f} x rsync -a  ({ph(rep1)})")
        print(f"one-file change, 4 hosts:             {t_delta:7.2f} s   = {t_delta / t_first:.1%} of the first deploy "
              f"(target < 15 %)  ({ph(rep2)})")
        print(f"  push+verify phase only:             {rep2['push_seconds']:7.2f} s   = "
              f"{rep2['push_seconds'] / rep1['push_seconds']:.1%} of the first push phase")
        print(f"  bytes sent per host: {min(sent):,}..{max(sent):,} of {rel_bytes:,} "
              f"= {max(sent) / rel_bytes:.3%} of the tree (target < 1 %)")
        print(f"fresh deploy 1 host / 4 hosts:        {res[1][0]:7.2f} s / {res[4][0]:.2f} s = {res[4][0] / res[1][0]:.2f} (target <= 1.5)")
        print(f"one-file delta 1 host / 4 hosts:      {res[1][1]:7.2f} s / {res[4][1]:.2f} s = {res[4][1] / res[1][1]:.2f} (target <= 1.5)")
        print(json.dumps({"rsync_s": round(t_rsync, 3), "first_s": round(t_first, 3), "delta_s": round(t_delta, 3),
                          "first_vs_rsync": round(t_first / t_rsync, 3), "delta_vs_first": round(t_delta / t_first, 4),
                          "bytes_fraction": round(max(sent) / rel_bytes, 6),
                          "push_delta_vs_first": round(rep2["push_seconds"] / rep1["push_seconds"], 4),
                          "hosts4_vs_1_fresh": round(res[4][0] / res[1][0], 3),
                          "hosts4_vs_1_delta": round(res[4][1] / res[1][1], 3),
                          "cpus": os.cpu_count(), "load": os.getloadavg()[0]}))
        return 0
    finally:
        if c:
            c.stop()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
