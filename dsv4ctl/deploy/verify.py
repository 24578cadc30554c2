"""The manifest check run on each host (``python3 -c SCRIPT``).

argv: the release folder, then verified releases it was hard-linked from (``--link-dest``).
A file that is the same inode as the same path in a link-dest release whose manifest has the
same sha256 is trusted (that release was verified and releases are immutable); every other
file is hashed. Prints one JSON line ``{"ok", "checked", "hashed", "bad": [...]}``; exit 1 when not ok."""

SCRIPT = r'''
import hashlib, json, os, stat, sys
rel, bases = sys.argv[1], sys.argv[2:]
man = json.load(open(os.path.join(rel, "MANIFEST.json")))
files, links = man["files"], man.get("links", {})
old = []
for b in bases:
    try:
        old.append((b, json.load(open(os.path.join(b, "MANIFEST.json")))["files"]))
    except Exception:
        pass
bad, hashed = [], 0
for p, (h, size, ex) in files.items():
    fp = os.path.join(rel, p)
    try:
        st = os.lstat(fp)
    except OSError:
        bad.append("missing " + p); continue
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        bad.append("size " + p); continue
    trusted = False
    for b, of in old:
        if of.get(p, [None])[0] != h:
            continue
        try:
            s2 = os.lstat(os.path.join(b, p))
        except OSError:
            continue
        if (s2.st_ino, s2.st_dev) == (st.st_ino, st.st_dev):
            trusted = True; break
    if not trusted:
        d = hashlib.sha256()
        with open(fp, "rb") as f:
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
seen = set()
for dp, dn, fn in os.walk(rel):
    for n in fn:
        seen.add(os.path.relpath(os.path.join(dp, n), rel))
extra = sorted(seen - set(files) - set(links) - {"MANIFEST.json", "RELEASE.json"})
bad += ["extra " + p for p in extra[:5]]
if not os.path.isfile(os.path.join(rel, "RELEASE.json")):
    bad.append("missing RELEASE.json")
print(json.dumps({"ok": not bad, "checked": len(files), "hashed": hashed, "bad": bad[:10], "nbad": len(bad)}))
sys.exit(1 if bad else 0)
'''
