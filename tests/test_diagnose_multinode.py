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
