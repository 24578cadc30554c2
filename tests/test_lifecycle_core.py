"""The pure core of start / stop / restart (dsv4ctl.deploy.servers, lifecycle.batches): which servers are acted
on, multi-node servers whole, batches, and the alive parser."""

from __future__ import annotations

import pytest

from dsv4ctl.deploy.lifecycle import batches
from dsv4ctl.deploy.servers import ServerAction, parse_alive, plan_servers

# prefill TP16 over h0+h1 (one server), decode with two replicas on h2 and h3, a router on h4
SPEC = {
    "prefill": {"role": "prefill", "servers": [["h0", "h1"]], "port": 30000},
    "decode": {"role": "decode", "servers": [["h2"], ["h3"]], "port": 30001},
    "router": {"role": "router", "host": "h4", "port": 8000},
}
ALL_UP = {"h0": {"prefill": True}, "h1": {"prefill": True}, "h2": {"decode": True}, "h3": {"decode": True},
          "h4": {"router": True}}


def up(**down):
    """ALL_UP with the (host, group) pairs given as host=group marked not running."""
    a = {h: dict(gs) for h, gs in ALL_UP.items()}
    for h, g in down.items():
        a[h][g] = False
    return a


def test_start_with_everything_running_is_nothing():
    assert plan_servers(SPEC, ALL_UP, "start") == []


def test_start_a_dead_replica_alone():
    assert plan_servers(SPEC, up(h3="decode"), "start") == [
        ServerAction("decode", "decode#1", (), ("h3",), "not running")]


def test_start_a_multi_node_server_with_node_1_down_restarts_it_whole():
    assert plan_servers(SPEC, up(h1="prefill"), "start") == [
        ServerAction("prefill", "prefill", ("h0",), ("h0", "h1"), "node 1 (h1) not running")]


def test_start_a_multi_node_server_with_every_node_down():
    a = up(h0="prefill", h1="prefill")
    assert plan_servers(SPEC, a, "start") == [ServerAction("prefill", "prefill", (), ("h0", "h1"), "not running")]


def test_a_host_missing_from_the_facts_counts_as_not_running():
    a = {h: gs for h, gs in ALL_UP.items() if h != "h4"}
    assert plan_servers(SPEC, a, "start") == [ServerAction("router", "router", (), ("h4",), "not running")]


def test_restart_selects_by_group_and_host_and_keeps_multi_node_servers_whole():
    assert plan_servers(SPEC, ALL_UP, "restart", groups=["decode"]) == [
        ServerAction("decode", "decode#0", ("h2",), ("h2",), "restart"),
        ServerAction("decode", "decode#1", ("h3",), ("h3",), "restart")]
    assert plan_servers(SPEC, ALL_UP, "restart", hosts=["h1"]) == [
        ServerAction("prefill", "prefill", ("h0", "h1"), ("h0", "h1"), "restart")]
    assert [a.server for a in plan_servers(SPEC, ALL_UP, "restart")] == ["decode#0", "decode#1", "prefill", "router"]


def test_restart_of_a_dead_server_only_starts_it():
    assert plan_servers(SPEC, up(h2="decode"), "restart", groups=["decode"])[0] == \
        ServerAction("decode", "decode#0", (), ("h2",), "restart")


def test_stop_stops_only_running_nodes():
    assert plan_servers(SPEC, up(h1="prefill"), "stop", groups=["prefill"]) == [
        ServerAction("prefill", "prefill", ("h0",), (), "stop")]


def test_unknown_how_is_a_value_error():
    with pytest.raises(ValueError):
        plan_servers(SPEC, ALL_UP, "reload")


def test_batches():
    acts = plan_servers(SPEC, ALL_UP, "restart")
    assert batches(acts, None) == [acts] and batches(acts, 0) == [acts] and batches(acts, 9) == [acts]
    assert [[a.server for a in b] for b in batches(acts, 3)] == [["decode#0", "decode#1", "prefill"], ["router"]]
    assert batches([], 2) == [] and batches([], None) == []


def test_parse_alive():
    text = "@alive decode 1\nnoise\n@alive router 0\n@alive prefill 2\n"
    assert parse_alive(text, ["decode", "router", "prefill", "other"]) == {
        "decode": True, "router": False, "prefill": False, "other": False}
    assert parse_alive("", []) == {}


def _man(tree="t1", prefill="p1", decode="d1", link=None):
    m = {"files": {"tree/python/sglang/x.py": [tree, 10, 420], "configs/prefill.yaml": [prefill, 5, 420],
                   "configs/decode.yaml": [decode, 5, 420], "launch.json": ["l", 3, 420]}, "links": {}}
    if link:
        m["links"]["tree/python/sglang/alias.py"] = link
    return m


SPEC2 = {"prefill": {"role": "prefill", "host": "h0", "port": 1, "env": {}},
         "decode": {"role": "decode", "host": "h1", "port": 2, "env": {}},
         "router": {"role": "router", "host": "h2", "port": 3}}


def test_changed_groups_serve_config_only():
    from dsv4ctl.deploy.servers import changed_groups
    assert changed_groups(_man(), _man(decode="d2"), SPEC2, SPEC2) == frozenset({"decode"})
    assert changed_groups(_man(), _man(), SPEC2, SPEC2) == frozenset()


def test_changed_groups_spec_entries_added_removed_or_changed():
    from dsv4ctl.deploy.servers import changed_groups
    env = {**SPEC2, "prefill": {**SPEC2["prefill"], "env": {"X": "1"}}}
    assert changed_groups(_man(), _man(), SPEC2, env) == frozenset({"prefill"})
    no_router = {g: s for g, s in SPEC2.items() if g != "router"}
    assert changed_groups(_man(), _man(), SPEC2, no_router) == frozenset({"router"})
    assert changed_groups(_man(), _man(), no_router, SPEC2) == frozenset({"router"})


def test_changed_groups_tree_difference_restarts_everything():
    from dsv4ctl.deploy.servers import changed_groups
    assert changed_groups(_man(), _man(tree="t2"), SPEC2, SPEC2) is None
    assert changed_groups(_man(), _man(link="mod.py"), SPEC2, SPEC2) is None
    extra = _man()
    extra["files"]["tree/new.py"] = ["n", 1, 420]
    assert changed_groups(_man(), extra, SPEC2, SPEC2) is None
