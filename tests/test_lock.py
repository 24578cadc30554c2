"""``dsv4ctl lock status|acquire|release`` and ``deploy -m`` on real sshd hosts (issue 26, item 3)."""

from __future__ import annotations

import json

import pytest

from dsv4ctl.hosts.layout import HostFacts
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.test_converge import cli, world  # noqa: F401 - the same four-host world and CLI helper

pytestmark = pytest.mark.sshd


def run_lock(w, host: str, who: str, what: str, pid: int, since: str):
    """A lock held on ``host`` by another run (its holder.json as a deploy writes it)."""
    lock = w.roots[host] / ".lock"
    lock.mkdir(parents=True)
    (lock / "holder.json").write_text(json.dumps({"who": who, "what": what, "pid": pid, "since": since,
                                                  "token": "tok-" + who}))
    return lock


def test_lock_by_hand_blocks_deploys_until_released_and_deploy_message(world):
    w = world
    r = cli(w, "lock", "status", "--json")
    assert r.code == 0, r.err
    assert r.json()["hosts"] == {h: {"held": False} for h in ("h0", "h1", "h2", "h3")}

    # --dry-run (issue 31: on every mutating command) reads and takes nothing
    r = cli(w, "lock", "acquire", "-m", "upgrading NVIDIA drivers", "--dry-run")
    assert r.code == 0 and r.out.strip() == "dry run: would lock h0, h1, h2, h3: upgrading NVIDIA drivers", r.err
    assert not any((w.roots[h] / ".lock").exists() for h in w.roots)
    r = cli(w, "lock", "acquire", "-m", "upgrading NVIDIA drivers", "--json")
    assert r.code == 0, r.err
    assert r.json() == {"schema": "dsv4ctl.lock/1", "action": "acquire", "message": "upgrading NVIDIA drivers",
                        "hosts": ["h0", "h1", "h2", "h3"]}
    r = cli(w, "lock", "acquire", "-m", "second", "--dry-run")
    assert r.code == 3 and "lock acquire would take nothing (dry run)" in r.err
    r = cli(w, "lock", "release", "--dry-run", "--json")
    assert r.code == 0 and r.json()["dry_run"] is True and r.json()["hosts"] == ["h0", "h1", "h2", "h3"], r.err
    assert all((w.roots[h] / ".lock").is_dir() for h in w.roots)
    doc = cli(w, "lock", "status", "--json").json()["hosts"]["h1"]
    assert doc["held"] and doc["manual"] and not doc["stale"] and doc["age_s"] < 120
    assert doc["holder"]["message"] == "upgrading NVIDIA drivers" and "token" not in doc["holder"]
    assert doc["holder"]["what"] == "lock acquire: upgrading NVIDIA drivers"
    r = cli(w, "lock", "status")
    assert "held (by hand)" in r.out and "lock acquire: upgrading NVIDIA" in r.out

    r = cli(w, "deploy", "--no-preflight")
    assert r.code == 3
    line = r.err.strip().splitlines()[-1]
    assert "deploy lock" in line and "(lock acquire: upgrading NVIDIA drivers, pid " in line
    assert line.endswith("min old; it was taken by hand: dsv4ctl lock release PROFILE when the work it names is done")
    assert not any((w.roots[h] / "current").exists() for h in w.roots)
    r = cli(w, "lock", "acquire", "-m", "second")
    assert r.code == 3 and "upgrading NVIDIA drivers" in r.err
    assert cli(w, "lock", "status", "--json").json()["hosts"]["h0"]["holder"]["message"] == "upgrading NVIDIA drivers"

    r = cli(w, "lock", "release")
    assert r.code == 0, r.err
    assert r.out.splitlines()[0].startswith("h0: released the lock held by ")
    for h in w.roots:
        recs = [(x["action"], x["result"]) for x in w.audit(h)]
        assert recs == [("lock acquire", "ok"), ("lock release", "ok")], (h, recs)
        assert w.audit(h)[-1]["detail"].endswith(": upgrading NVIDIA drivers")
    assert cli(w, "lock", "release").out.strip() == "no lock held"

    r = cli(w, "deploy", "--no-preflight", "-m", "bf16 index-K patch, HiCache off", "--json")
    assert r.code == 0, r.err
    rid = r.json()["release"]
    assert w.audit("h0")[-1]["message"] == "bf16 index-K patch, HiCache off"
    assert w.state("h0")["releases"][rid]["message"] == "bf16 index-K patch, HiCache off"
    rows = cli(w, "releases", "--json").json()["hosts"]["h0"]["releases"]
    assert rows[0]["id"] == rid and rows[0]["message"] == "bf16 index-K patch, HiCache off"
    r = cli(w, "audit", "--markdown")
    row = [ln for ln in r.out.splitlines() if "| h0 | deploy |" in ln][-1]
    assert row.endswith(f'| {rid} | ok (no preflight) | "bf16 index-K patch, HiCache off" |'), row


