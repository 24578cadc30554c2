"""Release states that cannot lie (deploy/states.py), tested as a table, and the story end to end
on local hosts with the DSV4 stand-in: a promotion fails and rolls back; a plain deploy of the
failed release is refused; --force-failed activates it as active (recorded), never good; the
default rollback never picks it; a failing preflight changes no host."""

from __future__ import annotations

import json
import time

import pytest

from dsv4ctl.deploy import engine
from dsv4ctl.deploy.promote import PromoteOptions, promote_by_hand
from dsv4ctl.deploy.site import Options
from dsv4ctl.deploy.states import Refused, next_state, transition
from dsv4ctl.errors import InputError, VerdictError
from dsv4ctl.profile.deployment import load_deployment
from tests.test_golden import needs_rsync
from tests.test_steps_equal import standin_world


@pytest.fixture
def promote_world(tmp_path):
    """A stand-in world with nothing deployed (each test starts from its first deploy)."""
    w = standin_world(tmp_path)
    yield w
    w.stop_services()

TABLE = {  # from-state -> {event: to-state}; an interrupt is not a verdict: it keeps the state
    None:     {"pushed": "pushed", "healthy": "active", "gate_passed": "good", "failed": "failed", "interrupted": "pushed"},
    "pushed": {"pushed": "pushed", "healthy": "active", "gate_passed": "good", "failed": "failed", "interrupted": "pushed"},
    "active": {"pushed": "active", "healthy": "active", "gate_passed": "good", "failed": "failed", "interrupted": "active"},
    "good":   {"pushed": "good", "healthy": "good", "gate_passed": "good", "failed": "failed", "interrupted": "good"},
    "failed": {"pushed": "failed", "healthy": "refused", "gate_passed": "good", "failed": "failed",
               "interrupted": "failed"},
}


@pytest.mark.parametrize("frm,event,to", [(f, e, t) for f, row in TABLE.items() for e, t in row.items()])
def test_transition_table(frm, event, to):
    rec = None if frm is None else {"state": frm, "failed_at": "T0", "failed_check": "check load"} \
        if frm == "failed" else {"state": frm}
    assert next_state(rec, event) == to
    if to == "refused":
        with pytest.raises(Refused, match=r"release r1 failed on h0 at T0: check load; gate it again"):
            transition(rec, event, at="T1", by="me", rid="r1", host="h0")
        forced = transition(rec, event, at="T1", by="me", force_failed=True)
        assert forced["state"] == "active" and forced["forced_at"] == "T1" and forced["failed_at"] == "T0"
    else:
        new = transition(rec, event, at="T1", by="me", failure="why")
        assert new["state"] == to and (rec is None or new is not rec)
    with pytest.raises(ValueError):
        transition(rec, "bogus", at="T", by="me")


def test_only_a_gate_writes_good():
    for frm in TABLE:
        for event in ("pushed", "healthy", "failed"):
            rec = None if frm is None else {"state": frm}
            if frm != "good":
                assert next_state(rec, event, force_failed=True) != "good"


def _state(w, host: str, rid: str) -> dict:
    return json.loads((w.roots[host] / "state.json").read_text())["releases"].get(rid, {})


def _audit(w, host: str) -> list[dict]:
    return [json.loads(ln) for ln in (w.roots[host] / "audit.jsonl").read_text().splitlines()]


def _snapshot(w) -> dict:
    return {h: ((r / "state.json").read_text(), (r / "current").resolve()) for h, r in w.roots.items()}


