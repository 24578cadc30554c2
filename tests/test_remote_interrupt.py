"""Ctrl-C or SIGTERM during a parallel multi-host read (``status``, ``diagnose``) against real
OpenSSH sshd hosts that are slow (every host's ``state.json`` is a FIFO nobody writes, so the
remote ``cat`` blocks): the command exits 130 within seconds and no command it started keeps
running on any host afterwards (each remote command's process group is stopped over SSH)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.sshd.world import World

pytestmark = pytest.mark.sshd


def procs_mentioning(text: str) -> list[str]:
    """Command lines of live processes (not zombies) whose command line contains ``text``."""
    out = []
    me = os.getpid()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            state = next((ln for ln in (d / "status").read_text().splitlines() if ln.startswith("State:")), "")
        except OSError:
            continue
        if text in cmd and "zombie" not in state:
            out.append(cmd)
    return out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("argv", [["status"], ["diagnose", "--window", "0"]])
def test_interrupted_parallel_read_stops_every_remote_command(live_cluster, tmp_path, argv, sig):
    # Before: SIGTERM killed dsv4ctl at once (exit -15); on SIGINT the transports were closed
    # but the hosts' commands (the blocked `cat`) kept running after dsv4ctl had exited.
    w = World(live_cluster, tmp_path, nhosts=3)
    fifos = []
    for h, root in w.roots.items():
        root.mkdir(parents=True)
        os.mkfifo(root / "state.json")
        fifos.append(str(root / "state.json"))
    p = subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", argv[0], str(w.profile), *argv[1:]], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env=dict(os.environ, **w.env()))
    try:
        hosts = 3 if argv[0] == "status" else 2          # diagnose reads the server groups' hosts
        deadline = time.monotonic() + 60
        while sum(1 for f in fifos if procs_mentioning(f"cat {f}")) < hosts:
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "the hosts' commands never started"
            time.sleep(0.05)
        t0 = time.monotonic()
        os.kill(p.pid, sig)                              # dsv4ctl alone, as `kill` or a supervisor does
        out, err = p.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 130, (p.returncode, err)
    assert "Traceback" not in err and err.strip().endswith("interrupted"), err
    assert took < 5, took
    left = [c for r in w.roots.values() for c in procs_mentioning(str(r))]
    assert left == [], left                                # nothing dsv4ctl started runs on a host
    assert procs_mentioning(str(w.profile)) == []           # nor dsv4ctl itself (no worker kept it alive)


def test_sigterm_during_run_parallel_stops_local_hosts_commands(tmp_path):
    """``local: true`` hosts: SIGTERM during ``run_parallel`` is an interrupt too, and each host's
    command (its own process group) is stopped before KeyboardInterrupt goes on."""
    marker = f"sleep 333.{os.getpid()}"
    code = f'''
import os, signal, sys, threading, time
from dsv4ctl.remote import LocalTransport, run_parallel
ts = {{n: LocalTransport(n) for n in ("a", "b", "c")}}
threading.Timer(0.8, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
t0 = time.monotonic()
try:
    run_parallel(ts, lambda t: t.run("{marker}; echo done"))
except KeyboardInterrupt:
    print("interrupted", round(time.monotonic() - t0, 1))
'''
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.stdout.startswith("interrupted") and float(r.stdout.split()[1]) < 5, (r.stdout, r.stderr)
    assert procs_mentioning(marker) == []