def test_a_runs_lock_is_released_only_with_force_and_bad_messages(world):
    w = world
    lock = run_lock(w, "h2", "alice@ops1", "deploy rX", 4242, "2026-11-29T10:00:00Z")
    r = cli(w, "lock", "status")
    assert "alice@ops1 (deploy rX, pid 4242, since 2026-11-29T10:00:00Z)" in r.out and "(stale?)" in r.out
    assert "if its run is gone, dsv4ctl lock release PROFILE --force" in r.out
    r = cli(w, "lock", "release")
    assert r.code == 3 and "h2: the lock is held by a run, not by lock acquire: alice@ops1 (deploy rX" in r.err
    assert "nothing released" in r.err and lock.is_dir()
    r = cli(w, "lock", "release", "--dry-run")
    assert r.code == 3 and "would release nothing" in r.err and lock.is_dir()
    r = cli(w, "lock", "release", "--force", "--dry-run")
    assert r.code == 0 and r.out.startswith("h2: dry run: would release the lock held by alice@ops1") and lock.is_dir()
    r = cli(w, "lock", "release", "--force")
    assert r.code == 0, r.err
    assert not lock.exists() and w.audit("h2")[-1]["action"] == "lock release"
    for args in (["lock", "acquire", "-m", ""], ["lock", "acquire", "-m", "two\nlines"], ["deploy", "-m", " "],
                 ["lock", "acquire", "-m", "a\u2028b"], ["lock", "acquire", "-m", "\x9b31mRED"],
                 ["deploy", "-m", "rtl\u202eevil"], ["lock", "acquire", "-m", "x" * 501]):
        r = cli(w, *args)
        assert r.code == 2 and r.err.strip() == "dsv4ctl: error: --message must be one line of 1-500 printable characters", (args, r.err)


def test_only_the_current_release_is_active():
    f = HostFacts("h", "/r", releases={"r1": {}, "r2": {}, "r3": {}}, current="r3", previous="r2")
    f.state = {"releases": {"r1": {"state": "active"}, "r2": {"state": "active"}, "r3": {"state": "active"}}}
    assert [f.release_state(r) for r in ("r1", "r2", "r3")] == ["ran", "previous", "active"]


def test_a_lock_acquire_that_cannot_take_every_host_gives_back_and_says_so(world):
    w = world
    lock = run_lock(w, "h2", "bob@ops2", "deploy rY", 7, "2026-12-04T10:00:00Z")
    r = cli(w, "lock", "acquire", "-m", "maintenance")
    assert r.code == 3 and "h2: deploy lock" in r.err and "bob@ops2 (deploy rY" in r.err
    for h in ("h0", "h1", "h3"):
        assert not (w.roots[h] / ".lock").exists()
        recs = [(x["action"], x["result"], x["detail"]) for x in w.audit(h)]
        assert recs == [("lock acquire", "ok", "maintenance"),
                        ("lock release", "ok", "given back: another host's lock could not be taken")], (h, recs)
    assert lock.is_dir()                                  # the other run's lock is not touched
    lock.joinpath("holder.json").unlink()
    lock.rmdir()

    # a lock taken by hand is not stale: --break-lock refuses it, only lock release removes it
    assert cli(w, "lock", "acquire", "-m", "driver upgrade").code == 0
    r = cli(w, "deploy", "--no-preflight", "--break-lock")
    assert r.code == 3 and "--break-lock does not remove a lock taken by hand" in r.err, r.err
    assert all((w.roots[h] / ".lock").is_dir() for h in w.roots)
    assert cli(w, "lock", "release").code == 0

