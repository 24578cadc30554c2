"""Drift: is a release on a host still exactly what its manifest says? A fact (one read-only
command, :data:`dsv4ctl.deploy.verify.SCRIPT` in verify-only mode, and a pure parser).

Every file is checked against its manifest hash, each inode read once per run: releases share
unchanged files by hard link, so an in-place edit of one inode changes every release that holds
it without changing its size or inode; only the content, or the inode's ctime, tells. Before
every switch (deploy, rollback, an "already active" deploy; a delta push verifies its base's
files as part of the new release) a file whose identity (device, inode, size, mtime_ns,
ctime_ns) is the one recorded in the host's hash cache (``releases/.verify-cache.json``,
:data:`dsv4ctl.deploy.verify.CACHE_NAME`, written by the push and by every verify) is not read
again: any write, chmod, link or ``touch`` changes the ctime. ``dsv4ctl verify`` reads every
file (``full``): it alone catches a file rewritten with a forged ctime (a changed clock, or raw
access to the disk)."""

from __future__ import annotations

import json

from ..errors import RemoteError
from ..remote import Transport, q
from .verify import SCRIPT, cache_path


def verify_command(python: str) -> str:
    """The host command; the job (``{"verify": [path, ...]}``) goes on its stdin."""
    return f"{q(python)} -S -c {q(SCRIPT)}"


def verify_job(paths: list[str], full: bool = False) -> bytes:
    """The verify-only job of release folders ``paths`` (one host's), using the hash cache of
    their releases folder; ``full``: every file's content is read (the cache is only written)."""
    job: dict = {"verify": list(paths)}
    if paths:
        job["cache"] = cache_path(paths[0])
    if full:
        job["full"] = True
    return json.dumps(job).encode()


def bind_seal(path: str, v: dict) -> dict:
    """The verify report ``v`` of the release folder ``path`` with the id binding checked (pure):
    :func:`dsv4ctl.deploy.release.seal_problems` of the folder's real name, RELEASE.json's id
    fields and the MANIFEST.json sha256 the script reported go first in ``bad`` (``nbad``
    counts them). A report without ``seal`` (the manifest was unreadable) is returned as is."""
    from .release import seal_problems
    seal = v.get("seal")
    if not isinstance(seal, dict):
        return v
    extra = seal_problems(seal.get("name") or path.rstrip("/").rsplit("/", 1)[-1], seal.get("meta"),
                          seal.get("manifest_sha256"))
    if extra:
        v = {**v, "bad": extra + list(v.get("bad", [])), "nbad": v.get("nbad", 0) + len(extra)}
    return v


def parse_verify(host: str, code: int, out: str, err: str = "") -> dict[str, dict]:
    """{release path: {"bad": [...], "nbad": N, "checked": N}} from the script's output (pure),
    each bound to its id (:func:`bind_seal`). RemoteError when the script did not run (no JSON
    line, or its own error)."""
    lines = out.strip().splitlines()
    try:
        v = json.loads(lines[-1]) if lines else None
    except ValueError:
        v = None
    if not isinstance(v, dict) or "releases" not in v:
        why = (v or {}).get("error") if isinstance(v, dict) else None
        raise RemoteError(f"{host}: verifying releases failed (exit {code}): "
                          + (why or (err.strip().splitlines() or ["no report"])[-1]))
    return {p: bind_report(p, r) if isinstance(r, dict) else r for p, r in v["releases"].items()}


def bind_report(path: str, v: dict) -> dict:
    """A verify report of release folder ``path`` judged whole (pure): :func:`bind_seal` (the
    id binding), then :func:`bind_env` (its environment against its lock)."""
    return bind_env(bind_seal(path, v))


def bind_env(v: dict) -> dict:
    """The verify report ``v`` with its environment judged against the release's own lock
    (pure): :func:`dsv4ctl.deploy.environment.env_problems` go after the tree's problems in
    ``bad`` (``nbad`` counts them); the report keeps ``environment`` {digest, ok, problems}. A
    report without ``env`` (a release without an environment) is returned as is."""
    from ..errors import InputError
    from .environment import env_problems, marker_env, parse_lock
    ev = v.get("env")
    if not isinstance(ev, dict):
        return v
    import re
    pyv = ".".join(re.findall(r"\d+", str(ev.get("python_version") or "3.11"))[:3]) or "3.11"
    try:                   # the lock's markers judged for the host (its CPU, the environment's Python)
        lock = parse_lock(str(ev.get("lock") or ""), "environment.lock",
                          marker_env(str(ev.get("machine") or "x86_64"), pyv))
        probs = env_problems(lock, ev)
    except InputError as e:
        probs = [f"env lock ({e})"]
    extra = max(0, int(ev.get("nbad") or 0) - len(ev.get("bad") or []))
    v = {k: x for k, x in v.items() if k != "env"}
    v["environment"] = {"digest": ev.get("digest"), "ok": not probs, "problems": probs[:10]}
    if probs:
        v = {**v, "bad": list(v.get("bad", [])) + probs, "nbad": v.get("nbad", 0) + len(probs) + extra}
    return v


def verify_releases(t: Transport, python: str, paths: list[str], timeout: float = 1800,
                    full: bool = False) -> dict[str, dict]:
    """Run the verify-only job on the host behind ``t`` (no release changes; the hash cache is
    updated); ``full``: every file's content read, as ``dsv4ctl verify`` does."""
    if not paths:
        return {}
    r = t.run(verify_command(python), input=verify_job(paths, full), timeout=timeout, check=False)
    return parse_verify(t.name, r.code, r.out, r.err)


