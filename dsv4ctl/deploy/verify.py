"""The on-host half of a push: stage, merge, verify and place a release (``python3 -S -c
SCRIPT``, standard library only). One JSON document on stdin says what to do:

``{"rel": INCOMING, "side": SIDE|null, "bases": [RELEASE, ...], "stage": {"from": RELEASE,
"gone": [PATH, ...]}|null, "wait": {"marker": PATH, "timeout": S}|null, "place": {"final":
RELEASE, "state": STATE_JSON, "doc": TEXT}|null}``

1. **Stage** (delta push): ``cp -al`` the previous release into ``rel`` and remove the paths
   the new release drops. The engine runs this *while* rsync sends the changes into ``side``,
   and the script also reads the trees and the link-dest manifest it will need, then
2. **waits** for ``marker + ".done"`` (rsync finished) — or ``.fail``, ``rel`` vanishing
   (a cleanup), its own stdout closing (the SSH session is gone) or the timeout, which abort
   (exit 3) and remove the staged folders — hashing the staged files meanwhile. Folders left
   empty by the dropped paths are removed, as a full push would not have them.
3. **Merge** ``side``: every file and symlink is renamed into ``rel`` at the same path
   (``rename(2)`` replaces the hard link there, so the release it was linked from is never
   modified), then ``side`` is removed.
4. **Verify** against ``rel/MANIFEST.json``: every file's content hash is checked — a file
   hard-linked from another release is not trusted for its inode, because an in-place edit of
   that inode (``vi``, ``sed -i`` keeps it for some editors, ``>`` and ``dd conv=notrunc``
   always do) changes every release that holds it without changing size or inode. Each inode
   is read once per run; with the job's ``"cache"`` (the host's hash cache file,
   :data:`CACHE_NAME`) not at all when its identity (device, inode, size,
   mtime_ns, ctime_ns) is the cached one — an edit, chmod, link or ``touch`` changes the
   ctime, so the inode is read again. The files of the release a delta starts from are looked
   up before ``cp -al`` (whose new link changes their ctime) and kept while size and mtime stay.
   The cache is read only when it is a regular file of this user that nobody else can write, in
   a folder of this user that nobody else can write (``"cache": "refused: ..."`` otherwise:
   every file is read); it is rewritten atomically (0600 temp file, rename: a link there
   is replaced, never followed; a torn file after a crash reads as no cache) with every inode
   used this run under the identity it was last seen with (a change since then is a new ctime:
   read next time), and the older entries whose file still has their identity. Extra, missing,
   resized or rewritten files, wrong symlink targets, set-uid/gid or sticky bits and an exec
   bit other than the manifest's (``mode PATH``), and a
   missing RELEASE.json are problems. Then every file loses its write bits (other bits kept, so
   a 0600 file becomes 0400) and every folder its group/other write bits: nothing edits a file
   inside a release. (Verify-only: a folder others can write is ``mode DIR/``.)
5. **Place**: rename ``rel`` to ``final`` (a complete release under its final name, or
   nothing; a leftover folder already there, which the host's facts did not count as a
   release, is replaced) and replace ``state`` atomically with ``doc`` (a 0600 temp file,
   fsync, the old file's mode, rename; the temp file removed on failure).

Prints one JSON line ``{"ok", "checked", "hashed", "merged", "bad": [...], "nbad", "placed"}``
(plus ``"aborted"`` or ``"error"``; with a cache ``"cache"`` (used, absent or refused: why),
``"read"`` (inodes read) and ``"cached"`` (inodes the cache gave)); exit 0 placed, 1
verification failed, 3 aborted, 2 error.

**Verify only** (``{"verify": [RELEASE, ...]}``): check each release folder as in 4., change
nothing, print ``{"ok", "hashed", "releases": {RELEASE: {"bad", "nbad", "checked", "seal"}}}``
(a placed release's write bits are a ``mode`` problem too; ``seal``: the MANIFEST.json sha256,
RELEASE.json's id fields and the folder's real name, which the control machine binds to the
release id with :func:`dsv4ctl.deploy.release.seal_problems` — the one copy of the id rule);
exit 0 all intact, 1 drift. This is what runs before every switch (deploy, rollback, an "already
active" deploy; with the cache) and what ``dsv4ctl verify`` runs (``"full": true``: every file
read, the cache only written — what a forged mtime *and* ctime hides from the cache, it
catches)."""

