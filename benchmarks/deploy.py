"""Deploy benchmark: the real SGLang 0.5.23 Python tree (the PyPI wheel's ``sglang/`` package in
``.venv-oracle``, ~5.8k files, ~117 MiB) deployed with ``dsv4ctl deploy`` to real OpenSSH sshd
hosts on 127.0.0.2-17 (tests/sshd/harness.py: 16 sshd, each host its own deploy root), one
colocated SGLang stand-in group started and health-checked on h0. Baselines run in the same
process, over the same SSH settings.

Each round (``--rounds``, default 1) uses fresh deploy roots and a cold build cache, and for each
fleet size N (``--sizes``, default 16,4,1) runs, back to back: ``rsync -a`` of the tree to N hosts
(in parallel, fresh folders), a first deploy to the N hosts, the same ``rsync -a`` again after a
one-file change, and a one-file-change deploy (a patch in the series). Printed (medians over the
rounds, with the range), each ratio with its target and PASS/FAIL:

  1. first deploy / ``rsync -a`` of the same tree to the same N hosts (target <= 1.0, issue 48.3),
     and after a one-file change, the deploy / ``rsync -a``'s own resync (target <= 1.5, issue
     48.3): each twice, to healthy (the deploy's whole wall time, what the operator waits for)
     and to switched (without the server's restart: the stand-in's stop + start on its host and
     the health gate, item 4's "server restart", which no transfer tool pays);
  2. N-host / 1-host wall time of dsv4ctl divided by ``rsync -a``'s own N-host / 1-host ratio on
     this machine (target <= 1.1: the simulated hosts share this machine's cores, so the cores,
     not dsv4ctl, must be what limits the fan-out), for the first deploy and the one-file change;
  3. after a one-file change: bytes sent per host as a fraction of the tree (target < 1 %) and
     wall time as a fraction of the first deploy (target < 15 %);
  4. per deploy, the time dsv4ctl adds beside the transfer and the server restart, by phase
     (build, lock + facts, verify, switch, close-out, other) and, for the largest fleet, per host
     (from the report's per-step ``duration_s`` and the push's ``transfer_seconds`` /
     ``verify_seconds``); "server restart" is the switch on the host where it took longest plus the
     health gate.

    bash scripts/oracle-env.sh          # builds .venv-oracle (the sglang 0.5.23 wheel) if missing
    .venv/bin/python benchmarks/deploy.py [--rounds N] [--sizes 16,4,1] [--keep]

``--two-node`` deploys multi-node servers instead (issue 25): N hosts run N/2 servers of two nodes
each (``--nnodes 2``, node 0 waits for node 1 before it serves), every server restarted and
gated on each deploy; the same ratios against the same ``rsync -a``::

    .venv/bin/python benchmarks/deploy.py --two-node --sizes 16,2,1     # 8 two-node servers on 16 hosts

``--profile-out DIR`` writes a cProfile of every deploy of the largest fleet (to tell dsv4ctl's
own CPU time from the cores' contention).
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
from tests.sshd.world import MEMORY, STANDIN, git  # noqa: E402

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
    f.write_text(changed_text(old))
    patch = dst.parent / "0001-one-file.patch"
    patch.write_text(git(dst, "diff"))
    f.write_text(old)
    files = int(git(dst, "ls-files", "-z").count("\0"))
    nbytes = sum((dst / p).stat().st_size for p in git(dst, "ls-files", "-z").split("\0") if p)
    return dst, patch, files, nbytes


def changed_text(old: str) -> str:
    """The one-file change (the patch, and the baseline's edit of its source folder)."""
    key = "mem_fraction_static: Optional[float] = None"
    return old.replace(key, key + "  # dsv4ctl benchmark", 1) if key in old else old + "\n# dsv4ctl benchmark\n"


def write_profile(path: Path, c, hosts, roots: dict, tree: Path, port: int, two_node: bool = False) -> Path:
    """The benchmark profile for ``hosts``: one colocated TP1 server on h0, or with ``two_node``
    (and an even number of hosts) one two-node TP2 server per pair of hosts (``--nnodes 2``: node
    0 on the even host, each server its own dist-init port), every one started and health-gated."""
    import yaml
    # a serve config the deploy preflight (config lint + plan) passes, as an operator's would
    serve = {"model-path": "deepseek-ai/DeepSeek-V4-Flash", "served-model-name": "deepseek-v4-flash",
             "port": port, "tp-size": 1, "reasoning-parser": "deepseek-v4", "tool-call-parser": "deepseekv4"}
    groups = [{"name": "colocated", "role": "colocated", "host": hosts[0].name, "gpus": [0], "tp": 1,
               "serve_config": "colocated.yaml", "memory": MEMORY}]
    (path.parent / "colocated.yaml").write_text(yaml.safe_dump(serve))
    if two_node and len(hosts) >= 2:
        groups = []
        for i in range(len(hosts) // 2):
            name = f"s{i}"
            (path.parent / f"{name}.yaml").write_text(yaml.safe_dump({**serve, "tp-size": 2, "nnodes": 2}))
            groups.append({"name": name, "role": "colocated", "nodes": [hosts[2 * i].name, hosts[2 * i + 1].name],
                           "gpus": [0], "dist_init_port": harness.free_port(hosts[2 * i].address),
                           "serve_config": f"{name}.yaml", "memory": MEMORY})
    prof = {"version": 1, "name": "bench", "model": "deepseek-v4-flash",
            "sglang": {"tree": str(tree), "base_ref": "v0.5.23", "series": None},
            "deploy": {"root": "/nonexistent", "keep_releases": 5, "health_timeout_s": 60, "python": sys.executable,
                       "launch": {"server": STANDIN + " --config {config} --host {address} --port {port}"}},
            "hosts": [c.host_yaml(h, roots[h.name]) for h in hosts],
            "groups": groups}
    path.write_text(yaml.safe_dump(prof, sort_keys=False))
    return path


class Meter:
    """CPU while a block runs: the machine's busy cores (``/proc/stat``, every process on it:
    the sshd "hosts", rsync, ssh, and anything else running), this process's CPU (dsv4ctl's
    control side: the engine, paramiko, the build's hashing) and its waited-for children's
    (git, tar, rsync and ssh clients)."""

    @staticmethod
    def snap():
        import resource
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return (time.perf_counter(), sum(v) - v[3] - v[4], v[7], me.ru_utime + me.ru_stime,
                kids.ru_utime + kids.ru_stime)

    def __enter__(self):
        self.a = self.snap()
        return self

    def __exit__(self, *exc):
        b, tick = self.snap(), os.sysconf("SC_CLK_TCK")
        wall = b[0] - self.a[0]
        self.cpu = {"wall": wall, "busy_cores": (b[1] - self.a[1]) / tick / wall,
                    "steal_cores": (b[2] - self.a[2]) / tick / wall, "self_s": b[3] - self.a[3],
                    "children_s": b[4] - self.a[4]}
        return False


def deploy(profile: Path, patches=None, prof_out: Path | None = None) -> tuple[float, dict]:
    from dsv4ctl.deploy import engine
    from dsv4ctl.profile.model import load_profile
    pr = None
    if prof_out is not None:
        import cProfile
        pr = cProfile.Profile()
        pr.enable()
    t0 = time.perf_counter()
    rep = engine.deploy(load_profile(profile), engine.Options(), patches=patches)
    wall = time.perf_counter() - t0
    if pr is not None:
        pr.disable()
        pr.dump_stats(str(prof_out))
    return wall, rep


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


def breakdown(rep: dict, wall: float) -> dict:
    """Where a deploy's wall time went, from its report: phases run one after the other (every
    host's lock, then every host's push, …), so a phase's span is its slowest host's step.

    ``transfer``: the slowest host's rsync; ``restart``: the server's stop + start (the switch
    of the host that runs a group) and the health gate; ``added``: the rest of the wall time,
    which is what dsv4ctl adds beside them, by phase."""
    steps = rep["steps"]
    hosts = list(rep["hosts"])

    def of(phase, h=None):
        return [s["duration_s"] for s in steps if s["phase"] == phase and (h is None or s["host"] == h)]

    push = {h: rep["hosts"][h]["push"] for h in hosts}
    per_host = {h: {"lock": sum(of("lock", h)), "transfer": push[h].get("transfer_seconds", 0.0),
                    "verify": push[h].get("verify_seconds", 0.0), "push": sum(of("push", h)),
                    "switch": sum(of("switch", h)), "close": sum(of("close", h))} for h in hosts}
    for v in per_host.values():
        v["push_other"] = max(0.0, v["push"] - v["transfer"] - v["verify"])
    slow = max(hosts, key=lambda h: per_host[h]["push"])          # the push phase's critical path
    span = {k: max(v[k] for v in per_host.values()) for k in ("lock", "push", "switch", "close")}
    # the gate: every worker's /health (together), then the chat completion(s) (timed from then)
    gates = [s for s in steps if s["phase"] == "gate"]
    gate = (max((s["duration_s"] for s in gates if not s["summary"].startswith("POST")), default=0.0)
            + max((s["duration_s"] for s in gates if s["summary"].startswith("POST")), default=0.0))
    group_host = max(hosts, key=lambda h: per_host[h]["switch"])   # where a server restarted (h0, or any node)
    restart = per_host[group_host]["switch"] + gate
    transfer = per_host[slow]["transfer"]
    build = rep.get("build_seconds") or 0.0
    other = wall - build - span["lock"] - span["push"] - span["switch"] - gate - span["close"]
    added = {"build": build, "lock+facts": span["lock"], "verify": per_host[slow]["verify"],
             "push other": per_host[slow]["push_other"],
             "switch": max(0.0, span["switch"] - per_host[group_host]["switch"]),
             "close": span["close"], "other": max(0.0, other)}
    return {"wall": wall, "transfer": transfer, "restart": restart, "gate": gate, "span": span,
            "added": added, "added_total": wall - transfer - restart, "per_host": per_host, "slow": slow,
            "group_host": group_host}


def one_round(work: Path, c, tree: Path, patch: Path, port: int, r: int, sizes: list[int],
              prof_dir: Path | None, two_node: bool = False) -> dict:
    """One round (see the module docstring); every deploy starts with a cold build cache."""
    hosts = c.hosts
    out = {}
    src = tree / "python" / "sglang"
    f = tree / CHANGED
    old = f.read_text()
    for n in sizes:        # each pair of runs back to back: a busy machine slows both alike
        d = work / f"round{r}-rsync{n}"
        d.mkdir()
        os.environ["DSV4CTL_CACHE"] = str(work / f"round{r}-cache{n}")
        roots = {h.name: work / f"round{r}-roots{n}" / h.name for h in hosts[:n]}
        (work / f"round{r}-p{n}").mkdir()
        prof = write_profile(work / f"round{r}-p{n}" / "profile.yaml", c, hosts[:n], roots, tree, port, two_node)
        po = (lambda what: prof_dir / f"round{r}-{what}{n}.prof") if prof_dir and n == max(sizes) else (lambda w: None)
        try:
            with Meter() as m:
                out[f"rsync{n}"] = rsync_baseline(c, hosts[:n], src, lambda h, d=d: d / h.name)
            out[f"cpu_rsync{n}"] = m.cpu
            with Meter() as m:
                out[f"first{n}"], rep1 = deploy(prof, prof_out=po("first"))
            out[f"cpu_first{n}"] = m.cpu
            f.write_text(changed_text(old))
            try:
                with Meter() as m:
                    out[f"rsync_delta{n}"] = rsync_baseline(c, hosts[:n], src, lambda h, d=d: d / h.name)
                out[f"cpu_rsync_delta{n}"] = m.cpu
            finally:
                f.write_text(old)
            with Meter() as m:
                out[f"delta{n}"], rep2 = deploy(prof, [str(patch)], prof_out=po("delta"))
            out[f"cpu_delta{n}"] = m.cpu
        finally:
            stop_services(roots)
            shutil.rmtree(d, ignore_errors=True)
        out[f"bd_first{n}"], out[f"bd_delta{n}"] = breakdown(rep1, out[f"first{n}"]), breakdown(rep2, out[f"delta{n}"])
        out[f"sent{n}"] = max(rep2["hosts"][h]["push"]["bytes_sent"] for h in roots)
        out["tree_bytes"] = rep1["bytes"]
        shutil.rmtree(work / f"round{r}-roots{n}", ignore_errors=True)
        shutil.rmtree(work / f"round{r}-cache{n}", ignore_errors=True)
    return out


def show_breakdown(label: str, b: dict) -> None:
    a = b["added"]
    print(f"  {label}: wall {b['wall']:.2f} s = transfer {b['transfer']:.2f} + server restart {b['restart']:.2f} "
          f"(switch on {b['group_host']} + health gate {b['gate']:.2f}) + dsv4ctl {b['added_total']:.2f} "
          f"({b['added_total'] / b['wall']:.0%})")
    print("      dsv4ctl's part: " + ", ".join(f"{k} {v:.2f}" for k, v in a.items())
          + f"  (push phase: slowest host {b['slow']})")


def show_per_host(label: str, b: dict) -> None:
    print(f"  {label}, per host (s):")
    print("      host  lock+facts  transfer  verify  push-other  switch  close")
    for h, v in b["per_host"].items():
        print(f"      {h:4s}  {v['lock']:10.2f}  {v['transfer']:8.2f}  {v['verify']:6.2f}  {v['push_other']:10.2f}"
              f"  {v['switch']:6.2f}  {v['close']:5.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1, help="rounds (fresh roots, cold build cache); default 1")
    ap.add_argument("--sizes", default="16,4,1",
                    help="fleet sizes, comma-separated; must include 1 (default 16,4,1; at most 100 hosts)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--two-node", action="store_true",
                    help="N hosts run N/2 two-node servers (--nnodes 2) instead of one server on h0; sizes must be "
                         "even or 1 (1 host: the one server)")
    ap.add_argument("--profile-out", metavar="DIR", help="cProfile every deploy of the largest fleet into DIR")
    a = ap.parse_args()
    try:
        sizes = sorted({int(x) for x in a.sizes.split(",")}, reverse=True)
    except ValueError:
        ap.error(f"--sizes {a.sizes!r}: expected comma-separated host counts, e.g. 16,4,1")
    if a.rounds < 1:
        ap.error("--rounds: at least 1")
    if 1 not in sizes or sizes[0] > 100 or len(sizes) < 2 or sizes[-1] < 1:
        ap.error("--sizes: at least two sizes, one of them 1, none below 1 or above 100")
    if a.two_node and any(n % 2 for n in sizes if n != 1):
        ap.error("--two-node: every size but 1 must be even (two hosts per server)")
    if not SGLANG.is_dir():
        print(f"benchmark: {SGLANG} missing; run: bash scripts/oracle-env.sh", file=sys.stderr)
        return 2
    why = harness.available()
    if why:
        print(f"benchmark: {why}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="dsv4ctl-bench-"))
    prof_dir = Path(a.profile_out).resolve() if a.profile_out else None
    if prof_dir:
        prof_dir.mkdir(parents=True, exist_ok=True)
    c = None
    big = sizes[0]
    try:
        t_all = time.perf_counter()
        tree, patch, files, nbytes = make_repo(work / "sglang")
        print(f"tree: {files} files, {nbytes / 2**20:.1f} MiB (sglang 0.5.23 wheel); git repo in "
              f"{time.perf_counter() - t_all:.1f} s; {os.cpu_count()} CPU(s); load average {os.getloadavg()[0]:.2f} "
              "(other processes share the cores: compare runs of one round, made back to back)")
        t0 = time.perf_counter()
        c = harness.start_cluster(work / "sshd", big)
        print(f"{big} sshd hosts on {c.hosts[0].address}..{c.hosts[-1].address} started in "
              f"{time.perf_counter() - t0:.1f} s")
        port = harness.free_port("127.0.0.2")
        rounds = []
        for r in range(a.rounds):
            t0 = time.perf_counter()
            rounds.append(one_round(work, c, tree, patch, port, r, sizes, prof_dir, a.two_node))
            x = rounds[-1]
            print(f"round {r + 1} ({time.perf_counter() - t0:.0f} s):")
            for n in sizes:
                print(f"  {n:2d} host(s): rsync -a {x[f'rsync{n}']:.2f} s, again after a one-file change "
                      f"{x[f'rsync_delta{n}']:.2f} s; first deploy {x[f'first{n}']:.2f} s, one-file change "
                      f"{x[f'delta{n}']:.2f} s")
            for n in sizes:
                show_breakdown(f"first deploy, {n} host(s)", x[f"bd_first{n}"])
                show_breakdown(f"one-file change, {n} host(s)", x[f"bd_delta{n}"])
            print("  CPU (machine-wide busy cores of %d, incl. steal; dsv4ctl's control process; its children):"
                  % os.cpu_count())
            for n in sizes:
                for k, what in (("rsync", "rsync -a"), ("rsync_delta", "rsync -a, one-file change"),
                                ("first", "first deploy"), ("delta", "one-file change")):
                    u = x[f"cpu_{k}{n}"]
                    print(f"      {n:2d} host(s) {what:26s} busy {u['busy_cores']:.2f} (steal {u['steal_cores']:.2f})"
                          f"  control {u['self_s']:6.2f} s  children {u['children_s']:6.2f} s  wall {u['wall']:6.2f} s")
            show_per_host(f"first deploy, {big} hosts", x[f"bd_first{big}"])
            show_per_host(f"one-file change, {big} hosts", x[f"bd_delta{big}"])

        verdicts = []

        def show(label, f, fmt="{:.2f}", target=None):
            v = [f(x) for x in rounds]
            m, lo, hi = statistics.median(v), min(v), max(v)
            rng = f"  (range {fmt.format(lo)}..{fmt.format(hi)})" if len(rounds) > 1 else ""
            tgt = ""
            if target is not None:
                op, lim = target
                ok = m <= lim if op == "<=" else m < lim
                verdicts.append(ok)
                tgt = f"  target {op} {fmt.format(lim)}  {'PASS' if ok else 'FAIL'}"
            print(f"{label:58s} {fmt.format(m):>8s}{tgt}{rng}")
            return m

        print()
        print(f"medians over {len(rounds)} round(s):")
        res = {}
        for n in sizes:
            show(f"rsync -a, {n} host(s) (s)", lambda x: x[f"rsync{n}"])
            show(f"first deploy, {n} host(s) (s)", lambda x: x[f"first{n}"])
            show(f"one-file change, {n} host(s) (s)", lambda x: x[f"delta{n}"])
        for n in sizes:
            if n == 1:
                continue
            res[f"first_vs_rsync_{n}"] = show(f"first deploy to healthy / rsync -a, {n} hosts",
                                              lambda x: x[f"first{n}"] / x[f"rsync{n}"], target=("<=", 1.0))
            res[f"first_switched_vs_rsync_{n}"] = show(
                f"first deploy to switched (no restart) / rsync -a, {n} hosts",
                lambda x: (x[f"first{n}"] - x[f"bd_first{n}"]["restart"]) / x[f"rsync{n}"], target=("<=", 1.0))
        for n in sizes:
            if n == 1:
                continue
            show(f"{n} hosts / 1 host, rsync -a (this machine)", lambda x: x[f"rsync{n}"] / x["rsync1"])
            show(f"{n} hosts / 1 host, first deploy", lambda x: x[f"first{n}"] / x["first1"])
            res[f"scale_first_{n}"] = show(f"  / rsync's {n}/1, first deploy",
                                           lambda x: (x[f"first{n}"] / x["first1"]) / (x[f"rsync{n}"] / x["rsync1"]),
                                           target=("<=", 1.1))
            show(f"{n} hosts / 1 host, rsync -a after a one-file change", lambda x: x[f"rsync_delta{n}"] / x["rsync_delta1"])
            show(f"{n} hosts / 1 host, one-file change", lambda x: x[f"delta{n}"] / x["delta1"])
            res[f"scale_delta_{n}"] = show(f"  / rsync's {n}/1, one-file change",
                                           lambda x: (x[f"delta{n}"] / x["delta1"])
                                           / (x[f"rsync_delta{n}"] / x["rsync_delta1"]), target=("<=", 1.1))
        for n in sizes:
            if n == 1:
                continue
            res[f"bytes_fraction_{n}"] = show(f"bytes sent per host / tree, one-file change, {n} hosts",
                                              lambda x: x[f"sent{n}"] / x["tree_bytes"], "{:.3%}", ("<", 0.01))
            res[f"delta_vs_first_{n}"] = show(f"one-file change / first deploy, {n} hosts",
                                              lambda x: x[f"delta{n}"] / x[f"first{n}"], "{:.1%}", ("<", 0.15))
            # issue 48.3: <= 1.5, as the operator waits (to healthy) and without the server's restart
            # (to switched: the stand-in's stop + start and the health gate taken out; see "server restart")
            res[f"delta_vs_rsync_{n}"] = show(f"one-file change to healthy / rsync -a after it, {n} hosts",
                                              lambda x: x[f"delta{n}"] / x[f"rsync_delta{n}"], target=("<=", 1.5))
            res[f"delta_switched_vs_rsync_{n}"] = show(
                f"one-file change to switched (no restart) / rsync -a after it, {n} hosts",
                lambda x: (x[f"delta{n}"] - x[f"bd_delta{n}"]["restart"]) / x[f"rsync_delta{n}"], target=("<=", 1.5))
            show(f"  its server restart (stop + start + health gate), {n} hosts (s)",
                 lambda x: x[f"bd_delta{n}"]["restart"])
        for n in sizes:
            show(f"dsv4ctl's part of the first deploy, {n} host(s) (s)", lambda x: x[f"bd_first{n}"]["added_total"])
            show(f"dsv4ctl's part of the one-file change, {n} host(s) (s)",
                 lambda x: x[f"bd_delta{n}"]["added_total"])
        print(f"targets: {sum(verdicts)}/{len(verdicts)} PASS; whole benchmark {time.perf_counter() - t_all:.0f} s")
        print(json.dumps({"rounds": len(rounds), "sizes": sizes, **{k: round(v, 4) for k, v in res.items()},
                          "raw": [{k: v for k, v in x.items() if not k.startswith(("bd_", "cpu_"))} for x in rounds],
                          "cpus": os.cpu_count(), "load": os.getloadavg()[0]}))
        return 0
    finally:
        if c:
            c.stop()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
