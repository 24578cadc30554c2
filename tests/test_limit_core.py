"""The rules of a limited deploy (``deploy -g/--host``: dsv4ctl/deploy/limit.py) and exec's pure
parts (targets, the host command's result), on a profile read as the CLI reads it: prefill on
h0, decode as two replicas on h1 and h2, the router alone on h3, h4 running nothing, and a
two-node colocated server over h5+h6 sharing h6 with nothing else. No host is contacted."""

from __future__ import annotations

import pytest
import yaml

from dsv4ctl.deploy.execute import exec_targets, exec_verdict
from dsv4ctl.deploy.limit import limit_deploy
from dsv4ctl.errors import InputError
from dsv4ctl.hosts.execute import IN_RELEASE, NOT_RUN, NOT_RUN_STATUS, parse_exec
from dsv4ctl.profile.deployment import resolve
from dsv4ctl.profile.model import load_profile

GPUS = {"model": "NVIDIA B200", "count": 8, "memory_mib": 183359}


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    d = tmp_path_factory.mktemp("limit")
    for g, mode in (("prefill", "prefill"), ("decode", "decode"), ("big", None)):
        cfg = {"model-path": "deepseek-ai/DeepSeek-V4-Flash", "tp-size": 2 if g == "big" else 1}
        if mode:
            cfg["disaggregation-mode"] = mode
        else:
            cfg["nnodes"] = 2
        (d / f"{g}.yaml").write_text(yaml.safe_dump(cfg))
    prof = {"version": 1, "name": "t", "model": "deepseek-v4-flash",
            "sglang": {"version": "0.5.23", "tree": None, "base_ref": "v0.5.23", "series": None},
            "deploy": {"root": "/srv/x", "python": "python3"},
            "hosts": [{"name": f"h{i}", "address": f"10.0.0.{i + 1}", "gpus": GPUS} for i in range(7)],
            "groups": [{"name": "prefill", "role": "prefill", "host": "h0", "gpus": [0], "tp": 1, "serve_config": "prefill.yaml"},
                       {"name": "decode", "role": "decode", "replicas": ["h1", "h2"], "gpus": [0], "tp": 1,
                        "serve_config": "decode.yaml"},
                       {"name": "router", "role": "router", "host": "h3", "port": 8000, "prefill": ["prefill"],
                        "decode": ["decode"]},
                       {"name": "big", "role": "colocated", "nodes": ["h5", "h6"], "gpus": [0], "tp": 2,
                        "dist_init_port": 5000, "serve_config": "big.yaml"}]}
    (d / "p.yaml").write_text(yaml.safe_dump(prof, sort_keys=False))
    return resolve(load_profile(d / "p.yaml"))


def refused(dep, groups, hosts, allow=False) -> str:
    with pytest.raises(InputError) as e:
        limit_deploy(dep, groups, hosts, allow)
    return str(e.value)


def test_what_a_limited_deploy_switches(dep):
    lim = limit_deploy(dep, ["router"], [])                       # a router alone on its host
    assert (lim.hosts, lim.groups, lim.words, lim.mixed_pd) == (("h3",), ("router",), "-g router", False)
    lim = limit_deploy(dep, ["prefill", "decode"], [])            # the PD pair together, every replica
    assert (lim.hosts, lim.groups, lim.mixed_pd) == (("h0", "h1", "h2"), ("decode", "prefill"), False)
    lim = limit_deploy(dep, ["big"], [])                          # a two-node server, both nodes
    assert (lim.hosts, lim.groups) == (("h5", "h6"), ("big",))
    lim = limit_deploy(dep, [], ["h2"], allow_mixed_pd=True)      # one decode replica, allowed mixed
    assert (lim.hosts, lim.groups, lim.words, lim.mixed_pd) == (("h2",), ("decode",), "--host h2 --allow-mixed-pd", True)


def test_what_a_limited_deploy_refuses(dep):
    assert "this switches decode, decode#1 but not prefill; add those (-g prefill), or --allow-mixed-pd" \
        in refused(dep, ["decode"], [])
    assert "this switches decode#1 but not prefill, decode" in refused(dep, [], ["h2"])
    assert refused(dep, [], ["h6"]) == ("big is one server over 2 nodes (h5, h6) and is deployed whole: h6 selected, "
                                        "h5 not: add --host h5 (or -g big)")
    assert refused(dep, [], ["h4"]).startswith("--host h4: runs no group of ")
    assert refused(dep, [], ["h9"]).startswith("--host 'h9': not a host of ")
    assert "no group 'nope'" in refused(dep, ["nope"], [])


def test_a_group_sharing_a_host_needs_the_other_group_or_the_host(tmp_path):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"model-path": "deepseek-ai/DeepSeek-V4-Flash", "tp-size": 1}))
    prof = {"version": 1, "name": "t", "model": "deepseek-v4-flash",
            "sglang": {"version": "0.5.23", "tree": None, "base_ref": "v0.5.23", "series": None},
            "deploy": {"root": "/srv/x", "python": "python3"},
            "hosts": [{"name": "a", "address": "10.0.0.1", "gpus": GPUS}],
            "groups": [{"name": "one", "role": "colocated", "host": "a", "gpus": [0], "tp": 1, "serve_config": "s.yaml"},
                       {"name": "two", "role": "colocated", "host": "a", "gpus": [1], "tp": 1, "serve_config": "s.yaml",
                        "port": 30002}]}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(prof, sort_keys=False))
    dep = resolve(load_profile(tmp_path / "p.yaml"))
    assert refused(dep, ["one"], []) == ("-g one: host a also runs two and a host has one active release (all its "
                                         "groups switch): add -g two, or name the host with --host a")
    assert limit_deploy(dep, ["one", "two"], []).hosts == ("a",)
    assert limit_deploy(dep, ["one"], ["a"]).groups == ("one", "two")


def test_exec_targets_every_node_and_replica(dep):
    assert [(t.host, t.replica, t.rank, t.label) for t in exec_targets(dep, "decode")] == \
        [("h1", 0, 0, "h1"), ("h2", 1, 0, "h2")]
    assert [t.label for t in exec_targets(dep, "big")] == ["h5/node0", "h6/node1"]
    assert [t.host for t in exec_targets(dep, "big", ["h6"])] == ["h6"]
    with pytest.raises(InputError, match=r"group big does not run there \(h5, h6\)"):
        exec_targets(dep, "big", ["h1"])


def test_the_host_commands_result_is_read_back():
    r = parse_exec(2, "out\n", f"{IN_RELEASE}r0123456789ab\nwarn\n")
    assert (r.status, r.stdout, r.stderr, r.release, r.not_run) == (2, "out\n", "warn\n", "r0123456789ab", None)
    r = parse_exec(NOT_RUN_STATUS, "", f"{NOT_RUN}no active release (/srv/x/current)\n")
    assert (r.status, r.release, r.not_run) == (None, None, "no active release (/srv/x/current)")
    r = parse_exec(NOT_RUN_STATUS, "", "the command's own 125\n")         # the command itself exited 125
    assert (r.status, r.not_run) == (NOT_RUN_STATUS, None)
    ok = {"label": "a", "exit_status": 0, "error": None, "timed_out": False, "not_run": None}
    assert exec_verdict({"a": ok}) == (0, None)
    assert exec_verdict({"a": ok, "b": {**ok, "label": "b", "exit_status": None, "not_run": "no active release"}}) == \
        (1, "the command failed on 1 of 2 host(s): b: not run: no active release")
    assert exec_verdict({"a": {**ok, "exit_status": 1}, "b": {**ok, "exit_status": None, "error": "b: refused"}})[0] == 3
