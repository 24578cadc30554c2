"""Diagnosis of a server over several nodes (``--nnodes``): :func:`diagnose_server` over every
node's evidence, from the synthetic ``mn_*.log`` fixtures (each names the message it follows)."""

from __future__ import annotations

from dsv4ctl.diagnose.rules import Evidence, diagnose_server
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "diagnose"
HEALTHY = "\n" + (DATA / "healthy.log").read_text().split("\n", 1)[1]


def _log(name: str) -> str:
    return "\n" + (DATA / name).read_text().split("\n", 1)[1]


def _node(node: int, log: str = HEALTHY, *, alive=True, exit_status=None, health=None, release="r2",
          host=None) -> Evidence:
    host = host or f"h{node}"
    return Evidence(group="prefill", host=host, role="prefill", alive=alive, exit_status=exit_status, log=log,
                    log_source=f"{host}:/srv/dsv4/logs/prefill.log", health=health, node=node, nnodes=2,
                    release=release, dist_init="10.0.0.1:5000")


def _rules(fs):
    return [(f.rule, f.host, f.severity) for f in fs]


def test_two_healthy_nodes_are_healthy():
    fs = diagnose_server([_node(0, health="ok"), _node(1)])
    assert _rules(fs) == [("healthy", "h0", "ok")]


def test_one_node_is_the_single_host_diagnosis():
    one = Evidence(group="prefill", host="h0", log=HEALTHY, health="ok", alive=True)
    assert _rules(diagnose_server([one])) == [("healthy", "h0", "ok")]


def test_dead_node_1_with_node_0_stuck_is_a_lost_node_on_node_1():
    fs = diagnose_server([_node(0, health="GET /health: HTTP 503"),
                          _node(1, HEALTHY, alive=False,
                                exit_status=137)])
    f = fs[0]
    assert (f.rule, f.host, f.severity, f.runbook) == ("lost_node", "h1", "crash", None)
    assert "node 1 of 2 is dead" in f.cause and "stays stuck in a collective" in f.cause
    assert "HTTP 503" in f.cause
    assert f.evidence[0] == "h1: node 1 process not running, exit status 137"
    assert f.detail["node"] == 1 and f.detail["node0_alive"] is True
    assert [x.rule for x in fs] == ["lost_node"]       # node 0 alive: no unknown/healthy beside it


def test_node_0_exited_on_its_watchdog_after_losing_node_1():
    fs = diagnose_server([_node(0, _log("mn_node0_collective_timeout.log"), alive=False, exit_status=134,
                                health="cannot connect to 10.0.0.1:30000 (connection refused)"),
                          _node(1, _log("mn_node1_oom.log"), alive=False, exit_status=1)])
    rules = _rules(fs)
    assert rules[0] == ("cuda_oom", "h1", "crash")                 # the root cause, on node 1's host
    assert ("lost_node", "h1", "crash") in rules
    lost = next(f for f in fs if f.rule == "lost_node")
    assert "node 0 exited on its collective watchdog" in lost.cause
    assert any("Watchdog caught collective operation timeout" in e and e.startswith("h0:") for e in lost.evidence)
    dead0 = next(f for f in fs if f.rule == "dead_rank")
    assert dead0.host == "h0" and dead0.detail["explained_by"] == "lost_node"
    assert rules[-1][0] == "dead_rank"


def test_node_0_died_first_the_others_followed_is_node_0s_finding():
    oom0 = _log("mn_node1_oom.log").replace("TP8", "TP0")
    fs = diagnose_server([_node(0, oom0, alive=False, exit_status=1, health="cannot connect"),
                          _node(1, _log("mn_node1_node0_gone.log"), alive=False, exit_status=1)])
    assert [(f.rule, f.host) for f in fs] == [("cuda_oom", "h0"), ("dead_rank", "h0")]


def test_dist_init_unreachable_from_node_1():
    fs = diagnose_server([_node(0, health="cannot connect to 10.0.0.1:30000 (connection refused)"),
                          _node(1, _log("mn_node1_dist_init_timeout.log"), alive=False, exit_status=1)])
    f = next(f for f in fs if f.rule == "dist_init_unreachable")
    assert f.host == "h1" and f.severity == "crash" and "10.0.0.1:5000" in f.cause
    assert f.evidence[0].startswith("h1:/srv/dsv4/logs/prefill.log:4: [rank8]: torch.distributed.DistNetworkError")


