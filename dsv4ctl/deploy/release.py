"""Releases: immutable, content-addressed SGLang trees + serve configs, built locally.

A release is a folder::

    tree/            the SGLang source at the base commit with the patch series applied
    configs/G.yaml   the rendered serve config of every server group G
    launch.json      per group: the launch command template, port, env (the service backend reads it)
    environment.lock the hashed requirements lock of the Python environment it runs on (only
                     with ``sglang.environment``; each group's launch spec names its digest)
    MANIFEST.json    {path: [sha256, size, exec]} for every regular file, {path: target} for links
    RELEASE.json     id, base ref/commit, patches, configs, built when/by, file count, bytes

The id is ``r`` + 12 hex of sha256 over what RELEASE.json says it was built from (base commit,
each patch's name and sha256, the series identity, each config's group and sha256) **and the
sha256 of its MANIFEST.json** (:func:`release_id`): the id binds the content, so a file edited
inside a release together with its manifest entry no longer matches the release's id
(:func:`seal_problems`, checked by every verify). A build is deterministic, so the same inputs
always give the same id and any change gives a new one; the local cache finds a build of the
same inputs by :func:`input_key`. File mtimes are derived from content (``content_mtime``) so rsync's quick
check (size + mtime) reuses every unchanged file with ``--link-dest`` across rebuilds, even
though ``git archive`` stamps every file with the commit time."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError
from ..hosts.audit import now_iso
from ..profile.deployment import as_deployment

MTIME_BASE = 1_500_000_000  # 2017-07-14; content mtimes live in [base, base + 2**30)


# -- pure core ---------------------------------------------------------------------------------

def input_key(base_commit: str, patches: list[tuple[str, str]], configs: dict[str, str],
               launch: dict | None = None, series_identity: str | None = None) -> str:
    """``k`` + 24 hex digits of sha256 over the canonical JSON of a build's inputs: the name under
    which the local cache finds an earlier build of the same inputs (``cache/.inputs/<key>``,
    holding the release id). Not a release id: it says nothing about the content built.

    ``patches`` is [(name, sha256)] in series order; ``configs`` {group: sha256 of the rendered
    serve config}; ``launch`` the launch spec (JSON-able); ``series_identity`` the patch
    series identity of :func:`dsv4ctl.patches.series.series_identity` when the patches come
    from a ``series`` file. Order of ``configs`` keys is irrelevant."""
    doc = {"base": base_commit, "patches": [list(p) for p in patches],
           "configs": dict(sorted(configs.items())), "launch": launch or {}}
    if series_identity:
        doc["series"] = series_identity
    return "k" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:24]


RELEASE_SCHEMA = "dsv4ctl.release/2"      # /2: the id covers MANIFEST.json (/1 ids did not)


def release_id(meta: dict, manifest_sha256: str) -> str:
    """``r`` + 12 hex digits of sha256 over the canonical JSON of the release's own record
    (``meta``: RELEASE.json's ``base_commit``, ``patches`` [{name, sha256}], ``series_identity``,
    ``configs`` {group: sha256}) and ``manifest_sha256``, the sha256 of the MANIFEST.json bytes,
    which lists every file's sha256/size/exec bit and every link (launch.json and the serve
    configs included). KeyError/TypeError when ``meta`` lacks those fields."""
    doc = {"base": meta["base_commit"], "patches": [[p["name"], p["sha256"]] for p in meta.get("patches") or []],
           "series": meta.get("series_identity"), "configs": dict(sorted((meta.get("configs") or {}).items())),
           "manifest": manifest_sha256}
    return "r" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]


def seal_problems(rid: str, meta, manifest_sha256: str | None) -> list[str]:
    """Problems binding the release folder ``releases/<rid>`` to its content (pure): ``[]`` when
    RELEASE.json (``meta``) names ``rid`` and :func:`release_id` of it and of the MANIFEST.json
    digest gives ``rid``. Else ``id RELEASE.json`` (another id, or not a record),
    ``unsealed RELEASE.json`` (schema other than /2: built before ids covered the manifest; a
    new deploy of the same inputs gives a sealed release) or ``seal MANIFEST.json`` (the manifest
    or RELEASE.json changed after the release was built: an edit made to match edited files)."""
    if not isinstance(meta, dict) or meta.get("id") != rid:
        return ["id RELEASE.json"]
    if meta.get("schema") != RELEASE_SCHEMA:
        return ["unsealed RELEASE.json"]
    try:
        ok = manifest_sha256 is not None and release_id(meta, manifest_sha256) == rid
    except (KeyError, TypeError, AttributeError):
        ok = False
    return [] if ok else ["seal MANIFEST.json"]


def content_mtime(sha256_hex: str) -> int:
    """Deterministic mtime (s since epoch) of a file from its content hash: equal content →
    equal mtime, so rsync's size+mtime quick check recognises unchanged files across builds."""
    return MTIME_BASE + int(sha256_hex[:8], 16) % (1 << 30)


