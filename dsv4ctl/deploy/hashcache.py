"""The release build cache's hash cache (issue 48 item 3): a file's sha256 kept under its
identity (device, inode, size, mtime_ns, ctime_ns), so the check of a release built from the
base export (:func:`dsv4ctl.deploy.release.check_release`) does not read again the files it
shares with the export by hard link. The control-machine twin of the host's cache in
:mod:`dsv4ctl.deploy.verify`, with the same rules:

* an entry is used only when the file's identity now is exactly the recorded one: a write, a
  chmod, a new link or ``touch`` changes the ctime, and the file is read again;
* within one build, a file hashed (or found in the cache) keeps its hash while its size and
  mtime stay — the build's own ``cp -al`` of the export and its chmods change the ctime;
* the file ``<cache>/.hashes.json`` is read only when it is a regular file of this user, not a
  link (:func:`dsv4ctl.resources.open_cache_file`), in the trusted cache folder
  (:func:`dsv4ctl.deploy.release.trusted_cache`); it is replaced atomically (0600 temp file,
  fsync, rename) and holds only inodes whose file is still there with that identity.

A file rewritten with its mtime *and* ctime forged is not caught by a cached check; the host's
full ``dsv4ctl verify`` reads every byte."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

NAME = ".hashes.json"
SCHEMA = "dsv4ctl.hashcache/1"
MAX_BYTES = 64 << 20


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
                e = self.entries.get(f"{st.st_dev}:{st.st_ino}")
                if stat.S_ISREG(st.st_mode) and e is not None and e[:3] == [st.st_size, st.st_mtime_ns,
                                                                              st.st_ctime_ns]:
                    self.known[(st.st_dev, st.st_ino)] = [e[3], st.st_size, st.st_mtime_ns, full]

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
        e = self.entries.get(f"{st.st_dev}:{st.st_ino}")
        if e is not None and e[:3] == [st.st_size, st.st_mtime_ns, st.st_ctime_ns]:
            self.known[k] = [e[3], st.st_size, st.st_mtime_ns, str(path)]
            return e[3]
        import hashlib
        d = hashlib.sha256()
        with open(path, "rb") as f:
            fs = os.fstat(f.fileno())
            for chunk in iter(lambda: f.read(1 << 20), b""):
                d.update(chunk)
        self.read += 1
        self.note(path, d.hexdigest(), fs)
        return d.hexdigest()

    def save(self) -> None:
        """Write ``folder/.hashes.json`` (see the module docstring); OSError is ignored (a cache)."""
        if self.folder is None:
            return
        out: dict[str, list] = {}

        def keep(k: str, sha: str, path: str, same) -> None:
            try:
                st = os.lstat(path)
            except OSError:
                return
            if stat.S_ISREG(st.st_mode) and f"{st.st_dev}:{st.st_ino}" == k and same(st):
                out[k] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, sha, path]
        for (dev, ino), (sha, size, mtime, path) in self.known.items():
            keep(f"{dev}:{ino}", sha, path, lambda st: [st.st_size, st.st_mtime_ns] == [size, mtime])
        for k, e in self.entries.items():
            if k not in out:
                keep(k, e[3], e[4], lambda st: [st.st_size, st.st_mtime_ns, st.st_ctime_ns] == e[:3])
        import tempfile
        import time
        try:
            for n in os.listdir(self.folder):    # a run killed between its temp file and the rename
                if n.startswith(NAME + ".tmp.") and os.lstat(self.folder / n).st_mtime < time.time() - 3600:
                    os.unlink(self.folder / n)
            fd, tmp = tempfile.mkstemp(prefix=NAME + ".tmp.", dir=self.folder)
        except OSError:
            return
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"schema": SCHEMA, "entries": out}, f, separators=(",", ":"))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.folder / NAME)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def load_entries(folder: Path) -> dict[str, list]:
    """The well-formed entries of ``folder/.hashes.json``; {} when it is absent, a link, not a
    regular file of this user (:func:`dsv4ctl.resources.open_cache_file`), bigger than
    :data:`MAX_BYTES` or not a cache document."""
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
        st = os.fstat(f.fileno())
        if st.st_mode & 0o022 or st.st_size > MAX_BYTES:
            return {}
        try:
            doc = json.loads(f.read())
            ent = doc["entries"] if doc.get("schema") == SCHEMA else {}
        except (ValueError, KeyError, TypeError, AttributeError):
            return {}
    if not isinstance(ent, dict):
        return {}
    return {k: v for k, v in ent.items()
            if isinstance(v, list) and len(v) == 5 and all(type(x) is int for x in v[:3])
            and isinstance(v[3], str) and len(v[3]) == 64 and isinstance(v[4], str)}
