"""Issue 48 item 3: the release build cache's hash cache (dsv4ctl/deploy/hashcache.py). A build
checks every file of the release it made, but reads only the files whose identity (device,
inode, size, mtime_ns, ctime_ns) the cache does not hold; an in-place edit (its mtime put back)
changes the ctime and is read again and caught; a cache file that is a link is not read."""

from __future__ import annotations

import json
import os
import stat

from dsv4ctl.deploy.hashcache import NAME, HashCache
from dsv4ctl.deploy.release import build_release, check_release
from tests.sshd.world import make_patch, make_tree

SHARED = "tree/python/sglang/srt/mod002.py"       # not patched: an inode the export and every release share


def build(tmp_path, config: bytes):
    tree = tmp_path / "t"
    if not tree.exists():
        make_tree(tree, files=5)
        make_patch(tree, tmp_path / "0001.patch")
    return build_release(tree, "v0.5.23", [tmp_path / "0001.patch"], {"decode": config}, {"decode": {"cmd": "x"}},
                         cache=tmp_path / "cache", who="me")


def edit_in_place(f, data: bytes) -> None:
    """Same inode, same size, mtime put back: only the ctime tells."""
    st = f.stat()
    assert len(data) == st.st_size
    os.chmod(f, 0o644)
    with open(f, "r+b") as fh:
        fh.write(data)
    os.chmod(f, stat.S_IMODE(st.st_mode))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_build_reads_only_what_the_cache_lacks_and_a_tampered_file_is_read_again(tmp_path):
    first = build(tmp_path, b"a: 1\n")
    cache = tmp_path / "cache"
    assert oct((cache / NAME).stat().st_mode & 0o777) == "0o600"
    second = build(tmp_path, b"a: 2\n")                 # a new release from the same export
    assert (second.path / SHARED).stat().st_ino == (first.path / SHARED).stat().st_ino
    hc = HashCache(cache)
    assert check_release(second.path, hc) == [] and check_release(first.path, hc) == [] and hc.read == 0
    good = (first.path / SHARED).read_bytes()
    edit_in_place(first.path / SHARED, b"X" + good[1:])
    hc = HashCache(cache)
    assert check_release(second.path, hc) == ["hash " + SHARED] and hc.read == 1
    # the next build of either release moves the tampered one aside and builds it again from git
    again = build(tmp_path, b"a: 2\n")
    assert again.id == second.id and (again.path / SHARED).read_bytes() == good
    assert check_release(again.path) == []


def test_a_hash_cache_that_is_a_link_is_not_read(tmp_path):
    rel = build(tmp_path, b"a: 1\n")
    cache = tmp_path / "cache"
    edit_in_place(rel.path / SHARED, b"X" + (rel.path / SHARED).read_bytes()[1:])
    st = (rel.path / SHARED).stat()
    sha = json.loads((rel.path / "MANIFEST.json").read_text())["files"][SHARED][0]
    evil = tmp_path / "evil.json"
    evil.write_text(json.dumps({"schema": "dsv4ctl.hashcache/1", "entries": {
        f"{st.st_dev}:{st.st_ino}": [st.st_size, st.st_mtime_ns, st.st_ctime_ns, sha, str(rel.path / SHARED)]}}))
    evil.chmod(0o600)
    (cache / NAME).unlink()
    (cache / NAME).symlink_to(evil)
    hc = HashCache(cache)
    assert hc.entries == {} and check_release(rel.path, hc) == ["hash " + SHARED]
    hc.save()                                           # the link is replaced, its target untouched
    assert not (cache / NAME).is_symlink() and json.loads(evil.read_text())["entries"]
    # the same forged document as the user's own regular file is what the cache trusts: the
    # documented blind spot of a forged ctime, which the host's full verify covers
    (cache / NAME).unlink()
    os.rename(evil, cache / NAME)
    assert check_release(rel.path, HashCache(cache)) == []
    assert check_release(rel.path) == ["hash " + SHARED]
