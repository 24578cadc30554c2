"""Remote layer against real OpenSSH sshd processes (tests/sshd/harness.py) and the local machine."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from dsv4ctl.errors import RemoteError
from dsv4ctl.remote import (Action, LocalTransport, append_jsonl, atomic_write, describe_actions,
                            read_text, run_actions, run_parallel)
from dsv4ctl.remote.ssh import SSHTransport, fingerprint
from tests.sshd import harness
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401

pytestmark = pytest.mark.sshd


def ssh_for(c, h, **kw) -> SSHTransport:
    kw.setdefault("known_hosts", str(c.known_hosts))
    return SSHTransport(h.name, h.address, user=c.user, port=h.port, key=str(c.user_key), **kw)


# -- local transport ---------------------------------------------------------------------------

def test_local_run_input_and_errors(tmp_path):
    t = LocalTransport("here")
    assert t.run("echo hi; echo err >&2").out == "hi\n"
    assert t.run("cat", input=b"abc").stdout == b"abc"
    r = t.run("exit 7", check=False)
    assert r.code == 7
    with pytest.raises(RemoteError, match=r"^here: .*: boom$"):
        t.run("echo boom >&2; exit 3")
    with pytest.raises(RemoteError, match="here: timed out after 0.3 s"):
        t.run("sleep 5", timeout=0.3)


def test_atomic_write_and_audit_local(tmp_path):
    t = LocalTransport("here")
    p = tmp_path / "sub" / "f.yaml"
    atomic_write(t, str(p), "a: 1\n", mode=0o600)
    assert p.read_text() == "a: 1\n"
    assert oct(p.stat().st_mode & 0o777) == "0o600"
    ino = p.stat().st_ino
    atomic_write(t, str(p), b"a: 2\n")
    assert p.read_text() == "a: 2\n"
    assert p.stat().st_ino != ino  # replaced by rename, not rewritten in place
    assert list(p.parent.iterdir()) == [p]  # no temp file left
    log = tmp_path / "audit.jsonl"
    append_jsonl(t, str(log), {"who": "x", "what": "deploy", "n": 1})
    append_jsonl(t, str(log), {"who": "y", "what": "rollback", "n": 2})
    lines = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert lines == [{"who": "x", "what": "deploy", "n": 1}, {"who": "y", "what": "rollback", "n": 2}]
    assert read_text(t, str(tmp_path / "missing"), default="D") == "D"
    assert read_text(t, str(p)) == "a: 2\n"
    # no mode given: the replaced file keeps its mode, a copy can take another file's, new is 0644
    assert oct(p.stat().st_mode & 0o777) == "0o600"      # kept from the first write
    atomic_write(t, str(tmp_path / "sub" / "f.yaml.bak"), "a: 1\n", like=str(p))
    assert oct((tmp_path / "sub" / "f.yaml.bak").stat().st_mode & 0o777) == "0o600"
    atomic_write(t, str(tmp_path / "new.yaml"), "b: 1\n")
    assert oct((tmp_path / "new.yaml").stat().st_mode & 0o777) == "0o644"


def test_atomic_write_failure_leaves_old_file(tmp_path):
    t = LocalTransport("here")
    p = tmp_path / "f"
    p.write_text("old")
    os.chmod(tmp_path, 0o500)
    try:
        if os.geteuid() == 0:
            pytest.skip("root ignores directory permissions")
        with pytest.raises(RemoteError):
            atomic_write(t, str(p), "new")
    finally:
        os.chmod(tmp_path, 0o700)
    assert p.read_text() == "old"


def test_actions_describe_and_run_stop_at_first_failure(tmp_path):
    ts = {"a": LocalTransport("a"), "b": LocalTransport("b")}
    fa, fb = tmp_path / "a", tmp_path / "b"
    acts = [
        Action("a", f"write {fa}", lambda t: t.run(f"echo 1 > {fa}")),
        Action("b", "fail", lambda t: t.run("false")),
        Action("b", f"write {fb}", lambda t: t.run(f"echo 1 > {fb}")),
        Action("a", "echo", lambda t: t.run("echo ok").out.strip()),
    ]
    assert describe_actions(acts) == [f"a: write {fa}", "a: echo", "b: fail", f"b: write {fb}"]
    res = run_actions(ts, acts)
    assert res["a"].ok and res["a"].value[1] == "ok" and fa.exists()
    assert not res["b"].ok and res["b"].error.startswith("b: ") and not fb.exists()


# -- SSH transport -----------------------------------------------------------------------------

def test_ssh_parallel_all_hosts(live_cluster):
    c = live_cluster
    ts = {h.name: ssh_for(c, h) for h in c.hosts}
    res = run_parallel(ts, lambda t: t.run("echo $SSH_CONNECTION; cat", input=b"in").out, timeout=30)
    assert list(res) == ["h0", "h1", "h2", "h3"]
    for h in c.hosts:
        r = res[h.name]
        assert r.ok, r.error
        conn, data = r.value.split("\n", 1)
        assert conn.split()[2:] == [h.address, str(h.port)]
        assert data == "in"
    r = ts["h1"].run("echo x >&2; exit 5", check=False)
    assert (r.code, r.err) == (5, "x\n")
    with pytest.raises(RemoteError, match="^h1: .*: x$"):
        ts["h1"].run("echo x >&2; exit 5")
    for t in ts.values():
        t.close()


def test_parallel_per_host_timeout_and_errors(live_cluster):
    c = live_cluster
    ts = {h.name: ssh_for(c, h) for h in c.hosts[:3]}

    def body(t):
        if t.name == "h0":
            t.run("sleep 20")
        if t.name == "h1":
            t.run("echo nope >&2; exit 2")
        return t.run("hostname").code

    t0 = time.monotonic()
    res = run_parallel(ts, body, timeout=2)
    assert time.monotonic() - t0 < 8
    assert not res["h0"].ok and res["h0"].error == "h0: timed out after 2 s"
    assert not res["h1"].ok and res["h1"].error.endswith(": nope") and res["h1"].error.startswith("h1: ")
    assert res["h2"].ok and res["h2"].value == 0


def test_unknown_host_key_refused_then_accept_new(live_cluster, tmp_path):
    c = live_cluster
    h = c.hosts[1]
    kh = tmp_path / "kh"
    with pytest.raises(RemoteError) as e:
        ssh_for(c, h, known_hosts=str(kh)).run("true")
    assert "h1: unknown host key ssh-ed25519" in str(e.value)
    assert "--accept-new-host-keys" in str(e.value)
    assert not kh.exists()
    # the fingerprint printed is the real one of the host key
    fp = subprocess.run(["ssh-keygen", "-lf", str(h.host_key) + ".pub"], capture_output=True, text=True).stdout.split()[1]
    assert fp in str(e.value)
    t = ssh_for(c, h, known_hosts=str(kh), accept_new_host_keys=True)
    assert t.run("echo ok").out == "ok\n"
    line = kh.read_text().strip()
    assert line == f"[{h.address}]:{h.port} " + " ".join(h.host_pub.split()[:2])
    # now known: a plain connection works, and OpenSSH accepts the file paramiko wrote
    assert ssh_for(c, h, known_hosts=str(kh)).run("echo ok2").out == "ok2\n"
    p = subprocess.run(["ssh", "-p", str(h.port), "-i", str(c.user_key), "-o", "BatchMode=yes",
                        "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={kh}",
                        f"{c.user}@{h.address}", "echo viassh"], capture_output=True, text=True, timeout=20)
    assert p.stdout == "viassh\n", p.stderr


def test_changed_host_key_always_refused(live_cluster, tmp_path):
    c = live_cluster
    h = c.hosts[2]
    other = tmp_path / "other"
    harness.keygen(other)
    kh = tmp_path / "kh"
    kh.write_text(f"[{h.address}]:{h.port} " + " ".join(Path(str(other) + ".pub").read_text().split()[:2]) + "\n")
    before = kh.read_text()
    for accept in (False, True):
        with pytest.raises(RemoteError) as e:
            ssh_for(c, h, known_hosts=str(kh), accept_new_host_keys=accept).run("true")
        assert "h2: host key for" in str(e.value) and "CHANGED" in str(e.value)
    assert kh.read_text() == before


def test_jump_host(live_cluster):
    c = live_cluster
    j, h = c.hosts[0], c.hosts[3]
    t = ssh_for(c, h, jump=ssh_for(c, j))
    out = t.run("echo $SSH_CONNECTION").out.split()
    assert out[2:] == [h.address, str(h.port)]
    # rsync goes through the same jump: over the same connection, or (bulk) over OpenSSH with
    # a ProxyCommand through the jump and strict host keys
    src = Path(tempfile.mkdtemp())
    (src / "f").write_text("through the jump")
    try:
        for bulk in (False, True):
            args, dest = t.rsync_dest(f"{src}.dst{int(bulk)}/", bulk=bulk)
            assert ("ProxyCommand=" in args[1]) == bulk
            r = subprocess.run(["rsync", "-a", *args, f"{src}/", dest], capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, r.stderr
            assert Path(f"{src}.dst{int(bulk)}", "f").read_text() == "through the jump"
    finally:
        t.close()
        for d in (src, f"{src}.dst0", f"{src}.dst1"):
            shutil.rmtree(d, ignore_errors=True)
    # with the jump host down the target cannot be reached: the path really goes through it
    j.kill()
    with pytest.raises(RemoteError, match="^h3: cannot connect"):
        ssh_for(c, h, jump=ssh_for(c, j), connect_timeout=3).run("true")


def test_ssh_config_and_agent(live_cluster, tmp_path, monkeypatch):
    """~/.ssh/config supplies HostName/Port/User; the key comes from ssh-agent only."""
    c = live_cluster
    h = c.hosts[1]
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host gpu-box\n  HostName {h.address}\n  Port {h.port}\n  User {c.user}\n")
    agent = subprocess.run(["ssh-agent", "-s"], capture_output=True, text=True, check=True).stdout
    env = dict(x.split("=", 1) for x in agent.replace(";", "\n").split() if "=" in x)
    try:
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv("SSH_AUTH_SOCK", env["SSH_AUTH_SOCK"])
        t = SSHTransport("box", "gpu-box", known_hosts=str(c.known_hosts))
        with pytest.raises(RemoteError, match="authentication failed|cannot connect"):
            t.run("true")  # no key anywhere yet
        subprocess.run(["ssh-add", str(c.user_key)], env=dict(os.environ, SSH_AUTH_SOCK=env["SSH_AUTH_SOCK"]),
                       check=True, capture_output=True)
        t = SSHTransport("box", "gpu-box", known_hosts=str(c.known_hosts))
        assert t.run("echo $SSH_CONNECTION").out.split()[2:] == [h.address, str(h.port)]
        t.close()
    finally:
        os.kill(int(env["SSH_AGENT_PID"]), 15)


def test_remote_atomic_write_audit_and_rsync(live_cluster, tmp_path):
    c = live_cluster
    h = c.hosts[0]
    t = ssh_for(c, h)
    target = tmp_path / "remote" / "cfg.yaml"
    atomic_write(t, str(target), "port: 1\n")
    assert target.read_text() == "port: 1\n"
    append_jsonl(t, str(tmp_path / "remote" / "audit.jsonl"), {"what": "x"})
    assert json.loads((tmp_path / "remote" / "audit.jsonl").read_text()) == {"what": "x"}
    assert read_text(t, str(target)) == "port: 1\n"
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_text("data")
    args, dest = t.rsync_dest(str(tmp_path / "dst") + "/")
    try:
        subprocess.run(["rsync", "-a", *args, f"{src}/", dest], check=True, capture_output=True, timeout=30)
    finally:
        t.close()
    assert (tmp_path / "dst" / "d" / "f").read_text() == "data"


def _sshd_sessions(h) -> int:
    """Number of per-connection sshd processes serving host ``h`` (children of its listener)."""
    return len([p for p in harness.descendants(h.proc.pid) if b"sshd" in open(f"/proc/{p}/cmdline", "rb").read()])


def test_rsync_runs_over_the_transport_connection(live_cluster, tmp_path):
    """rsync's remote side runs on an exec channel of the transport's own SSH connection: no
    second login reaches sshd; delta transfer, stderr and exit codes come through; close()
    removes the private socket folder."""
    c = live_cluster
    h = c.hosts[1]
    t = ssh_for(c, h)
    t.run("true")
    logins = _sshd_sessions(h)
    src = tmp_path / "src"
    src.mkdir()
    (src / "big").write_bytes(os.urandom(1 << 20))
    args, dest = t.rsync_dest(str(tmp_path / "dst") + "/")
    r = subprocess.run(["rsync", "-a", "--stats", *args, f"{src}/", dest], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "dst" / "big").read_bytes() == (src / "big").read_bytes()
    assert _sshd_sessions(h) == logins       # the same connection, no new login
    # a small change in a big file: only about the changed block crosses (rsync's delta)
    with open(src / "big", "r+b") as f:
        f.seek(500_000)
        f.write(b"patched")
    st = os.stat(src / "big")
    os.utime(src / "big", (st.st_atime, st.st_mtime + 10))   # same size: rsync's quick check needs a new mtime
    r = subprocess.run(["rsync", "-a", "--stats", *args, f"{src}/", dest], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    sent = int(re.search(r"Total bytes sent: ([\d,]+)", r.stdout).group(1).replace(",", ""))
    assert sent < 40_000, sent
    assert (tmp_path / "dst" / "big").read_bytes() == (src / "big").read_bytes()
    # the remote side's errors and exit status come back, every time (stderr before the end of
    # rsync's protocol on stdout: rsync kills the bridge once that ends)
    for _ in range(15):
        r = subprocess.run(["rsync", "-a", *args, f"{src}/", "dsv4ctl:/proc/no-such-dir/x/"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0 and "No such file or directory" in r.stderr, r.stderr
    folder = os.path.dirname(t._rsync["path"])
    assert oct(os.stat(folder).st_mode & 0o777) == "0o700"
    t.close()
    assert not os.path.exists(folder)
    assert not [th for th in threading.enumerate() if th.name == f"rsync-bridge-{h.name}"]
    t.close()   # twice is fine


def test_rsync_bridge_with_a_long_tmpdir(live_cluster, tmp_path, monkeypatch):
    """A TMPDIR too long for a Unix socket path: the bridge's socket goes to /tmp instead."""
    import tempfile
    long = tmp_path / ("x" * 90)
    long.mkdir()
    monkeypatch.setenv("TMPDIR", str(long))
    monkeypatch.setattr(tempfile, "tempdir", None)
    c = live_cluster
    t = ssh_for(c, c.hosts[0])
    try:
        args, dest = t.rsync_dest(str(tmp_path / "dst") + "/")
        assert dest.startswith("dsv4ctl:") and t._rsync["path"].startswith("/tmp/dsv4ctl-rsync-")
        (tmp_path / "src").mkdir()
        (tmp_path / "src" / "f").write_text("ok")
        subprocess.run(["rsync", "-a", *args, f"{tmp_path / 'src'}/", dest], check=True, capture_output=True, timeout=30)
        assert (tmp_path / "dst" / "f").read_text() == "ok"
    finally:
        t.close()


