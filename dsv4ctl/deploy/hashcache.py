"""The release build cache's hash cache (issue 48 item 3): a file's sha256 kept under its
identity (device, inode, size, mtime_ns, ctime_ns), so the check of a release built from the
base export (:func:`dsv4ctl.deploy.release.check_release`) does not read again the files it
shares with the export by hard link. The control-machine twin of the host's cache in
:mod:`dsv4ctl.deploy.verify`: both are the rules of :mod:`dsv4ctl.deploy.hashrules` (the host
script carries that module's text), plus, here:

* within one build, a file hashed (or found in the cache) keeps its hash while its size and
  mtime stay — the build's own ``cp -al`` of the export and its chmods change the ctime;
* the file ``<cache>/.hashes.json`` is opened without following a link
  (:func:`dsv4ctl.resources.open_cache_file`) in the trusted cache folder
  (:func:`dsv4ctl.deploy.release.trusted_cache`); it is replaced atomically (0600 temp file,
  fsync, rename) and holds only inodes whose file is still there with that identity.

A file rewritten with its mtime *and* ctime forged is not caught by a cached check; the host's
full ``dsv4ctl verify`` reads every byte."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .hashrules import cached_sha256, file_sha256, read_entries, still_there, valid_entry, write_entries

NAME = ".hashes.json"


class HashCache:
    """Hashes of one build (``known``: ``(dev, ino) -> [sha256, size, mtime_ns, path]``) on top
    of the entries read from ``folder/.hashes.json`` (``entries``: ``"dev:ino" -> [size,
    mtime_ns, ctime_ns, sha256, path]``). ``folder`` None: an empty cache that saves nothing."""

    def __init__(self, folder: Path | None):
        self.folder = folder
        self.known: dict[tuple[int, int], list] = {}
        self.entries: dict[str, list] = {}
        self.read = 0
        if folder is not None:
            self.entries = load_entries(folder)

    def prime(self, root: Path) -> None:
        """Take the cached hash of every regular file under ``root`` whose identity is the cached
        one (before a ``cp -al`` of it changes the ctime)."""
        if not self.entries:
            return
        for dirpath, _dirs, names in os.walk(root):
            for n in names:
                full = os.path.join(dirpath, n)
                try:
                    st = os.lstat(full)
                except OSError:
                    continue
                sha = cached_sha256(self.entries, st) if stat.S_ISREG(st.st_mode) else None
                if sha is not None:
                    self.known[(st.st_dev, st.st_ino)] = [sha, st.st_size, st.st_mtime_ns, full]

    def note(self, path: Path | str, sha256: str, st: os.stat_result) -> None:
        """Record that the file ``path`` (status ``st``, taken before its content was read) holds
        ``sha256``."""
        self.known[(st.st_dev, st.st_ino)] = [sha256, st.st_size, st.st_mtime_ns, str(path)]

    def sha256(self, path: Path | str, st: os.stat_result) -> str:
        """The sha256 of the regular file ``path`` (``st``: its lstat): this build's or the
        cache's when size and mtime (cache: and ctime) match, else read (and recorded)."""
        k = (st.st_dev, st.st_ino)
        h = self.known.get(k)
        if h is not None and h[1:3] == [st.st_size, st.st_mtime_ns]:
            h[3] = str(path)            # where it is now (an export renamed into place, a release)
            return h[0]
        sha = cached_sha256(self.entries, st)
        if sha is not None:
            self.known[k] = [sha, st.st_size, st.st_mtime_ns, str(path)]
            return sha
        sha, fs = file_sha256(path)
        self.read += 1
        self.note(path, sha, fs)
        return sha

    def save(self) -> None:
        """Write ``folder/.hashes.json`` (see the module docstring); OSError is ignored (a cache)."""
        if self.folder is None:
            return
        out: dict[str, list] = {}
        for (dev, ino), (sha, size, mtime, path) in self.known.items():
            k = f"{dev}:{ino}"
            st = still_there(k, path, lambda st: [st.st_size, st.st_mtime_ns] == [size, mtime])
            if st is not None:
                out[k] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, sha, path]
        for k, e in self.entries.items():
            if k not in out and still_there(k, e[4], lambda st: cached_sha256(self.entries, st) is not None):
                out[k] = e
        write_entries(str(self.folder), NAME, out, fsync=True)


def load_entries(folder: Path) -> dict[str, list]:
    """The well-formed entries of ``folder/.hashes.json``; {} when it is absent, a link, not a
    regular file of this user (:func:`dsv4ctl.resources.open_cache_file`), bigger than
    :data:`dsv4ctl.deploy.hashrules.MAX_BYTES` or not a cache document."""
    from ..resources import open_cache_file
    try:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        fd = open_cache_file(dfd, NAME, os.O_RDONLY)
    except OSError:
        return {}
    finally:
        os.close(dfd)
    with os.fdopen(fd, "rb") as f:
        ent, _why = read_entries(f)
    return {k: v for k, v in ent.items() if valid_entry(v)}