def manifest_diff(old: dict, new: dict) -> dict[str, list[str]]:
    """{added, changed, removed, same}: paths of two ``MANIFEST.json['files']`` maps."""
    a = sorted(p for p in new if p not in old)
    r = sorted(p for p in old if p not in new)
    c = sorted(p for p in new if p in old and old[p] != new[p])
    s = sorted(p for p in new if p in old and old[p] == new[p])
    return {"added": a, "changed": c, "removed": r, "same": s}


# -- inputs ------------------------------------------------------------------------------------

def series_patches(series: Path | None, patches: list[Path] | None = None, dep=None) -> tuple[list[Path], str | None]:
    """(patch files in order, series identity) of what a release applies: explicit ``patches``
    win (no identity); else a folder with a ``series`` file, read and validated by
    :func:`dsv4ctl.patches.ops.load_series` (the one series reader; its identity goes into the
    release id) — with ``dep`` (the Deployment whose ``sglang.series`` is ``series``) the one it
    keeps (:func:`dsv4ctl.patches.resolved.loaded_series`, read once per Deployment); else the
    folder's ``*.patch`` sorted; none for no folder. InputError for a missing file or folder, and
    the series file's own errors."""
    if patches:
        from ..patches.ops import read_patch_text
        for p in patches:
            if not Path(p).exists():
                raise InputError(f"{p}: patch file not found")
            read_patch_text(p)          # a regular file of bounded size, UTF-8 (a FIFO is never waited on)
        return [Path(p) for p in patches], None
    if series is None:
        return [], None
    series = Path(series)
    if not series.is_dir():
        raise InputError(f"{series}: patch series folder not found")
    if (series / "series").is_file():
        from ..patches.ops import load_series
        from ..patches.resolved import loaded_series
        ls = load_series(series) if dep is None else loaded_series(dep)
        return [ls.path(e) for e in ls.series.entries], ls.identity
    return sorted(series.glob("*.patch")), None


def _git(tree: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, **kw)