def test_rsync_bridge_reports_a_lost_connection(live_cluster, tmp_path):
    """sshd killed during a bridged rsync: rsync fails (the bridge exits 255 like ssh)."""
    c = live_cluster
    h = c.hosts[3]
    t = ssh_for(c, h)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"f{i}").write_bytes(os.urandom(1 << 20))
    args, dest = t.rsync_dest(str(tmp_path / "dst") + "/")
    p = subprocess.Popen(["rsync", "-a", "--bwlimit=4m", *args, f"{src}/", dest], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    # kill once bytes are landing (the session is established): killed earlier, the listener's
    # child for a connection being accepted at that instant can escape the kill on a loaded machine
    dst = tmp_path / "dst"
    deadline = time.monotonic() + 30
    while not (dst.is_dir() and any(dst.iterdir())) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    h.kill()
    try:
        _, err = p.communicate(timeout=60)
    finally:
        h.start()
        t.close()
    assert p.returncode != 0, err


def test_connection_lost_is_remote_error(live_cluster):
    c = live_cluster
    h = c.hosts[2]
    t = ssh_for(c, h)
    assert t.run("true").code == 0
    import threading
    threading.Timer(0.5, h.kill).start()
    with pytest.raises(RemoteError, match="^h2: SSH connection lost"):
        t.run("sleep 10", timeout=20)
    with pytest.raises(RemoteError, match="^h2: cannot connect"):
        ssh_for(c, h, connect_timeout=2).run("true")


def test_profile_jump_names_another_host(live_cluster):
    """``ssh.jump`` naming another profile host: connect() goes through that host."""
    from dsv4ctl.profile.model import Host
    from dsv4ctl.remote import connect
    c = live_cluster
    j, h = c.hosts[1], c.hosts[2]
    hosts = {n.name: Host(n.name, n.address, user=c.user, port=n.port, key=str(c.user_key),
                          known_hosts=str(c.known_hosts)) for n in (j, h)}
    hosts[h.name].jump = j.name
    t = connect(hosts[h.name], hosts=hosts)
    assert t.jump is not None and t.jump.address == j.address
    assert t.run("echo $SSH_CONNECTION").out.split()[2:] == [h.address, str(h.port)]
    t.close()
    local = connect(Host("me", "127.0.0.1", local=True))
    assert local.is_local and local.run("echo hi").out == "hi\n"


def test_not_an_ssh_server_is_one_line(tmp_path):
    """A port that answers with something other than SSH: one RemoteError line, and nothing
    else on stderr (paramiko's own traceback logging stays quiet)."""
    code = r'''
import socket, sys, threading
from dsv4ctl.errors import RemoteError
from dsv4ctl.remote.ssh import SSHTransport
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(5)
def serve():
    while True:
        c, _ = s.accept(); c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n"); c.close()
threading.Thread(target=serve, daemon=True).start()
try:
    SSHTransport("web", "127.0.0.1", port=s.getsockname()[1], known_hosts="/dev/null", connect_timeout=3).run("true")
except RemoteError as e:
    print(e)
'''
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stderr == ""
    assert r.stdout.startswith("web: cannot connect to 127.0.0.1:") and r.stdout.count("\n") == 1, r.stdout


def test_run_parallel_finish_on_interrupt():
    """An interrupt while hosts are busy: with finish_on_interrupt every host's call completes
    (and its transport stays open) before KeyboardInterrupt propagates; child processes the
    calls start do not inherit blocked signals. Without it, the transports are closed at once."""
    import signal as sig

    class T:
        def __init__(self, name):
            self.name, self.closed = name, False

        def close(self):
            self.closed = True
    for finish in (True, False):
        done, masks = [], []

        started, fired = [], threading.Event()

        def slow(t):
            masks.append(subprocess.run(["sh", "-c", "grep SigBlk /proc/self/status"], capture_output=True,
                                        text=True).stdout.split()[1])
            started.append(t.name)
            fired.wait(60)                 # busy until the interrupt has landed, then a while more
            time.sleep(1.0)
            done.append(t.name)

        def interrupt():                   # once every host's call runs: no fixed delay to lose under load
            end = time.monotonic() + 60
            while len(started) < 3 and time.monotonic() < end:
                time.sleep(0.01)
            os.kill(os.getpid(), sig.SIGINT)
            fired.set()
        ts = {n: T(n) for n in ("a", "b", "c")}
        threading.Thread(target=interrupt, daemon=True).start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            run_parallel(ts, slow, finish_on_interrupt=finish)
        if finish:
            assert sorted(done) == ["a", "b", "c"] and time.monotonic() - t0 >= 1.0
            assert not any(t.closed for t in ts.values())
            assert all(int(m, 16) & (1 << (sig.SIGINT - 1)) == 0 for m in masks), masks
        else:
            assert done == [] and all(t.closed for t in ts.values())
            time.sleep(0.7)
