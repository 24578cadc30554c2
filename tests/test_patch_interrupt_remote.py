"""SIGTERM or SIGINT during ``patch apply|revert --host`` (a long ``git am`` / ``git revert`` on
a host's tree, over a real OpenSSH sshd): the git on the host is stopped (its process group,
over a second SSH channel), the host's tree is exactly as before (HEAD, status, no am /
sequencer session, no lock files) and the command exits 130; no git keeps running there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from pathlib import Path

from tests.conftest import REPO
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.test_patch_interrupt import ENV, git, git_children_on, make_tree

pytestmark = pytest.mark.sshd


def profile(c, tmp_path):
    h = c.hosts[0]
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump(dict(
        version=1, name="remote-patch", model="deepseek-v4-flash", sglang=dict(version="0.5.23"),
        hosts=[c.host_yaml(h, tmp_path / "srv")],
        groups=[dict(name="main", role="colocated", host=h.name, gpus=list(range(8)), tp=8)]), sort_keys=False))
    return h, ["--host", h.name, "--profile", str(prof)]


def slow_git(tree) -> None:
    """Hooks that make every applied patch and every commit of the tree's git take 3 s more:
    the git session on the host is certain to be mid-way when the signal comes, and would still
    be running when dsv4ctl exits if dsv4ctl did not stop it."""
    for hook in ("post-applypatch", "post-commit"):
        f = tree / ".git" / "hooks" / hook
        f.write_text("#!/bin/sh\nsleep 3\n")
        f.chmod(0o755)


def start(args, marker_path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", *args], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True, env=ENV)
    deadline = time.monotonic() + 120
    while not marker_path.exists():
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, "git never started"
        time.sleep(0.005)
    return p


def working_in(tree) -> list[str]:
    """Command lines of live processes whose working directory is in ``tree`` (git's hooks)."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and os.readlink(d / "cwd").startswith(str(tree)) and \
                    "zombie" not in (d / "status").read_text():
                out.append((d / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace"))
        except OSError:
            continue
    return out


def assert_restored(tree, head):
    assert git_children_on(tree) == []                  # the host's git was stopped, not orphaned
    assert working_in(tree) == []                       # and so were its hooks
    time.sleep(0.5)                                     # and nothing changes the tree afterwards
    assert git(tree, "rev-parse", "HEAD").strip() == head
    assert git(tree, "status", "--porcelain") == ""
    for d in ("rebase-apply", "sequencer", "REVERT_HEAD"):
        assert not (tree / ".git" / d).exists(), d
    assert list((tree / ".git").rglob("*.lock")) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_mid_remote_apply_stops_host_git_and_restores(live_cluster, tmp_path, sig):
    # Before: dsv4ctl stopped waiting but the `git am` on the host went on after it had exited
    # (and the restore ran against a tree git was still changing).
    h, remote = profile(live_cluster, tmp_path)
    tree, series = make_tree(tmp_path)
    git(tree, "reset", "-q", "--hard", "v0.5.23")
    slow_git(tree)
    head = git(tree, "rev-parse", "HEAD").strip()
    p = start(["patch", "apply", str(tree), "--series", str(series), *remote], tree / ".git" / "rebase-apply")
    os.kill(p.pid, sig)
    out, err = p.communicate(timeout=120)
    assert (p.returncode, err) == (130, f"dsv4ctl: error: {h.name}:{tree}: interrupted; tree restored to {head[:12]}\n")
    assert_restored(tree, head)


def test_sigterm_mid_remote_revert_stops_host_git_and_restores(live_cluster, tmp_path):
    h, remote = profile(live_cluster, tmp_path)
    tree, _ = make_tree(tmp_path)
    slow_git(tree)
    head = git(tree, "rev-parse", "HEAD").strip()
    commits = git(tree, "rev-list", "v0.5.23..HEAD").split()
    p = start(["patch", "revert", str(tree), *commits, *remote], tree / ".git" / "sequencer")
    os.kill(p.pid, signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert (p.returncode, err) == (130, f"dsv4ctl: error: {h.name}:{tree}: interrupted; tree restored to {head[:12]}\n")
    assert_restored(tree, head)


def test_stale_locks_of_a_stopped_host_git_are_removed(live_cluster, tmp_path):
    """A host git that had to be SIGKILLed leaves its lock files: the restore removes those made
    since the run began (by the host's clock), and leaves an older one (someone else's) alone."""
    from dsv4ctl.patches.gitio import Git, transport_runner
    from dsv4ctl.patches.ops import _remove_stale_locks, _tree_clock
    from dsv4ctl.remote.ssh import SSHTransport
    c = live_cluster
    h = c.hosts[0]
    t = SSHTransport(h.name, h.address, user=c.user, port=h.port, key=str(c.user_key), known_hosts=str(c.known_hosts))
    tree = tmp_path / "t"
    tree.mkdir()
    git(tree, "init", "-q")
    gd = tree / ".git"
    old = gd / "config.lock"
    old.write_text("")
    os.utime(old, (time.time() - 3600,) * 2)
    try:
        g = Git(str(tree), transport_runner(t), where=f"{h.name}:{tree}")
        since = _tree_clock(g)
        assert abs(since - time.time()) < 5
        (gd / "index.lock").write_text("")
        (gd / "refs" / "heads" / "main.lock").write_text("")
        _remove_stale_locks(g, since)
    finally:
        t.close()
    assert not (gd / "index.lock").exists() and not (gd / "refs" / "heads" / "main.lock").exists()
    assert old.exists()
