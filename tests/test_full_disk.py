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
from dsv4ctl.hosts.day2 import parse_audit
from dsv4ctl.hosts.layout import Paths
from dsv4ctl.hosts.lock import holder, take_cmd
from dsv4ctl.remote.ops import atomic_write_cmd as _atomic_write_cmd, framed
from tests.conftest import REPO as REPO_ROOT, mount_tmpfs, umount
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


def atomic_write_cmd(path: str, **kw) -> str:
    """The command as a close step builds it: the expected size and sha256 on stdin
    (:func:`framed`), so the data below go through :func:`framed`."""
    return _atomic_write_cmd(path, size=None, **kw)


def test_atomic_write_on_a_full_disk_keeps_the_old_file(tmpfs):
    path = tmpfs / "state.json"
    path.write_text('{"old": true}\n')
    os.chmod(path, 0o600)
    fill(tmpfs)
    r = sh(atomic_write_cmd(str(path)), framed(b'{"new": true}\n' * 500))
    assert r.returncode != 0
    assert path.read_text() == '{"old": true}\n'
    assert sorted(p.name for p in tmpfs.iterdir()) == [".filler", "state.json"]   # no temp file left
    # the same command composed into an && list (as close_cmd does) still fails
    r = sh(f"true && {atomic_write_cmd(str(path))} && echo next", framed(b"x" * 20000))
    assert r.returncode != 0 and b"next" not in r.stdout
    assert path.read_text() == '{"old": true}\n'


def test_atomic_write_with_room_replaces_and_keeps_the_mode(tmpfs):
    path = tmpfs / "sub" / "state.json"
    r = sh(atomic_write_cmd(str(path)), framed(b"first\n"))
    assert r.returncode == 0, r.stderr
    assert path.read_bytes() == b"first\n" and oct(path.stat().st_mode & 0o777) == "0o644"
    os.chmod(path, 0o600)
    assert sh(atomic_write_cmd(str(path)), framed(b"second\n")).returncode == 0
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
    r = sh(close_cmd(site, "h", {"action": "rollback", "result": "ok"}, [], None), framed(b'{"releases": {"x": {}}}\n' * 300))
    assert r.returncode != 0
    assert json.loads((tmpfs / "state.json").read_text()) == {"releases": {}}
    assert not (tmpfs / ".lock").exists()
    assert [x.name for x in tmpfs.iterdir() if x.name.startswith("state.json.tmp")] == []


def test_close_with_room_records_and_unlocks(tmpfs):
    p = Paths(str(tmpfs))
    assert sh(take_cmd(p.lock, holder("deploy", "tok9"))).returncode == 0
    site = SimpleNamespace(paths={"h": p}, token="tok9")
    r = sh(close_cmd(site, "h", {"action": "deploy", "result": "ok"}, [], None), framed(b'{"releases": {"y": {}}}\n'))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmpfs / "state.json").read_text()) == {"releases": {"y": {}}}
    assert json.loads((tmpfs / "audit.jsonl").read_text())["action"] == "deploy"
    assert not (tmpfs / ".lock").exists()


def test_close_on_a_near_full_disk_audits_before_the_state(tmpfs):
    """Room for one more page: the audit record takes it (whole, on its own line), state.json
    then cannot be written (the old one stays), the exit status says so, the lock is released.
    (The state used to be written first and the audit line torn by the full disk.)"""
    p = Paths(str(tmpfs))
    audit = tmpfs / "audit.jsonl"
    first = json.dumps({"ts": "2026-12-01T00:00:00Z", "action": "deploy", "result": "ok"}, separators=(",", ":"))
    audit.write_text(first + "\n" + "x" * (PAGE - len(first) - 2 - 40) + "\n")   # 40 bytes left in its last page
    assert sh(take_cmd(p.lock, holder("deploy", "tok7"))).returncode == 0
    fill(tmpfs, free_pages=1)
    site = SimpleNamespace(paths={"h": p}, token="tok7")
    r = sh(close_cmd(site, "h", {"action": "rollback", "result": "ok", "detail": "d" * 300}, [], None),
           framed(b'{"releases": {"x": {}}}\n' * 100))        # one page: it would fit alone
    assert r.returncode != 0
    assert not (tmpfs / "state.json").exists()
    recs = parse_audit("h", audit.read_text())
    assert [(x["action"], x.get("detail")) for x in recs] == [("deploy", None), ("?", None), ("rollback", "d" * 300)]
    assert not (tmpfs / ".lock").exists()