def test_dist_init_port_taken_on_node_0():
    fs = diagnose_server([_node(0, _log("mn_node0_dist_init_in_use.log"), alive=False, exit_status=1,
                                health="cannot connect"), _node(1)])
    assert fs[0].rule == "dist_init_bind" and fs[0].host == "h0"
    assert "cannot listen on 10.0.0.1:5000" in fs[0].cause


def test_the_http_port_taken_is_not_a_dist_init_clash():
    fs = diagnose_server([_node(0, _log("mn_node0_http_in_use.log"), alive=False, exit_status=1,
                                health="cannot connect"), _node(1)])
    assert "dist_init_bind" not in [f.rule for f in fs]
    assert fs[0].rule == "dead_rank" and fs[0].host == "h0"


def test_a_bare_address_in_use_naming_the_dist_init_port_is_a_clash():
    log = HEALTHY + "\nOSError: [Errno 98] Address already in use: ('10.0.0.1', 5000)\n"
    fs = diagnose_server([_node(0, log, alive=False, health="cannot connect"), _node(1)])
    assert fs[0].rule == "dist_init_bind"
    log = HEALTHY + "\nOSError: [Errno 98] Address already in use: ('10.0.0.1', 50001)\n"
    assert "dist_init_bind" not in [f.rule for f in diagnose_server([_node(0, log, alive=False), _node(1)])]


def test_nodes_on_different_releases():
    fs = diagnose_server([_node(0, health="ok", release="r3"), _node(1, release="r2")])
    assert _rules(fs) == [("release_split", "h0", "crash")]
    assert fs[0].evidence == ["h0: node 0 runs r3", "h1: node 1 runs r2"]
    assert fs[0].detail["releases"] == {0: "r3", 1: "r2"}


def test_a_node_with_no_release_read_is_not_a_split():
    fs = diagnose_server([_node(0, health="ok", release="r3"), _node(1, release=None)])
    assert _rules(fs) == [("healthy", "h0", "ok")]


def test_a_request_line_in_the_access_log_is_not_evidence():
    log = HEALTHY + ('\nINFO:     10.1.2.3:5555 - "GET /health?EADDRINUSE HTTP/1.1" 200 OK'
                     '\nINFO:     10.1.2.3:5555 - "GET /x?DistNetworkError HTTP/1.1" 404 Not Found\n')
    fs = diagnose_server([_node(0, log, health="ok"), _node(1, log)])
    assert _rules(fs) == [("healthy", "h0", "ok")]


def test_node_0_dead_without_a_watchdog_line_is_not_said_to_have_one():
    fs = diagnose_server([_node(0, HEALTHY, alive=False, health="cannot connect"), _node(1, HEALTHY, alive=False)])
    lost = next(f for f in fs if f.rule == "lost_node")
    assert "node 0 is not running either" in lost.cause and "watchdog" not in lost.cause.split(";")[0]


def test_a_collective_timeout_with_every_node_alive_is_named():
    fs = diagnose_server([_node(0, _log("mn_node0_collective_timeout.log"), alive=False, health="cannot connect"),
                          _node(1)])
    assert fs[0].rule == "collective_timeout" and fs[0].host == "h0"
    assert "Watchdog caught collective operation timeout" in fs[0].evidence[0]
    dead = next(f for f in fs if f.rule == "dead_rank")
    assert dead.detail["explained_by"] == "collective_timeout"


def test_a_node_not_read_is_not_healthy():
    fs = diagnose_server([_node(0, health="ok", release="r3"), _node(1, alive=None, release=None)])
    assert _rules(fs) == [("node_not_read", "h1", "degraded")]


