"""A deploy converges (issue 26): re-deploying the active release over a server that is not
running starts it and gates it, never "nothing to do"; a server that cannot start fails the
deploy (exit 1) without marking the release failed. Real sshd hosts, the launcher, the stand-in."""

from __future__ import annotations

import os
import re
import signal
import socket

import pytest

from tests.conftest import run_cli
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.sshd.world import World, http_status, kill_server, wait_for

pytestmark = pytest.mark.sshd


@pytest.fixture
def world(live_cluster, tmp_path):
    w = World(live_cluster, tmp_path, keep=3)
    yield w
    w.stop_services()


def cli(w: World, *args, timeout=180):
    return run_cli(*args, str(w.profile), env=w.env(), timeout=timeout)


def pid(w: World, host: str, group: str) -> int:
    return int((w.roots[host] / "run" / f"{group}.pid").read_text())


def url(w: World, group: str) -> str:
    return f"http://{w.hosts[{'prefill': 0, 'decode': 1, 'router': 2}[group]].address}:{w.ports[group]}/health"


def kill(w: World, host: str, group: str) -> None:
    kill_server(w.roots[host] / "run" / f"{group}.pid")
    assert wait_for(lambda: http_status(url(w, group), 0.5) == 0, 10)


def test_deploy_of_the_active_release_starts_a_dead_server_and_gates_it(world):
    w = world
    r = cli(w, "deploy", "--json", "--no-preflight")
    assert r.code == 0, r.err
    rid = r.json()["release"]
    prefill_pid = pid(w, "h0", "prefill")

    # every server runs: nothing to do, said as such
    r = cli(w, "deploy", "--json", "--no-preflight")
    assert r.code == 0, r.err
    assert r.json()["unchanged"] is True and r.json()["started"] == []
    assert "every server runs: nothing to do" in r.err

    kill(w, "h1", "decode")
    # the dry run lists exactly the start and the gate; nothing is started by it
    r = cli(w, "deploy", "--dry-run", "--no-preflight")
    assert r.code == 0, r.err
    assert f"h1: start decode (not running) from {rid} (launcher)" in r.out, r.out
    assert f"wait for GET http://{w.hosts[1].address}:{w.ports['decode']}/health = 200" in r.out
    assert "h0: start" not in r.out and "h2: start" not in r.out
    assert http_status(url(w, "decode"), 0.5) == 0

    r = cli(w, "deploy", "--json", "--no-preflight")
    assert r.code == 0, r.err
    rep = r.json()
    assert rep["release"] == rid and rep["unchanged"] is False and rep["started"] == ["decode"]
    assert [(s["phase"], s["host"]) for s in rep["steps"] if s["phase"] in ("start", "stop")] == [("start", "h1")]
    assert http_status(url(w, "decode")) == 200
    assert pid(w, "h0", "prefill") == prefill_pid               # a running server is left alone
    rec = w.audit("h1")[-1]
    assert (rec["action"], rec["result"], rec["release"]) == ("deploy", "ok", rid)
    assert rec["detail"] == "already active; started decode (not running) on h1"
    assert w.state("h1")["releases"][rid]["state"] == "active"


def test_a_dead_server_that_cannot_start_fails_the_deploy_not_the_release(world):
    w = world
    r = cli(w, "deploy", "--json", "--no-preflight")
    assert r.code == 0, r.err
    rid = r.json()["release"]
    kill(w, "h1", "decode")
    # the decode port taken by another process: the restarted server cannot bind and exits
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    blocker.bind((w.hosts[1].address, w.ports["decode"]))
    blocker.listen()
    try:
        r = cli(w, "deploy", "--no-preflight")
        assert r.code == 1, r.err
        line = r.err.strip().splitlines()[-1]
        assert line.startswith(f"dsv4ctl: gate failed: {rid} is active and decode (not running) was started, but did "
                               "not pass the health gate (the release is not marked failed): host h1 group decode: "
                               "server process exited"), line
        assert "address already in use" in line
        rec = w.audit("h1")[-1]
        assert (rec["action"], rec["result"]) == ("deploy", "failed")
        assert rec["detail"].startswith("started decode (not running); health gate: ")
        assert all(w.state(h)["releases"][rid]["state"] == "active" for h in ("h0", "h1", "h2"))   # not marked failed
        assert not any((w.roots[h] / ".lock").exists() for h in w.roots)
    finally:
        blocker.close()
    r = cli(w, "deploy", "--json", "--no-preflight")
    assert r.code == 0, r.err
    assert r.json()["started"] == ["decode"]
    assert http_status(url(w, "decode")) == 200


