"""Faults during deploys against real sshd hosts: sshd killed mid-transfer, a full disk on one
host (a small tmpfs), interrupts during the push and during activation. After each, every
host's ``current`` points to a complete release and all hosts are on the same one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, mount_tmpfs, umount
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.sshd.world import World, git, http_status, wait_for

pytestmark = pytest.mark.sshd

BIG_MB = 6


@pytest.fixture
def world(live_cluster, tmp_path):
    w = World(live_cluster, tmp_path)
    # a second base commit with a big incompressible file: slow to push under --bwlimit
    (w.tree / "python" / "sglang" / "srt" / "weights_stub.bin").write_bytes(os.urandom(BIG_MB << 20))
    git(w.tree, "checkout", "-q", "-b", "big")
    git(w.tree, "add", "-A")
    git(w.tree, "commit", "-q", "-m", "big file")
    git(w.tree, "checkout", "-q", "v0.5.23")
    yield w
    w.stop_services()


def start(w: World, *args, env=None) -> subprocess.Popen:
    e = dict(os.environ, COLUMNS="200", NO_COLOR="1", **w.env(), **(env or {}))
    return subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", *args, str(w.profile)], cwd=REPO, env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(w: World, *args, env=None, timeout=240):
    p = start(w, *args, env=env)
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def all_on(w: World, rid: str) -> None:
    """Every host's current is ``rid`` and complete; no incoming folder, no lock left."""
    assert w.currents() == {h: rid for h in w.roots}
    for h, root in w.roots.items():
        w.assert_complete(h)
        assert not [p for p in (root / "releases").iterdir() if p.name.startswith(".incoming-")], h


def first_release(w: World) -> str:
    code, out, err = run(w, "deploy", "--json")
    assert code == 0, err
    return json.loads(out)["release"]


def incoming_bytes(w: World, host: str) -> int:
    n = 0
    for d in (w.roots[host] / "releases").glob(".incoming-*"):
        for dp, _, fs in os.walk(d):
            for f in fs:
                try:
                    n += os.lstat(os.path.join(dp, f)).st_size
                except OSError:
                    pass
    return n


SLOW = {"DSV4CTL_RSYNC_ARGS": "--bwlimit=1000"}  # KiB/s: the big file takes ~6 s per host


def test_sshd_killed_mid_transfer(world):
    w = world
    a = first_release(w)
    p = start(w, "deploy", "--base", "big", env=SLOW)
    assert wait_for(lambda: incoming_bytes(w, "h2") > 300_000, timeout=60), p.stderr.read() if p.poll() is not None else ""
    w.c.hosts[2].kill()
    out, err = p.communicate(timeout=120)
    assert p.returncode == 3, err
    last = err.strip().splitlines()[-1]
    assert "stopped before any host was switched: push failed on h2: " in last
    assert w.currents() == {h: a for h in w.roots}
    for h in ("h0", "h1", "h3"):
        all_on_one = w.assert_complete(h)
        assert all_on_one == a
        assert not list((w.roots[h] / "releases").glob(".incoming-*"))
        assert not (w.roots[h] / ".lock").exists()
        assert w.audit(h)[-1]["result"] == "failed" and "h2" in w.audit(h)[-1]["detail"]
    w.assert_complete("h2")  # the half-pushed release is only in .incoming-<id>, never current
    # h2 comes back: its lock is still held by the failed run (it could not be reached to
    # unlock), so the next deploy names it; breaking it explicitly finishes the job
    w.c.hosts[2].start()
    code, out, err = run(w, "deploy", "--base", "big", "--json")
    assert code == 3 and "h2: deploy lock" in err and "that run is dead" in err, err
    assert f"free the lock with dsv4ctl lock release {w.profile} --force" in err
    code, out, err = run(w, "deploy", "--base", "big", "--break-lock", "--json")
    assert code == 0, err
    b = json.loads(out)["release"]
    all_on(w, b)