#: The host's hash cache, in the releases folder: the document of :mod:`dsv4ctl.deploy.hashrules`
#: (whose text the script carries), 0600, replaced atomically; a link, a file that is not regular,
#: another user's, or in a folder others can write is refused.
CACHE_NAME = ".verify-cache.json"


def cache_path(release_path: str) -> str:
    """The hash cache of the releases folder holding ``release_path`` (``ROOT/releases/ID``)."""
    return release_path.rstrip("/").rsplit("/", 1)[0] + "/" + CACHE_NAME


def _host_rules() -> str:
    """The text of :mod:`dsv4ctl.deploy.hashrules`, the hash cache's rules, which the script
    carries (one copy of them for the control machine's cache and the host's)."""
    from pathlib import Path
    return Path(__file__).with_name("hashrules.py").read_text(encoding="utf-8")


SCRIPT = _host_rules() + r'''
import hashlib, json, os, shutil, stat, subprocess, sys, tempfile, time
out = {"ok": False, "checked": 0, "hashed": 0, "merged": 0, "bad": [], "nbad": 0, "placed": False}
def done(code, **kw):
    out.update(kw)
    try:
        print(json.dumps(out), flush=True)
    except OSError:                 # nobody reads any more (the session is gone)
        sys.stdout = open(os.devnull, "w")
    sys.exit(code)
def tree(root):
    """{relative path: [inode, absolute path]} of every non-directory under root (readdir only)."""
    res, stack = {}, [""]
    while stack:
        d = stack.pop()
        with os.scandir(os.path.join(root, d) if d else root) as it:
            for e in it:
                p = d + "/" + e.name if d else e.name
                if e.is_dir(follow_symlinks=False):
                    stack.append(p)
                else:
                    res[p] = [e.inode(), e.path]
    return res
HASHES = {}          # (st_dev, st_ino) -> [sha256, size, mtime_ns, path, from the cache, ctime_ns seen]
MAN = {}
SEAL = {}            # release folder -> {"manifest_sha256", "meta", "name"} (the id binding, checked by the caller)
USED = set()         # inodes a verification needed ("hashed": their number; "cached": those the cache gave)
CACHE = None         # the job's "cache": the hash cache file (None: every file's content is read)
CACHED = {}          # "dev:ino" -> [size, mtime_ns, ctime_ns, sha256, path] from the cache file
FULL = False         # the job's "full": every file read, the cache only written
PRIMED = set()       # inodes prime() took from the cache that no check has looked at since
def cached(s):
    """The cache's sha256 of the file whose lstat is s when its identity is exactly the cached one."""
    return cached_sha256(CACHED, s)
def digest(path, s, count=True):
    """sha256 of the regular file path (s: its lstat). An inode is read once per run while its
    size and mtime stay; from the cache when its identity (device, inode, size, mtime_ns,
    ctime_ns) is exactly the cached one (any write, chmod, link or utime changes ctime)."""
    k = (s.st_dev, s.st_ino)
    PRIMED.discard(k)
    h = HASHES.get(k)
    if h is None or h[1:3] != [s.st_size, s.st_mtime_ns]:
        c = None if FULL else cached(s)
        if c is not None:
            h = HASHES[k] = [c, s.st_size, s.st_mtime_ns, path, True, s.st_ctime_ns]
        else:
            sha, fs = file_sha256(path)         # fs: the identity the content read belongs to
            h = HASHES[k] = [sha, fs.st_size, fs.st_mtime_ns, path, False, fs.st_ctime_ns]
            out["read"] = out.get("read", 0) + 1
    else:
        h[3], h[5] = path, s.st_ctime_ns      # where and as what it was last seen
    if count and k not in USED:
        if h[4]:
            out["cached"] = out.get("cached", 0) + 1
        USED.add(k)
        out["hashed"] = len(USED)
    return h[0]
def load_cache(path):
    """CACHED from the cache file: refused (out["cache"] says why; every file is read) when it
    or its folder is a link, not a regular file / folder, another user's or writable by others."""
    global CACHE, CACHED
    CACHE = path
    try:
        if not folder_trusted(os.path.dirname(path)):
            CACHE = None
            out["cache"] = "refused: folder not the deploy user's or writable by others"
            return
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        out["cache"] = "absent" if e.errno == 2 else "refused: %s" % (os.strerror(e.errno) if e.errno else e)
        return
    with os.fdopen(fd, "rb") as f:
        CACHED, why = read_entries(f)                   # entries are checked when used (cached())
    out["cache"] = why or "used"
def prime(root):
    """Seed this run's hashes from the cache for every file under root (before cp -al links
    them, which changes their ctime: size and mtime still have to match when they are used)."""
    if not CACHED or FULL:
        return
    for p, (ino, full) in tree(root).items():
        try:
            s = os.lstat(full)
            c = cached(s) if stat.S_ISREG(s.st_mode) else None
            if c is not None:
                HASHES[(s.st_dev, s.st_ino)] = [c, s.st_size, s.st_mtime_ns, full, True, s.st_ctime_ns]
                PRIMED.add((s.st_dev, s.st_ino))
        except OSError:
            pass
def save_cache(moved=None):
    """Write the cache atomically (0600 temp file in its folder, rename: a link there is
    replaced, never followed; a torn file after a crash reads as no cache): every inode used
    this run under the identity it was last seen with (a file changed since has another ctime:
    it is read next time), plus the older entries whose file is still there with the same
    identity. moved: (old folder, new folder) of a renamed release."""
    if CACHE is None:
        return
    ent = {}
    pre = moved[0] + "/" if moved else None
    for (dev, ino), (sha, size, mtime, path, _c, ctime) in HASHES.items():
        if pre and path.startswith(pre):
            path = moved[1] + path[len(moved[0]):]
        if (dev, ino) in PRIMED:        # a base file the new release dropped or replaced: its link
            try:                        # count (so its ctime) changed; still what was hashed?
                s = os.lstat(path)
            except OSError:
                continue
            if (s.st_dev, s.st_ino) != (dev, ino) or [s.st_size, s.st_mtime_ns] != [size, mtime]:
                continue
            ctime = s.st_ctime_ns
        ent["%d:%d" % (dev, ino)] = [size, mtime, ctime, sha, path]
    for k, v in CACHED.items():
        if k not in ent and valid_entry(v) and still_there(k, v[4], cached) is not None:
            ent[k] = v
    write_entries(os.path.dirname(CACHE), os.path.basename(CACHE), ent)
def check(rel, have=None, placed=True):
    """([problem, ...], extra files not listed) of the release folder rel against its MANIFEST.json.
    Every file's content is hashed (an in-place edit of an inode shared by hard link with
    another release keeps size and inode: only the content tells); an inode is hashed once.
    Modes: set-uid/gid or sticky bits, an exec bit other than the manifest's, and (placed
    releases) write bits are problems. SEAL[rel] gets the MANIFEST.json sha256 and the id
    fields of RELEASE.json, which the control machine binds to the release id."""
    if have is None:
        have = tree(rel)
    try:
        with open(os.path.join(rel, "MANIFEST.json"), "rb") as f:
            mb = f.read()
        man = MAN[rel] = json.loads(mb)
        files, links = man["files"], man.get("links", {})
    except (OSError, ValueError, KeyError, TypeError) as e:
        MAN[rel] = {"files": {}}
        return ["manifest MANIFEST.json (%s)" % type(e).__name__], 0
    try:
        with open(os.path.join(rel, "RELEASE.json")) as f:
            meta = json.load(f)
        meta = {k: meta.get(k) for k in ("schema", "id", "base_commit", "patches", "series_identity", "configs")}
    except (OSError, ValueError, AttributeError):
        meta = None
    SEAL[rel] = {"manifest_sha256": hashlib.sha256(mb).hexdigest(), "meta": meta,
                 "name": os.path.basename(os.path.realpath(rel))}
    bad = []
    for p, (h, size, ex) in sorted(files.items()):
        e = have.get(p)
        if e is None:
            bad.append("missing " + p); continue
        s = os.lstat(e[1])
        if not stat.S_ISREG(s.st_mode) or s.st_size != size:
            bad.append("size " + p); continue
        if digest(e[1], s) != h:
            bad.append("hash " + p)
        elif s.st_mode & (0o7000 | (0o222 if placed else 0)) or bool(s.st_mode & 0o111) != bool(ex):
            bad.append("mode " + p)
    for p, target in sorted(links.items()):
        try:
            if os.readlink(os.path.join(rel, p)) != target:
                bad.append("link " + p)
        except OSError:
            bad.append("link " + p)
    if placed:        # a folder others can write lets them swap a file after any verify
        for d, _dirs, _names in os.walk(rel):
            try:      # the release folder itself may be reached through a link (status: current)
                if (os.stat(d) if d == rel else os.lstat(d)).st_mode & 0o022:
                    bad.append("mode " + (os.path.relpath(d, rel) + "/" if d != rel else "./"))
            except OSError:
                pass
    extra = sorted(set(have) - set(files) - set(links) - {"MANIFEST.json", "RELEASE.json"})
    bad += ["extra " + p for p in extra[:5]]
    if "RELEASE.json" not in have:
        bad.append("missing RELEASE.json")
    return bad, max(0, len(extra) - 5)
ENV_HASH = True     # False (the job's "env_hash": status): environment files by RECORD size, not content
def envcheck(rel, image=False):
    """The environment release folder rel runs on (its launch.json names ``python_env``; a
    release image's only in the image, ``image``: its folder is the one inside the mounted image):
    {"digest", "lock" (environment.lock's text), "present" (ENV.json there), "python" (its
    interpreter resolves), "dists" {name: version} of every *.dist-info, "bad" [files whose
    content differs from their RECORD hash], "nbad"}; None for a release without one. Judged
    against the lock by the control machine (dsv4ctl.deploy.environment.env_problems)."""
    import base64, csv, glob
    try:
        with open(os.path.join(rel, "launch.json")) as f:
            spec = json.load(f)
        d = next((s.get("python_env") for s in spec.values() if isinstance(s, dict) and s.get("python_env")
                  and (image or "container" not in s)), None)
    except (OSError, ValueError, AttributeError):
        return None
    if not d:
        return None
    try:
        with open(os.path.join(rel, "environment.lock"), encoding="utf-8", errors="replace") as f:
            lock = f.read()
    except OSError:
        lock = ""
    env = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(rel))), "envs", d)
    rep = {"digest": d, "lock": lock, "present": os.path.isfile(os.path.join(env, "ENV.json")), "dists": {},
           "bad": [], "nbad": 0, "python": False, "machine": os.uname().machine, "python_version": None}
    if not rep["present"]:
        return rep
    rep["python"] = os.path.exists(os.path.join(env, "bin", "python"))
    bad = []
    cfg = {}
    try:
        with open(os.path.join(env, "pyvenv.cfg"), "rb") as f:
            raw = f.read()
        for line in raw.decode("utf-8", "replace").splitlines():
            k, sep, v = line.partition("=")
            if sep:
                cfg[k.strip()] = v.strip()
        with open(os.path.join(env, "ENV.json")) as f:
            want = json.load(f).get("pyvenv_cfg_sha256")
        if want and hashlib.sha256(raw).hexdigest() != want:
            bad.append("pyvenv.cfg")
    except (OSError, ValueError, AttributeError):
        bad.append("pyvenv.cfg")
    rep["python_version"] = cfg.get("version_info") or cfg.get("version")
    claimed = set()
    for sp in sorted(glob.glob(os.path.join(env, "lib", "python*", "site-packages"))):
        for di in sorted(os.listdir(sp)):
            if not di.endswith(".dist-info"):
                continue
            name = ver = None
            try:
                with open(os.path.join(sp, di, "METADATA"), encoding="utf-8", errors="replace") as f:
                    for line in f:
                        if not line.strip():
                            break
                        if line.startswith("Name:"):
                            name = line[5:].strip()
                        elif line.startswith("Version:"):
                            ver = line[8:].strip()
                with open(os.path.join(sp, di, "RECORD"), newline="", encoding="utf-8") as f:
                    rows = list(csv.reader(f))
            except OSError:
                bad.append(di)
                continue
            if name:
                rep["dists"][name] = ver
            for row in rows:
                if row:
                    claimed.add(os.path.normpath(os.path.join(sp, row[0])))
                if len(row) < 2 or not row[1].startswith("sha256="):
                    continue
                p = os.path.normpath(os.path.join(sp, row[0]))
                try:
                    s = os.stat(p)
                    if ENV_HASH:
                        ok = base64.urlsafe_b64encode(bytes.fromhex(digest(p, s, count=False))).rstrip(b"=").decode() \
                            == row[1][7:]
                    else:
                        ok = len(row) < 3 or not row[2].isdigit() or s.st_size == int(row[2])
                except OSError:
                    ok = False
                if not ok:
                    bad.append(os.path.relpath(p, env))
        # what no RECORD claims: a sitecustomize.py, a .pth file, a package dropped in by hand
        # (bytecode caches are written by every import: not judged)
        for d, dirs, names in os.walk(sp):
            dirs[:] = [x for x in dirs if x != "__pycache__" and not x.endswith(".dist-info")]
            for n in names:
                full = os.path.normpath(os.path.join(d, n))
                if full not in claimed and not n.endswith((".pyc", ".pyo")):
                    bad.append("unclaimed " + os.path.relpath(full, env))
    rep["nbad"], rep["bad"] = len(bad), bad[:10]
    return rep
def readonly(rel, have):
    """Drop the write bits of every file of the placed release (other bits kept: a 0600 serve
    config stays private) and group/other write bits of its folders (a umask of 002 on the
    control machine): nothing edits a file inside a release."""
    for d, _dirs, _names in os.walk(rel):
        try:
            m = stat.S_IMODE(os.lstat(d).st_mode)
            if m & 0o022:
                os.chmod(d, m & ~0o022)
        except OSError:
            pass
    for p, (ino, full) in have.items():
        try:
            s = os.lstat(full)
            if stat.S_ISREG(s.st_mode) and s.st_mode & 0o222:
                os.chmod(full, stat.S_IMODE(s.st_mode) & ~0o222)
                h = HASHES.get((s.st_dev, s.st_ino))
                if h is not None:       # the chmod's ctime: still what was hashed if size and mtime stay
                    s2 = os.lstat(full)
                    if [s2.st_size, s2.st_mtime_ns] == h[1:3]:
                        h[5] = s2.st_ctime_ns
        except OSError:
            pass
try:
    try:
        job = json.load(sys.stdin)
        FULL = bool(job.get("full"))
        if isinstance(job.get("cache"), str):
            load_cache(job["cache"])
        if "verify" in job:
            rels = job["verify"]
            ENV_HASH = bool(job.get("env_hash", True))
            if not isinstance(rels, list) or not all(isinstance(r, str) for r in rels):
                raise ValueError("verify must be a list of paths")
            res = {}
            for r in rels:
                if not os.path.isdir(r):
                    res[r] = {"bad": ["missing release folder"], "nbad": 1}
                    continue
                b, nx = check(r)
                res[r] = {"bad": b[:10], "nbad": len(b) + nx, "checked": len(MAN[r]["files"])}
                if r in SEAL:
                    res[r]["seal"] = SEAL[r]
                ev = envcheck(r, bool(job.get("image")))
                if ev is not None:
                    res[r]["env"] = ev
            save_cache()
            done(0 if all(not v["nbad"] for v in res.values()) else 1,
                 ok=all(not v["nbad"] for v in res.values()), releases=res)
        rel, side, bases = job["rel"], job.get("side"), job.get("bases") or []
        if not isinstance(rel, str) or not (side is None or isinstance(side, str)) or \
                not all(isinstance(b, str) for b in bases):
            raise ValueError("rel, side and bases must be paths")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        done(2, error="bad job: %s" % e)
    st = job.get("stage")
    if st:
        shutil.rmtree(rel, ignore_errors=True)
        prime(st["from"])
        r = subprocess.run(["cp", "-al", st["from"], rel], capture_output=True, text=True)
        if r.returncode:
            done(2, error="cp -al: " + (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1])
        for p in st["gone"]:
            try:
                os.unlink(os.path.join(rel, p))
            except FileNotFoundError:
                pass
            d = os.path.dirname(p)          # folders the new release no longer has (as a full push)
            while d:
                try:
                    os.rmdir(os.path.join(rel, d))
                except OSError:
                    break
                d = os.path.dirname(d)
    try:
        have = tree(rel)
    except FileNotFoundError:
        if os.path.isdir(rel):
            raise
        have = {}       # removed while listed (a clean-up of the incoming folder): the wait aborts
    pending = iter(sorted(have.items()))      # hashed while rsync still runs (each inode once)
    def prehash(n):
        for _ in range(n):
            x = next(pending, None)
            if x is None:
                return
            try:
                s_ = os.lstat(x[1][1])
                if stat.S_ISREG(s_.st_mode):
                    digest(x[1][1], s_, count=False)
            except OSError:
                pass
    w = job.get("wait")
    if w:
        deadline = time.monotonic() + float(w["timeout"])
        import select
        watch = select.poll()
        watch.register(1, select.POLLERR | select.POLLHUP)   # our SSH session closed: nobody waits for us
        while not os.path.exists(w["marker"] + ".done"):
            if (os.path.exists(w["marker"] + ".fail") or not os.path.isdir(rel) or time.monotonic() > deadline
                    or watch.poll(0)):
                shutil.rmtree(rel, ignore_errors=True)
                if side:
                    shutil.rmtree(side, ignore_errors=True)
                for m in (".fail", ".done"):
                    try:
                        os.unlink(w["marker"] + m)
                    except FileNotFoundError:
                        pass
                done(3, aborted=True)
            prehash(64)
            time.sleep(0.001)
        os.unlink(w["marker"] + ".done")
    if side:
        for p, (ino, src) in sorted(tree(side).items()):
            dst = os.path.join(rel, p)
            if os.path.isdir(dst) and not os.path.islink(dst):
                shutil.rmtree(dst)
                have = {k: v for k, v in have.items() if not k.startswith(p + "/")}
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.replace(src, dst)
            have[p] = [ino, dst]
            out["merged"] += 1
        shutil.rmtree(side)
    bad, nextra = check(rel, have, placed=False)
    out.update(checked=len(MAN[rel]["files"]), bad=bad[:10], nbad=len(bad) + nextra, ok=not bad)
    if bad:
        done(1)
    if job.get("readonly", True):
        readonly(rel, have)
    pl = job.get("place")
    if pl:
        final = pl["final"]
        if os.path.lexists(final):
            # not listed as a release (or we would not push it): a leftover without its
            # RELEASE.json + MANIFEST.json pair, e.g. from an interrupted manual rm -rf. The
            # verified copy takes its place.
            trash = "%s.trash-%d" % (final, os.getpid())
            os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.rename(rel, final)
        out["placed"] = True
        path = pl["state"]
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except FileNotFoundError:
            mode = 0o644
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".tmp.", dir=os.path.dirname(path) or ".")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(pl["doc"])
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    save_cache((rel, pl["final"]) if pl else None)
    done(0)
except SystemExit:
    raise
except BaseException as e:
    done(2, ok=False, error="%s: %s" % (type(e).__name__, e))
'''
