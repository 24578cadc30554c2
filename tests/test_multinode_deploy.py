"""Multi-node servers deployed end to end (issue 25 item 4): four real sshd hosts, a prefill
server over two of them and a decode server over the other two (SGLang ``--nnodes 2``), the
stand-in reproducing SGLang's multi-node start (tests/standin/multinode.py: node 0 serves HTTP
only once node 1 has joined its dist-init address; node 1 serves no HTTP and exits when node 0
goes away)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import run_cli
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.sshd.harness import free_port
from tests.sshd.world import World, http_status, kill_server, wait_for

pytestmark = pytest.mark.sshd


class TwoNodeWorld(World):
    """prefill: nodes h0 (node 0), h1; decode: nodes h2 (node 0), h3; the router on h0. Each
    server is TP2, one GPU per node."""

    def __init__(self, cluster, tmp):
        self.dist = {}
        self.node_env = {}
        super().__init__(cluster, tmp, nhosts=4)

    def write(self) -> None:
        super().write()
        h = self.hosts
        if not self.dist:
            self.dist = {"prefill": free_port(h[0].address), "decode": free_port(h[2].address)}
            self.ports["decode"] = free_port(h[2].address)
            self.ports["router"] = free_port(h[0].address)
        for g in ("prefill", "decode"):
            f = self.cfgdir / f"{g}.yaml"
            cfg = yaml.safe_load(f.read_text())
            cfg.update({"tp-size": 2, "nnodes": 2, "port": self.ports[g], **self.extra[g]})
            f.write_text(yaml.safe_dump(cfg, sort_keys=False))
        prof = yaml.safe_load(self.profile.read_text())
        decode_url = f"http://{h[2].address}:{self.ports['decode']}"
        prof["deploy"]["launch"]["router"] = prof["deploy"]["launch"]["router"].rsplit(" --router ", 1)[0] + \
            " --router " + decode_url
        for grp in prof["groups"]:
            if grp["name"] == "prefill":
                del grp["host"], grp["tp"]
                grp.update(nodes=[h[0].name, h[1].name], dist_init_port=self.dist["prefill"], env=self.node_env)
            elif grp["name"] == "decode":
                del grp["host"], grp["tp"]
                grp.update(nodes=[h[2].name, h[3].name], dist_init_port=self.dist["decode"])
            else:
                grp.update(host=h[0].name, port=self.ports["router"])
        self.profile.write_text(yaml.safe_dump(prof, sort_keys=False))

    def log(self, host: str, group: str) -> str:
        p = self.roots[host] / "logs" / f"{group}.log"
        return p.read_text() if p.exists() else ""

    def starts(self, host: str, group: str) -> list[str]:
        return [ln.split(" release ")[1].split()[0] for ln in self.log(host, group).splitlines()
                if ln.startswith(f"=== dsv4ctl start {group} release ")]


def ps() -> str:
    """Every process (pid, process group, state, command): what a failed liveness assertion shows."""
    import subprocess
    return subprocess.run(["ps", "-eo", "pid,pgid,stat,args"], capture_output=True, text=True).stdout


@pytest.fixture
def world(live_cluster, tmp_path):
    w = TwoNodeWorld(live_cluster, tmp_path)
    yield w
    w.stop_services()


def cli(w, *args, timeout=240):
    return run_cli(*args, str(w.profile), env=w.env(), timeout=timeout)


def test_two_node_servers_deploy_and_a_node_that_fails_puts_every_node_back(world):
    w = world
    h = [x.name for x in w.hosts]
    addr = {x.name: x.address for x in w.hosts}

    # the dry run shows each node's own command line and the gate on node 0 with node 1 alive
    r = cli(w, "deploy", "--dry-run", "-v")
    assert r.code == 0, r.err
    assert f"--nnodes 2 --node-rank 1 --dist-init-addr {addr[h[0]]}:{w.dist['prefill']}" in r.out
    assert f"--nnodes 2 --node-rank 0 --dist-init-addr {addr[h[2]]}:{w.dist['decode']}" in r.out
    assert f"/health = 200 (group prefill, processes alive on {h[1]}," in r.out
    assert f"http://{addr[h[1]]}:{w.ports['prefill']}/health" not in r.out      # node 1 serves no HTTP

    # deploy: every node of both servers runs the release; node 0 serves once node 1 joined
    r = cli(w, "deploy", "--json")
    assert r.code == 0, r.err
    good = r.json()["release"]
    assert w.currents() == {x: good for x in h}
    assert w.starts(h[0], "prefill") == [good] and w.starts(h[1], "prefill") == [good]
    assert w.starts(h[2], "decode") == [good] and w.starts(h[3], "decode") == [good]
    assert w.starts(h[1], "decode") == [] and w.starts(h[3], "prefill") == []
    assert "node 1 joined" in w.log(h[0], "prefill") and "all 2 nodes joined" in w.log(h[2], "decode")
    assert f"joined node 0 at {addr[h[0]]}:{w.dist['prefill']}" in w.log(h[1], "prefill")
    assert http_status(f"http://{addr[h[0]]}:{w.ports['prefill']}/health") == 200
    assert http_status(f"http://{addr[h[2]]}:{w.ports['decode']}/health") == 200
    assert http_status(f"http://{addr[h[0]]}:{w.ports['router']}/health") == 200

    # status: every node, node 1 by its process; logs: every node's log, prefixed with its host
    r = cli(w, "status", "--json")
    assert r.code == 0, r.err
    hosts = r.json()["hosts"]
    node1 = dict(hosts[h[1]]["groups"]["prefill"])
    assert 0 <= node1.pop("uptime_s") < 300
    assert node1 == {
        "role": "prefill", "url": f"http://{addr[h[0]]}:{w.ports['prefill']}", "alive": True,
        "replica": 0, "node": 1, "nnodes": 2, "health": None, "hicache_differences": [],
        "state": "running", "state_detail": "ok", "stopped": None, "port": w.ports["prefill"], "restarts": 0,
        "exit_status": None, "pid": int((w.roots[h[1]] / "run" / "prefill.pid").read_text())}
    assert hosts[h[0]]["groups"]["prefill"]["health"] == "ok" and hosts[h[0]]["groups"]["prefill"]["node"] == 0
    assert set(hosts[h[3]]["groups"]) == {"decode"} and set(hosts[h[0]]["groups"]) == {"prefill", "router"}
    r = cli(w, "status")
    assert "prefill node 1" in r.out and "served by node 0" in r.out
    r = cli(w, "logs", "prefill")
    assert r.code == 0, r.err
    assert f"{h[0]}: [node 0] all 2 nodes joined" in r.out and f"{h[1]}: [node 1] joined node 0 at" in r.out

    # a release whose prefill node 1 cannot start: node 0 waits for it, the gate sees node 1's
    # process gone and every node of both servers goes back to the good release
    w.node_env = {"STANDIN_CRASH_NODE": "1"}
    w.write()
    r = cli(w, "deploy", "--json")
    assert r.code == 1, r.out + r.err
    assert f"rolled back to {good} on all hosts (h0, h1, h2, h3): host {h[1]} group prefill: the server " \
           "process of node 1 (of 2) exited; last log lines: " in r.err
    assert "uncorrectable ECC error" in r.err                  # node 1's log tail is quoted
    assert w.currents() == {x: good for x in h}
    bad = w.starts(h[1], "prefill")[1]
    assert bad != good
    assert w.starts(h[0], "prefill") == [good, bad, good] and w.starts(h[1], "prefill") == [good, bad, good]
    assert w.starts(h[2], "decode") == [good, bad, good] and w.starts(h[3], "decode") == [good, bad, good]
    assert wait_for(lambda: http_status(f"http://{addr[h[0]]}:{w.ports['prefill']}/health") == 200, 30)
    assert w.log(h[0], "prefill").count("all 2 nodes joined") == 2


def test_killing_node_1_stops_node_0_on_its_watchdog(world):
    """SGLang's behaviour the day-2 diagnosis relies on: node 1 gone -> node 0 stalls (/health
    503), then exits on the NCCL watchdog; node 0 gone -> node 1 exits. Then diagnose names the
    lost node, and a runbook's service.start / service.restart bring whole servers back."""
    import os
    import signal
    w = world
    h = [x.name for x in w.hosts]
    r = cli(w, "deploy", "--json")
    assert r.code == 0, r.err
    kill_server(w.roots[h[1]] / "run" / "prefill.pid")
    r = cli(w, "status", "--json")
    assert r.code == 1, r.err
    assert f"{h[1]}/prefill: node 1 of 2: process not running (node 0 stalls in its collectives until its " \
           "watchdog ends it)" in r.json()["unhealthy"]
    assert wait_for(lambda: "exited with status" in w.log(h[0], "prefill"), 30)
    assert "Watchdog caught collective operation timeout: node 1 is gone" in w.log(h[0], "prefill")
    os.killpg(int((w.roots[h[2]] / "run" / "decode.pid").read_text()), signal.SIGKILL)
    assert wait_for(lambda: "exited with status 1" in w.log(h[3], "decode"), 30)
    assert "connection to node 0" in w.log(h[3], "decode")

    # diagnose reads every node: the lost prefill node 1 is the cause (node 0 followed it on its
    # watchdog); the decode's node 0 died first, so node 1's exit is not a second cause
    r = cli(w, "diagnose", "--json", "--window", "0")
    assert r.code == 1, r.err
    doc = r.json()
    pre = doc["groups"]["prefill"]
    assert [(n["node"], n["host"], n["alive"]) for n in pre["nodes"]] == [(0, h[0], False), (1, h[1], False)], \
        (w.log(h[0], "prefill"), (w.roots[h[0]] / "run" / "prefill.pid").read_text(), ps())
    # each node's log where its own host keeps it (every host of this world has its own root)
    assert [n["log_source"] for n in pre["nodes"]] == [f"{x}:{w.roots[x]}/logs/prefill.log" for x in h[:2]]
    lost = pre["findings"][0]
    assert (lost["rule"], lost["host"], lost["severity"]) == ("lost_node", h[1], "crash")
    assert lost["cause"].startswith("node 1 of 2 is dead: node 0 exited on its collective watchdog")
    assert any(e.startswith(f"{h[0]}:") and "Watchdog caught collective operation timeout" in e for e in lost["evidence"])
    dec = doc["groups"]["decode"]
    assert [f["rule"] for f in dec["findings"]] == ["dead_rank"] and dec["findings"][0]["host"] == h[2]
    assert doc["findings"][0]["rule"] == "lost_node"
    assert f"diagnose: prefill: node 1 of 2 is dead" in r.err

    # a runbook's service.start brings each server back whole from the active release (node 0
    # cannot take a node back: every node starts again, each with its own --node-rank) ...
    good = w.currents()[h[0]]
    addr = {x.name: x.address for x in w.hosts}
    book = w.cfgdir / "multinode.yaml"
    book.write_text(yaml.safe_dump({"name": "multinode", "description": "start, then restart, whole servers",
                                    "steps": [{"id": "start", "action": "service.start",
                                               "args": {"groups": ["prefill", "decode"]}}]}))
    r = run_cli("runbook", "run", str(book), str(w.profile), "--yes", env=w.env(), timeout=240)
    assert r.code == 0, r.out + r.err
    assert w.starts(h[0], "prefill") == [good, good] and w.starts(h[1], "prefill") == [good, good]
    assert w.starts(h[2], "decode") == [good, good] and w.starts(h[3], "decode") == [good, good]
    assert http_status(f"http://{addr[h[0]]}:{w.ports['prefill']}/health") == 200
    assert http_status(f"http://{addr[h[2]]}:{w.ports['decode']}/health") == 200
    # ... and service.restart of a running multi-node server stops every node, then starts them all
    book.write_text(yaml.safe_dump({"name": "multinode", "description": "restart a whole server",
                                    "steps": [{"id": "restart", "action": "service.restart",
                                               "args": {"groups": ["decode"]}}]}))
    r = run_cli("runbook", "run", str(book), str(w.profile), "--yes", env=w.env(), timeout=240)
    assert r.code == 0, r.out + r.err
    assert w.starts(h[2], "decode") == [good] * 3 and w.starts(h[3], "decode") == [good] * 3
    assert w.starts(h[0], "prefill") == [good, good]
    assert http_status(f"http://{addr[h[2]]}:{w.ports['decode']}/health") == 200
    for x in (h[2], h[3]):
        recs = [json.loads(ln) for ln in (w.roots[x] / "audit.jsonl").read_text().splitlines()]
        rec = [r for r in recs if r["action"] == "service-restart"]
        assert [(r["result"], r["group"]) for r in rec] == [("ok", "decode")], recs[-3:]


