"""Ctrl-C or SIGTERM during `patch apply` / `patch revert` (a long `git am` / `git revert`
session on a real git tree): the command exits 130 and the tree is exactly as before (HEAD,
status, no git am / sequencer session left), or — if the signal came after git finished — fully
applied; never in between; and no git child keeps running after dsv4ctl has exited."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

ENV = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
           GIT_COMMITTER_EMAIL="t@t")
N = 150


def git(tree, *args):
    return subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True, text=True,
                          env=ENV).stdout


def make_tree(tmp_path: Path, n: int = N) -> tuple[Path, Path]:
    """A tree at v0.5.23 and a series of ``n`` one-file patches on it (the tree is reset to the base)."""
    tree = tmp_path / "sglang"
    (tree / "python" / "sglang").mkdir(parents=True)
    for i in range(n):
        (tree / "python" / "sglang" / f"m{i:03d}.py").write_text(f"x = {i}\n")
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "base")
    git(tree, "tag", "v0.5.23")
    for i in range(n):
        (tree / "python" / "sglang" / f"m{i:03d}.py").write_text(f"x = {i + 1000}\n")
        git(tree, "commit", "-q", "-am", f"change {i}")
    series = tmp_path / "series-dir"
    series.mkdir()
    git(tree, "format-patch", "-q", "-o", str(series), "v0.5.23..HEAD")
    names = sorted(p.name for p in series.glob("*.patch"))
    (series / "series").write_text("base sglang==0.5.23\n" + "".join(f"{n}\n" for n in names))
    return tree, series


def git_children_on(tree: Path) -> list[str]:
    """Command lines of running processes that work on ``tree`` (git -C TREE ...)."""
    from tests.test_remote_interrupt import procs_mentioning
    return [c for c in procs_mentioning(str(tree)) if "git" in c]


def start(args, tree: Path, marker: str) -> subprocess.Popen:
    """Start ``dsv4ctl ARGS`` in its own session and wait until git's session folder ``marker``
    (under .git) exists: git is mid-way."""
    p = subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", *args], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True, env=ENV)
    deadline = time.monotonic() + 60
    while not (tree / ".git" / marker).exists():
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, "git never started"
        time.sleep(0.005)
    return p


def test_interrupted_apply_restores_the_tree(tmp_path):
    tree, series = make_tree(tmp_path)
    git(tree, "reset", "-q", "--hard", "v0.5.23")
    head = git(tree, "rev-parse", "HEAD").strip()

    p = subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", "patch", "apply", str(tree), "--series", str(series)],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, env=ENV)
    time.sleep(1.5)
    os.killpg(p.pid, signal.SIGINT)         # like Ctrl-C in a terminal: the whole process group
    out, err = p.communicate(timeout=120)
    assert "Traceback" not in err
    assert not (tree / ".git" / "rebase-apply").exists()
    status = git(tree, "status", "--porcelain")
    assert status == ""
    now = git(tree, "rev-parse", "HEAD").strip()
    if p.returncode == 130:
        assert now == head and "interrupted" in err
    else:
        assert p.returncode == 0, err
        assert len(git(tree, "rev-list", f"{head}..HEAD").split()) == N


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_to_dsv4ctl_alone_mid_apply_stops_git_and_restores(tmp_path, sig):
    # SIGTERM (or a SIGINT sent to dsv4ctl only, as `kill -INT PID` does) while `git am` runs.
    # Before: SIGTERM killed dsv4ctl at once; its `git am` went on as an orphan and applied the
    # series (or stopped half-way with .git/rebase-apply left) after dsv4ctl had died.
    tree, series = make_tree(tmp_path)
    git(tree, "reset", "-q", "--hard", "v0.5.23")
    head = git(tree, "rev-parse", "HEAD").strip()
    p = start(["patch", "apply", str(tree), "--series", str(series)], tree, "rebase-apply")
    os.kill(p.pid, sig)
    out, err = p.communicate(timeout=120)
    assert (p.returncode, err) == (130, f"dsv4ctl: error: {tree}: interrupted; tree restored to {head[:12]}\n")
    assert git_children_on(tree) == []
    time.sleep(0.5)                                     # nothing changes the tree afterwards either
    assert git(tree, "rev-parse", "HEAD").strip() == head
    assert git(tree, "status", "--porcelain") == ""
    assert not (tree / ".git" / "rebase-apply").exists() and list((tree / ".git").rglob("*.lock")) == []


def test_sigterm_mid_revert_stops_git_and_restores(tmp_path):
    tree, _ = make_tree(tmp_path)
    head = git(tree, "rev-parse", "HEAD").strip()
    commits = git(tree, "rev-list", "v0.5.23..HEAD").split()      # newest first
    p = start(["patch", "revert", str(tree), *commits], tree, "sequencer")
    os.kill(p.pid, signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert (p.returncode, err) == (130, f"dsv4ctl: error: {tree}: interrupted; tree restored to {head[:12]}\n")
    assert git_children_on(tree) == []
    time.sleep(0.5)
    assert git(tree, "rev-parse", "HEAD").strip() == head and git(tree, "status", "--porcelain") == ""
    assert not (tree / ".git" / "sequencer").exists() and not (tree / ".git" / "REVERT_HEAD").exists()
    assert list((tree / ".git").rglob("*.lock")) == []
    r = subprocess.run([sys.executable, "-m", "dsv4ctl.cli", "patch", "status", str(tree), "--json",
                        "--series", str(tmp_path / "series-dir")], cwd=REPO, capture_output=True, text=True, env=ENV)
    assert r.returncode == 0 and '"operation": null' in r.stdout, r.stderr      # no git revert left "in progress"


def hooked_tree(tmp_path: Path, n: int = 5) -> tuple[Path, Path, Path]:
    """A small tree and series whose git hooks (real git features) open two windows: the
    ``pre-applypatch`` hook of patch 3 writes ``mid`` and sleeps (git am is half-way), and the
    ``reference-transaction`` hook, once ``marks/slow`` exists, writes ``restoring`` and sleeps
    once (the restore's ``git am --abort`` is moving HEAD back)."""
    tree, series = make_tree(tmp_path, n)
    git(tree, "reset", "-q", "--hard", "v0.5.23")
    marks = tmp_path / "marks"
    marks.mkdir()
    hooks = tree / ".git" / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "pre-applypatch").write_text(
        f'#!/bin/sh\n[ "$(cat "$(git rev-parse --git-path rebase-apply)/next")" = 3 ] || exit 0\n'
        f'touch {marks}/mid; sleep 30\n')
    (hooks / "reference-transaction").write_text(
        f"#!/bin/sh\ncat >/dev/null\nmv {marks}/slow {marks}/slept 2>/dev/null || exit 0\n"
        f"touch {marks}/restoring; sleep 1.5\n")
    for h in hooks.iterdir():
        h.chmod(0o755)
    return tree, series, marks