def test_an_append_after_a_torn_line_starts_on_a_fresh_line(tmpfs):
    """A full disk tears an audit line (its exit status says so); once there is room again the
    next record is a line of its own: the torn line is unreadable, nothing after it is lost."""
    from dsv4ctl.hosts.audit import append_cmd
    from dsv4ctl.remote import LocalTransport, append_jsonl
    from dsv4ctl.remote.ops import append_jsonl_cmd
    audit = tmpfs / "audit.jsonl"
    audit.write_text("a" * (PAGE - 11) + "\n")                            # 10 bytes left in its last page
    fill(tmpfs)
    r = sh(append_cmd(str(audit), {"action": "deploy", "result": "ok"}))
    assert r.returncode != 0                                               # the failed append is an error
    assert not audit.read_bytes().endswith(b"\n")                          # ... and tore the line
    (tmpfs / ".filler").unlink()
    assert sh(append_cmd(str(audit), {"action": "rollback", "result": "ok"})).returncode == 0
    assert sh(append_jsonl_cmd(str(audit), {"ts": "t2", "action": "promote"})).returncode == 0
    append_jsonl(LocalTransport("h"), str(audit), {"ts": "t3", "action": "runbook"})
    recs = parse_audit("h", audit.read_text())
    assert [x["action"] for x in recs] == ["?", "?", "rollback", "promote", "runbook"]
    assert recs[1]["unreadable"].startswith('{"ts":"20') and len(recs[1]["unreadable"]) == 10
    lines = audit.read_text().splitlines()
    assert len(lines) == 5 and all(json.loads(x)["action"] for x in lines[2:])
    # an appended file that ends in a newline gets none added; a new file starts at once
    before = audit.read_bytes()
    assert sh(append_jsonl_cmd(str(audit), {"n": 1})).returncode == 0
    assert audit.read_bytes() == before + b'{"n":1}\n'
    assert sh(append_jsonl_cmd(str(tmpfs / "new" / "a.jsonl"), {"n": 2})).returncode == 0
    assert (tmpfs / "new" / "a.jsonl").read_bytes() == b'{"n":2}\n'


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



def test_a_lock_that_cannot_be_made_is_an_error_not_held(tmp_path):
    """A file in the way of ``.lock`` (or no inodes, a read-only root): mkdir's error, exit 1 —
    never 'held by unknown holder' (exit 75), which --break-lock could not clear."""
    lock = tmp_path / ".lock"
    lock.write_text("stray file")
    r = sh(take_cmd(str(lock), holder("deploy", "tok1"), then="echo facts"))
    assert r.returncode == 1 and b"facts" not in r.stdout and b"File exists" in r.stderr
    lock.unlink()
    lock.mkdir()
    (lock / "holder.json").write_text('{"who": "x@y"}')
    assert sh(take_cmd(str(lock), holder("deploy", "tok1"))).returncode == 75     # a real lock is held


def test_atomic_write_through_a_symlink_keeps_the_targets_mode(tmp_path):
    real = tmp_path / "real.yaml"
    real.write_text("api-key: sk-1\n")
    os.chmod(real, 0o600)
    link = tmp_path / "link.yaml"
    os.symlink(real, link)
    assert sh(atomic_write_cmd(str(link)), framed(b"api-key: sk-2\n")).returncode == 0
    assert oct(link.stat().st_mode & 0o777) == "0o600"          # not the link's own 0777


def test_sighup_with_the_terminal_gone_lets_the_clean_up_print(tmp_path):
    """The SSH session to the control machine closes: the terminal is hung up, every write to it
    fails with EIO. The SIGHUP handler points stdout/stderr that are terminals at /dev/null, so the
    clean-up's messages cannot cut the clean-up short (it used to exit 1 with a traceback)."""
    import pty
    import signal
    import sys
    import time
    prog = ("import signal, sys, time\n"
            "from dsv4ctl.signals import TERMINATING, raise_interrupt\n"
            "for s in TERMINATING: signal.signal(s, raise_interrupt)\n"
            "print('ready', flush=True)\n"
            "try:\n    time.sleep(30)\n"
            "except KeyboardInterrupt:\n"
            "    for i in range(200): print('putting the hosts back', i, file=sys.stderr, flush=True)\n"
            f"    open({str(tmp_path / 'done')!r}, 'w').write('cleaned up')\n"
            "    sys.exit(130)\n")
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-c", prog], stdin=slave, stdout=slave, stderr=slave, cwd=str(REPO_ROOT))
    os.close(slave)
    buf = b""
    while b"ready" not in buf or not buf.endswith(b"\n"):     # the whole line: print is done with it
        buf += os.read(master, 100)
    os.close(master)                     # the terminal goes away ...
    time.sleep(0.2)
    p.send_signal(signal.SIGHUP)         # ... and its session leader's hangup reaches dsv4ctl
    assert p.wait(timeout=30) == 130
    assert (tmp_path / "done").read_text() == "cleaned up"
