"""The hash cache's rules, once (issue 48 item 3): the control machine's build cache
(:mod:`dsv4ctl.deploy.hashcache`) imports this module, and the host's verify script
(:data:`dsv4ctl.deploy.verify.SCRIPT`) is this module's text followed by the script's own, so the
two caches cannot drift apart. Standard library only, no relative import, no ``from __future__``
and no syntax newer than the hosts' ``python3`` (the script runs there under ``-S``).

An entry is ``"DEV:INO": [size, mtime_ns, ctime_ns, sha256, path]``, the document
``{"schema": "dsv4ctl.hashcache/1", "entries": {...}}``:

* an entry gives its hash only when the file's identity now is exactly the recorded one
  (:func:`cached_sha256`): a write, chmod, new link or ``touch`` changes the ctime and the file is
  read again;
* a cache file is used only when it is a regular file of this user that nobody else can write,
  at most :data:`MAX_BYTES` (:func:`read_entries`), in a folder of this user that nobody else can
  write (:func:`folder_trusted`, or :func:`dsv4ctl.deploy.release.trusted_cache` locally);
* it is replaced atomically (:func:`write_entries`: a 0600 temp file in the folder, rename; a
  link there is replaced, never followed); temp files older than an hour, left by a run killed
  before its rename, are removed.

A file rewritten with its mtime *and* ctime forged is not caught through the cache; the host's
full ``dsv4ctl verify`` reads every byte."""

import hashlib
import json
import os
import stat
import tempfile
import time

HASHCACHE_SCHEMA = "dsv4ctl.hashcache/1"
MAX_BYTES = 64 << 20


def identity_key(s):
    """``"DEV:INO"`` of the status ``s``: the key of its entry."""
    return "%d:%d" % (s.st_dev, s.st_ino)


def valid_entry(e):
    """Whether ``e`` has an entry's shape: three ints, a 64-character sha256, a path."""
    return (type(e) is list and len(e) == 5 and all(type(x) is int for x in e[:3])
            and type(e[3]) is str and len(e[3]) == 64 and type(e[4]) is str)


def cached_sha256(entries, s):
    """The sha256 ``entries`` hold for the file whose lstat is ``s``, when its identity (device,
    inode, size, mtime_ns, ctime_ns) is exactly the recorded one; else None."""
    e = entries.get(identity_key(s))
    if valid_entry(e) and e[:3] == [s.st_size, s.st_mtime_ns, s.st_ctime_ns]:
        return e[3]
    return None


def file_sha256(path):
    """(sha256 hex, fstat) of the regular file ``path``, read in 1 MiB chunks; the status is the
    one of the file the content was read from."""
    d = hashlib.sha256()
    with open(path, "rb") as f:
        fs = os.fstat(f.fileno())
        for chunk in iter(lambda: f.read(1 << 20), b""):
            d.update(chunk)
    return d.hexdigest(), fs


def folder_trusted(d):
    """The folder ``d`` is this user's and nobody else can write it (or plant a file)."""
    s = os.stat(d)
    return stat.S_ISDIR(s.st_mode) and s.st_uid == os.getuid() and not s.st_mode & 0o022


def read_entries(f):
    """(entries, None) of the open cache file ``f`` (binary), or ({}, why) when it is not a regular
    file of this user, others can write it, it is over :data:`MAX_BYTES` or not a cache document.
    Entries are checked when used (:func:`cached_sha256`)."""
    s = os.fstat(f.fileno())
    if not stat.S_ISREG(s.st_mode) or s.st_uid != os.getuid() or s.st_mode & 0o022 or s.st_size > MAX_BYTES:
        return {}, "refused: not a regular file of the deploy user, or writable by others, or too big"
    try:
        doc = json.loads(f.read())
        ent = doc["entries"] if doc.get("schema") == HASHCACHE_SCHEMA else {}
    except (ValueError, KeyError, TypeError, AttributeError):
        ent = {}
    return (ent if isinstance(ent, dict) else {}), None


def still_there(k, path, same):
    """The status of ``path`` when it is still the regular file of key ``k`` and ``same(status)``
    holds, else None (gone, replaced, changed)."""
    try:
        s = os.lstat(path)
    except (OSError, TypeError, ValueError):
        return None
    if stat.S_ISREG(s.st_mode) and identity_key(s) == k and same(s):
        return s
    return None


def write_entries(folder, name, entries, fsync=False):
    """Replace ``folder/name`` with the document of ``entries`` (see the module docstring); False
    when the folder is not trusted or a write failed (a cache: nothing else happens)."""
    prefix = name + ".tmp."
    try:
        if not folder_trusted(folder):
            return False
        for n in os.listdir(folder):    # a run killed between its temp file and the rename
            if n.startswith(prefix) and os.lstat(os.path.join(folder, n)).st_mtime < time.time() - 3600:
                os.unlink(os.path.join(folder, n))
        fd, tmp = tempfile.mkstemp(prefix=prefix, dir=folder)
    except OSError:
        return False
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"schema": HASHCACHE_SCHEMA, "entries": entries}, separators=(",", ":")))
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, os.path.join(folder, name))
        return True
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False
