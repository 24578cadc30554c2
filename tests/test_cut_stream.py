"""A stdin cut short (the SSH stream dropped mid-transfer) never installs a truncated file: the
atomic write checks the byte count (and sha256) it was told to expect before its rename. The
commands run under ``/bin/sh`` exactly as the deploy engine sends them; then over a real sshd."""

from __future__ import annotations

import hashlib
import subprocess
from types import SimpleNamespace

import pytest

from dsv4ctl.deploy.steps import close_cmd
from dsv4ctl.hosts.layout import Paths
from dsv4ctl.hosts.lock import holder, take_cmd
from dsv4ctl.remote.ops import atomic_write_cmd, framed
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401

OLD = b'{"releases": {"old": {}}}\n'
NEW = b'{"releases": {"new": {"state": "active"}}}\n' * 40


def sh(cmd: str, data: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/sh", "-c", cmd], input=data, capture_output=True, timeout=30)


def leftovers(d) -> list[str]:
    return sorted(p.name for p in d.iterdir() if ".tmp." in p.name)


def test_a_short_stdin_is_refused_and_the_old_file_kept(tmp_path):
    path = tmp_path / "state.json"
    path.write_bytes(OLD)
    cmd = atomic_write_cmd(str(path), size=len(NEW), sha256=hashlib.sha256(NEW).hexdigest())
    r = sh(cmd, NEW[:-9])
    assert r.returncode == 1
    assert path.read_bytes() == OLD and leftovers(tmp_path) == []
    assert f"got {len(NEW) - 9} of {len(NEW)} bytes (input cut short): not written".encode() in r.stderr
    # composed into an && list (a close step): the list stops there
    r = sh(f"true && {cmd} && echo next", NEW[:100])
    assert r.returncode == 1 and b"next" not in r.stdout and path.read_bytes() == OLD
    # nothing at all arrived
    assert sh(cmd, b"").returncode == 1 and path.read_bytes() == OLD
    # the whole data: written
    r = sh(cmd, NEW)
    assert r.returncode == 0, r.stderr
    assert path.read_bytes() == NEW and leftovers(tmp_path) == []


def test_the_same_size_with_other_bytes_is_refused_by_the_digest(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(OLD)
    other = NEW.replace(b"new", b"bad")
    assert len(other) == len(NEW)
    r = sh(atomic_write_cmd(str(path), size=len(NEW), sha256=hashlib.sha256(NEW).hexdigest()), other)
    assert r.returncode == 1 and b"sha256 differs from the data sent: not written" in r.stderr
    assert path.read_bytes() == OLD and leftovers(tmp_path) == []
    # a size alone (no digest) checks the size only
    assert sh(atomic_write_cmd(str(path), size=len(NEW)), other).returncode == 0
    assert path.read_bytes() == other


def test_framed_data_carry_their_size(tmp_path):
    """``size=None``: the header line of :func:`framed` says what must arrive (a close step,
    whose command is listed by --dry-run before its state document exists)."""
    path = tmp_path / "state.json"
    path.write_bytes(OLD)
    cmd = atomic_write_cmd(str(path), size=None)
    assert framed(NEW).split(b"\n", 1)[0] == f"{len(NEW)} {hashlib.sha256(NEW).hexdigest()}".encode()
    for cut in (1, 7, len(NEW) - 1):
        r = sh(cmd, framed(NEW)[:-cut])
        assert r.returncode == 1, cut
        assert path.read_bytes() == OLD and leftovers(tmp_path) == []
    r = sh(cmd, framed(NEW)[:10])          # the header itself cut: no size, nothing written
    assert r.returncode == 1 and path.read_bytes() == OLD and leftovers(tmp_path) == []
    r = sh(cmd, NEW)                       # no header at all
    assert r.returncode == 1 and b"no size header" in r.stderr and path.read_bytes() == OLD
    r = sh(cmd, framed(NEW))
    assert r.returncode == 0, r.stderr
    assert path.read_bytes() == NEW
    assert sh(cmd, framed(b"")).returncode == 0 and path.read_bytes() == b""


def test_bad_expectations_are_refused_when_building():
    with pytest.raises(ValueError):
        atomic_write_cmd("/x", size=-1)
    with pytest.raises(ValueError):
        atomic_write_cmd("/x", size=1, sha256="'; rm -rf /; '")


def test_a_close_whose_state_document_is_cut_keeps_the_old_state_and_unlocks(tmp_path):
    p = Paths(str(tmp_path))
    (tmp_path / "state.json").write_bytes(OLD)
    assert sh(take_cmd(p.lock, holder("deploy", "tok5"))).returncode == 0
    site = SimpleNamespace(paths={"h": p}, token="tok5")
    r = sh(close_cmd(site, "h", {"action": "deploy", "result": "ok"}, [], None), framed(NEW)[:-20])
    assert r.returncode == 1
    assert (tmp_path / "state.json").read_bytes() == OLD and leftovers(tmp_path) == []
    assert not (tmp_path / ".lock").exists()


@pytest.mark.sshd
def test_a_cut_stream_over_ssh_installs_nothing(live_cluster, tmp_path):
    """Over a real sshd: the data the client sends end early (its channel's stdin closed)."""
    from dsv4ctl.errors import RemoteError
    from dsv4ctl.remote import atomic_write
    from dsv4ctl.remote.ssh import SSHTransport
    h = live_cluster.hosts[0]
    t = SSHTransport(h.name, h.address, port=h.port, user=live_cluster.user, key=str(live_cluster.user_key),
                     known_hosts=str(live_cluster.known_hosts))
    try:
        path = tmp_path / "serve.yaml"
        path.write_bytes(b"port: 1\n")
        data = b"port: 2\n" * 5000
        cmd = atomic_write_cmd(str(path), size=len(data), sha256=hashlib.sha256(data).hexdigest())
        res = t.run(cmd, input=data[: len(data) // 2], check=False, timeout=60)
        assert res.code == 1 and f"got {len(data) // 2} of {len(data)} bytes".encode() in res.stderr
        assert path.read_bytes() == b"port: 1\n" and leftovers(tmp_path) == []
        atomic_write(t, str(path), data)
        assert path.read_bytes() == data
        with pytest.raises(RemoteError):
            t.run(cmd, input=data[:-1], timeout=60)
        assert path.read_bytes() == data
    finally:
        t.close()