def test_stop_start_restart_rolling_and_bad_input(world):
    w = world
    r = cli(w, "deploy", "--json", "--no-preflight")
    assert r.code == 0, r.err
    rid = r.json()["release"]
    before = {g: pid(w, h, g) for h, g in (("h0", "prefill"), ("h1", "decode"), ("h2", "router"))}

    r = cli(w, "stop", "-g", "decode", "--dry-run")
    assert r.code == 0, r.err
    assert "h1: stop decode (launcher)" in r.out and "h0: stop" not in r.out
    assert all(f"  {h}: lock {w.roots[h]}/.lock" in r.out for h in w.roots)      # the run takes every lock first
    assert http_status(url(w, "decode")) == 200                        # a dry run changes nothing
    r = cli(w, "stop", "-g", "decode")
    assert r.code == 0, r.err
    assert r.out.strip() == "stopped decode"
    assert http_status(url(w, "decode"), 0.5) == 0 and http_status(url(w, "prefill")) == 200
    assert (w.audit("h1")[-1]["action"], w.audit("h1")[-1]["result"]) == ("stop", "ok")
    assert w.current("h1") == rid and w.state("h1")["releases"][rid]["state"] == "active"   # still the active release

    r = cli(w, "start", "--json")
    assert r.code == 0, r.err
    rep = r.json()
    assert rep["servers"] == [{"server": "decode", "group": "decode", "stop": [], "start": ["h1"], "why": "not running"}]
    assert rep["detail"] == "started decode (not running)"
    assert http_status(url(w, "decode")) == 200 and pid(w, "h0", "prefill") == before["prefill"]
    r = cli(w, "start")
    assert r.code == 0 and r.out.strip() == "nothing to start: every selected server runs", r.out + r.err

    # rolling restart, one server at a time, each gated before the next
    r = cli(w, "restart", "--batch", "1", "--dry-run")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    order = [ln.strip().split(": ", 1)[1] for ln in lines if ": [batch " in ln]
    assert [x.split("] ")[0] for x in order if "stop" in x.split("] ")[1][:5]] == ["[batch 1/3", "[batch 2/3", "[batch 3/3"]
    r = cli(w, "restart", "--batch", "1", "--json")
    assert r.code == 0, r.err
    assert [s["server"] for s in r.json()["servers"]] == ["decode", "prefill", "router"]
    after = {g: pid(w, h, g) for h, g in (("h0", "prefill"), ("h1", "decode"), ("h2", "router"))}
    assert all(after[g] != before[g] for g in ("prefill", "router"))
    assert all(http_status(url(w, g)) == 200 for g in ("prefill", "decode", "router"))
    assert (w.audit("h0")[-1]["action"], w.audit("h0")[-1]["detail"]) == ("restart", "restarted decode, prefill, router")

    for args, msg in ((["start", "-g", "nope"], "no group 'nope' in the active release (groups: decode, prefill, router)"),
                      (["restart", "--host", "h9"], "no host 'h9' in the profile (hosts: h0, h1, h2, h3)"),
                      (["restart", "--batch", "0"], "--batch must be in 1..10000")):
        r = cli(w, *args)
        assert r.code == 2 and r.err.strip() == f"dsv4ctl: error: {msg}", (args, r.err)


def test_start_of_a_server_that_cannot_bind_is_a_gate_failure(world):
    w = world
    assert cli(w, "deploy", "--no-preflight").code == 0
    assert cli(w, "stop", "-g", "decode").code == 0
    blocker = socket.socket()
    blocker.bind((w.hosts[1].address, w.ports["decode"]))
    blocker.listen()
    try:
        r = cli(w, "start", "-g", "decode")
        assert r.code == 1, r.err
        line = r.err.strip().splitlines()[-1]
        assert line.startswith("dsv4ctl: gate failed: start of decode: not healthy: host h1 group decode: "
                               "server process exited"), line
        assert (w.audit("h1")[-1]["action"], w.audit("h1")[-1]["result"]) == ("start", "failed")
        assert not any((w.roots[h] / ".lock").exists() for h in w.roots)
    finally:
        blocker.close()