def test_full_disk_on_one_host(world):
    w = world
    root = w.roots["h3"]
    root.mkdir(parents=True)
    mount_tmpfs(root, "3m")
    try:
        a = first_release(w)
        code, out, err = run(w, "deploy", "--base", "big")
        assert code == 3, err
        last = err.strip().splitlines()[-1]
        assert "stopped before any host was switched: push failed on h3: " in last
        assert "No space left on device" in last
        all_on(w, a)
        for h in w.roots:
            assert not (w.roots[h] / ".lock").exists()
        assert w.audit("h3")[-1]["result"] == "failed"
        assert http_status(f"http://{w.hosts[1].address}:{w.ports['decode']}/health") == 200  # still serving a
    finally:
        w.stop_services()
        umount(root)


def test_interrupt_during_push(world):
    w = world
    a = first_release(w)
    p = start(w, "deploy", "--base", "big", env=SLOW)
    assert wait_for(lambda: all(incoming_bytes(w, h) > 100_000 for h in w.roots), timeout=60)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert err.strip().splitlines()[-1] == "dsv4ctl: error: interrupted"
    all_on(w, a)
    for h in w.roots:
        assert not (w.roots[h] / ".lock").exists()
        assert w.audit(h)[-1]["result"] == "interrupted"
    assert http_status(f"http://{w.hosts[1].address}:{w.ports['decode']}/health") == 200


def test_interrupt_during_activation_rolls_back(world):
    w = world
    a = first_release(w)
    w.extra["decode"] = {"standin-startup-s": 300}   # the new decode server takes "forever" to load
    w.write()
    p = start(w, "deploy", "--health-timeout", "200", "--no-preflight")   # a stand-in control key
    assert wait_for(lambda: all(c and c != a for c in w.currents().values()), timeout=90), \
        p.stderr.read() if p.poll() is not None else w.currents()
    b = w.current("h0")
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)   # SIGTERM is handled like Ctrl-C
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    all_on(w, a)
    for h in w.roots:
        assert os.readlink(w.roots[h] / "releases" / a / ".." / ".." / "current") == f"releases/{a}"
        # an interrupt is not a verdict: recorded as interrupted, the release not marked failed
        rec = w.state(h)["releases"][b]
        assert rec["state"] == "pushed" and rec["interrupted_during"] == "activation" and rec["interrupted_at"]
        assert w.audit(h)[-1]["result"] == "interrupted"
        assert not (w.roots[h] / ".lock").exists()
    assert wait_for(lambda: http_status(f"http://{w.hosts[1].address}:{w.ports['decode']}/health") == 200, timeout=30)
    # the interrupted release is never chosen by a bare rollback (it never passed a gate: not good)
    code, out, err = run(w, "releases", "--json")
    assert {x["id"]: x["state"] for x in json.loads(out)["hosts"]["h1"]["releases"]} == {a: "active", b: "pushed"}


def signal_after(p: subprocess.Popen, needle: str, count: int = 1, delay: float = 0.0,
                 sig: int = signal.SIGINT) -> list[str]:
    """Read the deploy's stderr until ``needle`` has appeared ``count`` times, wait ``delay`` s,
    send ``sig``; return the lines read so far (the rest stays for communicate())."""
    seen, lines = 0, []
    while seen < count:
        line = p.stderr.readline()
        assert line, "".join(lines)
        lines.append(line)
        seen += needle in line
    time.sleep(delay)
    p.send_signal(sig)
    return lines


@pytest.mark.parametrize("needle, count, delay", [
    ("built r", 1, 0.0),        # while the locks are being taken
    ("pushed ", 4, 0.05),       # as the hosts start switching
])
def test_interrupt_at_phase_boundaries(world, needle, count, delay):
    """Ctrl-C as the locks are taken or as activation starts: in-flight lock/switch commands
    finish first, then every lock is dropped and every host is back on the same release."""
    w = world
    a = first_release(w)
    w.extra["decode"] = {"chunked-prefill-size": 4096}
    w.write()
    p = start(w, "deploy", "--health-timeout", "60")
    head = signal_after(p, needle, count, delay)
    out, err = p.communicate(timeout=180)
    assert p.returncode == 130, "".join(head) + err
    all_on(w, a)
    for h in w.roots:
        assert not (w.roots[h] / ".lock").exists(), (h, "".join(head) + err)
    assert wait_for(lambda: http_status(f"http://{w.hosts[1].address}:{w.ports['decode']}/health") == 200, timeout=30)