def wait_for(path: Path, p: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.005)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_sighup_during_the_restore_does_not_leave_a_git_am_session(tmp_path, sig):
    """SIGINT/SIGTERM/SIGHUP mid-apply, then the SIGHUP of a closing terminal while the restore's
    ``git am --abort`` runs (issue 41 item 5). Before: the SIGHUP cut the restore (only SIGINT and
    SIGTERM were held back): "interrupted", ``.git/rebase-apply`` left, the next apply refused
    ("a git am is in progress")."""
    tree, series, marks = hooked_tree(tmp_path)
    head = git(tree, "rev-parse", "HEAD").strip()
    p = subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", "patch", "apply", str(tree), "--series", str(series)],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, env=ENV)
    wait_for(marks / "mid", p)                       # patches 1, 2 applied, git am half-way
    (marks / "slow").touch()
    os.kill(p.pid, sig)
    wait_for(marks / "restoring", p)                 # the restore is moving HEAD back
    os.kill(p.pid, signal.SIGHUP)
    out, err = p.communicate(timeout=120)
    assert (p.returncode, err) == (130, f"dsv4ctl: error: {tree}: interrupted; tree restored to {head[:12]}\n")
    assert not (tree / ".git" / "rebase-apply").exists()
    assert git(tree, "rev-parse", "HEAD").strip() == head and git(tree, "status", "--porcelain") == ""
    for h in (tree / ".git" / "hooks").iterdir():
        h.unlink()
    r = subprocess.run([sys.executable, "-m", "dsv4ctl.cli", "patch", "apply", str(tree), "--series", str(series)],
                       cwd=REPO, capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr                # the next apply is not refused
    assert len(git(tree, "rev-list", f"{head}..HEAD").split()) == 5