def test_rollback_of_a_decode_only_change_restarts_only_decode(world):
    w = world
    r = cli(w, "deploy", "--json", "--no-preflight")
    assert r.code == 0, r.err
    a = r.json()["release"]
    w.extra["decode"] = {"chunked-prefill-size": 4096}
    w.write()
    r = cli(w, "deploy", "--json", "--no-preflight")
    assert r.code == 0, r.err
    b = r.json()["release"]
    assert a != b
    pids = {g: pid(w, h, g) for h, g in (("h0", "prefill"), ("h1", "decode"), ("h2", "router"))}
    r = cli(w, "rollback", "--to", a, "--dry-run")
    assert r.code == 0, r.err
    assert f"h1: switch {w.roots['h1']}/current: {b} -> {a} (previous -> {b}); stop decode; start decode" in r.out
    assert f"h0: switch {w.roots['h0']}/current: {b} -> {a} (previous -> {b}); no group restarted" in r.out
    r = cli(w, "rollback", "--to", a)
    assert r.code == 0, r.err
    assert f"{b} and {a} differ only in the serve files of decode: restarting only those (prefill, router keep running)" in r.err
    assert w.currents() == {h: a for h in w.roots}
    assert pid(w, "h0", "prefill") == pids["prefill"] and pid(w, "h2", "router") == pids["router"]
    assert pid(w, "h1", "decode") != pids["decode"]
    assert all(http_status(url(w, g)) == 200 for g in ("prefill", "decode", "router"))
    assert "chunked-prefill-size" not in (w.roots["h1"] / "current" / "configs" / "decode.yaml").read_text()


def test_health_wait_prints_progress_and_q_silences_it(world):
    import yaml
    w = world
    prof = yaml.safe_load(w.profile.read_text())
    prof["groups"][0]["env"] = {"STANDIN_STARTUP_S": "3"}          # prefill loads for 3 s
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
    env = {**w.env(), "DSV4CTL_PROGRESS_S": "1"}
    r = run_cli("deploy", str(w.profile), "--no-preflight", env=env, timeout=180)
    assert r.code == 0, r.err
    lines = [ln for ln in r.err.splitlines() if ln.startswith("dsv4ctl: health: 1/2 worker(s) ready, ")]
    assert lines, r.err
    # each line names the worker not ready and why: not listening yet (a loaded machine starts the
    # stand-in's Python slowly), then answering 503 while it loads (3 s: about three 1 s ticks)
    assert all(re.search(r" s of 20 s; prefill on h0: /health(: not listening yet| answered 503)", ln)
               for ln in lines), lines
    assert any(" s of 20 s; prefill on h0: /health answered 503" in ln for ln in lines), lines
    assert "decode on h1" not in lines[-1]
    r = run_cli("restart", str(w.profile), "-g", "prefill", "-q", env=env, timeout=180)
    assert r.code == 0 and r.err == "", r.err


def test_an_interrupt_between_stop_and_start_starts_the_server_again(world):
    import subprocess
    import sys

    from tests.conftest import REPO
    w = world
    assert cli(w, "deploy", "--no-preflight").code == 0
    old = pid(w, "h1", "decode")
    p = subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", "restart", str(w.profile), "-g", "decode", "-v"],
                         cwd=REPO, env=dict(os.environ, **w.env()), text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    lines = []
    while True:
        line = p.stderr.readline()
        assert line, "".join(lines)
        lines.append(line)
        if "dsv4ctl: step h1: stop decode" in line:
            break
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, "".join(lines) + err
    assert err.strip().splitlines()[-1] == "dsv4ctl: error: interrupted"
    assert "interrupted: started again (not gated): decode (restart) on h1" in err
    assert wait_for(lambda: http_status(url(w, "decode"), 0.5) == 200, 30)
    assert pid(w, "h1", "decode") != old
    rec = w.audit("h1")[-1]
    assert (rec["action"], rec["result"]) == ("restart", "interrupted")
    assert rec["detail"] == "interrupted during restart; started again (not gated): decode (restart) on h1"
    assert not any((w.roots[h] / ".lock").exists() for h in w.roots)



def test_status_names_a_group_the_active_release_does_not_run(world):
    import yaml
    w = world
    assert cli(w, "deploy", "--no-preflight").code == 0
    rid = w.current("h1")
    prof = yaml.safe_load(w.profile.read_text())
    extra = dict(next(g for g in prof["groups"] if g["name"] == "decode"), name="decode2", host="h3")
    prof["groups"].append(extra)
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
    r = cli(w, "status", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["ok"] is True and doc["unhealthy"] == []
    assert doc["differing"] == [f"h3/decode2: in the profile, not in the active release {rid}"]
    assert doc["hosts"]["h3"]["groups"]["decode2"]["deployed"] is False
