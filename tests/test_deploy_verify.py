"""The on-host merge + manifest check (dsv4ctl/deploy/verify.py), run as deploy runs it:
``python -S -c SCRIPT REL SIDE BASE...`` on real folders with hard links."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4ctl.deploy.verify import SCRIPT


def write_release(root: Path, files: dict[str, bytes], links: dict[str, str], rid: str) -> Path:
    """A release folder as the builder lays it out: files, symlinks, MANIFEST.json, RELEASE.json."""
    root.mkdir(parents=True)
    for p, data in files.items():
        (root / p).parent.mkdir(parents=True, exist_ok=True)
        (root / p).write_bytes(data)
    for p, target in links.items():
        (root / p).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, root / p)
    man = {"files": {p: [hashlib.sha256(d).hexdigest(), len(d), False] for p, d in files.items()}, "links": links}
    (root / "MANIFEST.json").write_text(json.dumps(man))
    (root / "RELEASE.json").write_text(json.dumps({"id": rid}))
    return root


def run(rel: Path, side: Path | str, *bases: Path) -> tuple[int, dict]:
    r = subprocess.run([sys.executable, "-S", "-c", SCRIPT, str(rel), str(side), *map(str, bases)],
                       capture_output=True, text=True)
    assert r.stderr == "", r.stderr
    return r.returncode, json.loads(r.stdout)


OLD = {f"tree/pkg/mod{i:03d}.py": f"x = {i}\n".encode() for i in range(40)}
OLD["tree/pkg/gone.py"] = b"removed in the new release\n"
OLD["tree/pkg/was_file"] = b"becomes a folder\n"


def new_files() -> dict[str, bytes]:
    new = {k: v for k, v in OLD.items() if k not in ("tree/pkg/gone.py", "tree/pkg/was_file")}
    new["tree/pkg/mod007.py"] = b"x = 'patched'\n"                      # changed
    new["tree/pkg/sub/new/added.py"] = b"added = True\n"                  # added in a new folder
    new["tree/pkg/was_file/inner.py"] = b"now a folder\n"                # file -> folder
    return new


@pytest.fixture
def delta(tmp_path):
    """(base release, incoming hard-link copy minus dropped paths, side folder with the changes)
    — the state :func:`dsv4ctl.deploy.engine._push_rsync` leaves before the verify step."""
    base = write_release(tmp_path / "releases" / "rOLD", OLD, {"tree/pkg/alias.py": "mod000.py"}, "rOLD")
    new = new_files()
    newlinks = {"tree/pkg/alias.py": "mod001.py"}                      # a symlink re-pointed
    staged = write_release(tmp_path / "build" / "rNEW", new, newlinks, "rNEW")
    inc = tmp_path / "releases" / ".incoming-rNEW"
    subprocess.run(["cp", "-al", str(base), str(inc)], check=True)
    for p in ("tree/pkg/gone.py", "tree/pkg/was_file", "tree/pkg/alias.py"):
        (inc / p).unlink()
    side = tmp_path / "releases" / ".incoming-rNEW.delta-1"
    for p in ("tree/pkg/mod007.py", "tree/pkg/sub/new/added.py", "tree/pkg/was_file/inner.py",
              "tree/pkg/alias.py", "MANIFEST.json", "RELEASE.json"):
        (side / p).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(staged / p, side / p, follow_symlinks=False)
    return base, inc, side


def test_delta_merge_then_verify(delta):
    base, inc, side = delta
    before = {p: (base / p).read_bytes() for p in OLD}
    code, v = run(inc, side, base)
    assert code == 0 and v["ok"], v
    assert v["merged"] == 6 and v["checked"] == len(new_files())
    assert v["hashed"] == 3                     # changed + added + file->folder; the 39 others trusted by inode
    assert not side.exists()
    assert (inc / "tree/pkg/mod007.py").read_bytes() == b"x = 'patched'\n"
    assert os.readlink(inc / "tree/pkg/alias.py") == "mod001.py"
    assert (inc / "tree/pkg/mod008.py").stat().st_ino == (base / "tree/pkg/mod008.py").stat().st_ino
    # the release it was linked from is untouched
    assert {p: (base / p).read_bytes() for p in OLD} == before
    assert os.readlink(base / "tree/pkg/alias.py") == "mod000.py"
    code, v = run(base, "-")
    assert code == 0 and v["hashed"] == len(OLD)


@pytest.mark.parametrize("fault, expect", [
    ("extra", "extra tree/pkg/stray.py"),
    ("rewritten", "hash tree/pkg/mod011.py"),      # same size, new content, new inode
    ("missing", "missing tree/pkg/mod012.py"),
    ("resized", "size tree/pkg/mod013.py"),
    ("link", "link tree/pkg/alias.py"),
    ("no-release-json", "missing RELEASE.json"),
])
def test_tampered_release_fails(delta, fault, expect):
    base, inc, side = delta
    if fault == "extra":
        (inc / "tree/pkg/stray.py").write_text("not in the manifest\n")
    elif fault == "rewritten":
        (inc / "tree/pkg/mod011.py").unlink()
        (inc / "tree/pkg/mod011.py").write_bytes(b"x = 99\n")
    elif fault == "missing":
        (inc / "tree/pkg/mod012.py").unlink()
    elif fault == "resized":
        (inc / "tree/pkg/mod013.py").unlink()
        (inc / "tree/pkg/mod013.py").write_bytes(b"x = 13  # longer\n")
    elif fault == "link":
        (side / "tree/pkg/alias.py").unlink()
        os.symlink("elsewhere.py", side / "tree/pkg/alias.py")
    elif fault == "no-release-json":
        (side / "RELEASE.json").unlink()
        (inc / "RELEASE.json").unlink()
    code, v = run(inc, side, base)
    assert code == 1 and not v["ok"] and expect in v["bad"], v


def test_trust_needs_the_same_hash_in_the_base_manifest(delta):
    """A file hard-linked from a base whose manifest gives another hash is hashed, not trusted."""
    base, inc, side = delta
    man = json.loads((base / "MANIFEST.json").read_text())
    man["files"]["tree/pkg/mod020.py"][0] = "0" * 64
    (base / "MANIFEST.json").write_text(json.dumps(man))
    code, v = run(inc, side, base)
    assert code == 0 and v["hashed"] == 4, v


def test_later_bases_are_read_only_when_needed(delta, tmp_path):
    """A second link-dest release is consulted for files the first does not vouch for; a
    missing or unreadable one is skipped."""
    base, inc, side = delta
    other = write_release(tmp_path / "releases" / "rOTHER", {"tree/pkg/sub/new/added.py": b"added = True\n"}, {},
                          "rOTHER")
    (side / "tree/pkg/sub/new/added.py").unlink()
    os.link(other / "tree/pkg/sub/new/added.py", side / "tree/pkg/sub/new/added.py")
    code, v = run(inc, side, base, tmp_path / "releases" / "rMISSING", other)
    assert code == 0 and v["hashed"] == 2, v        # added.py trusted through rOTHER
