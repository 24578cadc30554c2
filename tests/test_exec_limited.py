"""``dsv4ctl exec`` and limited deploys (``deploy -g GROUP`` / ``--host HOST``), issue 46 item 9,
on four real sshd hosts running two two-node servers (prefill over h0+h1, decode over h2+h3, the
router on h0: tests/test_multinode_deploy.py's world), one deploy for the whole test."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.sshd.harness import free_port
from tests.sshd.world import World, http_status
from tests.test_multinode_deploy import TwoNodeWorld

pytestmark = pytest.mark.sshd

SECRET = "hf_exec_secret_4242"


@pytest.fixture
def world(live_cluster, tmp_path):
    w = TwoNodeWorld(live_cluster, tmp_path)
    w.node_env = {"EXEC_MARK": "m-1", "HF_TOKEN": SECRET}
    w.write()
    yield w
    w.stop_services()


def ex(w, group: str, *args, profile=None, timeout=120):
    """``dsv4ctl exec GROUP PROFILE [options] -- ...`` (``args`` holds the options, ``--`` and the command)."""
    return run_cli("exec", group, str(profile or w.profile), *args, env=w.env(), timeout=timeout)


def audit_execs(w, host: str) -> list[dict]:
    return [r for r in w.audit(host) if r["action"] == "exec"]


def check_exec(w, h: list[str], first: str) -> None:
    """exec over every node of a group, its environment, --host, a failing node, --json, the
    dry run, an unreachable host and the audit lines."""
    r = ex(w, "prefill", "-m", "look around", "--",
           'echo "$DSV4CTL_NODE_RANK $DSV4CTL_RELEASE $EXEC_MARK $HF_TOKEN"; pwd -P; echo to-err >&2')
    assert r.code == 0, r.err
    out = sorted(r.out.splitlines())
    root = {x: str(w.roots[x].resolve()) for x in h}
    assert out == sorted([f"{h[0]}/node0: 0 {first} m-1 ***", f"{h[0]}/node0: {root[h[0]]}/releases/{first}",
                          f"{h[1]}/node1: 1 {first} m-1 ***", f"{h[1]}/node1: {root[h[1]]}/releases/{first}"])
    assert SECRET not in r.out + r.err
    assert f"{h[0]}/node0: to-err" in r.err and f"{h[1]}/node1: exit 0 (release {first})" in r.err
    rec = audit_execs(w, h[1])
    assert [(x["result"], x["group"], x["message"], x["host"]) for x in rec] == [("ok", "prefill", "look around", h[1])]
    assert audit_execs(w, h[2]) == []                       # decode's hosts were not touched

    # one node fails: exit 1 naming it; --json has every host's status and output
    r = ex(w, "decode", "--json", "--", 'echo rank $DSV4CTL_NODE_RANK; test "$DSV4CTL_NODE_RANK" = 0')
    assert r.code == 1, r.err
    assert f"the command failed on 1 of 2 host(s): {h[3]}/node1: exit 1" in r.err
    doc = r.json()
    assert doc["schema"] == "dsv4ctl.exec/1" and doc["ok"] is False
    assert {x: (e["exit_status"], e["stdout"], e["release"]) for x, e in doc["hosts"].items()} == \
        {h[2]: (0, "rank 0\n", first), h[3]: (1, "rank 1\n", first)}
    assert audit_execs(w, h[3])[-1]["result"] == "failed"

    # --host narrows; a host the group does not run on is bad input
    r = ex(w, "decode", "--host", h[3], "--", "echo one")
    assert (r.code, r.out) == (0, f"{h[3]}/node1: one\n"), r.err
    r = ex(w, "decode", "--host", h[0], "--", "echo one")
    assert r.code == 2 and f"group decode does not run there ({h[2]}, {h[3]})" in r.err

    # the dry run prints the ssh command of each node and runs nothing
    n = len(w.audit(h[0]))
    r = ex(w, "router", "--dry-run", "--", "touch /tmp/never")
    assert r.code == 0, r.err
    host0 = w.hosts[0]
    assert f"ssh -i {w.c.user_key} -p {host0.port}" in r.out and f"{w.c.user}@{host0.address} 'cd " in r.out
    assert "touch /tmp/never" in r.out and len(w.audit(h[0])) == n

    # no command, or a command before --: usage errors
    assert ex(w, "decode").code == 2
    r = ex(w, "decode", "echo")
    assert r.code == 2 and "put the command after --" in r.err

    # a host that cannot be reached: exit 3 (the others still ran)
    prof = json.loads(json.dumps(__import__("yaml").safe_load(w.profile.read_text())))
    for hy in prof["hosts"]:
        if hy["name"] == h[3]:
            hy["ssh"]["port"] = free_port(hy["address"])
    bad = w.profile.with_name("unreachable.yaml")
    bad.write_text(__import__("yaml").safe_dump(prof, sort_keys=False))
    r = ex(w, "decode", "--", "echo hi", profile=bad)
    assert r.code == 3, r.err
    assert f"{h[2]}/node0: hi" in r.out and f"1 host(s) unreachable: {h[3]}" in r.err


def check_limits(w, h: list[str], first: str, tmp_path, cluster) -> None:
    """The rules of a limited deploy, refused before anything is read (exit 2)."""
    cases = [(["-g", "decode"], "this switches decode but not prefill; add those (-g prefill), or --allow-mixed-pd"),
             (["--host", h[3], "--allow-mixed-pd"], f"decode is one server over 2 nodes ({h[2]}, {h[3]}) and is deployed "
                                                    f"whole: {h[3]} selected, {h[2]} not: add --host {h[2]}"),
             (["-g", "router"], f"host {h[0]} also runs prefill and a host has one active release"),
             (["-g", "nope"], "nope"),
             (["--allow-mixed-pd"], "--allow-mixed-pd goes with -g/--host"),
             (["-g", "decode", "--promote"], "-g/--host cannot go with --promote")]
    for args, why in cases:
        r = run_cli("deploy", str(w.profile), "--dry-run", *args, env=w.env(), timeout=60)
        assert r.code == 2 and why in r.err, (args, r.err)
    # a router alone on its host switches by itself (the base world: prefill h0, decode h1, router h2)
    from dsv4ctl.deploy.limit import limit_deploy
    from dsv4ctl.profile.deployment import resolve
    from dsv4ctl.profile.model import load_profile
    solo = World(cluster, tmp_path / "solo", nhosts=3)
    lim = limit_deploy(resolve(load_profile(solo.profile)), ["router"], [])
    assert (lim.hosts, lim.groups, lim.mixed_pd) == ((solo.hosts[2].name,), ("router",), False)
    lim = limit_deploy(resolve(load_profile(solo.profile)), ["prefill", "decode"], [])
    assert (lim.hosts, lim.groups, lim.words) == ((solo.hosts[0].name, solo.hosts[1].name), ("decode", "prefill"),
                                                  "-g prefill -g decode")


def test_exec_and_limited_deploys_on_two_node_servers(world, live_cluster, tmp_path):
    w = world
    h = [x.name for x in w.hosts]
    r = run_cli("deploy", str(w.profile), "--json", env=w.env(), timeout=240)
    assert r.code == 0, r.err
    first = r.json()["release"]
    check_exec(w, h, first)
    check_limits(w, h, first, tmp_path, live_cluster)

    # a new release deployed to decode only (both nodes), prefill kept: the dry run lists h2, h3 only
    w.extra["decode"] = {"log-level": "info"}
    w.write()
    r = run_cli("deploy", str(w.profile), "-g", "decode", "--allow-mixed-pd", "--dry-run", env=w.env(), timeout=120)
    assert r.code == 0, r.err
    hosts_listed = {ln.split(":")[0].strip() for ln in r.out.splitlines()[1:] if ln.startswith("  ") and ":" in ln
                    and not ln.strip().startswith(("preflight", "on a failed"))}
    assert hosts_listed == {h[2], h[3]}, r.out
    assert f"to {h[2]}, {h[3]} only (-g decode --allow-mixed-pd)" in r.out.splitlines()[0]
    r = run_cli("deploy", str(w.profile), "-g", "decode", "--allow-mixed-pd", "-m", "decode first", "--json",
                env=w.env(), timeout=240)
    assert r.code == 0, r.err
    doc = r.json()
    second = doc["release"]
    assert second != first and set(doc["hosts"]) == {h[2], h[3]}
    assert doc["limited"] == {"hosts": [h[2], h[3]], "groups": ["decode"], "selection": "-g decode --allow-mixed-pd",
                              "mixed_pd": True}
    assert w.currents() == {h[0]: first, h[1]: first, h[2]: second, h[3]: second}
    assert w.starts(h[0], "prefill") == [first] and w.starts(h[2], "decode") == [first, second]
    assert w.starts(h[3], "decode") == [first, second]
    assert w.audit(h[2])[-1]["limited"] == "-g decode --allow-mixed-pd" and w.audit(h[0])[-1]["action"] != "deploy"
    assert http_status(f"http://{w.hosts[0].address}:{w.ports['router']}/health") == 200

    # releases and status say which release each host runs; exec shows it per node
    r = run_cli("releases", str(w.profile), "--json", env=w.env(), timeout=120)
    assert r.code == 0, r.err
    active = {x: [e["id"] for e in hr["releases"] if e["state"] == "active"] for x, hr in r.json()["hosts"].items()}
    assert active == {h[0]: [first], h[1]: [first], h[2]: [second], h[3]: [second]}
    r = run_cli("status", str(w.profile), "--json", env=w.env(), timeout=120)
    assert r.code == 0, r.err
    assert {x: hd["current"] for x, hd in r.json()["hosts"].items()} == \
        {h[0]: first, h[1]: first, h[2]: second, h[3]: second}
    assert r.json()["releases"] == {first: [h[0], h[1]], second: [h[2], h[3]]}
    r = run_cli("status", str(w.profile), env=w.env(), timeout=120)
    assert r.code == 0 and f"the hosts run 2 releases: {first} on {h[0]}, {h[1]}; {second} on {h[2]}, {h[3]} " \
        "(a limited deploy;" in r.out, r.out
    r = ex(w, "prefill", "--json", "--", "true")
    assert {x: e["release"] for x, e in r.json()["hosts"].items()} == {h[0]: first, h[1]: first}

    # a deploy of every host brings prefill onto the release; decode keeps running it
    r = run_cli("deploy", str(w.profile), "--json", env=w.env(), timeout=240)
    assert r.code == 0, r.err
    assert r.json()["release"] == second and w.currents() == {x: second for x in h}
