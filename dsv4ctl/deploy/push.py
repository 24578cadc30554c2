"""Pushing a release to a host: rsync (full, or a delta against a release the host has) or a
hard-link copy plus a tar of the changed files, then the host-side verify-and-place script
(:mod:`dsv4ctl.deploy.verify`). A host only ever holds complete, verified releases."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import secrets
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from ..errors import DsvError, InputError, RemoteError
from ..hosts.audit import now_iso
from ..remote import Transport, q, read_text, who
from .release import Release, manifest_diff
from .site import Site, link_bases, state_doc
from .states import transition
from .verify import SCRIPT as VERIFY_SCRIPT
from .verify import cache_path


def use_rsync(f) -> bool:
    """True when a push to the host of facts ``f`` uses rsync: the host has it and
    ``DSV4CTL_PUSH`` is not ``copy`` (one rule for the run and its listing)."""
    return f.rsync and os.environ.get("DSV4CTL_PUSH", "rsync") != "copy"


_RSYNC_PROCS: set = set()
_RSYNC_LOCK = threading.Lock()


def parse_rsync_stats(text: str) -> dict:
    """{bytes_sent, bytes_received, files_transferred, total_size} from ``rsync --stats`` (pure)."""
    def num(label):
        m = re.search(rf"^{label}: ([\d,.]+)", text, re.M)
        return int(m.group(1).replace(",", "").replace(".", "")) if m else 0
    return {"bytes_sent": num("Total bytes sent"), "bytes_received": num("Total bytes received"),
            "files_transferred": num(r"Number of regular files transferred"),
            "total_size": num("Total file size")}


class DriftedBase(RemoteError):
    """A delta push failed verification on a file hard-linked from its base release: that release
    was edited in place on the host."""


def push_host(t: Transport, site: Site, rel: Release, repair: bool = False) -> dict:
    """:func:`push_host_once`; when a delta push fails its verification because a file it
    hard-linked from the base release was edited in place there (drift), the host gets the whole
    release again — one rsync with ``--checksum`` against the same link-dest releases, so only
    files whose content matches are linked and the drifted inode is replaced by a fresh copy in
    the new release (the base keeps its drift: ``dsv4ctl verify`` reports it). Any problem of a
    delta push counts (a file missing from the base, a mode changed there): the new release was
    staged from the base. Without rsync the repair is a full tar of the release."""
    try:
        return push_host_once(t, site, rel, repair)
    except DriftedBase as e:
        if repair:
            raise
        site.opts.log(f"{e}; pushing the whole release again"
                      + (" (rsync --checksum)" if use_rsync(site.facts[t.name]) else " (tar)"))
        st = push_host_once(t, site, rel, True)
        st["repaired"] = True
        return st


def push_host_once(t: Transport, site: Site, rel: Release, repair: bool = False) -> dict:
    """Put ``rel`` into ``releases/<id>`` on one host (delta), verified. Returns push stats.

    The transfer (:func:`_push_rsync`, :func:`_push_copy`) and the host-side script of
    :mod:`dsv4ctl.deploy.verify`, which verifies the manifest, renames ``.incoming-<id>`` to
    ``<id>`` and records the push in ``state.json`` (for a delta push it runs alongside rsync).
    Leftover ``.incoming-*`` folders of other runs are removed by the first command."""
    f, p = site.facts[t.name], site.paths[t.name]
    t0 = time.monotonic()
    if rel.id in f.releases and not repair:
        return {"skipped": True, "bytes_sent": 0, "files_transferred": 0, "seconds": 0.0, "hashed": 0}
    inc = p.incoming(rel.id)
    bases = link_bases(f, rel.id)
    stale = " ".join(q(p.incoming(x)) for x in f.incoming if x != rel.id or repair)
    clean = f"rm -rf {stale} && " if stale else ""
    if repair:
        clean = f"rm -rf {q(inc)} && " + clean
    st = f.state.setdefault("releases", {})
    before = dict(st.get(rel.id, {}))
    st[rel.id] = transition(st.get(rel.id), "pushed", at=now_iso(), by=who())
    job = {"rel": inc, "side": None, "bases": [p.release(b) for b in bases], "stage": None, "wait": None,
           "place": {"final": p.release(rel.id), "state": p.state, "doc": state_doc(f).decode()},
           "cache": cache_path(p.release(rel.id))}
    if before:
        st[rel.id] = before
    else:
        st.pop(rel.id, None)
    place = f"{q(site.python[t.name])} -S -c {q(VERIFY_SCRIPT)}"
    if use_rsync(f):
        stats, r = _push_rsync(t, site, rel, inc, bases, clean, job, place, repair)
    else:
        t1 = time.monotonic()
        stats = _push_copy(t, site, rel, inc, [] if repair else bases, clean)
        t2 = time.monotonic()
        r = t.run(place, input=json.dumps(job).encode(), timeout=1800, check=False)
        stats.update(transfer_seconds=round(t2 - t1, 3), verify_seconds=round(time.monotonic() - t2, 3))
    lines = r.out.strip().splitlines()
    try:
        v = json.loads(lines[-1]) if lines else None
    except ValueError:
        v = None
    if v is not None and not v["ok"] and not v.get("error"):
        drifted = bool(bases)     # staged from a base: whatever differs may come from it
        raise (DriftedBase if drifted else RemoteError)(f"{t.name}: release {rel.id} failed manifest verification "
                          f"({v['nbad']} problem(s): {', '.join(v['bad'][:3])})"
                          + (f"; its unchanged files are hard links into {', '.join(bases[:1])}: a problem "
                             "there means that release changed on the host (dsv4ctl verify)"
                             if bases else ""))
    if r.code != 0 or v is None:
        if v is not None and v.get("error"):
            raise RemoteError(f"{t.name}: verifying/placing release {rel.id}: {v['error']}")
        raise t.fail(r, f"verifying/placing release {rel.id}")
    st[rel.id] = transition(st.get(rel.id), "pushed", at=now_iso(), by=who())
    f.releases[rel.id] = rel.meta
    stats.update(skipped=False, seconds=round(time.monotonic() - t0, 3), hashed=v["hashed"], link_dest=bases)
    return stats


def rsync_user_args() -> list[str]:
    """Extra rsync options from ``DSV4CTL_RSYNC_ARGS`` (e.g. ``--bwlimit=50m``). InputError for
    options that write in place: releases share files by hard link."""
    import shlex
    user = shlex.split(os.environ.get("DSV4CTL_RSYNC_ARGS", ""))
    unsafe = [a for a in user if a.split("=")[0] in ("--inplace", "--append", "--append-verify", "--link-dest",
                                                      "--files-from", "--delete-before")]
    if unsafe:
        raise InputError(f"DSV4CTL_RSYNC_ARGS: {unsafe[0]} is not allowed (releases share files by hard link)")
    return user


def _base_manifest(t: Transport, site: Site, rid: str) -> dict | None:
    """Files of release ``rid`` (local cache first, read once for all hosts; else the host's
    MANIFEST.json). None when neither is readable."""
    from .release import default_cache
    local = Path(site.opts.cache or default_cache()) / rid / "MANIFEST.json"
    with site.manifest_lock:
        if rid not in site.manifests and local.is_file():
            try:
                site.manifests[rid] = json.loads(local.read_text())
            except ValueError:
                pass
        if rid in site.manifests:
            return site.manifests[rid]
    try:
        txt = read_text(t, site.paths[t.name].release(rid) + "/MANIFEST.json")
        return json.loads(txt) if txt else None
    except (ValueError, DsvError):
        return None


#: A delta whose new/changed files add up to this many bytes or more goes over rsync's own
#: OpenSSH connection (bulk); smaller ones over the transport's connection (no handshake).
BULK_BYTES = 32 << 20


def _push_rsync(t: Transport, site: Site, rel: Release, inc: str, bases: list[str], clean: str,
                job: dict, place: str, repair: bool = False):
    """rsync the release to the host, then the host-side script ``place`` runs ``job``.
    Returns (rsync stats, the script's CmdResult).

    **Delta** (a previous release on the host whose manifest is known): the host-side script
    starts first and builds ``inc`` as a hard-link copy of that release (``cp -al``) minus the
    paths the new release drops, and reads what it will verify against; meanwhile rsync sends
    only the changed paths (``--files-from``) into a side folder ``inc.delta-<nonce>``, with the
    old release as ``--link-dest``, so each changed file travels as rsync's delta against its
    old version. A marker file then tells the script to merge the side folder (renames: no file
    of the old release is ever written), check the changed files and place the release. No
    whole-tree file list crosses the network.

    **Full** (nothing to start from): one rsync of the tree into ``inc`` with ``--link-dest``
    against the host's releases (unchanged files are hard-linked), then the script.

    Small deltas run over the transport's own SSH connection; a full push, or a delta of
    ``BULK_BYTES`` or more, over an OpenSSH connection of rsync's own
    (:meth:`~dsv4ctl.remote.Transport.rsync_dest`). The stats carry ``transfer_seconds`` (the
    rsync) and ``verify_seconds`` (the script after it: for a delta, the wait after the marker)."""
    p = site.paths[t.name]
    user = rsync_user_args()
    old = _base_manifest(t, site, bases[0]) if bases and not repair else None
    if old is None:
        if clean:
            t.run(clean + "true", timeout=300)
        extra, dest = t.rsync_dest(inc + "/", bulk=True)
        argv = ["rsync", "-a", "--delete", "--stats", "--info=progress2", *user, *(["--checksum"] if repair else []),
                *[f"--link-dest={p.release(b)}" for b in bases], *extra, f"{rel.path}/", dest]
        t1 = time.monotonic()
        stats = _run_rsync(t, site, rel, argv)
        t2 = time.monotonic()
        r = t.run(place, input=json.dumps(job).encode(), timeout=1800, check=False)
        stats.update(transfer_seconds=round(t2 - t1, 3), verify_seconds=round(time.monotonic() - t2, 3))
        return stats, r
    d = manifest_diff(old.get("files", {}), rel.files)
    links_changed = [k for k, v in rel.links.items() if old.get("links", {}).get(k) != v]
    gone = d["removed"] + [k for k in old.get("links", {}) if k not in rel.links or k in links_changed]
    send = d["added"] + d["changed"] + links_changed + ["MANIFEST.json", "RELEASE.json"]
    side = f"{inc}.delta-{secrets.token_hex(4)}"
    size = sum(rel.files[k][1] for k in d["added"] + d["changed"])
    job = {**job, "side": side, "stage": {"from": p.release(bases[0]), "gone": gone},
           "wait": {"marker": side, "timeout": site.opts.host_timeout or 3600}}
    with tempfile.NamedTemporaryFile(prefix="dsv4ctl-files-") as lf:
        lf.write(b"\0".join(x.encode() for x in send))
        lf.flush()
        with cf.ThreadPoolExecutor(1) as ex:
            placed = ex.submit(t.run, clean + place, input=json.dumps(job).encode(),
                               timeout=(site.opts.host_timeout or 3600) + 1800, check=False)
            try:
                extra, dest = t.rsync_dest(side + "/", bulk=size >= BULK_BYTES)
                argv = ["rsync", "-a", "--stats", "--info=progress2", "--from0", f"--files-from={lf.name}",
                        f"--link-dest={p.release(bases[0])}", *user, *extra, f"{rel.path}/", dest]
                t1 = time.monotonic()
                stats = _run_rsync(t, site, rel, argv)
                stats["transfer_seconds"] = round(time.monotonic() - t1, 3)
            except BaseException:
                try:           # tell the host-side script to give up; the rsync error is the one to report
                    t.run(f": > {q(side + '.fail')}", timeout=30)
                    placed.result()
                except Exception:
                    pass
                try:           # the script may have ended first (a cleanup removed inc): our leftovers
                    t.run(f"rm -rf {q(side)} {q(side + '.fail')} {q(side + '.done')}", timeout=60)
                except Exception:
                    pass
                raise
            t2 = time.monotonic()
            t.run(f": > {q(side + '.done')}", timeout=60)
            r = placed.result()
            stats["verify_seconds"] = round(time.monotonic() - t2, 3)
            return stats, r


def _run_rsync(t: Transport, site: Site, rel: Release, argv: list[str], key: str = "") -> dict:
    """Run one rsync of a push (``argv``), its percentages to ``site.opts.progress`` under
    ``key`` (default: the host's name; an image transfer uses ``HOST image``): its ``--stats``
    as a dict. RemoteError naming the host on a non-zero exit (a full disk named first)."""
    key = key or t.name
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    with _RSYNC_LOCK:
        _RSYNC_PROCS.add(proc)
    err_buf: list[bytes] = []
    et = threading.Thread(target=lambda: err_buf.append(proc.stderr.read()), daemon=True)
    et.start()
    out = bytearray()
    buf = b""
    try:
        while True:
            chunk = proc.stdout.read1(65536) if hasattr(proc.stdout, "read1") else proc.stdout.read(65536)
            if not chunk:
                break
            out += chunk
            buf = (buf + chunk)[-512:]
            if site.opts.progress:
                m = list(re.finditer(rb"\s(\d{1,3})%\s", buf))
                if m:
                    site.opts.progress(key, int(m[-1].group(1)), 100)
        code = proc.wait()
        et.join(5)
    finally:
        with _RSYNC_LOCK:
            _RSYNC_PROCS.discard(proc)
        if proc.poll() is None:
            proc.kill()
    if code != 0:
        err = (b"".join(err_buf)).decode("utf-8", "replace").strip().splitlines()
        msg = next((ln for ln in err if "No space left" in ln), None) or (err[0] if err else f"exit {code}")
        raise RemoteError(f"{t.name}: pushing release {rel.id} with rsync failed (exit {code}): {msg.strip()}")
    if site.opts.progress:
        site.opts.progress(key, 100, 100)
    stats = parse_rsync_stats(out.decode("utf-8", "replace"))
    stats["method"] = "rsync"
    return stats


def _push_copy(t: Transport, site: Site, rel: Release, inc: str, bases: list[str], clean: str = "") -> dict:
    """No rsync on the host: hard-link copy of the newest release, then a tar of the files that
    differ from its manifest (the others stay hard links)."""
    import io
    import tarfile
    p = site.paths[t.name]
    old_files: dict = {}
    if bases:
        txt = read_text(t, p.release(bases[0]) + "/MANIFEST.json", default="{}")
        old_files = json.loads(txt or "{}").get("files", {})
        t.run(f"{clean}rm -rf {q(inc)} && cp -al {q(p.release(bases[0]))} {q(inc)}", timeout=600)
    else:
        t.run(f"{clean}rm -rf {q(inc)} && mkdir -p {q(inc)}", timeout=60)
    d = manifest_diff(old_files, rel.files)
    drop = d["removed"] + d["changed"] + ["MANIFEST.json", "RELEASE.json"] + list(rel.links)
    if drop:
        t.run(f"cd {q(inc)} && xargs -0 rm -f", input=b"\0".join(x.encode() for x in drop), timeout=600)
    send = d["added"] + d["changed"] + ["MANIFEST.json", "RELEASE.json"] + list(rel.links)
    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w") as tf:
        for rel_path in send:
            tf.add(str(rel.path / rel_path), arcname=rel_path, recursive=False)
    data = bio.getvalue()
    t.run(f"tar -x -C {q(inc)} -f -", input=data, timeout=3600)
    return {"method": "copy", "bytes_sent": len(data), "files_transferred": len(send), "total_size": rel.bytes}


def incoming_rm(p, rid: str) -> str:
    """Shell: remove ``.incoming-<rid>`` and its ``.delta-*`` side folders."""
    return f"rm -rf {q(p.incoming(rid))} {q(p.incoming(rid))}.delta-*"


def kill_rsyncs() -> None:
    """Terminate rsync children (on interrupt)."""
    with _RSYNC_LOCK:
        for pr in list(_RSYNC_PROCS):
            try:
                pr.send_signal(signal.SIGTERM)
            except Exception:
                pass


