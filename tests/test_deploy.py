"""deploy / releases / rollback end to end: real sshd hosts, real rsync, the launcher starting
the SGLang stand-in, real HTTP health checks through the stand-in router."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import run_cli
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.sshd.world import World, http_status

pytestmark = pytest.mark.sshd


@pytest.fixture
def world(live_cluster, tmp_path):
    w = World(live_cluster, tmp_path, keep=2)
    yield w
    w.stop_services()


def cli(w: World, *args, timeout=180):
    return run_cli(*args, str(w.profile), env=w.env(), timeout=timeout)


def deploy_ok(w: World, *extra) -> dict:
    r = cli(w, "deploy", "--json", *extra)
    assert r.code == 0, r.err
    return r.json()


def serving(w: World) -> bool:
    return (http_status(f"http://{w.hosts[0].address}:{w.ports['prefill']}/health") == 200
            and http_status(f"http://{w.hosts[1].address}:{w.ports['decode']}/health") == 200)


def test_dry_run_changes_nothing(world):
    w = world
    r = cli(w, "deploy", "--dry-run", "--verbose")
    assert r.code == 0, r.err
    assert r.out.startswith("dry run: deploy r")
    for h in ("h0", "h1", "h2", "h3"):
        assert f"  {h}: lock {w.roots[h]}/.lock\n    $ mkdir -p {w.roots[h]}/releases && if mkdir {w.roots[h]}/.lock" in r.out
        assert f"  {h}: switch {w.roots[h]}/current: (none) -> " in r.out
    assert "h1: switch" in r.out and "start decode (launcher)" in r.out and "setsid env" in r.out
    assert f"wait for GET http://{w.hosts[1].address}:{w.ports['decode']}/health = 200" in r.out
    assert not any(p.exists() for p in w.roots.values())  # not even the deploy roots
    assert not (w.cache / "releases").exists()  # parsed YAML may be cached; no release was built


def test_deploy_then_delta_deploy_and_releases(world):
    w = world
    rep = deploy_ok(w)
    rid = rep["release"]
    assert w.currents() == {h: rid for h in w.roots}
    for h in w.roots:
        w.assert_complete(h)
        assert w.state(h)["releases"][rid]["state"] == "active"     # health gate passed; good needs a promotion gate
        a = w.audit(h)
        assert [(x["action"], x["result"], x["release"], x["from"]) for x in a] == [("deploy", "ok", rid, None)]
        assert a[0]["who"] and a[0]["host"] == h
        assert not (w.roots[h] / ".lock").exists()
    assert serving(w)
    # the router answers a 1-token chat completion
    import urllib.request
    req = urllib.request.Request(f"http://{w.hosts[2].address}:{w.ports['router']}/v1/chat/completions",
                                 data=json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode(),
                                 headers={"Content-Type": "application/json"})
    assert json.loads(urllib.request.urlopen(req, timeout=5).read())["choices"][0]["finish_reason"] == "length"

    # same inputs again: same release id, nothing pushed
    rep_same = deploy_ok(w)
    assert rep_same["release"] == rid and all(x["push"]["skipped"] for x in rep_same["hosts"].values())

    # a patch changes one file: new release, only that file (+ metadata) crosses, the rest hard-linked
    rep2 = deploy_ok(w, "--patch", str(w.patch))
    rid2 = rep2["release"]
    assert rid2 != rid and w.currents() == {h: rid2 for h in w.roots}
    for h, hr in rep2["hosts"].items():
        assert hr["from"] == rid
        assert hr["push"]["files_transferred"] <= 3, hr["push"]   # mem_cache.py + MANIFEST.json + RELEASE.json
        assert hr["push"]["bytes_sent"] < 20000
        root = w.roots[h]
        assert os.readlink(root / "previous") == f"releases/{rid}"
        same = "tree/python/sglang/srt/mod007.py"
        assert (root / "releases" / rid / same).stat().st_ino == (root / "releases" / rid2 / same).stat().st_ino
        changed = "tree/python/sglang/srt/mem_cache.py"
        assert (root / "current" / changed).read_text() == "INDEX_K_BYTES = 256\n"
        assert (root / "releases" / rid / changed).read_text() == "INDEX_K_BYTES = 132\n"
        w.assert_complete(h)
    assert serving(w)

    r = cli(w, "releases", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    for h in w.roots:
        rows = {x["id"]: x for x in doc["hosts"][h]["releases"]}
        assert rows[rid2]["state"] == "active" and rows[rid]["state"] == "previous"
        assert rows[rid2]["patches"] == [w.patch.name] and rows[rid]["patches"] == []
        assert rows[rid2]["base_ref"] == "v0.5.23" and rows[rid2]["who"]
    r = cli(w, "releases", "--markdown")
    assert r.code == 0 and f"| h3 | {rid2} | active | v0.5.23" in r.out

    # operator rollback: no release is good (no promotion gate passed), but the first one passed its health
    # gate when it was deployed: a bare rollback takes it and says why
    r = cli(w, "rollback", "--dry-run")
    assert r.code == 0 and f"dry run: rollback to {rid}" in r.out, r.err
    assert f"dsv4ctl: rollback to {rid}: the newest release built before the active {rid2} that passed its health " \
           "gate on every host and is not marked failed (recorded active)" in r.err
    r = cli(w, "rollback", "--to", rid, "--dry-run")
    assert r.code == 0 and f"dry run: rollback to {rid}" in r.out and w.currents() == {h: rid2 for h in w.roots}
    r = cli(w, "rollback", "--to", rid)
    assert r.code == 0, r.err
    assert w.currents() == {h: rid for h in w.roots}
    assert serving(w)
    for h in w.roots:
        assert w.audit(h)[-1]["action"] == "rollback" and w.audit(h)[-1]["result"] == "ok"
        assert (w.roots[h] / "current" / "tree/python/sglang/srt/mem_cache.py").read_text() == "INDEX_K_BYTES = 132\n"
    r = cli(w, "rollback", "--to", "rffffffffffff")
    assert r.code == 2 and "release rffffffffffff is not present on h0, h1, h2, h3" in r.err
    r = cli(w, "rollback", "--to", rid2)
    assert r.code == 0 and w.currents() == {h: rid2 for h in w.roots}

    # keep_releases = 2: a third release prunes the oldest (never current or previous)
    w.extra["prefill"] = {"chunked-prefill-size": 4096}
    w.write()
    rep3 = deploy_ok(w, "--patch", str(w.patch))
    for h in w.roots:
        assert sorted(p.name for p in (w.roots[h] / "releases").iterdir() if not p.name.startswith(".")) == sorted([rid2, rep3["release"]])
        assert rep3["hosts"][h]["pruned"] == [rid] and rid not in w.state(h)["releases"]
        assert w.audit(h)[-1]["pruned"] == [rid]


def test_unhealthy_release_rolls_back_automatically(world):
    w = world
    good = deploy_ok(w)["release"]
    w.extra["decode"] = {"standin-crash": "CUDA out of memory. Tried to allocate 2.00 GiB"}
    w.write()
    r = cli(w, "deploy", "--no-preflight")   # the crash is a stand-in control key: lint would refuse it
    assert r.code == 1, r.err
    err = r.err.strip().splitlines()[-1]
    # a failed health gate is a verdict, not an error: "gate failed", exit 1 (rollback: exit 3)
    assert err.startswith("dsv4ctl: gate failed: deploy of r") and f"rolled back to {good} on all hosts" in err
    assert "host h1 group decode: server process exited" in err
    assert "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB" in err
    assert "exited with status 1" in err
    bad = err.split("deploy of ")[1].split()[0]
    assert w.currents() == {h: good for h in w.roots}
    for h in w.roots:
        w.assert_complete(h)
        assert w.state(h)["releases"][bad]["state"] == "failed"
        assert w.audit(h)[-1]["result"] == "rolled-back" and w.audit(h)[-1]["release"] == bad
        assert not (w.roots[h] / ".lock").exists()
    assert serving(w)  # the good release's servers were restarted
    r = cli(w, "releases", "--json")
    assert {x["id"]: x["state"] for x in r.json()["hosts"]["h1"]["releases"]} == {good: "active", bad: "failed"}
    # never healthy (503 forever): the timeout names host and group
    w.extra["decode"] = {"standin-never-healthy": True}
    w.write()
    r = cli(w, "deploy", "--health-timeout", "3", "--no-preflight")
    assert r.code == 1
    assert "host h1 group decode: not healthy after the health timeout of 3 s (/health answered 503)" in r.err
    assert w.currents() == {h: good for h in w.roots} and serving(w)


def test_lock_held_fails_fast_and_break_lock(world):
    w = world
    lock = w.roots["h2"] / ".lock"
    lock.mkdir(parents=True)
    (lock / "holder.json").write_text(json.dumps({"who": "alice@ops1", "what": "deploy rX", "pid": 4242,
                                                  "since": "2026-11-29T10:00:00Z", "token": "t0k"}))
    r = cli(w, "deploy", "--patch", str(w.patch))
    assert r.code == 3
    assert ("h2: deploy lock " + str(lock) + " held by alice@ops1 (deploy rX, pid 4242, since 2026-11-29T10:00:00Z)") in r.err
    assert "--break-lock" in r.err
    for h in ("h0", "h1", "h3"):
        assert not (w.roots[h] / ".lock").exists()  # locks taken on the others were released
    r = cli(w, "releases")
    assert "h2: deploy lock held by alice@ops1" in r.out
    r = cli(w, "deploy", "--patch", str(w.patch), "--break-lock", "--json")
    assert r.code == 0, r.err
    a = w.audit("h2")
    brk = [x for x in a if x["action"] == "break-lock"]
    assert len(brk) == 1 and "alice@ops1" in brk[0]["detail"] and "t0k" not in json.dumps(a)
    assert not lock.exists()


def test_unknown_host_key_refused_then_accept_new(live_cluster, tmp_path):
    kh = tmp_path / "kh"
    live_cluster.write_known_hosts(kh, live_cluster.hosts[:2])  # h2 is unknown
    w = World(live_cluster, tmp_path / "w", nhosts=3, known_hosts=kh)
    r = cli(w, "deploy", "--dry-run")
    assert r.code == 3 and "h2: unknown host key ssh-ed25519 SHA256:" in r.err and "--accept-new-host-keys" in r.err
    before = kh.read_bytes()
    # a dry run trusts the new key for the run but writes nothing, known_hosts included (issue 13;
    # before, it appended h2's key)
    r = cli(w, "deploy", "--dry-run", "--accept-new-host-keys")
    assert r.code == 0, r.err
    assert kh.read_bytes() == before
    r = cli(w, "deploy", "--dry-run")
    assert r.code == 3 and "h2: unknown host key" in r.err
    # a real (read-only) command with accept-new records it, like OpenSSH's accept-new
    r = cli(w, "releases", "--accept-new-host-keys")
    assert r.code == 0, r.err
    assert f"[{live_cluster.hosts[2].address}]:{live_cluster.hosts[2].port} ssh-ed25519" in kh.read_text()
    r = cli(w, "deploy", "--dry-run")
    assert r.code == 0, r.err


def test_bad_inputs_exit_2(world):
    w = world
    r = cli(w, "deploy", "--base", "v9.9.9")
    assert r.code == 2 and "base ref 'v9.9.9' is not a commit" in r.err
    r = cli(w, "deploy", "--patch", "/nonexistent.patch")
    assert r.code == 2 and "/nonexistent.patch: patch file not found" in r.err
    r = run_cli("deploy", str(w.profile), env={**w.env(), "DSV4CTL_RSYNC_ARGS": "--bwlimit=9m --inplace"})
    assert r.code == 2 and "DSV4CTL_RSYNC_ARGS: --inplace is not allowed" in r.err
    assert not any(p.exists() for p in w.roots.values())


def test_push_without_rsync_on_the_host(live_cluster, tmp_path):
    """The no-rsync path (hard-link copy of the newest release + a tar of changed files) gives
    the same complete, verified releases with unchanged files shared."""
    w = World(live_cluster, tmp_path, nhosts=3)
    env = {"DSV4CTL_PUSH": "copy"}
    try:
        r = run_cli("deploy", "--json", str(w.profile), env={**w.env(), **env}, timeout=180)
        assert r.code == 0, r.err
        a = r.json()
        assert all(h["push"]["method"] == "copy" for h in a["hosts"].values())
        r = run_cli("deploy", "--json", "--patch", str(w.patch), str(w.profile), env={**w.env(), **env}, timeout=180)
        assert r.code == 0, r.err
        b = r.json()
        for h, hr in b["hosts"].items():
            # mem_cache.py, MANIFEST.json, RELEASE.json and the tree's one symlink (links are re-sent)
            assert hr["push"]["files_transferred"] == 4
            w.assert_complete(h)
            same = "tree/python/sglang/srt/mod003.py"
            root = w.roots[h]
            assert (root / "releases" / a["release"] / same).stat().st_ino == \
                   (root / "releases" / b["release"] / same).stat().st_ino
            assert os.readlink(root / "releases" / b["release"] / "tree/python/sglang/srt/alias.py") == "mod000.py"
        assert serving(w)
    finally:
        w.stop_services()


def test_step_durations_in_report_and_run_log(world, tmp_path):
    """Every executed step carries ``duration_s`` (non-negative) in the --json report and in the
    run log; per host they add up to less than the run's wall time (steps of one host run one
    after the other); the push stats split transfer and verify."""
    import time
    w = world
    env = dict(w.env(), DSV4CTL_STATE_DIR=str(tmp_path / "state"))
    t0 = time.monotonic()
    r = run_cli("deploy", "--json", str(w.profile), env=env, timeout=180)
    wall = time.monotonic() - t0
    assert r.code == 0, r.err
    rep = r.json()
    steps = rep["steps"]
    assert {s["phase"] for s in steps} == {"lock", "push", "switch", "gate", "close"}
    assert all(isinstance(s["duration_s"], float) and s["duration_s"] >= 0 for s in steps)
    for h in w.roots:
        mine = [s for s in steps if s["host"] == h]
        assert [s["phase"] for s in mine if s["phase"] != "gate"] == ["lock", "push", "switch", "close"]
        assert sum(s["duration_s"] for s in mine) < min(wall, rep["seconds"])
        push = rep["hosts"][h]["push"]
        assert 0 <= push["transfer_seconds"] and 0 <= push["verify_seconds"]
        # each figure is rounded to the millisecond: their sum may pass the rounded total by 1 ms
        assert push["transfer_seconds"] + push["verify_seconds"] <= push["seconds"] + 0.0015
    log = json.loads((tmp_path / "state" / "runs.jsonl").read_text().splitlines()[-1])
    assert sorted((s["phase"], s["host"], s["duration_s"]) for s in log["steps"]) == \
        sorted((s["phase"], s["host"], s["duration_s"]) for s in steps)
