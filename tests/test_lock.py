"""``dsv4ctl lock status|acquire|release`` and ``deploy -m`` on real sshd hosts (issue 26, item 3)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from dsv4ctl.hosts.layout import HostFacts
from tests.conftest import REPO, run_cli
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.test_converge import cli, world  # noqa: F401 - the same four-host world and CLI helper

pytestmark = pytest.mark.sshd


def run_lock(w, on: str, who: str, what: str, pid: int, since: str, **where):
    """A lock held on ``host`` by another run (its holder.json as a deploy writes it; ``where``:
    the machine record, none as an older dsv4ctl wrote it)."""
    lock = w.roots[on] / ".lock"
    lock.mkdir(parents=True)
    (lock / "holder.json").write_text(json.dumps({"who": who, "what": what, "pid": pid, "since": since,
                                                  "token": "tok-" + who, **where}))
    return lock


def here(pid: int) -> dict:
    """Where ``pid`` of this machine runs, read here the way an operator would (not by dsv4ctl)."""
    def first(path):
        with open(path) as f:
            return f.readline().strip()
    stat = open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1].split()
    return {"hostname": os.uname().nodename, "machine": first("/etc/machine-id"),
            "boot": first("/proc/sys/kernel/random/boot_id"), "pidns": os.readlink("/proc/self/ns/pid"),
            "pid_start": stat[19]}


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
    assert line.endswith(f"min old; it was taken by hand: dsv4ctl lock release {w.profile} when the work it names is done")
    assert not any((w.roots[h] / "current").exists() for h in w.roots)
    assert "dsv4ctl: built " not in r.err, r.err      # refused before the release is built (issue 46.7)
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
    """A run's lock (issue 41 a): without --force nothing; with --force only when its process is
    known gone — checked on this machine when it ran here (a pid reused by another process is
    gone); a holder on another machine (or written without the machine record) needs
    --force --yes-it-is-dead. Each refusal names the exact command with the profile as given."""
    w = world
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        live = here(sleeper.pid)
        lock = run_lock(w, "h2", "alice@ops1", "deploy rX", sleeper.pid, "2026-11-29T10:00:00Z", **live)
        r = cli(w, "lock", "status")
        assert "alice@ops1 (deploy rX, pid" in r.out and "(stale?)" in r.out and "dead" not in r.out, r.out
        assert cli(w, "lock", "status", "--json").json()["hosts"]["h2"]["process"] == "alive"
        r = cli(w, "lock", "release")
        assert r.code == 3 and "h2: the lock is held by a run, not by lock acquire: alice@ops1 (deploy rX" in r.err
        assert f"nothing released (that run is still going: pid {sleeper.pid} still runs on this machine" in r.err
        for extra in ([], ["--dry-run"]):
            r = cli(w, "lock", "release", "--force", *extra)
            assert r.code == 3 and f"nothing released: pid {sleeper.pid} still runs on this machine" in r.err, r.err
            assert len(r.err.strip().splitlines()) == 1 and lock.is_dir()
        assert ("(dry run)" in r.err) and f"dsv4ctl lock release {w.profile} --force --yes-it-is-dead" in r.err
        r = cli(w, "deploy", "--no-preflight")
        assert r.code == 3 and f"that run is still going (pid {sleeper.pid} still runs" in r.err, r.err
        for argv in (("deploy", "--no-preflight", "--dry-run"), ("start", "--dry-run")):   # the dry run is the run
            r = cli(w, *argv)
            assert r.code == 3 and f"that run is still going (pid {sleeper.pid} still runs" in r.err, (argv, r.err)
        r = cli(w, "deploy", "--no-preflight", "--break-lock")      # the same rule for --break-lock
        assert r.code == 3 and "h2: --break-lock does not remove the lock of a run that still runs" in r.err, r.err
        assert f"pid {sleeper.pid} still runs on this machine" in r.err and lock.is_dir()

        # the same pid started at another time is another process: the holder is gone
        (lock / "holder.json").write_text(json.dumps({**json.loads((lock / "holder.json").read_text()),
                                                      "pid_start": str(int(live["pid_start"]) - 7)}))
        r = cli(w, "lock", "release")
        assert r.code == 3 and (f"that run is dead (pid {sleeper.pid} is another process now (started later)): "
                                f"dsv4ctl lock release {w.profile} --force)") in r.err, r.err
    finally:
        sleeper.kill()
        sleeper.wait()
    # its process gone (the sleeper ended): dead, --force releases it
    (lock / "holder.json").write_text(json.dumps({**json.loads((lock / "holder.json").read_text()),
                                                  "pid_start": live["pid_start"]}))
    r = cli(w, "lock", "status")
    assert "held (run is dead)" in r.out and (f"h2: that run is dead (no process {sleeper.pid} runs on this "
                                              f"machine): dsv4ctl lock release {w.profile} --force") in r.out, r.out
    r = cli(w, "lock", "release", "--force", "--dry-run")
    assert r.code == 0 and r.out.startswith("h2: dry run: would release the lock held by alice@ops1") and lock.is_dir()
    r = cli(w, "lock", "release", "--force")
    assert r.code == 0, r.err
    assert not lock.exists() and w.audit("h2")[-1]["action"] == "lock release"

    # another machine's run (or an older dsv4ctl's record): only the operator can say it is gone
    for where, why in [({"hostname": "ops2", "machine": "0" * 32, "boot": "b", "pidns": "pid:[1]", "pid_start": "1"},
                        "pid 4242 runs on ops2, which this machine cannot check"),
                       ({}, "the holder record does not say which machine runs pid 4242")]:
        lock = run_lock(w, "h1", "bob@ops2", "rollback to rY", 4242, "2026-11-29T10:00:00Z", **where)
        r = cli(w, "lock", "release", "--force")
        assert r.code == 3 and r.err.strip().endswith(
            f"nothing released: {why} (if you are sure it is gone: dsv4ctl lock release {w.profile} --force "
            "--yes-it-is-dead)"), r.err
        r = cli(w, "deploy", "--no-preflight")
        assert r.code == 3 and r.err.strip().endswith(
            f"wait for it, or break a stale lock with --break-lock (if that run is gone: dsv4ctl lock release "
            f"{w.profile} --force --yes-it-is-dead; {why})"), r.err
        r = cli(w, "lock", "release", "--yes-it-is-dead")
        assert r.code == 2 and "--yes-it-is-dead goes with --force" in r.err and lock.is_dir()
        r = cli(w, "lock", "release", "--force", "--yes-it-is-dead")
        assert r.code == 0 and not lock.exists(), r.err
        assert w.audit("h1")[-1]["detail"].startswith("removed lock held by bob@ops2 (rollback to rY, pid 4242")
        assert "(--yes-it-is-dead)" in w.audit("h1")[-1]["detail"]
    for args in (["lock", "acquire", "-m", ""], ["lock", "acquire", "-m", "two\nlines"], ["deploy", "-m", " "],
                 ["lock", "acquire", "-m", "a\u2028b"], ["lock", "acquire", "-m", "\x9b31mRED"],
                 ["deploy", "-m", "rtl\u202eevil"], ["lock", "acquire", "-m", "x" * 501]):
        r = cli(w, *args)
        assert r.code == 2 and r.err.strip() == "dsv4ctl: error: --message must be one line of 1-500 printable characters", (args, r.err)


def test_a_live_deploys_lock_is_kept_and_a_killed_ones_is_named_dead(world):
    """The incident of issue 41 a, with a real deploy: while it waits for its health gate,
    ``lock release --force`` refuses (its pid runs here) and another deploy waits; once it is
    SIGKILLed (no clean-up), the next deploy names it dead with the exact command, which frees
    every host."""
    w = world
    prof = yaml.safe_load(w.profile.read_text())
    prof["groups"][0]["env"] = {"STANDIN_STARTUP_S": "60"}
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
    p = subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", "deploy", str(w.profile), "-v", "--no-preflight"],
                         cwd=REPO, env=dict(os.environ, **w.env(), COLUMNS="200", NO_COLOR="1"), text=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while True:
            line = p.stderr.readline()
            assert line, "the deploy ended before its health gate"
            if "step h0: wait for GET" in line:
                break
        r = cli(w, "lock", "release", "--force")
        assert r.code == 3 and f"nothing released: pid {p.pid} still runs on this machine" in r.err, r.err
        assert all((w.roots[h] / ".lock").is_dir() for h in w.roots)
        r = cli(w, "deploy", "--no-preflight")
        assert r.code == 3 and f"that run is still going (pid {p.pid} still runs on this machine" in r.err, r.err
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stderr.close()
    r = cli(w, "deploy", "--no-preflight")
    assert r.code == 3, r.err
    assert r.err.strip().endswith(f"that run is dead (no process {p.pid} runs on this machine): free the lock with "
                                  f"dsv4ctl lock release {w.profile} --force"), r.err
    assert "try again when it is done" not in r.err
    r = cli(w, "lock", "release", "--force")
    assert r.code == 0 and sorted(ln.split(":")[0] for ln in r.out.splitlines()) == sorted(w.roots), r.out + r.err
    assert not any((w.roots[h] / ".lock").exists() for h in w.roots)


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



def test_a_second_profile_on_a_roots_hosts_is_refused_with_both_names(world):
    """Issue 41 b: two profiles sharing a host's deploy root. The first deploy records its
    profile as the root's owner; another profile's deploy, dry run or not, restart or rollback is
    refused (exit 2, one line, both names), its servers untouched and no lock left behind."""
    from tests.test_converge import pid
    w = world
    r = cli(w, "deploy", "--no-preflight", "--json")
    assert r.code == 0, r.err
    own = json.loads((w.roots["h0"] / "owner.json").read_text())
    assert own["profile"] == "deploy-test" and own["path"] == str(w.profile) and own["since"].endswith("Z")
    before = pid(w, "h0", "prefill")
    other = w.cfgdir / "other.yaml"
    prof = yaml.safe_load(w.profile.read_text())
    prof["name"] = "other-team"
    other.write_text(yaml.safe_dump(prof, sort_keys=False))
    for args in (["deploy", "--dry-run"], ["deploy"], ["restart", "-g", "prefill"], ["rollback", "--dry-run"]):
        r = run_cli(args[0], str(other), *args[1:], "--no-preflight" if args[0] == "deploy" else "--accept-new-host-keys",
                    env=w.env(), timeout=120)
        assert r.code == 2, (args, r.err)
        errors = [ln for ln in r.err.splitlines() if "error" in ln]
        assert len(errors) == 1 and errors[0].startswith(
            f"dsv4ctl: error: h0: deploy root {w.roots['h0']} belongs to profile 'deploy-test' ("), (args, r.err)
        assert errors[0].endswith("profile 'other-team' would replace its releases and stop its servers: nothing "
                                  "changed (give 'other-team' its own deploy.root or hosts[].root)"), errors
    assert pid(w, "h0", "prefill") == before
    assert not any((w.roots[h] / ".lock").exists() for h in w.roots)
    assert [x["action"] for x in w.audit("h0")] == ["deploy"]
    assert cli(w, "deploy", "--no-preflight", "--dry-run").code == 0       # the owner itself goes on


def test_lock_status_shows_the_hosts_it_reads_when_one_is_lost(world):
    """One host unreachable: the others' locks are still shown (the dead run's hint too), then
    exit 3 naming the lost host; lock acquire --dry-run says it could not take that host
    (follower's finding: nothing was shown)."""
    w = world
    run_lock(w, "h1", "bob@ops2", "deploy rY", 7, "2026-12-04T10:00:00Z")
    w.c.hosts[3].kill()
    try:
        r = cli(w, "lock", "status")
        assert r.code == 3 and "reading the locks failed on 1 host(s): h3:" in r.err, r.err
        rows = {ln.split("|")[1].strip(): ln for ln in r.out.splitlines() if ln.startswith("| h")}
        assert "free" in rows["h0"] and "bob@ops2 (deploy rY" in rows["h1"] and "not read" in rows["h3"], r.out
        doc = cli(w, "lock", "status", "--json")
        assert doc.code == 3 and doc.json()["hosts"]["h3"]["held"] is None and doc.json()["hosts"]["h0"]["held"] is False
        r = cli(w, "lock", "acquire", "-m", "x", "--dry-run")
        assert r.code == 3 and "h3" in r.err
    finally:
        w.c.hosts[3].start()


def test_another_boot_is_dead_only_when_this_machine_booted_after_the_lock():
    """Same host name and machine id, another boot id: a restart since the lock was taken is
    proof (dead); a machine that has not booted since is a clone of one image (unknown: --force
    alone must not free a live run's lock) (breaker's finding)."""
    import time as _t
    from dsv4ctl.hosts.lock import holder_liveness
    since = _t.strftime("%Y-%m-%dT%H:%M:%SZ", _t.gmtime(_t.time() - 3600))
    h = {"hostname": "ops1", "machine": "m" * 32, "boot": "old", "pidns": "pid:[1]", "pid": 4242,
         "pid_start": "1", "since": since}
    here = {"hostname": "ops1", "machine": "m" * 32, "boot": "new", "pidns": "pid:[1]"}
    assert holder_liveness(h, {**here, "booted": int(_t.time()) - 60})[0] == "dead"          # rebooted since
    state, why = holder_liveness(h, {**here, "booted": int(_t.time()) - 7200})               # up for 2 h: a clone
    assert state == "unknown" and "a cloned machine?" in why
    assert holder_liveness(h, here)[0] == "unknown"                                           # boot time unread