def test_an_address_in_use_line_must_name_the_dist_init_port():
    other = HEALTHY + ("\n[rank0]: torch.distributed.DistNetworkError: The server socket has failed to listen on any "
                       "local network address. port: 30001, useIpv6: 0, code: -98, name: EADDRINUSE\n")
    assert "dist_init_bind" not in [f.rule for f in diagnose_server([_node(0, other, alive=False), _node(1)])]
    ev0 = _node(0, HEALTHY + "\n[2026-12-03 09:00:05] address already in use\n", alive=False)
    ev0.dist_init = "10.0.0.1:2026"                 # the year is not the port
    assert "dist_init_bind" not in [f.rule for f in diagnose_server([ev0, _node(1)])]


# --- collective timeouts read on every node (issue 45 item 3) --------------------------------------
# Lines in PyTorch's own wording (ProcessGroupNCCL watchdog as quoted in sglang#3784 and PR #3709,
# gloo's unbound_buffer timeout as quoted in public reports) and SGLang 0.5.23's scheduler watchdog
# (srt/utils/watchdog.py).
N0_STALL = """=== dsv4ctl start decode release r2 at 2026-12-03T09:00:00Z
[2026-12-03 09:01:10 DP0 TP0] Decode batch. #running-req: 12, #token: 5120, token usage: 0.04, #transfer-req: 0
[2026-12-03 09:06:11 DP0 TP0] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)
[rank0]:[E1203 09:11:12.512338170 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=48211, OpType=ALLREDUCE, NumelIn=7168, NumelOut=7168, Timeout(ms)=600000) ran for 600090 milliseconds before timing out.
"""
N1_ALLREDUCE = """=== dsv4ctl start decode release r2 at 2026-12-03T09:00:00Z
[2026-12-03 09:01:10 DP1 TP8] Decode batch. #running-req: 0, #token: 0, token usage: 0.00, #transfer-req: 0
[rank8]:[E1203 09:11:10.101000000 ProcessGroupNCCL.cpp:632] [Rank 8] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=48211, OpType=ALLREDUCE, NumelIn=7168, NumelOut=7168, Timeout(ms)=600000) ran for 600002 milliseconds before timing out.
[rank8]:[E1203 09:11:10.101500000 ProcessGroupNCCL.cpp:2168] [PG ID 0 PG GUID 0(default_pg) Rank 8] failure detected by watchdog at work sequence id: 48211 PG status: last enqueued work: 48211, last completed work: 48210
"""
N1_GLOO = """[2026-12-03 09:01:10 DP1 TP8] Decode batch. #running-req: 0, #token: 0, token usage: 0.00, #transfer-req: 0
Traceback (most recent call last):
  File "/opt/sglang/python/sglang/srt/layers/dp_attention.py", line 412, in gather_dp_metadata
    torch.distributed.all_gather_into_tensor(out, local, group=cpu_group)
  File "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", line 3846, in all_gather_into_tensor
    work.wait()
[2026-12-03 09:10:58 DP1 TP8] RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 600000ms for recv operation to complete
"""


def _dp(node: int, log: str, **kw) -> Evidence:
    return Evidence(group="decode", host=f"h{node}", role="decode", alive=True, log=log,
                    log_source=f"h{node}:/srv/dsv4/logs/decode.log", node=node, nnodes=2, release="r2", **kw)


def test_the_all_reduce_hang_is_named_on_the_node_that_timed_out_first_not_a_stall_on_node_0():
    """sglang#28915's shape: node 0's scheduler stalls (its watchdog line first), node 1's NCCL
    watchdog fires 2 s before node 0's. Was: watchdog_stall on node 0 (scheduler-stall) and a
    collective_timeout on node 0 reading node 0's log only."""
    fs = diagnose_server([_dp(0, N0_STALL, health="GET /health: HTTP 503"), _dp(1, N1_ALLREDUCE)])
    assert [f.rule for f in fs] == ["collective_timeout"]
    (f,) = fs
    assert (f.host, f.runbook, f.detail["collective"], f.detail["first_node"], f.detail["rank"], f.detail["seq"]) == (
        "h1", "scheduler-stall", "ALLREDUCE", 1, 8, 48211)
    assert f.cause.startswith("ALLREDUCE (NCCL) timed out first on node 1 of 2 (h1, rank 8 at 2026-12-03 09:11:10), "
                              "then on node(s) 0: a collective across the nodes hung")
    assert f.evidence[0].startswith("h1:/srv/dsv4/logs/decode.log:3: [rank8]") and "OpType=ALLREDUCE" in f.evidence[0]
    assert f.evidence[1].startswith("h0:/srv/dsv4/logs/decode.log:4: [rank0]")
    assert "Scheduler watchdog timeout" in f.evidence[2] and f.detail["explains"] == ["watchdog_stall@h0"]