def start_cli(w, *args):
    """``dsv4ctl ARGS PROFILE`` in the background (stderr read while it runs)."""
    import os
    import subprocess
    import sys
    from tests.conftest import REPO
    env = dict(os.environ, COLUMNS="200", NO_COLOR="1", **w.env())
    return subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", *args, str(w.profile)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def lose_host_in_gate(w, host: int, *args) -> tuple[int, str]:
    """Run ``dsv4ctl ARGS``; as its health gate starts (every host switched), kill ``host``'s sshd
    (the host drops off the network; its servers keep running). Returns (exit code, stderr)."""
    p = start_cli(w, *args)
    head = []
    while not any(ln.startswith("dsv4ctl: health: waiting for") for ln in head[-1:]):
        ln = p.stderr.readline()
        assert ln, "".join(head) + p.stderr.read()
        head.append(ln)
    w.c.hosts[host].kill()
    _, err = p.communicate(timeout=180)
    return p.returncode, "".join(head) + err


def test_a_node_lost_in_the_gate_is_no_verdict_and_status_sees_a_split_server(world):
    """Issue 41 item 3: SSH lost to one node during a multi-node gate (deploy, then rollback):
    exit 3 naming the lost host, where every host is, the lock left and the command that
    finishes the job; the release (a rollback's target) is not marked failed; status exits 1 for
    a server whose nodes run different releases (diagnose's release_split rule)."""
    import shlex
    w = world
    h = [x.name for x in w.hosts]
    w.extra["prefill"] = {"standin-startup-s": 3}    # every gate waits 3 s for prefill: time to lose h1 in it
    w.write()
    r = cli(w, "deploy", "--no-preflight", "--json")
    assert r.code == 0, r.err
    a = r.json()["release"]
    w.extra["prefill"]["chunked-prefill-size"] = 4096
    w.write()

    # deploy of b: h1 (prefill node 1) lost in the gate -> the others back on a, h1 left on b
    code, err = lose_host_in_gate(w, 1, "deploy", "--no-preflight")
    assert code == 3, err
    last = err.strip().splitlines()[-1]
    assert "deploy of " in last, err
    b = last.split("deploy of ")[1].split()[0]
    lock = w.roots[h[1]] / ".lock"
    assert last.startswith(f"dsv4ctl: error: deploy of {b} stopped during the health gate: h1 cannot be reached "
                           f"(h1: cannot connect to {w.hosts[1].address}:{w.hosts[1].port}"), last
    assert (f"a lost host is no verdict, {b} is not marked failed. Hosts now: h0, h2, h3 on {a}; h1 still on {b} "
            f"(could not be switched back); lock left on h1 ({lock}). When h1 answers again: dsv4ctl rollback "
            f"{w.profile} --to {a} --break-lock") in last, last
    assert "on all hosts" not in err
    assert w.currents() == {h[0]: a, h[1]: b, h[2]: a, h[3]: a}
    assert lock.is_dir() and not any((w.roots[x] / ".lock").exists() for x in (h[0], h[2], h[3]))
    for x in (h[0], h[2], h[3]):
        rec = w.state(x)["releases"][b]
        assert rec["state"] == "pushed" and rec["interrupted_during"] == "health gate", rec
        assert rec["fault"].startswith("unreachable: h1: cannot connect to"), rec
        assert w.audit(x)[-1]["result"] == "unreachable"
    assert w.state(h[1])["releases"][b]["state"] == "pushed"

    # h1 answers again: status names the split server; the printed command finishes the job
    w.c.hosts[1].start()
    r = cli(w, "status", "--json")
    assert r.code == 1, r.err
    split = [u for u in r.json()["unhealthy"] if "different releases" in u]
    assert split == [f"prefill: the nodes of this server run different releases: finish that deploy or roll back "
                     f"(dsv4ctl rollback) so every node runs one: h0: node 0 runs {a}; h1: node 1 runs {b}"], r.json()
    argv = shlex.split(last.split(" again: ", 1)[1])
    r = run_cli(*argv[1:], env=w.env(), timeout=240)
    assert r.code == 0, r.err
    assert w.currents() == {x: a for x in h} and not lock.exists()
    assert w.state(h[1])["releases"][a]["state"] == "active"

    # both nodes alive and healthy, but node 1's host switched by hand: status was exit 0
    link = w.roots[h[1]] / "current"
    (w.roots[h[1]] / "current.tmp").symlink_to(f"releases/{b}")
    (w.roots[h[1]] / "current.tmp").rename(link)
    r = cli(w, "status", "--json")
    assert r.code == 1 and any("different releases" in u for u in r.json()["unhealthy"]), r.out + r.err
    assert r.json()["hosts"][h[1]]["groups"]["prefill"]["alive"] is True
    (w.roots[h[1]] / "current.tmp").symlink_to(f"releases/{a}")
    (w.roots[h[1]] / "current.tmp").rename(link)

    # a rollback from b to a (older, healthy) loses h1 in its gate: a is not condemned
    r = cli(w, "deploy", "--no-preflight", "--json")
    assert r.code == 0 and r.json()["release"] == b, r.err
    code, err = lose_host_in_gate(w, 1, "rollback")
    assert code == 3, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"dsv4ctl: error: rollback to {a} stopped during the health gate: h1 cannot be reached"), last
    assert (f"{a} is not marked failed. Hosts now: h0, h2, h3 on {b}; h1 still on {a} (could not be switched back); "
            f"lock left on h1 ({lock}). When h1 answers again: dsv4ctl rollback {w.profile} --to {a} --break-lock") \
        in last, last
    assert w.currents() == {h[0]: b, h[1]: a, h[2]: b, h[3]: b}
    for x in (h[0], h[2], h[3]):
        assert w.state(x)["releases"][a]["state"] == "active" and "failed_at" not in w.state(x)["releases"][a]
        assert w.state(x)["releases"][b]["state"] == "active"
    assert lock.is_dir()
