"""The manifest check run on each host (``python3 -S -c SCRIPT``; standard library only).

argv: the release folder, a side folder to merge first (``-`` for none), then verified releases
it was hard-linked from (``--link-dest``), nearest first.

1. **Merge** (delta push): every file and symlink of the side folder is renamed into the release
   folder at the same path (``rename(2)`` replaces the hard link there, so the release it was
   linked from is never modified), then the side folder is removed.
2. **Verify**: a file that is the same inode as the same path in a link-dest release whose
   manifest has the same sha256 is trusted (that release was verified when it was pushed, and
   releases are immutable); every other file is hashed. Inode numbers come from ``readdir``
   (``os.scandir``: no ``stat`` per file); a mismatch falls back to ``lstat`` before hashing, so
   a filesystem whose ``readdir`` inodes differ from ``stat`` is slower, never wrong. A link-dest
   manifest is read only when a file is not trusted by the ones before it. Extra files, missing
   files, wrong sizes, wrong symlink targets and a missing RELEASE.json are problems.

Prints one JSON line ``{"ok", "checked", "hashed", "merged", "bad": [...], "nbad"}``; exit 1
when not ok."""

SCRIPT = r'''
import hashlib, json, os, shutil, stat, sys
rel, side, bases = sys.argv[1], sys.argv[2], sys.argv[3:]
def tree(root):
    """{relative path: DirEntry} of every non-directory entry under root (no stat calls)."""
    out, stack = {}, [""]
    while stack:
        d = stack.pop()
        with os.scandir(os.path.join(root, d) if d else root) as it:
            for e in it:
                p = d + "/" + e.name if d else e.name
                if e.is_dir(follow_symlinks=False):
                    stack.append(p)
                else:
                    out[p] = e
    return out
merged = 0
if side != "-":
    for p, e in sorted(tree(side).items()):
        dst = os.path.join(rel, p)
        if os.path.isdir(dst) and not os.path.islink(dst):
            shutil.rmtree(dst)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.replace(e.path, dst)
        merged += 1
    shutil.rmtree(side)
man = json.load(open(os.path.join(rel, "MANIFEST.json")))
files, links = man["files"], man.get("links", {})
have = tree(rel)
dev = os.stat(rel).st_dev
loaded = []          # [(manifest files, tree)] of the link-dest releases read so far
def base(i):
    while len(loaded) <= i:
        b = bases[len(loaded)]
        try:
            if os.stat(b).st_dev != dev:
                raise OSError("other filesystem")
            loaded.append((json.load(open(os.path.join(b, "MANIFEST.json")))["files"], tree(b)))
        except Exception:
            loaded.append(({}, {}))
    return loaded[i]
def same_inode(e, o):
    if e.inode() == o.inode():
        return True
    try:
        a, b = os.lstat(e.path), os.lstat(o.path)
    except OSError:
        return False
    return (a.st_ino, a.st_dev) == (b.st_ino, b.st_dev)
bad, hashed = [], 0
for p, (h, size, ex) in files.items():
    e = have.get(p)
    if e is None:
        bad.append("missing " + p); continue
    trusted = False
    for i in range(len(bases)):
        of, ot = base(i)
        o = ot.get(p)
        if o is not None and of.get(p, [None])[0] == h and same_inode(e, o):
            trusted = True; break
    if trusted:
        continue
    st = os.lstat(e.path)
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        bad.append("size " + p); continue
    d = hashlib.sha256()
    with open(e.path, "rb") as f:
        for c in iter(lambda: f.read(1 << 20), b""):
            d.update(c)
    hashed += 1
    if d.hexdigest() != h:
        bad.append("hash " + p)
for p, target in links.items():
    try:
        if os.readlink(os.path.join(rel, p)) != target:
            bad.append("link " + p)
    except OSError:
        bad.append("link " + p)
extra = sorted(set(have) - set(files) - set(links) - {"MANIFEST.json", "RELEASE.json"})
bad += ["extra " + p for p in extra[:5]]
if "RELEASE.json" not in have:
    bad.append("missing RELEASE.json")
print(json.dumps({"ok": not bad, "checked": len(files), "hashed": hashed, "merged": merged,
                  "bad": bad[:10], "nbad": len(bad) + max(0, len(extra) - 5)}))
sys.exit(1 if bad else 0)
'''