@needs_rsync
def test_failed_release_story(promote_world):
    w = promote_world
    opts = lambda **kw: Options(cache=w.tmp / "cache", **kw)  # noqa: E731
    dep = lambda: load_deployment(w.profile)  # noqa: E731
    passing = lambda: PromoteOptions(concurrency="4", turns=1, min_requests=4, max_corruption=0.6)  # noqa: E731
    failing = lambda: PromoteOptions(concurrency="4", turns=1, min_requests=4, max_corruption=0.0)  # noqa: E731

    a = engine.deploy(dep(), opts())
    assert a["result"] == "ok" and a["state"] == "active"            # a health gate is not a promotion
    assert promote_by_hand(dep(), opts(), a["release"], passing())["result"] == "good"
    assert _state(w, "h0", a["release"])["state"] == "good"
    time.sleep(1.05 - time.time() % 1)

    with pytest.raises(VerdictError, match="check load failed"):
        engine.deploy(dep(), opts(), patches=[str(w.patch1)], promote=failing())
    b = next(r for r in json.loads((w.roots["h0"] / "state.json").read_text())["releases"] if r != a["release"])
    rec = _state(w, "h1", b)
    assert rec["state"] == "failed" and rec["failed_check"] == "check load" and rec["evidence"].startswith("evidence/")
    assert "corruption" in rec["failure"] and "Wilson upper bound" in rec["failure"]
    assert {h: (r / "current").resolve().name for h, r in w.roots.items()} == {h: a["release"] for h in w.roots}

    before = _snapshot(w)
    for dry in (True, False):
        with pytest.raises(Refused, match=rf"release {b} failed on h0 at .*: check load .*--force-failed"):
            engine.deploy(dep(), opts(dry_run=dry), patches=[str(w.patch1)])
    assert _snapshot(w) == before and not (w.roots["h0"] / ".lock").exists()

    forced = engine.deploy(dep(), opts(force_failed=True), patches=[str(w.patch1)])
    assert forced["release"] == b and forced["state"] == "active"
    rec = _state(w, "h0", b)
    assert rec["state"] == "active" and rec["failed_at"] and rec["forced_at"]
    assert _audit(w, "h0")[-1]["forced_failed"] is True and _audit(w, "h0")[-1]["result"] == "ok"

    back = engine.rollback(dep(), opts())                         # the newest good release: A, never B
    assert back["release"] == a["release"] and back["state"] == "good"
    with pytest.raises(InputError, match=rf"no release built before the active {a['release']} passed its health gate "
                                         rf"on every host.*the previous release is {b} \(marked failed\): "
                                         rf"dsv4ctl rollback PROFILE --to {b} --force-failed$"):
        engine.rollback(dep(), opts())
    rows = engine.releases(dep(), opts())["hosts"]["h0"]["releases"]
    row = next(r for r in rows if r["id"] == b)
    assert row["recorded_state"] == "active" and row["failed_check"] == "check load" and row["forced_at"]


@needs_rsync
def test_a_failing_preflight_changes_no_host(promote_world):
    w = promote_world
    (w.cfgdir / "decode.yaml").write_text((w.cfgdir / "decode.yaml").read_text() + "max-running-requests: 100000\n")
    with pytest.raises(VerdictError, match=r"preflight: .* nothing touched"):
        engine.deploy(load_deployment(w.profile), Options(cache=w.tmp / "cache"))
    assert not any(r.exists() for r in w.roots.values()) and not (w.tmp / "cache" / "releases").exists()
    rep = engine.deploy(load_deployment(w.profile), Options(cache=w.tmp / "cache", preflight=False))
    assert rep["result"] == "ok"
    assert all(_audit(w, h)[-1]["preflight"] == "skipped" for h in w.roots)


@needs_rsync
def test_run_log_and_quiet(promote_world, tmp_path):
    """Every mutating run leaves one JSON line in <state>/runs.jsonl with its steps and outcome;
    -q prints only the verdict."""
    from tests.conftest import run_cli
    w = promote_world
    env = dict(w.env, DSV4CTL_STATE_DIR=str(tmp_path / "state"))
    r = run_cli("deploy", str(w.profile), "-q", env=env, timeout=300)
    assert r.code == 0, r.err
    assert r.out.startswith("deployed r") and r.out.strip().endswith("(active)") and r.err == ""
    r = run_cli("rollback", str(w.profile), "-q", env=env)
    assert r.code == 2
    recs = [json.loads(ln) for ln in (tmp_path / "state" / "runs.jsonl").read_text().splitlines()]
    assert [x["command"] for x in recs] == ["deploy", "rollback"]
    assert recs[0]["exit_code"] == 0 and recs[0]["state"] == "active"
    assert [s["phase"] for s in recs[0]["steps"] if s["host"] == "h0"] == ["lock", "push", "switch", "gate", "close"]
    assert recs[1]["exit_code"] == 2 and "no release built before the active" in recs[1]["error"]
    assert oct((tmp_path / "state" / "runs.jsonl").stat().st_mode & 0o777) == "0o600"
