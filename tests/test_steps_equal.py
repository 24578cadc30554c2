"""Dry run = the run: a real deploy / rollback / promote on local hosts executes exactly the steps
its ``--dry-run`` lists, command for command, and every executed step's command really reached
the host's transport.

Each case runs the dry run first (steps A), then the real run with ``Options.steps`` (the list the
run built after taking its locks: steps B) and ``Options.trace`` (each step as the engine ran
it: E), while every command given to a host transport is recorded (raw). Asserted:

* A == B, except the lock token (a dry run takes no lock: ``dry-run``);
* E == B's success path, per host in order (hosts run in parallel), gate/check steps included;
* every executed host command (lock, switch, close) is among the raw commands of its host.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict

import pytest
import yaml

from dsv4ctl.deploy import engine
from dsv4ctl.deploy.lifecycle import lifecycle
from dsv4ctl.deploy.promote import PromoteOptions, promote_by_hand
from dsv4ctl.deploy.site import Options
from dsv4ctl.deploy.steps import DRY_RUN_TOKEN
from dsv4ctl.profile.deployment import load_deployment
from dsv4ctl.remote.transport import LocalTransport
from tests.sshd.world import kill_server
from tests.test_golden import LocalWorld, needs_rsync


class Recorder:
    """Every command run on a LocalTransport, per host (the transport's name)."""

    def __init__(self, monkeypatch):
        self.raw: dict[str, list[str]] = defaultdict(list)
        self.lock = threading.Lock()
        orig = LocalTransport.run

        def run(t, cmd, **kw):
            with self.lock:
                self.raw[t.name].append(cmd)
            return orig(t, cmd, **kw)
        monkeypatch.setattr(LocalTransport, "run", run)


def _opts(w: LocalWorld, **kw) -> Options:
    return Options(cache=w.tmp / "cache", **kw)


def _key(s) -> tuple:
    d = s if isinstance(s, dict) else s.to_dict()
    return d["phase"], d["host"], d["stage"], d["summary"], d["cmd"]


def _by_host(steps) -> dict[str, list]:
    out: dict[str, list] = defaultdict(list)
    for s in steps:
        out[s.host].append(_key(s))
    return dict(out)


def check_equal(dry: dict, planned, executed: list, rec: Recorder, token: str) -> None:
    listed = [_key(s) for s in planned.steps]
    dry_listed = [_key(s) for s in dry["steps"]]
    assert dry_listed == [tuple(x.replace(token, DRY_RUN_TOKEN) if isinstance(x, str) else x for x in k) for k in listed]
    assert _by_host(executed) == _by_host(planned.steps)
    assert len(executed) == len(planned.steps)
    for s in executed:
        if s.phase in ("lock", "switch", "close"):
            assert s.cmd in rec.raw[s.host], f"{s.host}: {s.summary}: command not run on the host"


@pytest.fixture
def world(tmp_path):
    w = LocalWorld(tmp_path, keep=2)
    yield w
    w.stop_services()


def standin_world(path) -> LocalWorld:
    """LocalWorld whose servers are the DSV4 stand-in of tests/standin (real tool calls, so the
    promotion's checks pass), behind the tests/sshd stand-in router; nothing deployed yet."""
    from tests.sshd.promote_world import SHORT_CONTEXT, STANDIN
    w = LocalWorld(path, keep=2)
    w.prof["deploy"]["launch"]["server"] = STANDIN
    # the steps are what is tested, not the checks' sizes: a short context keeps check smoke's
    # over-length probe small (the stand-in tokenizes it), a few pairs keep the upgrade gate's A/B
    # short (its default is sized for a 1 % -> 2 % rise: 1,984 pairs per arm)
    for g in ("prefill", "decode"):
        cfg = w.cfgdir / f"{g}.yaml"
        cfg.write_text(cfg.read_text() + yaml.safe_dump(SHORT_CONTEXT))
    w.prof["check"]["compare"] = {"pairs": 16}
    w.profile = w.write_profile("profile.yaml", w.prof)
    return w


@pytest.fixture(scope="module")
def promote_world(tmp_path_factory):
    """:func:`standin_world` deployed once (a plain deploy), for the promote tests of this module
    (each promotes what it finds running)."""
    w = standin_world(tmp_path_factory.mktemp("promote-world"))
    try:
        assert engine.deploy(load_deployment(w.profile), _opts(w))["result"] == "ok"
        yield w
    finally:
        w.stop_services()


def _run(fn, w: LocalWorld, *args, **kw):
    planned, executed = [], []
    opts = _opts(w, steps=planned.append, trace=executed.append)
    rep = fn(load_deployment(w.profile), opts, *args, **kw)
    assert len(planned) == 1
    return rep, planned[0], executed


def _token(planned) -> str:
    """The run's lock token (in every lock holder and close command)."""
    lock = next(s for s in planned.steps if s.phase == "lock")
    return lock.cmd.split('"token":"')[1].split('"')[0]


@needs_rsync
@pytest.mark.parametrize("push", ["rsync", "copy"])
def test_deploy_runs_exactly_its_dry_run(world, monkeypatch, push):
    monkeypatch.setenv("DSV4CTL_PUSH", push)
    w = world
    dry = engine.deploy(load_deployment(w.profile), _opts(w, dry_run=True))
    rec = Recorder(monkeypatch)
    rep, planned, executed = _run(engine.deploy, w)
    assert rep["result"] == "ok" and rep["release"] == dry["release"]
    assert all(("with rsync" in s.summary) == (push == "rsync") for s in planned.of("push"))
    check_equal(dry, planned, executed, rec, _token(planned))
    assert [s.phase for s in executed if s.host == "h0"] == ["lock", "push", "switch", "gate", "close"]


@needs_rsync
def test_second_and_third_deploy_stop_removed_groups_and_prune(world, monkeypatch):
    """Release B drops the router (h2 stops it); release C prunes A (keep_releases 2)."""
    w = world
    assert engine.deploy(load_deployment(w.profile), _opts(w))["result"] == "ok"
    time.sleep(1.05 - time.time() % 1)
    prof = json.loads(json.dumps(w.prof))
    prof["groups"] = [g for g in prof["groups"] if g["role"] != "router"]
    p = w.write_profile("no-router.yaml", prof)
    dry = engine.deploy(load_deployment(p), _opts(w, dry_run=True), patches=[str(w.patch1)])
    rec = Recorder(monkeypatch)
    planned, executed = [], []
    rep = engine.deploy(load_deployment(p), _opts(w, steps=planned.append, trace=executed.append),
                        patches=[str(w.patch1)])
    assert rep["result"] == "ok"
    check_equal(dry, planned[0], executed, rec, _token(planned[0]))
    h2 = next(s for s in executed if s.host == "h2" and s.phase == "switch")
    assert "stop router" in h2.summary and "start" not in h2.summary
    time.sleep(1.05 - time.time() % 1)
    dry = engine.deploy(load_deployment(p), _opts(w, dry_run=True), patches=[str(w.patch2)])
    pruned = [s for s in dry["steps"] if s["phase"] == "close"]
    assert all(f"prune {rep['hosts']['h0']['from']}" in s["summary"] for s in pruned)
    planned, executed = [], []
    rep3 = engine.deploy(load_deployment(p), _opts(w, steps=planned.append, trace=executed.append),
                         patches=[str(w.patch2)])
    check_equal(dry, planned[0], executed, rec, _token(planned[0]))
    first = rep["hosts"]["h0"]["from"]
    assert rep3["hosts"]["h0"]["pruned"] == [first]
    assert not (w.roots["h0"] / "releases" / first).exists()


@needs_rsync
def test_converging_deploy_runs_exactly_its_dry_run(world, monkeypatch):
    """The active release deployed again with decode's process killed: the dry run lists the
    start on h1 and the gate, and the run executes exactly that (h1: lock, start, gate, close).
    Then ``restart -g decode`` on the same world runs exactly its dry run's steps."""
    w = world
    rid = engine.deploy(load_deployment(w.profile), _opts(w))["release"]
    kill_server(w.roots["h1"] / "run" / "decode.pid")
    dry = engine.deploy(load_deployment(w.profile), _opts(w, dry_run=True))
    assert dry["release"] == rid
    rec = Recorder(monkeypatch)
    rep, planned, executed = _run(engine.deploy, w)
    assert rep["result"] == "ok" and rep["started"] == ["decode"]
    check_equal(dry, planned, executed, rec, _token(planned))
    assert [s.phase for s in executed if s.host == "h1"] == ["lock", "verify", "start", "gate", "close"]
    start = next(s for s in executed if s.phase == "start")
    assert start.cmd in rec.raw["h1"] and start.summary == f"start decode (not running) from {rid} (launcher)"
    # and the lifecycle on the same world (issue 42 item 4): ``restart -g decode`` runs exactly its
    # dry run's steps (one server restarted: the lifecycle's step list is the same for each)
    dry = lifecycle(load_deployment(w.profile), _opts(w, dry_run=True), "restart", groups=["decode"])
    rep, planned, executed = _run(lifecycle, w, "restart", groups=["decode"])
    assert rep["result"] == "ok", rep
    check_equal(dry, planned, executed, rec, _token(planned))
    assert [s.phase for s in executed if s.host == "h1"] == ["lock", "stop", "start", "gate", "close"]


@needs_rsync
def test_rollback_runs_exactly_its_dry_run(world, monkeypatch):
    w = world
    a = engine.deploy(load_deployment(w.profile), _opts(w))["release"]
    time.sleep(1.05 - time.time() % 1)
    b = engine.deploy(load_deployment(w.profile), _opts(w), patches=[str(w.patch1)])["release"]
    dry = engine.rollback(load_deployment(w.profile), _opts(w, dry_run=True), to=a)
    assert dry["release"] == a
    rec = Recorder(monkeypatch)
    rep, planned, executed = _run(engine.rollback, w, to=a)
    assert rep["result"] == "ok" and rep["hosts"]["h0"] == {"from": b, "to": a}
    check_equal(dry, planned, executed, rec, _token(planned))


@needs_rsync
def test_promote_runs_exactly_its_dry_run(promote_world, monkeypatch):
    """``deploy --promote``: canary (decode host), checks against the router, the rest, smoke."""
    w = promote_world
    time.sleep(1.05 - time.time() % 1)
    po = lambda: PromoteOptions(concurrency="4", turns=1, min_requests=4, max_corruption=0.6)  # noqa: E731
    dry = engine.deploy(load_deployment(w.profile), _opts(w, dry_run=True), patches=[str(w.patch1)], promote=po())
    rec = Recorder(monkeypatch)
    planned, executed = [], []
    rep = engine.deploy(load_deployment(w.profile), _opts(w, steps=planned.append, trace=executed.append),
                        patches=[str(w.patch1)], promote=po())
    assert rep["result"] == "ok" and rep["promotion"]["canary"] == ["h1"]
    # the evidence stamp is taken when the steps are built: the dry run's differs
    stamp = planned[0].of("evidence")[0].summary.rsplit("/", 2)[-2]
    dstamp = next(s for s in dry["steps"] if s["phase"] == "evidence")["summary"].rsplit("/", 2)[-2]
    for s in dry["steps"]:
        for k in ("summary", "cmd"):
            if s[k]:
                s[k] = s[k].replace(dstamp, stamp)
    check_equal(dry, planned[0], executed, rec, _token(planned[0]))
    # the patch changes the series: the upgrade gate's A/B in sequence ('before' the canary's
    # switch, then after it beside the canary's own checks) is in the dry run as it runs
    assert [s.stage for s in executed if s.phase == "check"] == ["before", "canary", "canary", "canary", "rest"], \
        [(s.stage, s.summary) for s in executed if s.phase == "check"]


@needs_rsync
def test_promote_by_hand_runs_exactly_its_dry_run(promote_world, monkeypatch):
    w = promote_world
    rid = (w.roots["h0"] / "current").resolve().name         # the release the hosts run
    po = PromoteOptions(concurrency="4", turns=1, min_requests=4, max_corruption=0.6)
    dry = promote_by_hand(load_deployment(w.profile), _opts(w, dry_run=True), rid, po)
    rec = Recorder(monkeypatch)
    planned, executed = [], []
    opts = _opts(w, steps=planned.append, trace=executed.append)
    rep = promote_by_hand(load_deployment(w.profile), opts, rid, po)
    assert rep["result"] == "good"
    assert [s.phase for s in executed if s.host in ("local", "h0")] == ["check", "check", "lock", "evidence", "close"]
    assert all(s.cmd in rec.raw[s.host] for s in executed if s.phase in ("lock", "close"))
    assert [(s["phase"], s["host"]) for s in dry["steps"]] == [(s.phase, s.host) for s in executed]


@needs_rsync
def test_dry_run_catches_a_patch_that_does_not_apply(world, tmp_path):
    """The dry run builds the release in a throw-away folder when the cache has not got it: a patch
    that does not apply is the same exit-2 error the run gives, and nothing is written."""
    from dsv4ctl.errors import InputError
    w = world
    bad = tmp_path / "0009-bad.patch"
    bad.write_text("From 1 Mon Sep 17 00:00:00 2001\\nSubject: [PATCH] bad\\n\\n---\\n"
                   "diff --git a/nope/missing.py b/nope/missing.py\\n--- a/nope/missing.py\\n+++ b/nope/missing.py\\n"
                   "@@ -1 +1 @@\\n-a\\n+b\\n")
    for dry in (True, False):
        with pytest.raises(InputError, match="0009-bad.patch"):
            engine.deploy(load_deployment(w.profile), _opts(w, dry_run=dry), patches=[str(bad)])
    assert not any(r.exists() for r in w.roots.values())
    assert not (w.tmp / "cache" / "releases").exists() or not any(
        (w.tmp / "cache" / "releases").glob("r*/RELEASE.json"))
