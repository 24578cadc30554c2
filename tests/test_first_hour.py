"""A newcomer's first hour (issue 31 item 4), as one test: every command the README walks a new
operator through, in order, each with the exit code the README and ``--help`` document.

    profile init -> plan -> (edit the profile for the real hosts) -> facts --write -> deploy
    -> check load -> promote -> hicache off --remote -> rollback -> lock -> exec, limited deploys
    -> stop/status/start -> report

Real parts: one real OpenSSH sshd host (127.0.W.2, throwaway keys, known_hosts verified), real
rsync and git, the release launcher, real HTTP. Stand-ins, for what cannot run here (no GPU):
``nvidia-smi`` prints eight idle B200 rows (tests/sshd/gpuhost.py), the SGLang servers are the
DeepSeek-V4 stand-in (tests/standin: SGLang's real output path), the router the sshd stand-in
router, and the SGLang tree is a small git tree tagged v0.5.23 (tests/sshd/world.py; it cannot take
the real patch series, so the operator's edit sets ``series: null`` and, as a stock tree stores
the index-K in fp8, ``index_k_dtype: fp8``: with bf16 and HiCache on, ``config lint`` asks the tree
whether its index-K reads wait for HiCache's layer loads, and this tree has no SGLang sources). The operator's edits are
the ones the README asks for (hosts, tree, deploy root) plus the launch commands of the stand-ins
and free ports, made as text edits that keep every comment, as in an editor.

Part 2 (:func:`test_first_hour_part_2_a_two_node_server`): the first time with a server over two
nodes (SGLang ``--nnodes 2``), on the four session sshd hosts of tests/test_multinode_deploy.py's
world (prefill over h0+h1, decode over h2+h3, the router on h0; each host its own root): plan's
ranks per node, the deploy (every node switched, node 0 gated), status per node, ``logs --host``
of node 1, ``exec`` over both nodes, stop/status/start of the whole server, and ``diagnose`` naming
node 1, lost, with node 1's own log path. A second test rather than a second host in the first:
the one-host first hour runs the shipped profile's groups on one host, a two-node server needs
other hosts, and the session cluster already has them."""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import signal
import sys

import pytest
import yaml

from tests.conftest import run_cli
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.sshd.gpuhost import idle_gpus, start_gpu_cluster
from tests.sshd.harness import free_port
from tests.sshd.world import REPO, STANDIN as ROUTER_STANDIN, http_status, kill_server, make_tree
from tests.test_multinode_deploy import TwoNodeWorld

pytestmark = pytest.mark.sshd

SERVER = (f"env PYTHONPATH={REPO} {{python}} -m tests.standin.server --config {{config}} --host {{address}} "
          f"--port {{port}} --ttft-ms 2 --itl-ms 0")
B200_MIB, B200_FREE_MIB = 183359, 181760       # nvidia-smi memory.total / memory.free of an idle B200 (stand-in)


@pytest.fixture
def host(tmp_path):
    from tests.sshd import harness
    why = harness.available()
    if why:
        pytest.skip(why)
    c, bin_ = start_gpu_cluster(tmp_path / "hosts")
    idle_gpus(bin_, "NVIDIA B200", 8, B200_MIB, B200_FREE_MIB)
    yield c
    c.stop()


def replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def test_first_hour(tmp_path, host):
    h = host.hosts[0]
    env = {"DSV4CTL_CACHE": str(tmp_path / "cache"), "DSV4CTL_STATE_DIR": str(tmp_path / "state")}
    prof = tmp_path / "ops" / "prod.yaml"
    prof.parent.mkdir()
    root = tmp_path / "srv"

    def cli(*args, timeout=300):
        return run_cli(*args, env=env, timeout=timeout)

    try:
        # 1. a profile of one's own, from the shipped one (the README's first command)
        r = cli("profile", "init", str(prof))
        assert r.code == 0, r.err
        assert (prof.parent / "prod" / "prefill.yaml").is_file() and (prof.parent / "prod" / "decode.yaml").is_file()
        assert str(REPO) not in prof.read_text()          # portable: no path of this installation in it

        # 2. plan it: ok (both groups tight: SGLang's activation heuristic), exit 0
        r = cli("plan", str(prof), "--json")
        assert r.code == 0, r.err
        (tmp_path / "plan.json").write_text(r.out)
        assert r.json()["ok"] is True
        assert {g["name"]: g["verdict"]["level"] for g in r.json()["groups"]} == {"prefill": "tight", "decode": "tight"}

        # 3. the operator's edits: the real host, the SGLang tree, where releases go; here also how
        #    the stand-ins start and free ports (the shipped 30000/30001/8998/8000 may be taken)
        tree = make_tree(tmp_path / "sglang", files=8)
        ports = {k: free_port(h.address) for k in ("prefill", "decode", "bootstrap", "router")}
        text = prof.read_text()
        text = replace_once(text, "    address: 127.0.0.1 ", f"    address: {h.address} ")
        text = replace_once(text, "    ssh: {user: sglang, port: 22, key: ~/.ssh/id_ed25519}",
                            f"    ssh: {{user: {host.user}, port: {h.port}, key: {host.user_key}, "
                            f"known_hosts: {host.known_hosts}}}")
        text = replace_once(text, "  tree: null ", f"  tree: {tree} ")
        text = re.sub(r"(?m)^  series: \S+", "  series: null", text)
        text = re.sub(r"(?m)^  index_k_dtype: bf16", "  index_k_dtype: fp8", text)     # a stock tree: fp8
        text = replace_once(text, "  root: /srv/dsv4ctl", f"  root: {root}\n  python: {sys.executable}\n"
                            f"  launch:\n    server: \"{SERVER}\"\n"
                            f"    router: \"{ROUTER_STANDIN} --host {{address}} --port {{port}} --router "
                            f"http://{h.address}:{ports['decode']}\"")
        text = replace_once(text, "  health_timeout_s: 900", "  health_timeout_s: 60")
        text = replace_once(text, "  concurrency: 64", "  concurrency: 16\n  turns: 2")
        text = replace_once(text, "    port: 8000", f"    port: {ports['router']}")
        prof.write_text(text)
        for g, shipped_port in (("prefill", 30000), ("decode", 30001)):
            cfg = prof.parent / "prod" / f"{g}.yaml"
            t = replace_once(cfg.read_text(), f"\nport: {shipped_port}\n", f"\nport: {ports[g]}\n")
            cfg.write_text(replace_once(t, "disaggregation-bootstrap-port: 8998", f"disaggregation-bootstrap-port: {ports['bootstrap']}"))
        r = cli("config", "lint", str(prof))
        assert r.code == 0, r.out + r.err

        # 4. measure the GPUs and write what was measured into the profile
        r = cli("facts", str(prof), "--write", "--json")
        assert r.code == 0, r.err
        assert r.json()["written"] == ["prefill", "decode"]
        measured = round(B200_FREE_MIB / 1024 - 1.0, 3)
        assert "# measured by dsv4ctl facts" in prof.read_text()
        mem = [g["memory"]["free_gib_before_load"] for g in yaml.safe_load(prof.read_text())["groups"][:2]]
        assert all(len(m) == 4 and abs(m[0] - measured) < 1.5 for m in mem), mem

        # 5. the first deploy: a release, pushed, switched, started, health-gated
        r = cli("deploy", str(prof), "--json")
        assert r.code == 0, r.err
        first = r.json()["release"]
        assert http_status(f"http://{h.address}:{ports['router']}/health") == 200

        # 6. the load check through the router, at the profile's gate
        r = cli("check", "load", "-p", str(prof), "--json", "--turns", "2", "-c", "16", timeout=600)
        assert r.code == 0, r.err
        (tmp_path / "load.json").write_text(r.out)
        assert r.json()["pass"] is True and [lv["concurrency"] for lv in r.json()["levels"]] == [16]

        # 7. promote the release by hand: smoke + the profile's load gate, evidence kept
        r = cli("promote", first, str(prof), "--json", timeout=600)
        assert r.code == 0, r.err
        st = json.loads((root / "state.json").read_text())
        assert st["releases"][first]["state"] == "good"

        # 8. HiCache off on the running deployment: a new release with the edited serve configs,
        #    with a reason; releases says what that release changed
        r = cli("hicache", "off", str(prof), "--remote", "-m", "KV pressure test")
        assert r.code == 0, r.err
        changed = (root / "current").resolve().name
        assert changed != first
        assert "enable-hierarchical-cache: false" in (prof.parent / "prod" / "prefill.yaml").read_text()
        undo = [ln for ln in r.out.splitlines() if ln.startswith(f"released {changed} (from {first})")]
        assert len(undo) == 1 and undo[0].endswith(f"dsv4ctl rollback {prof} --to {first} undoes it"), r.out
        heads = [ln for ln in r.out.splitlines() if ln.startswith(("--- ", "+++ "))]
        assert len(heads) == 2 and all(ln.endswith(f"({first})" if ln[0] == "-" else f"({changed})") for ln in heads)
        r = cli("releases", str(prof))
        row = next(ln for ln in r.out.splitlines() if changed in ln)
        assert r.code == 0 and "hicache-off prefill,decode (from " in row and '"KV pressure test"' in row, r.out

        # 9. the undo hint, as printed, in the profile's folder: back on the promoted release
        argv = shlex.split(undo[0][undo[0].index("dsv4ctl rollback "):-len(" undoes it")])
        assert argv[0] == "dsv4ctl"
        r = run_cli(*argv[1:], env=env, cwd=prof.parent, timeout=300)
        assert r.code == 0, r.err
        assert (root / "current").resolve().name == first
        assert json.loads((root / "state.json").read_text())["releases"][first]["state"] == "good"
        assert http_status(f"http://{h.address}:{ports['router']}/health") == 200

        # 9b. a lock taken by hand: the deploy it refuses prints the release hint, which works as typed
        r = cli("lock", "acquire", str(prof), "-m", "disk swap")
        assert r.code == 0, r.err
        r = cli("restart", str(prof), "--break-lock")
        assert r.code == 3 and f"dsv4ctl lock release {prof} when the work it names is done" in r.err, r.err
        r = run_cli("lock", "release", str(prof), "-m", "swap done", env=env, cwd=prof.parent)
        assert r.code == 0 and "released the lock" in r.out, r.err
        assert not (root / ".lock").exists()

        # 9c. one command on the decode group's host, in its release; a limited deploy: this host runs
        #     every group, so -g decode alone is refused and --host lists that host's steps
        name = yaml.safe_load(prof.read_text())["hosts"][0]["name"]
        r = cli("exec", "decode", str(prof), "-m", "where", "--", 'pwd -P; echo "$DSV4CTL_RELEASE"')
        assert r.code == 0 and r.out.splitlines() == [f"{name}: {root.resolve()}/releases/{first}", f"{name}: {first}"], \
            r.out + r.err
        r = cli("deploy", str(prof), "-g", "decode", "--dry-run")
        assert r.code == 2 and f"host {name} also runs prefill, router" in r.err, r.err
        r = cli("deploy", str(prof), "--host", name, "--dry-run")
        assert r.code == 0 and f"only (--host {name}) (nothing changed)" in r.out.splitlines()[0], r.out + r.err

        # 9d. the decode group stopped on purpose is "stopped" (by whom, when, why: from the audit),
        #     not a crash; started again it is "running" with its pid, port, uptime and restarts
        r = cli("stop", str(prof), "-g", "decode", "-m", "disk swap")
        assert r.code == 0, r.err
        r = cli("status", str(prof), "--json")
        g = r.json()["hosts"][name]["groups"]["decode"]
        assert (g["state"], g["alive"], g["pid"], g["stopped"]["message"]) == ("stopped", False, None, "disk swap"), g
        assert g["state_detail"].startswith("stopped by ") and "crashed" not in r.err, r.err
        r = cli("status", str(prof))
        assert f"{name}/decode: stopped: stopped by " in r.out and '("disk swap")' in r.out, r.out
        r = cli("start", str(prof), "-g", "decode", "-m", "swap done")
        assert r.code == 0, r.err
        r = cli("status", str(prof), "--json")
        assert r.code == 0, r.err
        g = r.json()["hosts"][name]["groups"]["decode"]
        pid = int((root / "run" / "decode.pid").read_text())
        assert (g["state"], g["pid"], g["port"], g["stopped"]) == ("running", pid, ports["decode"], None), g
        assert g["restarts"] >= 1 and 0 <= g["uptime_s"] < 300, g

        # 10. one HTML report of the plan and the load check
        out = tmp_path / "report.html"
        r = cli("report", str(tmp_path / "plan.json"), str(tmp_path / "load.json"), "-o", str(out))
        assert r.code == 0, r.err
        html = out.read_text()
        assert "<svg" in html and "tight" in html
    finally:                          # the servers the launcher started, whatever step failed
        for pf in (root / "run").glob("*.pid") if (root / "run").exists() else []:
            try:
                os.killpg(int(pf.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError, PermissionError):
                pass


@pytest.fixture
def two_node(live_cluster, tmp_path):
    w = TwoNodeWorld(live_cluster, tmp_path)
    yield w
    w.stop_services()


def status_rows(out: str) -> dict:
    """``status``'s table as {(host, group): (state, pid, port, restarts)} (the cells as printed)."""
    rows = {}
    for ln in out.splitlines():
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if ln.startswith("| h") and len(cells) > 7:
            rows[(cells[0], cells[1])] = (cells[2], cells[4], cells[5], cells[7])
    return rows


def names(w) -> tuple:
    """The two-node world's host names (h0..h3), {host: address}, {host: root}, prefill's HTTP port
    and its dist-init port."""
    h = [x.name for x in w.hosts]
    return h, {x.name: x.address for x in w.hosts}, dict(w.roots), w.ports["prefill"], w.dist["prefill"]


def plan_and_deploy_two_nodes(w) -> str:
    """Part 2, steps 1-2: plan's ranks per node, then the deploy; returns the release."""
    h, addr, root, pre_port, dist = names(w)
    cli = functools.partial(run_cli, env=w.env(), timeout=240)

    # 1. plan: each server's ranks and the host (node) each rank runs on
    r = cli("plan", str(w.profile), "--json")
    assert r.code == 0, r.err
    ranks = {g["name"]: [(k["rank"], k["node"], k["host"], k["gpu"]) for k in g["ranks"]] for g in r.json()["groups"]}
    assert ranks == {"prefill": [(0, 0, h[0], 0), (1, 1, h[1], 0)], "decode": [(0, 0, h[2], 0), (1, 1, h[3], 0)]}
    r = cli("plan", str(w.profile))
    head, gpus = (next(ln for ln in r.out.splitlines() if ln.startswith(f"| {k} ")) for k in ("per rank", "GPUs"))
    assert [c.strip() for c in head.strip("|").split("|")][1:] == ["prefill ranks 0-1", "decode ranks 0-1"], r.out
    assert f"{h[0]}: 0 · {h[1]}: 0" in gpus and f"{h[2]}: 0 · {h[3]}: 0" in gpus, r.out

    # 2. deploy: the dry run shows node 1's own command line and the gate on node 0 with node 1 alive;
    #    the deploy switches every node, node 0 serves once node 1 has joined
    r = cli("deploy", str(w.profile), "--dry-run", "-v")
    assert r.code == 0, r.err
    assert f"--nnodes 2 --node-rank 1 --dist-init-addr {addr[h[0]]}:{dist}" in r.out
    assert f"/health = 200 (group prefill, processes alive on {h[1]}," in r.out
    assert f"http://{addr[h[1]]}:{pre_port}/health" not in r.out              # node 1 serves no HTTP
    r = cli("deploy", str(w.profile), "--json")
    assert r.code == 0, r.err
    rel = r.json()["release"]
    assert w.currents() == {x: rel for x in h} and w.starts(h[1], "prefill") == [rel]
    assert "health: waiting for 2 worker(s)" in r.err                        # the two node 0s, not four nodes
    assert "node 1 joined" in w.log(h[0], "prefill")
    assert http_status(f"http://{addr[h[0]]}:{w.ports['router']}/health") == 200
    return rel


def look_at_two_nodes(w, rel: str) -> None:
    """Part 2, steps 3-5: status per node, node 1's log, exec over both nodes."""
    h, addr, root, pre_port, dist = names(w)
    cli = functools.partial(run_cli, env=w.env(), timeout=240)

    # 3. status: one row per node, node 1 "served by node 0"
    r = cli("status", str(w.profile))
    assert r.code == 0, r.err
    rows = status_rows(r.out)
    pid1 = (root[h[1]] / "run" / "prefill.pid").read_text().strip()
    assert rows[(h[0], "prefill node 0")][0] == "running", r.out
    assert rows[(h[1], "prefill node 1")] == ("running", pid1, str(pre_port), "0"), r.out
    assert rows[(h[3], "decode node 1")][0] == "running", r.out
    assert f"served by node 0 (http://{addr[h[0]]}:{pre_port})" in r.out

    # 4. node 1's log, on its own host
    r = cli("logs", "prefill", str(w.profile), "--host", h[1], "-n", "5")
    assert r.code == 0, r.err
    assert r.out.strip() and all(ln.startswith(f"{h[1]}: ") for ln in r.out.splitlines()), r.out
    assert f"{h[1]}: [node 1] joined node 0 at {addr[h[0]]}:{dist} (nnodes 2)" in r.out

    # 5. one command on every node of the server, each line prefixed with its host and node
    r = cli("exec", "prefill", str(w.profile), "--", 'echo "rank $DSV4CTL_NODE_RANK"; pwd -P')
    assert r.code == 0, r.err
    assert sorted(r.out.splitlines()) == sorted([
        f"{h[0]}/node0: rank 0", f"{h[0]}/node0: {root[h[0]].resolve()}/releases/{rel}",
        f"{h[1]}/node1: rank 1", f"{h[1]}/node1: {root[h[1]].resolve()}/releases/{rel}"]), r.out
    assert f"{h[1]}/node1: exit 0 (release {rel})" in r.err


def stop_start_lose_node_1(w, rel: str) -> None:
    """Part 2, steps 6-8: the server stopped, started, then node 1 lost and diagnosed."""
    h, addr, root, pre_port, dist = names(w)
    cli = functools.partial(run_cli, env=w.env(), timeout=240)
    pid1 = (root[h[1]] / "run" / "prefill.pid").read_text().strip()

    # 6. node 1's host taken out for a cable swap: the whole server stops (node 0 too, a server
    #    cannot run without a node), both nodes "stopped" by whom and why, decode untouched, exit 0
    r = cli("stop", str(w.profile), "--host", h[1], "-m", "cable swap")
    assert r.code == 0, r.err
    r = cli("status", str(w.profile), "--json")
    assert r.code == 0 and r.json()["unhealthy"] == [], r.out + r.err
    hosts = r.json()["hosts"]
    got = {(x, n["node"]): (n["state"], n["alive"], n["pid"], (n["stopped"] or {}).get("message"))
           for x in h for g, n in hosts[x]["groups"].items() if g != "router"}
    assert got == {(h[0], 0): ("stopped", False, None, "cable swap"), (h[1], 1): ("stopped", False, None, "cable swap"),
                   (h[2], 0): ("running", True, hosts[h[2]]["groups"]["decode"]["pid"], None),
                   (h[3], 1): ("running", True, hosts[h[3]]["groups"]["decode"]["pid"], None)}, got
    r = cli("status", str(w.profile))
    rows = status_rows(r.out)
    assert (rows[(h[0], "prefill node 0")][0], rows[(h[1], "prefill node 1")][0]) == ("stopped", "stopped"), r.out
    assert f'{h[1]}/prefill: stopped: stopped by ' in r.out and '("cable swap")' in r.out, r.out

    # 7. started again: every node running, a new process on each, one restart
    r = cli("start", str(w.profile), "-g", "prefill", "-m", "swap done")
    assert r.code == 0, r.err
    r = cli("status", str(w.profile), "--json")
    assert r.code == 0, r.err
    hosts = r.json()["hosts"]
    for x, node in ((h[0], 0), (h[1], 1)):
        n = hosts[x]["groups"]["prefill"]
        pid = int((root[x] / "run" / "prefill.pid").read_text())
        assert (n["node"], n["state"], n["pid"], n["port"], n["restarts"], n["stopped"]) == \
            (node, "running", pid, pre_port, 1, None), n
    assert int(pid1) != hosts[h[1]]["groups"]["prefill"]["pid"]
    assert w.starts(h[1], "prefill") == [rel, rel]

    # 8. node 1's process killed: diagnose names node 1 on its host, lost, citing its own log
    kill_server(root[h[1]] / "run" / "prefill.pid")
    log1 = f"{h[1]}:{root[h[1]]}/logs/prefill.log"
    r = cli("diagnose", str(w.profile), "-g", "prefill", "--window", "0", "--json")
    assert r.code == 1, r.err
    pre = r.json()["groups"]["prefill"]
    assert [(n["node"], n["host"], n["log_source"]) for n in pre["nodes"]] == \
        [(0, h[0], f"{h[0]}:{root[h[0]]}/logs/prefill.log"), (1, h[1], log1)]
    assert pre["nodes"][1]["alive"] is False
    lost = pre["findings"][0]
    assert (lost["rule"], lost["host"], lost["severity"], lost["detail"]["node"]) == ("lost_node", h[1], "crash", 1)
    assert lost["cause"].startswith("node 1 of 2 is dead") and f"{h[1]}: node 1 process not running" in lost["evidence"]
    assert any(e.startswith(f"{log1}:") and "[node 1] joined node 0" in e for e in lost["evidence"]), lost["evidence"]
    r = cli("diagnose", str(w.profile), "-g", "prefill", "--window", "0")
    assert r.code == 1 and r.out.startswith(f"{h[1]}/prefill: [crash] node 1 of 2 is dead"), r.out + r.err
    assert f"    {log1}:" in r.out, r.out


def test_first_hour_part_2_a_two_node_server(two_node):
    rel = plan_and_deploy_two_nodes(two_node)
    look_at_two_nodes(two_node, rel)
    stop_start_lose_node_1(two_node, rel)
