"""Real SGLang 0.5.23 git trees for the patch tests.

The pristine repository is built once from the real sglang 0.5.23 wheel (``pip download
--no-deps sglang==0.5.23``, cached in ``.cache/wheels``; the wheel is fetched once when absent)
into ``.cache/trees/sglang-0.5.23`` by dsv4ctl's own :mod:`dsv4ctl.patches.pristine`; every test
gets a fresh ``git clone`` of it."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache"
SERIES = REPO / "patches" / "sglang-0.5.23"
ORACLE_PY = REPO / ".venv-oracle" / "bin" / "python"
ENV = {"DSV4CTL_CACHE": str(CACHE)}


def git(tree: Path, *args: str, input: str | None = None) -> str:
    env = {**os.environ, "LC_ALL": "C", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}
    p = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, env=env,
                       input=input)
    assert p.returncode == 0, f"git {' '.join(args)}: {p.stderr}"
    return p.stdout.strip()


def fresh_tree(dest: Path) -> Path:
    """A new clone of the pristine sglang 0.5.23 tree at ``dest``."""
    from dsv4ctl.patches.pristine import pristine_tree
    return pristine_tree("sglang", "0.5.23", dest, cache=CACHE)


def snapshot(tree: Path) -> dict:
    """Every byte of the work tree (sha256 per file, .git excluded) plus HEAD, branch and status."""
    files = {}
    for root, dirs, names in os.walk(tree):
        dirs[:] = [d for d in dirs if d != ".git"]
        for n in names:
            p = Path(root) / n
            files[str(p.relative_to(tree))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return dict(files=files, head=git(tree, "rev-parse", "HEAD"),
                branch=git(tree, "symbolic-ref", "HEAD"),
                status=git(tree, "status", "--porcelain=v1", "--untracked-files=all"))