def test_the_clock_offset_of_each_host_decides_which_node_was_first():
    """Node 1's host clock runs 5 s ahead: its 09:11:10 is 09:11:05 here... and node 0's clock
    10 s ahead makes node 0's 09:11:12 09:11:02: node 0 was first."""
    fs = diagnose_server([_dp(0, N0_STALL, health="GET /health: HTTP 503", clock_offset_s=10.0),
                          _dp(1, N1_ALLREDUCE, clock_offset_s=5.0)])
    assert (fs[0].rule, fs[0].detail["first_node"], fs[0].host) == ("collective_timeout", 0, "h0")


def test_a_gloo_timeout_names_the_collective_from_its_traceback():
    fs = diagnose_server([_dp(0, N0_STALL, health="GET /health: HTTP 503"), _dp(1, N1_GLOO)])
    f = fs[0]
    assert (f.rule, f.detail["collective"], f.detail["backend"], f.detail["first_node"]) == (
        "collective_timeout", "ALLGATHER", "gloo", 1)
    assert f.cause.startswith("ALLGATHER (GLOO) timed out first on node 1 of 2 (h1, 2026-12-03 09:10:58)") or \
        f.cause.startswith("ALLGATHER (GLOO) timed out first on node 1 of 2 (h1 at 2026-12-03 09:10:58)")


def test_standin_collective_hang_is_diagnosed_from_both_nodes_logs(tmp_path):
    """Two real stand-in processes (node 0 serves HTTP, node 1 joins its dist-init address) with
    the fault STANDIN_COLLECTIVE_HANG_S: node 0 stalls and logs the scheduler watchdog, node 1's
    NCCL watchdog fires first. diagnose names the all-reduce on node 1; without the fault the
    same two nodes are healthy."""
    import os
    import time
    import urllib.error
    import urllib.request

    from tests.standin.harness import free_port, popen_standin, wait_health, write_config

    def run(env_extra: dict) -> list:
        port, dist = free_port(), free_port()
        cfg = write_config(tmp_path / f"d{port}.yaml", port=port)
        mn = ["--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{dist}", "--ttft-ms", "0", "--itl-ms", "0"]
        env = dict(os.environ, **env_extra)
        p0 = popen_standin(["--config", str(cfg), "--host", "127.0.0.1", "--port", str(port), "--node-rank", "0", *mn], env)
        p1 = popen_standin(["--config", str(cfg), "--node-rank", "1", *mn], env)
        try:
            wait_health(f"http://127.0.0.1:{port}")
            time.sleep(3.0 if env_extra else 0.5)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    health = "ok" if r.status == 200 else f"GET /health: HTTP {r.status}"
            except urllib.error.HTTPError as e:
                health = f"GET /health: HTTP {e.code}"
        finally:
            for p in (p0, p1):
                p.terminate()
                p.wait(timeout=10)
            logs = [p.stdout.read() for p in (p0, p1)]
            for p in (p0, p1):
                p.stdout.close()
        return diagnose_server([_dp(0, logs[0], health=health), _dp(1, logs[1])])

    fs = run({"STANDIN_COLLECTIVE_HANG_S": "0.5"})
    assert [f.rule for f in fs] == ["collective_timeout"], [(f.rule, f.cause) for f in fs]
    assert (fs[0].host, fs[0].detail["collective"], fs[0].detail["first_node"], fs[0].runbook) == (
        "h1", "ALLREDUCE", 1, "scheduler-stall")
    assert fs[0].detail["explains"] == ["watchdog_stall@h0"]
    assert [f.rule for f in run({})] == ["healthy"]
