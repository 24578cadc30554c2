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
# No background ``git gc --auto`` after a pristine tree's one commit of ~5000 loose objects: it
# repacks ~150 MB detached from the command (measured: 10 of the 20 CPU-s a cold ``patch check``
# costs here) and the tests' trees are cloned, never fetched. Nothing asserted reads the packing.
NO_AUTO_GC = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "gc.auto", "GIT_CONFIG_VALUE_0": "0"}
ENV = {"DSV4CTL_CACHE": str(CACHE), **NO_AUTO_GC}


def git(tree: Path, *args: str, input: str | None = None) -> str:
    env = {**os.environ, "LC_ALL": "C", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}
    p = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, env=env,
                       input=input)
    assert p.returncode == 0, f"git {' '.join(args)}: {p.stderr}"
    return p.stdout.strip()


def fresh_tree(dest: Path) -> Path:
    """A new clone of the pristine sglang 0.5.23 tree at ``dest``."""
    from unittest import mock

    from dsv4ctl.patches.pristine import pristine_tree
    with mock.patch.dict(os.environ, NO_AUTO_GC):     # the build's git runs with this environment
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
