"""The hash cache's rules have one copy (issue 48, item 3's follow-up): the control machine's
build cache imports dsv4ctl/deploy/hashrules.py and the host's verify script carries its text."""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import REPO


def test_the_host_script_carries_the_rules_module_and_nobody_else_spells_them():
    from dsv4ctl.deploy import hashcache, hashrules, verify
    rules = Path(hashrules.__file__).read_text()
    assert verify.SCRIPT.startswith(rules) and verify.SCRIPT.count(rules) == 1
    assert hashcache.cached_sha256 is hashrules.cached_sha256 and hashcache.write_entries is hashrules.write_entries
    # the rule's own words appear in hashrules.py alone (the schema, the identity an entry is used under)
    for needle in ('"dsv4ctl.hashcache/1"', "[s.st_size, s.st_mtime_ns, s.st_ctime_ns]"):
        where = sorted(str(p.relative_to(REPO)) for p in (REPO / "dsv4ctl").rglob("*.py") if needle in p.read_text())
        assert where == ["dsv4ctl/deploy/hashrules.py"], (needle, where)


def test_a_cache_written_by_one_side_is_read_by_the_other(tmp_path):
    """The build cache's file and the host's are one format: entries the build kept give the
    host's script its hashes, under the same identity rule."""
    from dsv4ctl.deploy.hashcache import NAME, HashCache
    from dsv4ctl.deploy.hashrules import cached_sha256, read_entries
    tmp_path.chmod(0o700)
    f = tmp_path / "a.bin"
    f.write_bytes(b"x" * 3000)
    hc = HashCache(tmp_path)
    sha = hc.sha256(f, os.lstat(f))
    hc.save()
    with open(tmp_path / NAME, "rb") as fh:
        entries, why = read_entries(fh)
    assert why is None and cached_sha256(entries, os.lstat(f)) == sha
    os.utime(f, ns=(1, os.lstat(f).st_mtime_ns))          # a touch: the ctime moves, the entry is not used
    assert cached_sha256(entries, os.lstat(f)) is None