def resolve_base(tree: Path, ref: str) -> str:
    """The full commit id of ``ref`` in the git checkout ``tree``; InputError otherwise."""
    tree = Path(tree)
    if not tree.is_dir():
        raise InputError(f"{tree}: SGLang tree not found")
    p = _git(tree, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", text=True)
    if p.returncode != 0:
        if _git(tree, "rev-parse", "--git-dir").returncode != 0:
            raise InputError(f"{tree}: not a git checkout (sglang.tree must be a git checkout)")
        raise InputError(f"{tree}: base ref {ref!r} is not a commit")
    return p.stdout.strip()


@dataclass
class Release:
    """A built release in the local cache (``path``)."""

    id: str
    path: Path
    meta: dict
    files: dict = field(default_factory=dict)
    links: dict = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(v[1] for v in self.files.values())


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_release(path: Path) -> Release:
    """The release folder ``path`` as a Release (RELEASE.json + MANIFEST.json; not checked:
    :func:`cached_release` checks)."""
    meta = json.loads((path / "RELEASE.json").read_text())
    man = json.loads((path / "MANIFEST.json").read_text())
    return Release(meta["id"], path, meta, man["files"], man.get("links", {}))


#: Bits no file of a release may have: write (nothing edits a release), set-uid/gid, sticky.
BAD_MODE_BITS = 0o222 | 0o7000


def check_release(path: Path, hashes=None) -> list[str]:
    """Problems of the release folder ``path`` against its MANIFEST.json and its id (read-only;
    the same words as the host-side verify, :mod:`dsv4ctl.deploy.verify`): ``seal``/``id``/
    ``unsealed`` (:func:`seal_problems`), ``missing``/``size``/``hash``/``mode``/``link``/``extra
    PATH``, ``manifest MANIFEST.json``. Every file's content hash is checked (an edit in place
    keeps inode, size and, if restored, mtime). Cost: one read of every byte (about 0.3 s for the
    sglang 0.5.23 tree, 117 MiB), or with ``hashes`` (a :class:`dsv4ctl.deploy.hashcache.HashCache`)
    only of the files whose identity it does not hold (a build: the patched files)."""
    rid = path.name
    try:
        mbytes = (path / "MANIFEST.json").read_bytes()
        man = json.loads(mbytes)
        files, links = man["files"], man.get("links", {})
        meta = json.loads((path / "RELEASE.json").read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return ["manifest MANIFEST.json"]
    bad = seal_problems(rid, meta, hashlib.sha256(mbytes).hexdigest())
    have, open_dirs = _listing(path)
    base = str(path)
    for p_, v in sorted(files.items()):
        st = have.get(p_)
        if st is None:
            bad.append("missing " + p_)
            continue
        f = os.path.join(base, p_)
        if not stat.S_ISREG(st.st_mode) or st.st_size != v[1]:
            bad.append("size " + p_)
        elif (hashes.sha256(f, st) if hashes is not None else sha256_file(f)) != v[0]:
            bad.append("hash " + p_)
        elif st.st_mode & BAD_MODE_BITS or bool(st.st_mode & 0o111) != bool(v[2]):
            bad.append("mode " + p_)
    for p_, target in sorted(links.items()):
        try:
            if os.readlink(os.path.join(base, p_)) != target:
                bad.append("link " + p_)
        except OSError:
            bad.append("link " + p_)
    bad += ["extra " + p_ for p_ in sorted(set(have) - set(files) - set(links) - {"MANIFEST.json", "RELEASE.json"})]
    return bad + ["mode " + d for d in open_dirs]


def _listing(root: Path) -> tuple[dict[str, os.stat_result], list[str]]:
    """({relative path: lstat} of every entry under ``root`` but its folders (a link to a folder
    is listed, not entered), [``./`` and ``DIR/`` of every folder group or others can write])
    — one ``lstat`` per entry (``scandir``), folders in walk order."""
    have: dict[str, os.stat_result] = {}
    open_dirs = ["./"] if os.lstat(root).st_mode & 0o022 else []
    stack = [("", str(root))]
    while stack:
        pre, d = stack.pop(0)
        with os.scandir(d) as it:
            for e in sorted(it, key=lambda e: e.name):
                st = e.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    stack.append((pre + e.name + "/", e.path))
                    if st.st_mode & 0o022:
                        open_dirs.append(pre + e.name + "/")
                else:
                    have[pre + e.name] = st
    return have, open_dirs


def cached_release(cache: Path, rid: str, log=None, hashes=None) -> Release | None:
    """Release ``rid`` from the local cache ``cache`` after :func:`check_release`; None when it is
    not there. A cached release that fails the check (edited with or without its manifest) is
    moved aside to ``cache/.tampered-<rid>-<pid>``, never shipped, the export of its base commit
    (whose inodes it shares) is dropped, and None is returned so the caller builds it again from
    its inputs; ``log`` (default: stderr) gets one line naming the problems; ``hashes``: the
    build's :class:`~dsv4ctl.deploy.hashcache.HashCache`. InputError for a cache folder others
    can write (:func:`trusted_cache`)."""
    import sys
    path = trusted_cache(Path(cache)) / rid
    if not (path / "RELEASE.json").is_file():
        return None
    bad = check_release(path, hashes)
    if not bad:
        return load_release(path)
    try:
        commit = json.loads((path / "RELEASE.json").read_text()).get("base_commit")
    except (OSError, ValueError, AttributeError):
        commit = None
    n = 0
    while True:
        aside = Path(cache) / f".tampered-{rid}-{os.getpid()}" if not n else Path(cache) / f".tampered-{rid}-{os.getpid()}.{n}"
        try:
            os.rename(path, aside)
            break
        except OSError:
            if not aside.exists() or n > 100:
                raise
            n += 1
    if isinstance(commit, str) and len(commit) == 40 and all(c in "0123456789abcdef" for c in commit):
        # the release shares its unpatched files' inodes with the export of its base: whatever
        # changed there would come back in the rebuild
        shutil.rmtree(Path(cache).parent / "exports" / commit, ignore_errors=True)
    msg = (f"release {rid} in the local cache differs from its manifest or id ({', '.join(bad[:3])}"
           + (f", +{len(bad) - 3} more" if len(bad) > 3 else "") + f"): moved aside to {aside}, not shipped")
    (log or (lambda m: print(f"dsv4ctl: warning: {m}", file=sys.stderr)))(msg)
    return None


def trusted_cache(cache: Path) -> Path:
    """``cache`` (the release build cache) after checking that it, its parent (the cache root)
    and the ``exports``, ``.inputs`` folders in use belong to this user and are writable by nobody
    else: another user who can write there could plant a release, an index entry or a base export
    that a deploy would ship. Folders are created 0700. InputError (exit 2, nothing built)
    otherwise."""
    from ..resources import untrusted
    cache = Path(cache)
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    for d in (cache.parent, cache, cache.parent / "exports", cache / ".inputs"):
        try:
            st = os.stat(d)
        except FileNotFoundError:
            continue
        if untrusted(st):         # the cache folders' one rule (dsv4ctl.resources)
            raise InputError(f"release cache folder {d} is not yours alone (owner uid {st.st_uid}, mode "
                             f"{stat.S_IMODE(st.st_mode):o}): another user could plant a release there; make it "
                             "yours with mode 700, or point DSV4CTL_CACHE at a private folder")
    return cache


def _indexed(cache: Path, key: str) -> str | None:
    """The release id an earlier build of the inputs ``key`` gave (``cache/.inputs/<key>``)."""
    try:
        rid = (Path(cache) / ".inputs" / key).read_text().strip()
    except OSError:
        return None
    return rid if len(rid) == 13 and rid[0] == "r" and all(c in "0123456789abcdef" for c in rid[1:]) else None


def _index(cache: Path, key: str, rid: str) -> None:
    """Record that the inputs ``key`` build release ``rid`` (atomic: temp file + rename)."""
    d = Path(cache) / ".inputs"
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{key}.{os.getpid()}"
    tmp.write_text(rid + "\n")
    os.replace(tmp, d / key)


def release_key(rel: Release) -> str:
    """The :func:`input_key` of what ``rel`` was built from, read from the release itself (its
    RELEASE.json record and its launch.json, both bound to its id by :func:`seal_problems`)."""
    m = rel.meta
    launch = json.loads((rel.path / "launch.json").read_text())
    return input_key(m["base_commit"], [(p["name"], p["sha256"]) for p in m.get("patches") or []],
                     dict(m.get("configs") or {}), launch, m.get("series_identity"))


def cached_build(cache: Path, key: str, log=None, hashes=None) -> Release | None:
    """The checked release (:func:`cached_release`) an earlier build of the inputs ``key`` placed
    in ``cache``, None when there is none, it was tampered with (moved aside) or it was built
    from other inputs (an index entry pointing at another release: dropped, with a warning)."""
    import sys
    rid = _indexed(cache, key)
    rel = cached_release(cache, rid, log, hashes) if rid else None
    if rel is None:
        return None
    try:
        same = release_key(rel) == key
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        same = False
    if not same:
        (log or (lambda m: print(f"dsv4ctl: warning: {m}", file=sys.stderr)))(
            f"the local cache's index names release {rid} for inputs it was not built from: entry dropped, built again")
        try:
            os.unlink(Path(cache) / ".inputs" / key)
        except OSError:
            pass
        return None
    return rel


def default_cache() -> Path:
    """The release build cache: :func:`dsv4ctl.resources.cache_root` + ``/releases``."""
    from ..resources import cache_root
    return cache_root() / "releases"


def patch_paths(text: str) -> set[str]:
    """Paths a unified/git patch touches (``a/``/``b/`` prefixes stripped; /dev/null dropped)."""
    out = set()
    for line in text.splitlines():
        if line.startswith(("--- ", "+++ ")):
            p = line[4:].split("\t", 1)[0].strip()
            if p != "/dev/null":
                out.add(p[2:] if p[:2] in ("a/", "b/") else p)
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            out.add(line.split(" ", 2)[2].strip())
    return out


def _scan(root: Path, rels=None, hashes=None) -> tuple[dict, dict]:
    """(files, links) of ``root`` (or only the paths ``rels``): sha256/size/exec, content mtimes
    set; each file's hash noted in ``hashes`` (a HashCache) under its identity after that."""
    files, links = {}, {}
    base = str(root)
    if rels is None:          # every entry but folders (a link to a folder is a link of the release)
        found, stack = [], [("", base)]
        while stack:
            pre, d = stack.pop()
            with os.scandir(d) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        stack.append((pre + e.name + "/", e.path))
                    else:
                        found.append((pre + e.name, e.path, e.stat(follow_symlinks=False)))
    else:
        found = []
        for rel in rels:
            full = os.path.join(base, rel)
            try:
                found.append((rel, full, os.lstat(full)))
            except (FileNotFoundError, NotADirectoryError):    # a path the patches removed
                continue
    for rel, full, st in found:
        if stat.S_ISLNK(st.st_mode):
            links[rel] = os.readlink(full)
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        digest = sha256_file(full)
        files[rel] = [digest, st.st_size, bool(st.st_mode & 0o111)]
        m = content_mtime(digest)
        os.utime(full, (m, m))
        if hashes is not None:
            hashes.note(full, digest, os.lstat(full))
    return files, links


def _write_new(path: Path, data: bytes, private: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _place(tmp: Path, final: Path, marker: str) -> None:
    """Rename the finished folder ``tmp`` to ``final``; when a concurrent run placed a complete one
    first (its ``marker`` file exists), drop ``tmp`` and keep that one. OSError otherwise."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not (final / marker).is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def export_base(tree: Path, commit: str, cache: Path, hashes=None) -> Path:
    """``git archive`` of ``commit`` once per commit into ``cache/../exports/<commit>/`` with
    content mtimes and a hash table (``hashes.json``); releases hard-link from it. ``hashes`` (a
    HashCache) gets the export's files: a new export's as hashed, an existing one's from the
    cache when their identity is the cached one (before ``cp -al`` changes their ctime)."""
    exp = cache.parent / "exports" / commit
    if (exp / "hashes.json").is_file():
        if hashes is not None:
            hashes.prime(exp / "tree")
        return exp
    tmp = exp.parent / f".tmp-{commit}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "tree").mkdir(parents=True)
    try:
        arch = subprocess.Popen(["git", "-C", str(tree), "archive", "--format=tar", commit], stdout=subprocess.PIPE)
        tar = subprocess.run(["tar", "-x", "-C", str(tmp / "tree")], stdin=arch.stdout, capture_output=True)
        arch.stdout.close()
        if arch.wait() != 0 or tar.returncode != 0:
            raise InputError(f"{tree}: git archive {commit[:12]} failed: {tar.stderr.decode().strip()}")
        files, links = _scan(tmp / "tree", hashes=hashes)
        (tmp / "hashes.json").write_text(json.dumps({"files": files, "links": links}))
        _place(tmp, exp, "hashes.json")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return exp


def private_files(configs: dict[str, bytes], launch: dict, private: set[str] | frozenset = frozenset()) -> set[str]:
    """Release paths that hold a secret and are kept owner-only (0400 once read-only): the serve
    config of every group in ``private`` (its source file is not readable by group/others) or
    whose values include a secret (``api-key``, …), and ``launch.json`` when an env value or a
    launch command flag is secret (pure)."""
    import re

    import yaml

    from ..profile.secrets import is_secret_key, secret_strings
    out = set()
    for g, b in configs.items():
        try:
            data = yaml.safe_load(b)
        except yaml.YAMLError:
            data = None
        if g in private or secret_strings(data):
            out.add(f"configs/{g}.yaml")
    flags = [m.group(1) for s in launch.values() if isinstance(s, dict)
             for m in re.finditer(r"--([A-Za-z0-9-]+)", str(s.get("cmd", "")))]
    if secret_strings(launch) or any(is_secret_key(f) for f in flags):
        out.add("launch.json")
    return out


def make_read_only(root: Path, private: set[str] = frozenset()) -> None:
    """Drop the write bits of every regular file under ``root`` (other bits kept) and the
    group/other write bits of every folder; the paths in ``private`` become 0400. A release is
    never edited in place: not in the cache, not on a host. One ``lstat`` per entry (``scandir``)."""
    stack = [("", str(root))]
    while stack:
        rel_dir, d = stack.pop()
        dm = stat.S_IMODE(os.lstat(d).st_mode)
        if dm & 0o022:               # a umask of 002: nobody but the owner writes a release folder
            os.chmod(d, dm & ~0o022)
        with os.scandir(d) as it:
            for e in it:
                st = e.stat(follow_symlinks=False)
                rel = rel_dir + e.name
                if stat.S_ISDIR(st.st_mode):
                    stack.append((rel + "/", e.path))
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                have = st.st_mode & 0o7777
                mode = 0o400 if rel in private else have & ~0o222
                if have != mode:
                    os.chmod(e.path, mode)


def build_release(tree: Path, base_ref: str, patches: list[Path], configs: dict[str, bytes],
                  launch: dict, *, cache: Path | None = None, who: str = "",
                  series_identity: str | None = None, private: set[str] | frozenset = frozenset(),
                  environment: bytes | None = None) -> Release:
    """Build (or reuse from ``cache``) the release for these inputs; returns it, checked.

    ``configs`` {group: rendered serve config bytes}; ``launch`` {group: spec} (JSON-able);
    ``environment``: the environment lock's bytes, shipped as ``environment.lock`` (the launch
    spec's ``python_env`` names the environment's digest; InputError when a lock is given without
    one or the other way round).
    Steps: resolve the base commit; export it once (:func:`export_base`); hard-link the export
    into a new folder; break the links of the files the patches touch and ``git apply`` each
    patch in order (an InputError names the patch that does not apply); re-hash only touched
    files; write configs, launch.json, MANIFEST.json, then the id and RELEASE.json; rename the
    folder into place (a partial build is never visible). Cost after the first build of a
    base: one hard-link copy plus the patched files, then one read of the release
    (:func:`check_release`): a release shares inodes with the base export, so an edit made
    through another release would otherwise ship — except the files whose identity (device,
    inode, size, mtime_ns, ctime_ns) the cache folder's hash cache holds
    (:mod:`dsv4ctl.deploy.hashcache`; an edit changes the ctime). A build that fails the check is moved aside
    (one warning line), the export of its base is dropped and the release built once more from
    git; a reused release is checked the same way (:func:`cached_build`)."""
    from .hashcache import HashCache
    cache = trusted_cache(Path(cache or default_cache()))
    hashes = HashCache(cache)
    for attempt in range(2):
        rel, fresh = _build(tree, base_ref, patches, configs, launch, cache, who, series_identity, private,
                            environment, hashes)
        if not fresh or cached_release(cache, rel.id, hashes=hashes) is not None:
            hashes.save()
            return rel
        shutil.rmtree(cache.parent / "exports" / rel.meta["base_commit"], ignore_errors=True)
    raise InputError(f"release {rel.id} built in {cache} fails its own check twice: the cache folder is being "
                     "changed while dsv4ctl builds")


def _build(tree: Path, base_ref: str, patches: list[Path], configs: dict[str, bytes], launch: dict, cache: Path,
           who: str, series_identity: str | None, private, environment: bytes | None = None,
           hashes=None) -> tuple[Release, bool]:
    """(release, built now) of :func:`build_release` (a checked cached build is reused)."""
    from .environment import LOCK_NAME
    want = {s.get("python_env") for s in launch.values()} - {None}
    if len(want) > 1 or bool(want) != (environment is not None):
        raise InputError(f"the launch spec names environment(s) {sorted(want)}, "
                         + ("a lock is given" if environment is not None else "no lock is given"))
    have = next(iter(want), None)
    commit = resolve_base(tree, base_ref)
    pinfo = [(p.name, sha256_file(p)) for p in patches]
    chash = {g: hashlib.sha256(b).hexdigest() for g, b in configs.items()}
    key = input_key(commit, pinfo, chash, launch, series_identity)
    secret = private_files(configs, launch, private)
    done = cached_build(cache, key, hashes=hashes)
    if done is not None:
        return done, False
    cache.mkdir(parents=True, exist_ok=True)
    exp = export_base(tree, commit, cache, hashes)
    tmp = cache / f".build-{key}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        r = subprocess.run(["cp", "-al", str(exp / "tree"), str(tmp / "tree")], capture_output=True, text=True)
        if r.returncode != 0:
            raise InputError(f"{tmp}: cannot hard-link the base export: {r.stderr.strip()}")
        base = json.loads((exp / "hashes.json").read_text())
        files, links = dict(base["files"]), dict(base.get("links", {}))
        touched: set[str] = set()
        env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tmp))
        from ..patches.ops import read_patch_text
        for p in patches:
            paths = patch_paths(read_patch_text(p))
            for rel in paths:
                f = tmp / "tree" / rel
                if f.is_file() and not f.is_symlink():
                    data = f.read_bytes()
                    mode = f.stat().st_mode | 0o200    # writable while the patches apply
                    f.unlink()
                    f.write_bytes(data)
                    os.chmod(f, mode)
            touched |= paths
            r = subprocess.run(["git", "apply", "--whitespace=nowarn", str(Path(p).resolve())],
                               cwd=tmp / "tree", env=env, capture_output=True, text=True)
            if r.returncode != 0:
                msg = (r.stderr.strip().splitlines() or ["does not apply"])[0]
                raise InputError(f"{p}: patch does not apply to {base_ref} ({commit[:12]}): {msg}")
        tf, tl = _scan(tmp / "tree", sorted(touched), hashes)
        for rel in touched:
            files.pop(rel, None)
            links.pop(rel, None)
        files.update(tf)
        links.update(tl)
        files = {"tree/" + k: v for k, v in files.items()}
        links = {"tree/" + k: v for k, v in links.items()}
        (tmp / "configs").mkdir()
        for g, b in configs.items():        # a secret-holding file is created owner-only, never 0644
            _write_new(tmp / "configs" / f"{g}.yaml", b, f"configs/{g}.yaml" in secret)
        _write_new(tmp / "launch.json", (json.dumps(launch, indent=2, sort_keys=True) + "\n").encode(),
                   "launch.json" in secret)
        extra = []
        if environment is not None:
            _write_new(tmp / LOCK_NAME, environment, False)
            extra.append(LOCK_NAME)
        xf, _ = _scan(tmp, ["launch.json"] + extra + [f"configs/{g}.yaml" for g in configs], hashes)
        files.update(xf)
        meta = {"schema": RELEASE_SCHEMA, "base_ref": base_ref, "base_commit": commit,
                "patches": [{"name": n, "sha256": h} for n, h in pinfo], "series_identity": series_identity,
                "configs": {g: chash[g] for g in sorted(chash)}, "groups": sorted(launch),
                **({"environment": have} if have else {}),
                "built_at": now_iso(), "built_by": who,
                "files": len(files), "bytes": sum(v[1] for v in files.values())}
        rid = _seal(tmp, cache, files, links, meta, secret)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _index(cache, key, rid)
    return load_release(cache / rid), True


def _seal(tmp: Path, cache: Path, files: dict, links: dict, meta: dict, secret) -> str:
    """Write MANIFEST.json, then the id (:func:`release_id` over ``meta`` and the manifest's
    sha256) and RELEASE.json into the staged release ``tmp`` (content mtimes: same size is not
    same file), make it read-only and move it into place as ``cache/<id>``. Returns the id."""
    mbytes = json.dumps({"files": files, "links": links}, sort_keys=True).encode()
    (tmp / "MANIFEST.json").write_bytes(mbytes)
    meta["id"] = rid = release_id(meta, hashlib.sha256(mbytes).hexdigest())
    meta = {"schema": meta.pop("schema"), "id": meta.pop("id"), **meta}
    (tmp / "RELEASE.json").write_text(json.dumps(meta, indent=2) + "\n")
    for extra in ("MANIFEST.json", "RELEASE.json"):
        m = content_mtime(sha256_file(tmp / extra))
        os.utime(tmp / extra, (m, m))
    make_read_only(tmp, secret)
    _place(tmp, cache / rid, "RELEASE.json")
    return rid


# -- what a release is built from: the Deployment's tree, series, serve configs, launch spec --

def launch_spec(profile) -> dict:
    """{group: {role, host, port, cmd (template), env, model, router_args}} written to the
    release's ``launch.json`` (the Deployment's ports, served models and launch templates; the
    router gets ``--pd-disaggregation --prefill URL BOOTSTRAP --decode URL`` (repeated) or one
    ``--worker-urls URL...``, a URL per server of the group (replicas each; a multi-node server at its node 0, the only node
    that serves HTTP), ops reference §1.1, §3.4; BOOTSTRAP is the prefill serve config's
    ``disaggregation-bootstrap-port`` or SGLang's default 8998, never ``none``, which makes the
    gateway send ``bootstrap_port: null``; then ``--prometheus-host H --prometheus-port P`` from the
    router group, so two routers on one host do not both take the gateway's default 29000).

    A server group over several nodes or with replicas also has ``servers`` (host names per
    server, in node-rank order) and, with several nodes, ``dist_init_port`` (node 0's
    ``--dist-init-addr`` port): :func:`dsv4ctl.deploy.site.node_of` reads them. A one-host group
    has neither, so its launch spec (and release id) is what it was before multi-node servers.
    ``profile``: a Deployment (a Profile is resolved first). Derived once per Deployment
    (:meth:`dsv4ctl.profile.deployment.Deployment.once`); each call returns its own copy."""
    import copy
    dep = as_deployment(profile)
    return copy.deepcopy(dep.once("launch_spec", lambda: _launch_spec(dep)))


def _launch_spec(dep) -> dict:
    """:func:`launch_spec`, derived."""
    digest = environment_digest(dep)
    spec = {}
    for g in dep.groups.values():
        s = {"role": g.role, "host": g.group.host, "port": g.port, "cmd": g.launch_template, "env": g.env,
             "model": g.served_model}
        if digest is not None:
            s["python_env"] = digest
        if dep.sglang.image is not None:      # the group runs in a container of the release's image
            s["container"] = container_spec(dep, g)
        if g.is_server and (g.group.nnodes > 1 or g.group.replicas > 1):
            s["servers"] = [[n.host for n in srv] for srv in g.group.servers]
            if g.group.nnodes > 1:
                s["dist_init_port"] = g.dist_init_port
        if g.role == "router":
            words = []
            if g.group.prefill or g.group.decode:
                words.append("--pd-disaggregation")
                for n in g.group.prefill:
                    for _, url in dep.groups[n].replica_urls:
                        words += ["--prefill", url, str(dep.groups[n].bootstrap_port_effective)]
                for n in g.group.decode:
                    words += [w for _, url in dep.groups[n].replica_urls for w in ("--decode", url)]
            urls = [url for n in g.group.workers for _, url in dep.groups[n].replica_urls]
            if urls:     # nargs="*" without append: a second --worker-urls would replace the first
                words += ["--worker-urls", *urls]
            words += ["--prometheus-host", g.prometheus_host, "--prometheus-port", str(g.prometheus_port)]
            s["router_args"] = words
            s["model"] = next((spec[n]["model"] for n in g.group.decode + g.group.workers if n in spec), "default")
        spec[g.name] = s
    return spec


def container_spec(dep, g) -> dict | None:
    """The ``container`` entry of group ``g``'s launch spec (None without ``sglang.image``): the
    base as written, the interpreter in the image, ``--shm-size``, the read-only mounts (the
    profile's, and the serve config's ``model-path`` when it is a host folder) and, with
    ``gpus: cdi``, per host the CDI devices of the GPUs the group places there. Part of
    ``launch.json``, so of the release id: a rollback runs an image the way it was released."""
    img = dep.sglang.image
    if img is None:
        return None
    mounts = list(img.mounts)
    if g.is_server and g.serve_config_path is not None:
        mp = g.serve.data.get("model-path")
        if isinstance(mp, str) and mp.startswith("/") and mp not in mounts:
            mounts.append(mp)
    devices = {}
    if img.gpus == "cdi" and g.is_server:
        for srv in g.group.servers:
            for n in srv:
                devices[n.host] = [f"nvidia.com/gpu={i}" for i in n.gpus]
    return {"base": img.base, "python": img.python, "shm_size": img.shm_size, "mounts": mounts, "devices": devices}


def release_environment(profile) -> bytes | None:
    """The bytes of the profile's environment lock (``sglang.environment.lock``), None without
    one; read once per Deployment (:meth:`dsv4ctl.profile.deployment.Deployment.once`: the
    preflight, the launch spec and the build ask it). InputError (exit 2) when it cannot be read,
    is no regular file or larger than 8 MiB (:func:`dsv4ctl.deploy.environment.read_lock_file`) or
    is not a lock of exact pins with hashes (:func:`dsv4ctl.deploy.environment.parse_lock`)."""
    dep = as_deployment(profile)
    return dep.once("environment", lambda: _read_environment(dep))


def environment_digest(profile) -> str | None:
    """The digest of the profile's environment (:func:`dsv4ctl.deploy.environment.env_digest`
    of the lock's bytes and the interpreter that makes it: ``sglang.image.python`` in a release
    image, else ``deploy.python``): the ``python_env`` of every group's launch spec, the folder
    ``ENVS/<digest>`` on the hosts. None without a lock; computed once per Deployment."""
    dep = as_deployment(profile)

    def make():
        from .environment import env_digest
        data = release_environment(dep)
        if data is None:
            return None
        return env_digest(data, dep.sglang.image.python if dep.sglang.image else dep.deploy.python)
    return dep.once("environment_digest", make)


def _read_environment(dep) -> bytes | None:
    """:func:`release_environment`, read from the lock file."""
    from .environment import decode_lock, parse_lock, read_lock_file
    env = dep.sglang.environment
    if env is None:
        return None
    data = read_lock_file(env.lock, f"{env.lock}: sglang.environment.lock")
    parse_lock(decode_lock(data, str(env.lock)), str(env.lock))
    return data


def release_inputs(profile, tree: str | None, base_ref: str | None, patches: list[str] | None):
    """(tree, base_ref, patch paths, {group: serve config bytes}, launch spec, series identity)
    from the Deployment and CLI overrides. A series folder with a ``series`` file is read with
    :func:`dsv4ctl.patches.ops.load_series` (validated; its identity goes into the release id);
    an unset ``sglang.series`` ships no patches. InputError for missing pieces."""
    dep = as_deployment(profile)
    tree_p = dep.tree(tree, required=True)
    base_ref = base_ref or dep.sglang.base_ref or "HEAD"
    pl, ident = series_patches(dep.sglang.series if not patches else None, [Path(p) for p in patches] if patches else None,
                               dep=dep)
    configs = {g.name: g.serve.raw for g in dep.servers() if g.serve_config_path is not None}
    return tree_p, base_ref, pl, configs, launch_spec(dep), ident




def private_groups(profile) -> set[str]:
    """Server groups whose serve config file is readable by its owner only (mode & 077 == 0):
    their copy in a release stays private (:func:`private_files`)."""
    dep = as_deployment(profile)
    out = set()
    for g in dep.servers():
        try:
            if g.serve_config_path is not None and not os.stat(g.serve_config_path).st_mode & 0o077:
                out.add(g.name)
        except OSError:
            pass
    return out


def derive_release(base: Release, configs: dict[str, bytes], *, cache: Path | None = None, who: str = "",
                   change: str = "", private: set[str] | frozenset = frozenset()) -> Release:
    """The release ``base`` with some serve configs replaced (``configs`` {group: new bytes}):
    the same tree, patches and launch spec, so its id is exactly the one a deploy of a profile
    with these serve configs gives (:func:`release_id`). Built in the cache as a hard-link copy
    of ``base`` whose changed configs are new files (``base`` is never written), placed by
    rename; reused when it exists. ``change`` is recorded in RELEASE.json (``derived_from``)."""
    cache = trusted_cache(Path(cache or default_cache()))
    launch = json.loads((base.path / "launch.json").read_text())
    m = base.meta
    old_cfg = {g: (base.path / "configs" / f"{g}.yaml").read_bytes() for g in m.get("configs", {})}
    unknown = sorted(set(configs) - set(old_cfg))
    if unknown:
        raise InputError(f"release {base.id} has no serve config for group(s) {', '.join(unknown)}")
    new_cfg = {**old_cfg, **configs}
    chash = {g: hashlib.sha256(b).hexdigest() for g, b in new_cfg.items()}
    pinfo = [(p["name"], p["sha256"]) for p in m.get("patches", [])]
    key = input_key(m["base_commit"], pinfo, chash, launch, m.get("series_identity"))
    secret = private_files(new_cfg, launch, set(private) | {g for g in old_cfg if not
                                                            (base.path / "configs" / f"{g}.yaml").stat().st_mode & 0o077})
    done = cached_build(cache, key)
    if done is not None:
        return done
    tmp = cache / f".build-{key}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        r = subprocess.run(["cp", "-al", str(base.path), str(tmp)], capture_output=True, text=True)
        if r.returncode != 0:
            raise InputError(f"{tmp}: cannot hard-link release {base.id}: {r.stderr.strip()}")
        for x in ("MANIFEST.json", "RELEASE.json"):
            (tmp / x).unlink()
        for g, b in configs.items():
            f = tmp / "configs" / f"{g}.yaml"
            f.unlink()                       # a new inode: the base release keeps its own
            _write_new(f, b, f"configs/{g}.yaml" in secret)
        files = dict(base.files)
        xf, _ = _scan(tmp, [f"configs/{g}.yaml" for g in configs])
        files.update(xf)
        meta = {**m, "schema": RELEASE_SCHEMA, "configs": {g: chash[g] for g in sorted(chash)},
                "built_at": now_iso(), "built_by": who, "files": len(files),
                "bytes": sum(v[1] for v in files.values()), "derived_from": base.id, "change": change}
        meta.pop("id", None)
        rid = _seal(tmp, cache, files, base.links, meta, secret)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _index(cache, key, rid)
    return load_release(cache / rid)
