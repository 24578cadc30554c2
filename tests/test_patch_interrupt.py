"""Ctrl-C during `patch apply` (a long `git am` session on a real git tree): the command exits 130
and the tree is exactly as before (HEAD, status, no git am session left), or — if the signal came
after git finished — fully applied; never in between."""

import os
import signal
import subprocess
import sys
import time

from tests.conftest import REPO

ENV = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
           GIT_COMMITTER_EMAIL="t@t")


def git(tree, *args):
    return subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True, text=True,
                          env=ENV).stdout


def test_interrupted_apply_restores_the_tree(tmp_path):
    tree = tmp_path / "sglang"
    (tree / "python" / "sglang").mkdir(parents=True)
    for i in range(150):
        (tree / "python" / "sglang" / f"m{i:03d}.py").write_text(f"x = {i}\n")
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "base")
    git(tree, "tag", "v0.5.23")
    for i in range(150):
        (tree / "python" / "sglang" / f"m{i:03d}.py").write_text(f"x = {i + 1000}\n")
        git(tree, "commit", "-q", "-am", f"change {i}")
    series = tmp_path / "series-dir"
    series.mkdir()
    git(tree, "format-patch", "-q", "-o", str(series), "v0.5.23..HEAD")
    names = sorted(p.name for p in series.glob("*.patch"))
    (series / "series").write_text("base sglang==0.5.23\n" + "".join(f"{n}\n" for n in names))
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
        assert len(git(tree, "rev-list", f"{head}..HEAD").split()) == 150