def drift_text(res: dict) -> str:
    """``path: problem, problem (+N more)`` of each drifted release in ``res``, ``; ``-joined."""
    out = []
    for path, v in res.items():
        if v.get("nbad"):
            more = v["nbad"] - len(v["bad"][:3])
            out.append(f"{path}: " + ", ".join(v["bad"][:3]) + (f" (+{more} more)" if more > 0 else ""))
    return "; ".join(out)


def verify_fleet(profile, opts, releases: list[str] | None = None) -> dict:
    """``dsv4ctl verify``: every complete release on every host (or only ``releases``) hashed
    against its manifest, hosts in parallel, nothing changed. A ``dsv4ctl.verify/1`` document:
    per host ``{current, previous, releases: {id: {ok, problems, nbad, checked}}}`` or
    ``{error}`` (a shared root, ``deploy.slurm.shared_root``: once, at its owner, with
    ``shared_by`` the hosts that see it); ``drift``: one line per drifted release (``host: id: problem, ...``). Every
    file's content is read (no hash cache: a forged mtime and ctime is caught here)."""
    import time

    from ..hosts.layout import read_facts
    from ..remote import run_parallel
    from .site import open_site
    site = open_site(profile, opts)      # every host's releases: no group rules

    def body(t):
        p = site.paths[t.name]
        f = read_facts(t, p.root)
        ids = sorted(f.releases) if releases is None else [r for r in releases if r in f.releases]
        t0 = time.monotonic()
        res = verify_releases(t, site.python[t.name], [p.release(r) for r in ids], full=True)
        out = {r: res[p.release(r)] for r in ids}
        if site.profile.sglang.image is not None:       # release images: the release inside each image too
            out = verify_images(t, site, out)
        return f, out, time.monotonic() - t0
    try:
        out = run_parallel(site.root_transports, body, timeout=(opts.host_timeout or 3600) + opts.connect_timeout)
    finally:
        site.close()
    doc = {"schema": "dsv4ctl.verify/1", "hosts": {}, "drift": [], "unreachable": []}
    for h, r in out.items():
        if not r.ok:
            doc["hosts"][h] = {"error": r.error}
            doc["unreachable"].append(r.error)
            continue
        f, res, secs = r.value
        rels = {}
        for rid, v in res.items():
            rels[rid] = {"ok": not v.get("nbad"), "problems": v.get("bad", []), "nbad": v.get("nbad", 0),
                         "checked": v.get("checked", 0)}
            if v.get("nbad"):
                more = v["nbad"] - len(v["bad"])
                doc["drift"].append(f"{h}: {rid}" + (" (current)" if rid == f.current else "")
                                    + (" (previous)" if rid == f.previous else "") + ": "
                                    + ", ".join(v["bad"]) + (f" (+{more} more)" if more > 0 else ""))
        for b in f.broken:
            role = " (current)" if b == f.current else " (previous)" if b == f.previous else ""
            rels[b] = {"ok": False, "problems": ["missing MANIFEST.json or RELEASE.json"], "nbad": 1, "checked": 0}
            doc["drift"].append(f"{h}: {b}{role}: missing MANIFEST.json or RELEASE.json (the next deploy pushes it "
                                "again if it is the one deployed)")
        for link, target in f.foreign.items():
            doc["drift"].append(f"{h}: {f.root}/{link} -> {target}: outside {f.root}/releases "
                                "(the next deploy or rollback replaces it)")
        missing = [x for x in (releases or []) if x not in f.releases]
        for x in missing:
            rels[x] = {"ok": False, "problems": ["not on the host"], "nbad": 1, "checked": 0}
            doc["drift"].append(f"{h}: {x}: not on the host")
        doc["hosts"][h] = {"root": f.root, "current": f.current, "previous": f.previous, "releases": rels,
                           "foreign": dict(f.foreign),
                           "seconds": round(secs, 3), **({"shared_by": site.sharing(h)} if site.sharing(h) else {})}
    doc["ok"] = not doc["drift"] and not doc["unreachable"]
    return doc


def verify_images(t: Transport, site, reports: dict) -> dict:
    """``dsv4ctl verify`` on an image site: ``reports`` ({release: drift report} of the release
    folders on the host behind ``t``) with the problems of each release's image added, each
    prefixed ``image:`` (a release without an image record on the host: ``image: none
    recorded``). Releases run from folders alone keep their report."""
    from .image import expected_image, verify_image_host
    root = site.paths[t.name].root
    have = set(t.run(f"ls {q(root + '/images/ids')} 2>/dev/null || true", timeout=60).out.split())
    out = {}
    for rid, v in reports.items():
        if rid not in have:
            out[rid] = v
            continue
        try:
            r = verify_image_host(t, site, rid, expected_image(site, rid))
            res = parse_verify(t.name, r.code, r.out, r.err)
            bad = [f"image: {b}" for r in res.values() for b in r.get("bad", [])]
        except RemoteError as e:
            bad = [f"image: {str(e).split(': ', 1)[-1]}"]
        out[rid] = {**v, "bad": list(v.get("bad", [])) + bad, "nbad": v.get("nbad", 0) + len(bad)} if bad else v
    return out
