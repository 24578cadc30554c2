"""Pristine SGLang trees: a git repository holding exactly the sources of a released wheel.

The wheel (``pip download --no-deps sglang==VERSION``) is cached under the dsv4ctl cache
directory (``$DSV4CTL_CACHE``, default ``~/.cache/dsv4ctl``) in ``wheels/``. Its ``sglang/``
package becomes ``python/sglang/`` of the tree — the layout of an upstream SGLang checkout — in
one commit tagged ``vVERSION``, so series cut against upstream apply unchanged. Byte-code
(``__pycache__``) shipped in the wheel is left out."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Optional

from ..errors import DsvError, InputError
from .gitio import GIT_ENV

TREE_PREFIX = "python/"
_IDENT = {"GIT_AUTHOR_NAME": "dsv4ctl", "GIT_AUTHOR_EMAIL": "dsv4ctl@localhost",
          "GIT_COMMITTER_NAME": "dsv4ctl", "GIT_COMMITTER_EMAIL": "dsv4ctl@localhost",
          "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}


def cache_dir() -> Path:
    """dsv4ctl's cache folder (:func:`dsv4ctl.resources.cache_root`)."""
    from ..resources import cache_root
    return cache_root()


def find_wheel(package: str, version: str, directory: Path) -> Optional[Path]:
    """A cached ``PACKAGE-VERSION-*.whl`` in ``directory`` (the one for this Python preferred)."""
    cands = sorted(directory.glob(f"{package}-{version}-*.whl"))
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    cands.sort(key=lambda p: tag not in p.name)
    return cands[0] if cands else None


def fetch_wheel(package: str, version: str, directory: Optional[Path] = None) -> Path:
    """The cached wheel, downloaded once with ``pip download --no-deps`` when absent.
    DsvError (exit 3 is not used: nothing remote to blame) when pip cannot get it."""
    directory = directory or cache_dir() / "wheels"
    w = find_wheel(package, version, directory)
    if w:
        return w
    directory.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        f"{package}=={version}", "-d", str(directory)], capture_output=True, text=True)
    w = find_wheel(package, version, directory)
    if p.returncode != 0 or w is None:
        last = (p.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise DsvError(f"pip download {package}=={version} failed: {last}")
    return w


def build_tree(wheel: Path, dest: Path, package: str = "sglang", version: Optional[str] = None) -> Path:
    """Create a git tree at ``dest`` (must not exist) from ``wheel``'s ``PACKAGE/`` sources, one
    commit tagged ``vVERSION`` with a fixed identity and date (same wheel → same commit id)."""
    if dest.exists():
        raise InputError(f"{dest}: already exists")
    version = version or wheel.name.split("-")[1]
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                name = info.filename
                if info.is_dir() or not name.startswith(f"{package}/") or "__pycache__/" in name \
                        or name.endswith((".pyc", ".pyo")):
                    continue
                out = tmp / TREE_PREFIX / name
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(z.read(info))
                if (info.external_attr >> 16) & 0o111:
                    out.chmod(0o755)
        env = {**os.environ, **GIT_ENV, **_IDENT}
        for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"],
                     ["git", "commit", "-q", "--no-gpg-sign", "-m", f"{package} {version} (from {wheel.name})"],
                     ["git", "tag", f"v{version}"]):
            p = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, env=env)
            if p.returncode != 0:
                raise DsvError(f"building the pristine tree: {' '.join(argv[:2])}: {p.stderr.strip()}")
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def pristine_tree(package: str, version: str, dest: Path, cache: Optional[Path] = None) -> Path:
    """A fresh pristine tree of ``package==version`` at ``dest``: cloned from the cached pristine
    repository ``CACHE/trees/PACKAGE-VERSION`` (built from the wheel on first use)."""
    cache = cache or cache_dir()
    ref = cache / "trees" / f"{package}-{version}"
    if not (ref / ".git").is_dir():
        ref.parent.mkdir(parents=True, exist_ok=True)
        build_tree(fetch_wheel(package, version, cache / "wheels"), ref, package, version)
    p = subprocess.run(["git", "clone", "-q", str(ref), str(dest)],
                       capture_output=True, text=True, env={**os.environ, **GIT_ENV})
    if p.returncode != 0:
        raise DsvError(f"git clone {ref}: {p.stderr.strip()}")
    head, tag = (subprocess.run(["git", "-C", str(dest), "rev-parse", r], capture_output=True, text=True).stdout.strip()
                 for r in ("HEAD", f"v{version}^{{commit}}"))
    if not head or head != tag:
        shutil.rmtree(dest, ignore_errors=True)
        raise DsvError(f"{ref}: the cached pristine tree has commits after v{version}; delete it to rebuild")
    return dest
