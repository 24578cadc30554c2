"""A full disk on a host (a real tmpfs, filled): every remote write either lands whole or leaves
the previous file as it was, the command's exit status says so, and the host lock is released.

The shell-level tests run the exact commands the deploy engine sends (``atomic_write_cmd``,
``take_cmd``, ``close_cmd``) under ``/bin/sh`` on a full tmpfs; the end-to-end test rolls back a
fleet of real sshd hosts one of whose roots is that tmpfs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from dsv4ctl.deploy.steps import close_cmd
from dsv4ctl.hosts.layout import Paths
from dsv4ctl.hosts.lock import holder, take_cmd
from dsv4ctl.remote.ops import atomic_write_cmd
from tests.conftest import mount_tmpfs, umount
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401

PAGE = 4096


def fill(d: Path, free_pages: int = 0) -> None:
    """Fill the file system of folder ``d`` but ``free_pages`` 4 KiB pages (``d/.filler``)."""
    with open(d / ".filler", "ab", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * PAGE)
        except OSError:
            pass
    os.truncate(d / ".filler", max(0, os.path.getsize(d / ".filler") - free_pages * PAGE))


@pytest.fixture
def tmpfs(tmp_path):
    """A 64 KiB tmpfs mounted on a test folder (skips where mount is not allowed)."""
    d = tmp_path / "fs"
    d.mkdir()
    mount_tmpfs(d, "64k")

    try:
        yield d
    finally:
        umount(d)


def sh(cmd: str, data: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/sh", "-c", cmd], input=data, capture_output=True, timeout=30)


def test_atomic_write_on_a_full_disk_keeps_the_old_file(tmpfs):
    path = tmpfs / "state.json"
    path.write_text('{"old": true}\n')
    os.chmod(path, 0o600)
    fill(tmpfs)
    r = sh(atomic_write_cmd(str(path)), b'{"new": true}\n' * 500)
    assert r.returncode != 0
    assert path.read_text() == '{"old": true}\n'
    assert sorted(p.name for p in tmpfs.iterdir()) == [".filler", "state.json"]   # no temp file left
    # the same command composed into an && list (as close_cmd does) still fails
    r = sh(f"true && {atomic_write_cmd(str(path))} && echo next", b"x" * 20000)
    assert r.returncode != 0 and b"next" not in r.stdout
    assert path.read_text() == '{"old": true}\n'


def test_atomic_write_with_room_replaces_and_keeps_the_mode(tmpfs):
    path = tmpfs / "sub" / "state.json"
    r = sh(atomic_write_cmd(str(path)), b"first\n")
    assert r.returncode == 0, r.stderr
    assert path.read_bytes() == b"first\n" and oct(path.stat().st_mode & 0o777) == "0o644"
    os.chmod(path, 0o600)
    assert sh(atomic_write_cmd(str(path)), b"second\n").returncode == 0
    assert path.read_bytes() == b"second\n" and oct(path.stat().st_mode & 0o777) == "0o600"


def test_lock_on_a_full_disk_is_given_back(tmpfs):
    lock = tmpfs / ".lock"
    fill(tmpfs)
    r = sh(take_cmd(str(lock), holder("deploy", "tok123"), then="echo facts"))
    assert r.returncode == 1 and b"facts" not in r.stdout
    assert not lock.exists()                     # mkdir worked, holder.json did not: no orphan lock


def test_close_on_a_full_disk_keeps_state_and_unlocks(tmpfs):
    p = Paths(str(tmpfs))
    (tmpfs / "state.json").write_text('{"releases": {}}\n')
    assert sh(take_cmd(p.lock, holder("rollback to x", "tok123"))).returncode == 0
    assert (tmpfs / ".lock" / "holder.json").exists()
    fill(tmpfs)
    site = SimpleNamespace(paths={"h": p}, token="tok123")
    r = sh(close_cmd(site, "h", {"action": "rollback", "result": "ok"}, [], None), b'{"releases": {"x": {}}}\n' * 300)
    assert r.returncode != 0
    assert json.loads((tmpfs / "state.json").read_text()) == {"releases": {}}
    assert not (tmpfs / ".lock").exists()
    assert [x.name for x in tmpfs.iterdir() if x.name.startswith("state.json.tmp")] == []


def test_close_with_room_records_and_unlocks(tmpfs):
    p = Paths(str(tmpfs))
    assert sh(take_cmd(p.lock, holder("deploy", "tok9"))).returncode == 0
    site = SimpleNamespace(paths={"h": p}, token="tok9")
    r = sh(close_cmd(site, "h", {"action": "deploy", "result": "ok"}, [], None), b'{"releases": {"y": {}}}\n')
    assert r.returncode == 0, r.stderr
    assert json.loads((tmpfs / "state.json").read_text()) == {"releases": {"y": {}}}
    assert json.loads((tmpfs / "audit.jsonl").read_text())["action"] == "deploy"
    assert not (tmpfs / ".lock").exists()


# -- end to end: rollback onto a host whose root is full ---------------------------------------


@pytest.mark.sshd
@pytest.mark.parametrize("free_pages", [0, 1, 3])
def test_rollback_with_a_full_host_root(live_cluster, tmp_path, free_pages):
    """Whatever the free space, the outcome is whole: exit 0 with every host on the target and
    its state recorded, or exit 3 with a one-line error, state.json as before, no lock left."""
    from tests.sshd.world import World
    from tests.test_deploy_faults import run
    w = World(live_cluster, tmp_path)
    root = w.roots["h3"]
    root.mkdir(parents=True)
    mount_tmpfs(root, "3m")
    try:
        code, out, err = run(w, "deploy", "--json")
        assert code == 0, err
        a = json.loads(out)["release"]
        w.extra["decode"] = {"chunked-prefill-size": 4096}
        w.write()
        code, out, err = run(w, "deploy", "--json")
        assert code == 0, err
        b = json.loads(out)["release"]
        before = (root / "state.json").read_bytes()
        fill(root, free_pages)
        code, out, err = run(w, "rollback", "--to", a)
        assert "Traceback" not in err
        for h in w.roots:
            assert not (w.roots[h] / ".lock").exists(), h
            w.assert_complete(h)
        if code == 0:
            assert w.currents() == {h: a for h in w.roots}
            assert json.loads((root / "state.json").read_text())["releases"][a]["state"] in ("active", "good")
        else:
            assert code == 3, err
            assert len(err.strip().splitlines()[-1]) > 20 and err.strip().splitlines()[-1].startswith("dsv4ctl: ")
            st = (root / "state.json").read_bytes()
            assert st == before or json.loads(st)["releases"][a]
            assert set(w.currents().values()) <= {a, b}
    finally:
        w.stop_services()
        umount(root)

