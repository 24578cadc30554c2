"""The on-host half of a push (dsv4ctl/deploy/verify.py), run as deploy runs it:
``python -S -c SCRIPT`` with the job as JSON on stdin, on real folders with hard links."""

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
    """A release folder as the builder lays it out: read-only files, symlinks, MANIFEST.json,
    RELEASE.json."""
    root.mkdir(parents=True)
    for p, data in files.items():
        (root / p).parent.mkdir(parents=True, exist_ok=True)
        (root / p).write_bytes(data)
        os.chmod(root / p, 0o444)
    for p, target in links.items():
        (root / p).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, root / p)
    man = {"files": {p: [hashlib.sha256(d).hexdigest(), len(d), False] for p, d in files.items()}, "links": links}
    (root / "MANIFEST.json").write_text(json.dumps(man))
    (root / "RELEASE.json").write_text(json.dumps({"id": rid}))
    return root


def run(rel: Path, side: Path | None, *bases: Path, **job) -> tuple[int, dict]:
    doc = {"rel": str(rel), "side": str(side) if side else None, "bases": [str(b) for b in bases], **job}
    r = subprocess.run([sys.executable, "-S", "-c", SCRIPT], input=json.dumps(doc), capture_output=True,
                       text=True, timeout=60)
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
    — the state :func:`dsv4ctl.deploy.push._push_rsync` leaves before the verify step."""
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
    assert v["hashed"] == len(new_files())      # every file's content: no file is trusted for its inode
    assert not side.exists()
    assert (inc / "tree/pkg/mod007.py").read_bytes() == b"x = 'patched'\n"
    assert os.readlink(inc / "tree/pkg/alias.py") == "mod001.py"
    assert (inc / "tree/pkg/mod008.py").stat().st_ino == (base / "tree/pkg/mod008.py").stat().st_ino
    # the release it was linked from is untouched
    assert {p: (base / p).read_bytes() for p in OLD} == before
    assert os.readlink(base / "tree/pkg/alias.py") == "mod000.py"
    code, v = run(base, None, readonly=False)
    assert code == 0 and v["hashed"] == len(OLD) and not v["placed"]


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


def test_an_in_place_edit_of_a_shared_inode_is_caught(delta):
    """Issue 13: a delta push trusted a drifted hard link as verified. The base release's file is
    edited in place (same inode, same size): the new release, which hard-links it, fails."""
    base, inc, side = delta
    f = base / "tree/pkg/mod020.py"
    ino, size = f.stat().st_ino, f.stat().st_size
    with open(f, "r+b") as fh:                       # in place: the inode every release shares
        fh.write(b"y")
    assert f.stat().st_ino == ino and f.stat().st_size == size
    assert (inc / "tree/pkg/mod020.py").read_bytes().startswith(b"y")
    code, v = run(inc, side, base)
    assert code == 1 and not v["ok"] and "hash tree/pkg/mod020.py" in v["bad"], v


def test_verify_only_reports_drift_per_release_and_hashes_each_inode_once(delta, tmp_path):
    base, inc, side = delta
    code, v = run(inc, side, base)
    assert code == 0 and v["ok"]
    new = inc
    # an in-place edit of an inode both releases share, a deleted file in the old one
    with open(base / "tree/pkg/mod030.py", "r+b") as fh:
        fh.write(b"z")
    (base / "tree/pkg/mod031.py").unlink()
    doc = {"verify": [str(base), str(new), str(tmp_path / "releases" / "rGONE")]}
    r = subprocess.run([sys.executable, "-S", "-c", SCRIPT], input=json.dumps(doc), capture_output=True, text=True,
                       timeout=60)
    v = json.loads(r.stdout)
    assert r.returncode == 1 and not v["ok"], v
    rels = v["releases"]
    assert rels[str(base)]["bad"] == ["hash tree/pkg/mod030.py", "missing tree/pkg/mod031.py"]
    assert rels[str(new)]["bad"] == ["hash tree/pkg/mod030.py"] and rels[str(new)]["nbad"] == 1
    assert rels[str(tmp_path / "releases" / "rGONE")]["bad"] == ["missing release folder"]
    # shared inodes are hashed once: the union of both trees' distinct inodes
    inodes = {(base / p).stat().st_ino for p in OLD if (base / p).is_file()} | \
        {(new / p).stat().st_ino for p in new_files()}
    assert v["hashed"] == len(inodes)
    # verify-only changed nothing
    assert (base / "tree/pkg/mod030.py").read_bytes().startswith(b"z")


def test_placed_release_is_read_only_modes_otherwise_kept(delta):
    base, inc, side = delta
    (side / "tree/pkg/mod007.py").chmod(0o600)       # a private file stays private
    code, v = run(inc, side, base)
    assert code == 0 and v["ok"]
    modes = {p: (inc / p).stat().st_mode & 0o777 for p in new_files()}
    assert modes["tree/pkg/mod007.py"] == 0o400
    assert all(m & 0o222 == 0 for m in modes.values()), modes


def test_stage_wait_merge_verify_place(tmp_path):
    """The whole delta job: stage (cp -al minus dropped paths) while the side folder fills, wait
    for the marker, merge, verify, rename to the final name, replace state.json keeping its mode."""
    import threading
    import time
    rel_dir = tmp_path / "releases"
    base = write_release(rel_dir / "rOLD", OLD, {"tree/pkg/alias.py": "mod000.py"}, "rOLD")
    staged = write_release(tmp_path / "build" / "rNEW", new_files(), {"tree/pkg/alias.py": "mod001.py"}, "rNEW")
    inc, side, final = rel_dir / ".incoming-rNEW", rel_dir / ".incoming-rNEW.delta-1", rel_dir / "rNEW"
    state = tmp_path / "state.json"
    state.write_text("{}\n")
    state.chmod(0o600)

    def rsync_arrives():             # what rsync does meanwhile: fill the side folder, then the marker
        time.sleep(0.3)
        for p in ("tree/pkg/mod007.py", "tree/pkg/sub/new/added.py", "tree/pkg/was_file/inner.py",
                  "tree/pkg/alias.py", "MANIFEST.json", "RELEASE.json"):
            (side / p).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(staged / p, side / p, follow_symlinks=False)
        (rel_dir / ".incoming-rNEW.delta-1.done").touch()
    th = threading.Thread(target=rsync_arrives)
    th.start()
    code, v = run(inc, side, base, stage={"from": str(base), "gone": ["tree/pkg/gone.py", "tree/pkg/was_file",
                                                                     "tree/pkg/alias.py"]},
                  wait={"marker": str(side), "timeout": 30},
                  place={"final": str(final), "state": str(state), "doc": '{"placed": 1}\n'})
    th.join()
    assert code == 0 and v["ok"] and v["placed"] and v["merged"] == 6 and v["hashed"] == v["checked"] == 42, v   # every file, each inode once
    assert sorted(x.name for x in rel_dir.iterdir()) == ["rNEW", "rOLD"]     # no incoming, side or marker left
    assert (final / "tree/pkg/mod007.py").read_bytes() == b"x = 'patched'\n"
    assert (final / "tree/pkg/mod008.py").stat().st_ino == (base / "tree/pkg/mod008.py").stat().st_ino
    assert state.read_text() == '{"placed": 1}\n' and oct(state.stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("how", ["fail-marker", "cleanup", "timeout"])
def test_waiting_job_aborts(tmp_path, how):
    """rsync failed (``.fail``), a cleanup removed the incoming folder, or the wait timed out:
    exit 3, nothing placed, the staged folders removed."""
    import threading
    import time
    rel_dir = tmp_path / "releases"
    base = write_release(rel_dir / "rOLD", OLD, {}, "rOLD")
    inc, side = rel_dir / ".incoming-rNEW", rel_dir / ".incoming-rNEW.delta-1"
    side.mkdir()

    def copying() -> bool:
        """The job's ``cp -al`` into the incoming folder is still running (every entry can exist
        before cp has finished with them: removing the folder then fails cp, an error, not the
        abort this test is about)."""
        for proc in Path("/proc").iterdir():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[:2] == [b"cp", b"-al"] and str(inc).encode() in argv:
                return True
        return False

    def later():
        # once the staged copy is complete (a fixed 0.5 s raced a slow cp -al on a loaded machine;
        # so did counting its entries)
        want = sum(1 for _ in base.rglob("*"))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (inc.is_dir() and sum(1 for _ in inc.rglob("*")) >= want
                                                   and not copying()):
            time.sleep(0.01)
        if how == "fail-marker":
            (rel_dir / ".incoming-rNEW.delta-1.fail").touch()
        elif how == "cleanup":
            shutil.rmtree(inc)
    th = threading.Thread(target=later)
    th.start()
    code, v = run(inc, side, base, stage={"from": str(base), "gone": []},
                  wait={"marker": str(side), "timeout": 2 if how == "timeout" else 30},
                  place={"final": str(rel_dir / "rNEW"), "state": str(tmp_path / "state.json"), "doc": "{}"})
    th.join()
    assert code == 3 and v["aborted"] and not v["placed"], v
    assert sorted(x.name for x in rel_dir.iterdir()) == ["rOLD"]
    assert not (tmp_path / "state.json").exists()


def test_stage_error_is_a_json_line(tmp_path):
    """A failing step (here: no release to copy from) is one JSON line with the error, exit 2."""
    code, v = run(tmp_path / ".incoming-x", None, stage={"from": str(tmp_path / "missing"), "gone": []})
    assert code == 2 and not v["ok"] and v["error"].startswith("cp -al: "), v


def test_stage_removes_folders_the_new_release_drops_and_dir_symlinks_verify(tmp_path):
    """A package removed by the new release leaves no empty folders behind (a delta equals a
    full push), and a symlink to a folder is a link of the manifest like any other."""
    rel_dir = tmp_path / "releases"
    old = {**OLD, "tree/pkg/oldpkg/__init__.py": b"", "tree/pkg/oldpkg/deep/m.py": b"m = 1\n"}
    base = write_release(rel_dir / "rOLD", old, {"tree/pkg/dirlink": "sub0"}, "rOLD")
    (base / "tree/pkg/sub0").mkdir()
    new = {k: v for k, v in OLD.items()}
    staged = write_release(tmp_path / "build" / "rNEW", new, {"tree/pkg/dirlink": "sub0"}, "rNEW")
    (base / "tree/pkg/sub0").rmdir()
    inc, side = rel_dir / ".incoming-rNEW", rel_dir / ".incoming-rNEW.delta-1"
    for p in ("MANIFEST.json", "RELEASE.json"):
        side.mkdir(exist_ok=True)
        shutil.copy2(staged / p, side / p)
    (rel_dir / ".incoming-rNEW.delta-1.done").touch()
    code, v = run(inc, side, base, stage={"from": str(base), "gone": ["tree/pkg/oldpkg/__init__.py",
                                                                     "tree/pkg/oldpkg/deep/m.py"]},
                  wait={"marker": str(side), "timeout": 30})
    assert code == 0 and v["ok"], v
    assert not (inc / "tree/pkg/oldpkg").exists() and (inc / "tree/pkg").is_dir()
    assert os.readlink(inc / "tree/pkg/dirlink") == "sub0"


def test_release_scan_lists_symlinks_to_folders(tmp_path):
    from dsv4ctl.deploy.release import _scan
    (tmp_path / "pkg" / "real").mkdir(parents=True)
    (tmp_path / "pkg" / "real" / "m.py").write_text("x = 1\n")
    os.symlink("real", tmp_path / "pkg" / "alias")
    files, links = _scan(tmp_path)
    assert links == {"pkg/alias": "real"} and list(files) == ["pkg/real/m.py"]


def test_waiting_job_aborts_when_its_session_is_gone(tmp_path):
    """dsv4ctl died (its SSH session closed): the waiting script notices its stdout has no
    reader any more, removes what it staged and exits instead of waiting out the timeout."""
    rel_dir = tmp_path / "releases"
    base = write_release(rel_dir / "rOLD", OLD, {}, "rOLD")
    inc, side = rel_dir / ".incoming-rNEW", rel_dir / ".incoming-rNEW.delta-1"
    side.mkdir()
    job = {"rel": str(inc), "side": str(side), "bases": [str(base)], "stage": {"from": str(base), "gone": []},
           "wait": {"marker": str(side), "timeout": 600}}
    p = subprocess.Popen([sys.executable, "-S", "-c", SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdin.write(json.dumps(job).encode())
    p.stdin.close()
    import time
    for _ in range(200):
        if inc.is_dir():
            break
        time.sleep(0.02)
    time.sleep(0.3)
    assert p.poll() is None and inc.is_dir()       # staged, waiting for the marker
    p.stdout.close()                               # the session goes away
    assert p.wait(timeout=20) == 3
    assert sorted(x.name for x in rel_dir.iterdir()) == ["rOLD"]


def test_leftover_final_folder_is_replaced_by_the_verified_copy(delta, tmp_path):
    """A folder already at the final name that the host's facts did not count as a release (no
    RELEASE.json + MANIFEST.json pair, e.g. an interrupted manual rm -rf) is replaced."""
    base, inc, side = delta
    final = inc.parent / "rNEW"
    final.mkdir()
    (final / "RELEASE.json").write_text('{"id": "rNEW"}')
    state = tmp_path / "state.json"
    code, v = run(inc, side, base, place={"final": str(final), "state": str(state), "doc": "{}\n"})
    assert code == 0 and v["placed"], v
    assert (final / "MANIFEST.json").is_file() and (final / "tree/pkg/mod007.py").is_file()
    assert not inc.exists() and not [p for p in inc.parent.iterdir() if ".trash-" in p.name]
    assert state.read_text() == "{}\n" and oct(state.stat().st_mode & 0o777) == "0o644"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("state.json.tmp")]


@pytest.mark.parametrize("job", ["{not json", '{"rel": 5}', '{"side": "x"}', "[]"])
def test_malformed_job_is_a_json_error(job):
    r = subprocess.run([sys.executable, "-S", "-c", SCRIPT], input=job, capture_output=True, text=True, timeout=30)
    v = json.loads(r.stdout)
    assert r.returncode == 2 and not v["ok"] and v["error"].startswith("bad job: ") and r.stderr == "", (r, v)


# -- the host's hash cache (issue 48 item 3): a file whose identity (device, inode, size,
# mtime_ns, ctime_ns) is the cached one is not read again; dsv4ctl verify reads everything --

def verify_only(*rels: Path, cache: Path | None = None, full: bool = False) -> tuple[int, dict]:
    doc = {"verify": [str(r) for r in rels], **({"cache": str(cache)} if cache else {}),
           **({"full": True} if full else {})}
    r = subprocess.run([sys.executable, "-S", "-c", SCRIPT], input=json.dumps(doc), capture_output=True, text=True,
                       timeout=60)
    assert r.stderr == "", r.stderr
    return r.returncode, json.loads(r.stdout)


def edit_in_place(f: Path, data: bytes) -> None:
    """Rewrite ``f``'s inode with same-size content and put its mtime back (a forged mtime: only
    the ctime, which nobody sets back without the clock, says it changed)."""
    st = f.stat()
    assert len(data) == st.st_size
    f.chmod(0o644)
    with open(f, "r+b") as fh:
        fh.write(data)
    f.chmod(st.st_mode & 0o777)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_mtime_ns == st.st_mtime_ns and f.stat().st_ino == st.st_ino


def test_hash_cache_push_reads_only_changed_files_and_a_tampered_file_is_read_again(tmp_path):
    """Verify fills the cache; the delta push reads only the files it sent (the staged hard links
    keep size and mtime; cp -al's new ctime is recorded); the verify before the switch reads
    nothing; an in-place edit of a shared inode with its mtime put back is read again and caught."""
    rel_dir = tmp_path / "releases"
    cache = rel_dir / ".verify-cache.json"
    base = write_release(rel_dir / "rOLD", OLD, {"tree/pkg/alias.py": "mod000.py"}, "rOLD")
    code, v = verify_only(base, cache=cache)
    assert code == 0 and v["cache"] == "absent" and v["read"] == len(OLD) and "cached" not in v, v
    assert cache.is_file() and oct(cache.stat().st_mode & 0o777) == "0o600"
    code, v = verify_only(base, cache=cache)
    assert code == 0 and v["cache"] == "used" and v["cached"] == len(OLD) and "read" not in v, v
    staged = write_release(tmp_path / "build" / "rNEW", new_files(), {"tree/pkg/alias.py": "mod001.py"}, "rNEW")
    inc, side, final = rel_dir / ".incoming-rNEW", rel_dir / ".incoming-rNEW.delta-1", rel_dir / "rNEW"
    for p in ("tree/pkg/mod007.py", "tree/pkg/sub/new/added.py", "tree/pkg/was_file/inner.py",
              "tree/pkg/alias.py", "MANIFEST.json", "RELEASE.json"):
        (side / p).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(staged / p, side / p, follow_symlinks=False)
    (rel_dir / ".incoming-rNEW.delta-1.done").touch()
    code, v = run(inc, side, base, stage={"from": str(base), "gone": ["tree/pkg/gone.py", "tree/pkg/was_file",
                                                                     "tree/pkg/alias.py"]},
                  wait={"marker": str(side), "timeout": 30}, cache=str(cache),
                  place={"final": str(final), "state": str(tmp_path / "state.json"), "doc": "{}\n"})
    assert code == 0 and v["placed"] and v["hashed"] == v["checked"] == 42, v
    assert v["read"] == 3 and v["cached"] == 39, v          # mod007, added.py, inner.py: the files sent
    code, v = verify_only(final, cache=cache)
    assert code == 0 and v["cached"] == 42 and "read" not in v, v
    edit_in_place(base / "tree/pkg/mod020.py", b"y = 20\n")  # the inode rOLD and rNEW share
    code, v = verify_only(final, base, cache=cache)
    assert code == 1 and v["read"] == 1, v
    assert v["releases"][str(final)]["bad"] == v["releases"][str(base)]["bad"] == ["hash tree/pkg/mod020.py"]
    code, v = verify_only(final, cache=cache)                # the cache learnt the new content: still drift
    assert code == 1 and "read" not in v and v["releases"][str(final)]["bad"] == ["hash tree/pkg/mod020.py"], v


def forged_cache(rel: Path, path: str) -> dict:
    """A cache document that says ``rel/path`` (as it is now) holds its manifest content."""
    s = (rel / path).stat()
    sha = json.loads((rel / "MANIFEST.json").read_text())["files"][path][0]
    return {"schema": "dsv4ctl.hashcache/1",
            "entries": {f"{s.st_dev}:{s.st_ino}": [s.st_size, s.st_mtime_ns, s.st_ctime_ns, sha, str(rel / path)]}}


@pytest.mark.parametrize("how", ["link", "others-write", "other-owner", "folder-others-write"])
def test_hash_cache_that_is_a_link_or_not_the_deploy_users_is_refused(tmp_path, how):
    """A cache anyone but the deploy user could have written is not read: the tampered file is
    read and caught, and the file a link points at is never written."""
    rel_dir = tmp_path / "releases"
    base = write_release(rel_dir / "rOLD", OLD, {}, "rOLD")
    edit_in_place(base / "tree/pkg/mod005.py", b"q = 5\n")
    cache, evil = rel_dir / ".verify-cache.json", tmp_path / "evil.json"
    evil.write_text(json.dumps(forged_cache(base, "tree/pkg/mod005.py")))
    evil.chmod(0o600)
    before = evil.read_bytes()
    if how == "link":
        cache.symlink_to(evil)
    else:
        shutil.copy(evil, cache)
        if how == "others-write":
            cache.chmod(0o666)
        elif how == "other-owner":
            if os.getuid() != 0:
                pytest.skip("chown to another user needs root")
            os.chown(cache, 65534, -1)
        else:
            rel_dir.chmod(0o777)
    code, v = verify_only(base, cache=cache)
    assert v["cache"].startswith("refused"), v
    assert code == 1 and v["releases"][str(base)]["bad"] == ["hash tree/pkg/mod005.py"] and v["read"] == len(OLD), v
    assert evil.read_bytes() == before
    if how == "link":          # replaced by the deploy user's own file, the target untouched
        assert not cache.is_symlink() and cache.stat().st_uid == os.getuid()


def test_full_verify_catches_what_a_forged_identity_hides_from_the_cache(tmp_path):
    """The cache's limit, and what covers it: content rewritten with its mtime and ctime forged
    (a cache entry matching the file's identity now: what a clock set back would leave) passes
    the cached verify; ``full`` (dsv4ctl verify) reads every file and catches it."""
    rel_dir = tmp_path / "releases"
    cache = rel_dir / ".verify-cache.json"
    base = write_release(rel_dir / "rOLD", OLD, {}, "rOLD")
    assert verify_only(base, cache=cache)[0] == 0
    edit_in_place(base / "tree/pkg/mod009.py", b"z = 9\n")
    doc = json.loads(cache.read_text())
    doc["entries"].update(forged_cache(base, "tree/pkg/mod009.py")["entries"])
    cache.write_text(json.dumps(doc))
    code, v = verify_only(base, cache=cache)
    assert code == 0 and "read" not in v, v                      # the cache's documented blind spot
    code, v = verify_only(base, cache=cache, full=True)
    assert code == 1 and v["read"] == len(OLD) and v["releases"][str(base)]["bad"] == ["hash tree/pkg/mod009.py"], v
    code, v = verify_only(base, cache=cache)                    # the full verify rewrote the cache
    assert code == 1 and "read" not in v, v


def test_the_verify_before_a_switch_uses_the_cache_and_dsv4ctl_verify_reads_everything():
    """drift.verify_job: the job the engine's verify step sends names the releases folder's cache;
    verify_fleet's (``full``) reads every file."""
    from dsv4ctl.deploy.drift import verify_job
    assert json.loads(verify_job(["/srv/d/releases/rA", "/srv/d/releases/rB"])) == {
        "verify": ["/srv/d/releases/rA", "/srv/d/releases/rB"], "cache": "/srv/d/releases/.verify-cache.json"}
    assert json.loads(verify_job(["/srv/d/releases/rA"], full=True))["full"] is True
