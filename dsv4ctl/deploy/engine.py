"""Deploy / rollback orchestration over :mod:`dsv4ctl.remote`.

Phases (each a list of :class:`~dsv4ctl.remote.Action` that ``--dry-run`` prints):

1. **lock** every host (``mkdir <root>/.lock``; a held lock fails fast naming the holder);
2. **push** the release to ``releases/.incoming-<id>`` (rsync ``--link-dest`` against the
   host's releases, else hard-link copy + changed files), verify the manifest on the host,
   rename to ``releases/<id>`` — a host only ever holds complete releases under that name;
3. **activate** every host: ``previous``/``current`` symlinks switched by rename(2), groups
   restarted through the service backend;
4. **gate**: every worker's ``/health``, then a 1-token chat completion through the router;
   on failure (or interrupt) every switched host goes back to its previous release;
5. **finish**: state (good/failed), prune to ``keep_releases``, audit line, unlock.

A push failure on any host stops the deploy before any host is switched, so all hosts stay on
the same (old) release."""

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import DsvError, InputError, RemoteError, VerdictError
from .release import Release, build_release, manifest_diff, release_id, series_patches, sha256_file
from ..remote import (Action, Transport, append_jsonl, append_jsonl_cmd, atomic_write, atomic_write_cmd, connect,
                      q, read_text, run_parallel, who)
from ..hosts import health
from ..hosts.audit import audit_record, now_iso
from ..hosts.layout import (HostFacts, Paths, STATE_SCHEMA, choose_rollback_target, facts_command,
                            parse_facts, read_facts, render_launch, select_prune)
from ..hosts.lock import LOCK_HELD_CODE, held_error, holder_text, parse_holder, release_cmd, take_cmd
from ..hosts.lock import holder as lock_holder
from ..profile.deployment import as_deployment, http_url
from ..hosts.service import backend, log_tail_cmd
from .verify import SCRIPT as VERIFY_SCRIPT

SERVER_ROLES = ("prefill", "decode", "colocated")


@dataclass
class Options:
    """Knobs shared by deploy / rollback / releases."""

    dry_run: bool = False
    accept_new_host_keys: bool = False
    health_timeout: float | None = None
    break_lock: bool = False
    connect_timeout: float = 10.0
    host_timeout: float | None = 3600.0
    cache: Path | None = None
    log: Callable[[str], None] = lambda s: None
    progress: Callable[[str, int, int], None] | None = None   # (host, bytes_done_pct, 100)


# -- the profile's view ------------------------------------------------------------------------

def launch_spec(profile) -> dict:
    """{group: {role, host, port, cmd (template), env, model, router_args}} written to the
    release's ``launch.json`` (the Deployment's ports, served models and launch templates; the
    router gets ``--pd-disaggregation --prefill URL BOOTSTRAP --decode URL`` or ``--worker-urls``,
    ops reference §1.1, §3.4). ``profile``: a Deployment (a Profile is resolved first)."""
    dep = as_deployment(profile)
    spec = {}
    for g in dep.groups.values():
        s = {"role": g.role, "host": g.group.host, "port": g.port, "cmd": g.launch_template, "env": g.env,
             "model": g.served_model}
        if g.role == "router":
            words = []
            if g.group.prefill or g.group.decode:
                words.append("--pd-disaggregation")
                for n in g.group.prefill:
                    boot = dep.groups[n].bootstrap_port
                    words += ["--prefill", dep.groups[n].url, str(boot if boot is not None else "none")]
                for n in g.group.decode:
                    words += ["--decode", dep.groups[n].url]
            for n in g.group.workers:
                words += ["--worker-urls", dep.groups[n].url]
            s["router_args"] = words
            s["model"] = next((spec[n]["model"] for n in g.group.decode + g.group.workers if n in spec), "default")
        spec[g.name] = s
    return spec


def release_inputs(profile, tree: str | None, base_ref: str | None, patches: list[str] | None):
    """(tree, base_ref, patch paths, {group: serve config bytes}, launch spec, series identity)
    from the Deployment and CLI overrides. A series folder with a ``series`` file is read with
    :func:`dsv4ctl.patches.ops.load_series` (validated; its identity goes into the release id);
    an unset ``sglang.series`` ships no patches. InputError for missing pieces."""
    dep = as_deployment(profile)
    tree_p = dep.tree(tree, required=True)
    base_ref = base_ref or dep.sglang.base_ref or "HEAD"
    series_p = dep.sglang.series if not patches else None
    ident = None
    if series_p is not None and (series_p / "series").is_file():
        from ..patches.ops import load_series      # the patch series with its identity
        ls = load_series(series_p)
        pl, ident = [ls.path(e) for e in ls.series.entries], ls.identity
    else:
        pl = series_patches(series_p if series_p and series_p.exists() else None,
                            [Path(p) for p in patches] if patches else None)
    configs = {g.name: g.serve.raw for g in dep.servers() if g.serve_config_path is not None}
    return tree_p, base_ref, pl, configs, launch_spec(dep), ident


# -- site: transports, paths, facts ------------------------------------------------------------

@dataclass
class Site:
    profile: object
    opts: Options
    transports: dict[str, Transport] = field(default_factory=dict)
    paths: dict[str, Paths] = field(default_factory=dict)
    python: dict[str, str] = field(default_factory=dict)
    facts: dict[str, HostFacts] = field(default_factory=dict)
    token: str = ""
    unlocked: set = field(default_factory=set)
    manifests: dict = field(default_factory=dict)           # release id -> MANIFEST.json (local cache)
    manifest_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def hosts(self) -> list[str]:
        return list(self.transports)

    def close(self):
        for t in self.transports.values():
            t.close()


def open_site(profile, opts: Options) -> Site:
    """Transports (not yet connected) and deploy roots for every host of the Deployment (a
    Profile is resolved first)."""
    dep = as_deployment(profile)
    s = Site(dep, opts)
    for name, h in dep.hosts.items():
        s.transports[name] = connect(h, accept_new_host_keys=opts.accept_new_host_keys,
                                     connect_timeout=opts.connect_timeout, hosts=dep.hosts)
        s.paths[name] = Paths(dep.host_root(name))
        s.python[name] = dep.deploy.python
    return s


def _raise_failed(res: dict, what: str, cls=RemoteError):
    bad = [r for r in res.values() if not r.ok]
    if bad:
        raise cls(f"{what} failed on {len(bad)} host(s): " + "; ".join(r.error for r in bad))


def gather_facts(site: Site) -> dict[str, HostFacts]:
    """Read every host's facts in parallel; RemoteError naming each failing host."""
    res = run_parallel(site.transports, lambda t: read_facts(t, site.paths[t.name].root),
                       timeout=site.opts.connect_timeout + 60)
    _raise_failed(res, "reading host state")
    site.facts = {h: r.value for h, r in res.items()}
    return site.facts


# -- lock / audit / state ----------------------------------------------------------------------

def acquire_locks(site: Site, what: str) -> dict[str, HostFacts]:
    """Take every host's lock (:mod:`dsv4ctl.hosts.lock`) and read its facts in the same round
    trip. A held lock → LockHeld (exit 3) naming its holder; locks taken so far are released.
    ``--break-lock`` removes a stale lock first (audited with the old holder)."""
    site.token = secrets.token_hex(8)
    doc = lock_holder(what, site.token)

    def lock(t: Transport):
        p = site.paths[t.name]
        pre = ""
        if site.opts.break_lock:
            old = read_text(t, f"{p.lock}/holder.json")
            rec = audit_record(t.name, "break-lock", "ok", f"removed lock held by {holder_text(parse_holder(old))}")
            pre = f"if [ -d {q(p.lock)} ]; then rm -rf {q(p.lock)} && {append_jsonl_cmd(p.audit, rec)}; fi; "
        r = t.run(f"{pre}mkdir -p {q(p.releases)} && " + take_cmd(p.lock, doc, facts_command(p.root)),
                  check=False, timeout=120)
        if r.code == LOCK_HELD_CODE:
            raise held_error(t.name, p.lock, r.out, can_break=True)
        if r.code != 0:
            raise t.fail(r, f"lock {p.lock}")
        return parse_facts(t.name, p.root, r.out)

    # an interrupt lets every lock command finish (the caller's release_locks then sees them all)
    res = run_parallel(site.transports, lock, timeout=site.opts.connect_timeout + 120, finish_on_interrupt=True)
    if not all(r.ok for r in res.values()):
        release_locks(site, [h for h, r in res.items() if r.ok])
        _raise_failed(res, "locking")
    site.facts = {h: r.value for h, r in res.items()}
    return site.facts


def release_locks(site: Site, hosts: list[str] | None = None) -> None:
    """Drop the locks this run holds (only when the token matches); best effort."""
    hs = [h for h in (hosts if hosts is not None else site.hosts) if h not in getattr(site, "unlocked", set())]
    if not hs or not site.token:      # no token yet: this run has taken no lock (never match another's)
        return

    def unlock(t):
        t.run(release_cmd(site.paths[t.name].lock, site.token), timeout=30)
    run_parallel({h: site.transports[h] for h in hs}, unlock, timeout=60)


def save_state(t: Transport, site: Site) -> None:
    f = site.facts[t.name]
    f.state["schema"] = STATE_SCHEMA
    atomic_write(t, site.paths[t.name].state, json.dumps(f.state, indent=1, sort_keys=True) + "\n")


def set_release_state(t: Transport, site: Site, rid: str, **kv) -> None:
    site.facts[t.name].state.setdefault("releases", {}).setdefault(rid, {}).update(kv)
    save_state(t, site)


# -- push --------------------------------------------------------------------------------------

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


def link_bases(f: HostFacts, rid: str, limit: int = 19) -> list[str]:
    """Release ids to hard-link unchanged files from: current, previous, then newest others."""
    order = [r for r in (f.current, f.previous) if r and r in f.releases and r != rid]
    others = sorted((r for r in f.releases if r not in order and r != rid), key=lambda r: f.when(r), reverse=True)
    return (order + others)[:limit]


def state_doc(f: HostFacts) -> bytes:
    f.state["schema"] = STATE_SCHEMA
    return (json.dumps(f.state, indent=1, sort_keys=True) + "\n").encode()


def push_host(t: Transport, site: Site, rel: Release) -> dict:
    """Put ``rel`` into ``releases/<id>`` on one host (delta), verified. Returns push stats.

    The transfer (:func:`_push_rsync`, :func:`_push_copy`) and the host-side script of
    :mod:`dsv4ctl.deploy.verify`, which verifies the manifest, renames ``.incoming-<id>`` to
    ``<id>`` and records the push in ``state.json`` (for a delta push it runs alongside rsync).
    Leftover ``.incoming-*`` folders of other runs are removed by the first command."""
    f, p = site.facts[t.name], site.paths[t.name]
    t0 = time.monotonic()
    if rel.id in f.releases:
        return {"skipped": True, "bytes_sent": 0, "files_transferred": 0, "seconds": 0.0, "hashed": 0}
    inc = p.incoming(rel.id)
    bases = link_bases(f, rel.id)
    stale = " ".join(q(p.incoming(x)) for x in f.incoming if x != rel.id)
    clean = f"rm -rf {stale} && " if stale else ""
    use_rsync = f.rsync and os.environ.get("DSV4CTL_PUSH", "rsync") != "copy"
    st = f.state.setdefault("releases", {})
    before = dict(st.get(rel.id, {}))
    st.setdefault(rel.id, {}).update(state="pushed", pushed_at=now_iso(), pushed_by=who())
    job = {"rel": inc, "side": None, "bases": [p.release(b) for b in bases], "stage": None, "wait": None,
           "place": {"final": p.release(rel.id), "state": p.state, "doc": state_doc(f).decode()}}
    if before:
        st[rel.id] = before
    else:
        st.pop(rel.id, None)
    place = f"{q(site.python[t.name])} -S -c {q(VERIFY_SCRIPT)}"
    if use_rsync:
        stats, r = _push_rsync(t, site, rel, inc, bases, clean, job, place)
    else:
        stats = _push_copy(t, site, rel, inc, bases, clean)
        r = t.run(place, input=json.dumps(job).encode(), timeout=1800, check=False)
    lines = r.out.strip().splitlines()
    try:
        v = json.loads(lines[-1]) if lines else None
    except ValueError:
        v = None
    if v is not None and not v["ok"] and not v.get("error"):
        raise RemoteError(f"{t.name}: release {rel.id} failed manifest verification "
                          f"({v['nbad']} problem(s): {', '.join(v['bad'][:3])})")
    if r.code != 0 or v is None:
        if v is not None and v.get("error"):
            raise RemoteError(f"{t.name}: verifying/placing release {rel.id}: {v['error']}")
        raise t.fail(r, f"verifying/placing release {rel.id}")
    st.setdefault(rel.id, {}).update(state="pushed", pushed_at=now_iso(), pushed_by=who())
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
                job: dict, place: str):
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
    (:meth:`~dsv4ctl.remote.Transport.rsync_dest`)."""
    p = site.paths[t.name]
    user = rsync_user_args()
    old = _base_manifest(t, site, bases[0]) if bases else None
    if old is None:
        if clean:
            t.run(clean + "true", timeout=300)
        extra, dest = t.rsync_dest(inc + "/", bulk=True)
        argv = ["rsync", "-a", "--delete", "--stats", "--info=progress2", *user,
                *[f"--link-dest={p.release(b)}" for b in bases], *extra, f"{rel.path}/", dest]
        stats = _run_rsync(t, site, rel, argv)
        return stats, t.run(place, input=json.dumps(job).encode(), timeout=1800, check=False)
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
                stats = _run_rsync(t, site, rel, argv)
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
            t.run(f": > {q(side + '.done')}", timeout=60)
            return stats, placed.result()


def _run_rsync(t: Transport, site: Site, rel: Release, argv: list[str]) -> dict:
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
                    site.opts.progress(t.name, int(m[-1].group(1)), 100)
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
        site.opts.progress(t.name, 100, 100)
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


def cleanup_incoming(site: Site, rid: str) -> None:
    """Remove ``releases/.incoming-<id>`` and its delta side folders on every host (best effort)."""
    run_parallel(site.transports, lambda t: t.run(incoming_rm(site.paths[t.name], rid), timeout=300),
                 timeout=330)


# -- activation --------------------------------------------------------------------------------

def host_groups(spec: dict, host: str) -> list[str]:
    """Groups of ``spec`` on ``host``, servers first then the router (start order)."""
    gs = [g for g, s in spec.items() if s["host"] == host]
    return sorted(gs, key=lambda g: (spec[g]["role"] == "router", list(spec).index(g)))


def start_command(site: Site, host: str, rid: str, group: str, s: dict) -> str:
    p = site.paths[host]
    rd = p.release(rid)
    values = {"python": site.python[host], "release": rd, "tree": f"{rd}/tree",
              "config": f"{rd}/configs/{group}.yaml", "port": s["port"], "group": group, "root": p.root,
              "address": site.profile.hosts[host].address,
              "router_args": " ".join(q(w) for w in s.get("router_args", []))}
    return render_launch(s["cmd"], values)


def switch_cmd(p: Paths, rid: str | None, prev: str | None) -> str:
    """Atomic switch: ``previous`` then ``current`` re-pointed by rename of a fresh symlink
    (``rid`` None removes ``current``: nothing was active before the first deploy)."""
    parts = [f"cd {q(p.root)}"]
    if prev:
        parts.append(f"ln -sfn releases/{q(prev)} .previous.tmp && mv -T .previous.tmp previous")
    else:
        parts.append("rm -f previous")
    if rid:
        parts.append(f"ln -sfn releases/{q(rid)} .current.tmp && mv -T .current.tmp current")
    else:
        parts.append("rm -f current")
    return " && ".join(parts)


def read_spec(t: Transport, site: Site, rid: str) -> dict:
    txt = read_text(t, site.paths[t.name].release(rid) + "/launch.json", default=None)
    if txt is None:
        raise RemoteError(f"{t.name}: release {rid} has no launch.json")
    return json.loads(txt)


def activate_cmd(site: Site, host: str, rid: str | None, prev: str | None,
                 spec: dict | None, stop_spec: dict | None) -> str:
    """One shell command: stop this host's groups of ``stop_spec`` ∪ ``spec`` (router first),
    switch ``current``/``previous`` atomically, start the groups of ``spec`` (servers first)."""
    f, p = site.facts[host], site.paths[host]
    svc = backend(site.profile.deploy.service, f.systemd)
    spec = spec or {}
    stop = set(host_groups(stop_spec or {}, host)) | set(host_groups(spec, host))
    role = lambda g: (spec.get(g) or (stop_spec or {}).get(g) or {}).get("role")  # noqa: E731
    parts = [svc.stop_cmd(p, g) for g in sorted(stop, key=lambda g: (role(g) != "router", g))]
    parts.append(switch_cmd(p, rid, prev))
    if rid:
        for g in host_groups(spec, host):
            s_ = spec[g]
            parts.append(svc.start_cmd(p, g, rid, start_command(site, host, rid, g, s_), s_.get("env", {})))
    return " && ".join(f"( {x} )" for x in parts)


def activate_host(t: Transport, site: Site, rid: str | None, prev: str | None,
                  spec: dict | None, stop_spec: dict | None) -> None:
    """Run :func:`activate_cmd` on the host (one round trip)."""
    t.run(activate_cmd(site, t.name, rid, prev, spec, stop_spec), timeout=300)
    site.facts[t.name].current, site.facts[t.name].previous = rid, prev


def stop_all(site: Site, spec_by_host: dict[str, dict]) -> None:
    def body(t):
        f, p = site.facts[t.name], site.paths[t.name]
        svc = backend(site.profile.deploy.service, f.systemd)
        for g in host_groups(spec_by_host.get(t.name) or {}, t.name):
            t.run(svc.stop_cmd(p, g), timeout=120)
    run_parallel(site.transports, body, timeout=300)


def health_targets(site: Site, spec: dict, hosts: list[str] | None = None) -> tuple[list, list, str]:
    """(worker targets, chat targets, model) for a launch spec: workers are server groups, chat
    goes through the router group(s), or through decode/colocated groups when there is none.
    ``hosts``: only the groups on these hosts (a promotion canary: the other hosts still run the
    old release, or nothing yet)."""
    workers, routers = [], []
    for g, s in spec.items():
        h = s["host"]
        if hosts is not None and h not in hosts:
            continue
        url = http_url(site.profile.hosts[h].address, s['port'])
        t, p, f = site.transports[h], site.paths[h], site.facts[h]
        svc = backend(site.profile.deploy.service, f.systemd)
        alive_cmd = svc.alive_cmd(p, g)
        alive = (lambda t=t, c=alive_cmd: t.run(c, check=False, timeout=30).code == 0)
        tgt = health.Target(h, g, url, alive)
        (routers if s["role"] == "router" else workers).append(tgt)
    chat = routers or [w for w in workers if spec[w.group]["role"] in ("decode", "colocated")]
    model = next((spec[c.group]["model"] for c in chat), "default")
    return workers, chat, model


def log_tail(site: Site, host: str, group: str, n: int = 8) -> list[str]:
    try:
        r = site.transports[host].run(log_tail_cmd(site.paths[host], group, n), check=False, timeout=30)
        return [ln for ln in r.out.splitlines() if ln.strip() and not ln.startswith("=== dsv4ctl start")]
    except DsvError:
        return []


def failure_text(site: Site, fails: list) -> str:
    out = []
    for fl in fails:
        tail = log_tail(site, fl.host, fl.group)
        out.append(f"host {fl.host} group {fl.group}: {fl.reason}; last log lines: "
                   + (" | ".join(tail[-5:]) if tail else "(empty log)"))
    return "; ".join(out)


def health_timeout(site: Site) -> float:
    if site.opts.health_timeout is not None:
        return site.opts.health_timeout
    return site.profile.deploy.health_timeout_s


def switch_with_gate(site: Site, target: dict[str, str], *, what: str,
                     spec: dict | None = None, hosts: list[str] | None = None) -> tuple[bool, str, dict]:
    """Activate ``target`` {host: rid} on ``hosts`` (default: all), then run the health gate
    (every worker of the launch spec, then a chat completion). On any failure or interrupt every
    switched host is put back (``current``/``previous`` as before, groups restarted on the old
    release). Returns (ok, failure text, {host: old current})."""
    hosts = list(hosts) if hosts is not None else site.hosts
    sel = {h: site.transports[h] for h in hosts}
    old = {h: (site.facts[h].current, site.facts[h].previous) for h in hosts}
    specs: dict[str, dict] = {}
    old_specs: dict[str, dict | None] = {}

    def prep(t):
        rid = target[t.name]
        specs[t.name] = spec if spec is not None else read_spec(t, site, rid)
        old_specs[t.name] = site.facts[t.name].current_launch
    _raise_failed(run_parallel(sel, prep, timeout=120), "reading launch specs")
    switched: list[str] = []
    lock = threading.Lock()

    def act(t):
        h = t.name
        rid = target[h]
        oc = old[h][0]
        prev = oc if oc and oc != rid else old[h][1]
        try:
            activate_host(t, site, rid, prev, specs[h], old_specs[h])
        finally:
            with lock:
                switched.append(h)
    try:   # an interrupt lets every host finish its switch first, so the revert below sees them all
        res = run_parallel(sel, act, timeout=site.opts.host_timeout, finish_on_interrupt=True)
        bad = [r for r in res.values() if not r.ok]
        if bad:
            reason = "activation failed: " + "; ".join(r.error for r in bad)
        else:
            spec = next(iter(specs.values()))
            workers, chat, model = health_targets(site, spec, hosts if len(hosts) < len(site.hosts) else None)
            site.opts.log(f"health: waiting for {len(workers)} worker(s) and {len(chat)} chat target(s) "
                          f"(timeout {health_timeout(site):g} s)")
            fails = health.gate(workers, chat, health_timeout(site), model)
            if not fails:
                return True, "", {h: o[0] for h, o in old.items()}
            reason = failure_text(site, fails)
    except BaseException:
        _revert(site, switched, old, old_specs, specs)
        raise
    _revert(site, switched, old, old_specs, specs)
    ospec = next((v for v in old_specs.values() if v), None)
    if ospec:
        workers, chat, model = health_targets(site, ospec)
        fails = health.gate(workers, chat, health_timeout(site), model)
        reason += (" (the previous release is healthy again)" if not fails else
                   f" (after rolling back, still unhealthy: {failure_text(site, fails)})")
    return False, reason, {h: o[0] for h, o in old.items()}


def _revert(site, switched, old, old_specs, specs):
    site.opts.log(f"rolling back {', '.join(sorted(switched)) or 'no host'} to the previous release")

    def back(t):
        oc, op = old[t.name]
        activate_host(t, site, oc, op, old_specs.get(t.name), specs.get(t.name))
    res = run_parallel({h: site.transports[h] for h in switched}, back, timeout=site.opts.host_timeout)
    bad = [r.error for r in res.values() if not r.ok]
    if bad:
        site.opts.log("rollback failed on: " + "; ".join(bad))
    return res


# -- commands ----------------------------------------------------------------------------------

def plan_lines(site: Site, rel_id: str, n_files: int, nbytes: int, what: str = "deploy") -> list[str]:
    """The ``--dry-run`` lines: every action per host in execution order."""
    acts: list[Action] = []
    noop = lambda t: None  # noqa: E731
    spec = launch_spec(site.profile)
    for h in site.hosts:
        f, p = site.facts[h], site.paths[h]
        svc = backend(site.profile.deploy.service, f.systemd)
        acts.append(Action(h, f"lock {p.lock}" + (" (breaking the current lock first)" if site.opts.break_lock else ""), noop))
        if rel_id in f.releases:
            acts.append(Action(h, f"release {rel_id} already present: no push", noop))
        else:
            bases = link_bases(f, rel_id)
            how = "rsync" if f.rsync else "hard-link copy + changed files"
            size = f" ({n_files} files, {nbytes / 2**20:.1f} MiB)" if n_files else ""
            acts.append(Action(h, f"push {rel_id}{size} to {p.incoming(rel_id)} with {how}"
                                  + (f", reusing {', '.join(bases)}" if bases else ""), noop))
            acts.append(Action(h, f"verify the manifest on the host, rename to {p.release(rel_id)}", noop))
        acts.append(Action(h, f"switch {p.current}: {f.current or '(none)'} -> {rel_id} "
                              f"(previous -> {f.current if f.current and f.current != rel_id else f.previous or '(none)'})", noop))
        for g in host_groups(spec, h):
            s = spec[g]
            cmd = start_command(site, h, rel_id, g, s)
            acts.append(Action(h, f"restart {g} ({svc.name}): {cmd}", noop))
    lines = [a.describe() for a in acts]
    for g, s in spec.items():
        url = http_url(site.profile.hosts[s['host']].address, s['port'])
        if s["role"] == "router":
            lines.append(f"gate: POST {url}/v1/chat/completions (max_tokens 1) after the workers are healthy")
        else:
            lines.append(f"gate: GET {url}/health (group {g}, timeout {health_timeout(site):g} s)")
    lines.append("on gate failure or interrupt: every switched host back to its previous release, restarted")
    lines.append(f"on success: mark {rel_id} good, prune to keep_releases="
                 f"{site.profile.deploy.keep_releases}, append to each audit.jsonl, unlock")
    return lines


def deploy(profile, opts: Options, *, tree=None, base_ref=None, patches=None, promote=None) -> dict:
    """Build, push, activate, gate. Returns a report dict (``dsv4ctl.deploy/1``).

    ``promote`` (a :class:`dsv4ctl.deploy.promote.PromoteOptions`) turns on the promotion
    pipeline of :mod:`dsv4ctl.deploy.promote`: preflight before anything, then canary, checks,
    the rest, ``good``. Raises InputError (bad inputs, nothing changed), RemoteError (a host
    failed before any switch, or locks), VerdictError (the gate, a preflight plan or a promotion
    check failed; every switched host was rolled back)."""
    t_start = time.monotonic()
    rsync_user_args()
    tree_p, base_ref, pl, configs, spec, ident = release_inputs(profile, tree, base_ref, patches)
    if promote is not None:
        promote.prepare(as_deployment(profile), opts.log)
    site = open_site(profile, opts)
    try:
        if opts.dry_run:
            from .release import resolve_base
            import hashlib
            commit = resolve_base(tree_p, base_ref)
            rid = release_id(commit, [(p.name, sha256_file(p)) for p in pl],
                             {g: hashlib.sha256(b).hexdigest() for g, b in configs.items()}, spec, ident)
            gather_facts(site)
            if promote is not None:
                return {"schema": "dsv4ctl.deploy/1", "dry_run": True, "release": rid, "promote": True,
                        "actions": promote.dry_run_lines(site, rid)}
            return {"schema": "dsv4ctl.deploy/1", "dry_run": True, "release": rid,
                    "actions": plan_lines(site, rid, 0, 0)}
        t_build = time.monotonic()
        rel = build_release(tree_p, base_ref, pl, configs, spec, cache=opts.cache, who=who(), series_identity=ident)
        opts.build_seconds = round(time.monotonic() - t_build, 3)
        opts.log(f"built {rel.id}: base {base_ref} ({rel.meta['base_commit'][:12]}), {len(pl)} patch(es), "
                 f"{len(rel.files)} files, {rel.bytes / 2**20:.1f} MiB")
        try:       # release_locks only drops locks holding this run's token: safe whatever happened
            acquire_locks(site, f"deploy {rel.id}")
            return _deploy_locked(site, rel, t_start, promote)
        finally:
            release_locks(site)
    finally:
        site.close()


def close_out(site: Site, record: dict, *, state: dict | None = None, prune: int | None = None,
              cleanup: str | None = None, hosts: list[str] | None = None,
              per_host: dict[str, dict] | None = None) -> dict[str, list[str]]:
    """The last round trip of a run, per host: remove ``cleanup``'s incoming folder, prune to
    ``prune`` releases, apply ``state`` {rid: fields} to state.json (atomic), append ``record``
    to the audit log, drop the lock. Returns {host: pruned ids}; failures are logged, not raised."""
    hs = hosts if hosts is not None else site.hosts

    def body(t):
        f, p = site.facts[t.name], site.paths[t.name]
        parts, gone = [], []
        if cleanup:
            parts.append(incoming_rm(p, cleanup))
        for rid, kv in (state or {}).items():
            f.state.setdefault("releases", {}).setdefault(rid, {}).update(kv)
        if prune:
            gone = select_prune(f, prune)
            for r in gone:
                trash = p.releases + "/.trash-" + r
                parts.append(f"mv -T {q(p.release(r))} {q(trash)} && rm -rf {q(trash)}")
                f.releases.pop(r, None)
                f.state.get("releases", {}).pop(r, None)
        rec = audit_record(t.name, **{**record, **(per_host or {}).get(t.name, {})})
        if prune is not None:
            rec["pruned"] = gone
        parts.append(atomic_write_cmd(p.state))
        parts.append(append_jsonl_cmd(p.audit, rec))
        parts.append(f"({release_cmd(p.lock, site.token)})")
        t.run(" && ".join(parts), input=state_doc(f), timeout=900)
        return gone
    res = run_parallel({h: site.transports[h] for h in hs}, body, timeout=960)
    for r in res.values():
        if not r.ok:
            site.opts.log(f"warning: {r.error}")
    site.unlocked = set(h for h, r in res.items() if r.ok) | getattr(site, "unlocked", set())
    return {h: (r.value if r.ok else []) for h, r in res.items()}


def _deploy_locked(site: Site, rel: Release, t_start: float, promote=None) -> dict:
    opts = site.opts
    report = {"schema": "dsv4ctl.deploy/1", "release": rel.id, "base_ref": rel.meta["base_ref"],
              "base_commit": rel.meta["base_commit"], "files": len(rel.files), "bytes": rel.bytes,
              "build_seconds": getattr(opts, "build_seconds", None),
              "hosts": {h: {"from": site.facts[h].current} for h in site.hosts}}
    old_current = {h: site.facts[h].current for h in site.hosts}
    base_rec = {"action": "deploy", "release": rel.id}
    if all(c == rel.id and site.facts[h].good(c) for h, c in old_current.items()) and promote is None:
        opts.log(f"{rel.id} is already the active, good release on every host: nothing to do")
        close_out(site, {**base_rec, "result": "ok", "detail": "already active"},
                  per_host={h: {"from": rel.id} for h in site.hosts})
        report.update(result="ok", unchanged=True, seconds=round(time.monotonic() - t_start, 3))
        for h in site.hosts:
            report["hosts"][h].update(push={"skipped": True, "bytes_sent": 0, "files_transferred": 0}, pruned=[])
        return report
    frm = {h: {"from": c} for h, c in old_current.items()}
    # push
    try:
        t0 = time.monotonic()
        res = run_parallel(site.transports, lambda t: push_host(t, site, rel), timeout=opts.host_timeout)
        report["push_seconds"] = round(time.monotonic() - t0, 3)
        bad = [r for r in res.values() if not r.ok]
        if bad:
            why = "; ".join(r.error for r in bad)
            close_out(site, {**base_rec, "result": "failed", "detail": "push: " + why[:1500]}, cleanup=rel.id,
                      per_host=frm)
            raise RemoteError(f"deploy of {rel.id} stopped before any host was switched: push failed on {why}")
        for h, r in res.items():
            report["hosts"][h]["push"] = r.value
            opts.log(f"{h}: " + ("release already present" if r.value["skipped"] else
                                 f"pushed {r.value['files_transferred']} files, {r.value['bytes_sent']:,} bytes sent, "
                                 f"verified ({r.value['hashed']} hashed) in {r.value['seconds']:.1f} s"))
    except KeyboardInterrupt:
        kill_rsyncs()
        close_out(site, {**base_rec, "result": "interrupted", "detail": "interrupted during push; no host switched"},
                  cleanup=rel.id, per_host=frm)
        raise
    # activate + gate
    spec = json.loads((rel.path / "launch.json").read_text())
    if promote is not None:
        return promote.run_locked(site, rel, spec, report, frm, t_start)
    t_act = time.monotonic()
    try:
        ok, why, old = switch_with_gate(site, {h: rel.id for h in site.hosts}, what="deploy", spec=spec)
    except KeyboardInterrupt:
        close_out(site, {**base_rec, "result": "interrupted", "detail": "interrupted during activation; rolled back"},
                  state={rel.id: {"state": "failed", "failed_at": now_iso()}}, per_host=frm)
        raise
    if not ok:
        close_out(site, {**base_rec, "result": "rolled-back", "detail": why[:2000]},
                  state={rel.id: {"state": "failed", "failed_at": now_iso()}}, per_host=frm)
        back = sorted({o or "(none)" for o in old_current.values()})
        raise VerdictError(f"deploy of {rel.id} rolled back to {', '.join(back)} on all hosts "
                           f"({', '.join(site.hosts)}): {why}")
    report["activate_seconds"] = round(time.monotonic() - t_act, 3)
    return finish_good(site, rel.id, {**base_rec, "result": "ok"}, {}, report, frm, t_start)


def finish_good(site: Site, rid: str, record: dict, state: dict, report: dict, frm: dict, t_start: float) -> dict:
    """Close out a deploy whose release is now good everywhere: mark ``rid`` good (plus
    ``state`` fields) and activated, prune to ``keep_releases``, audit ``record``, unlock.
    Returns ``report`` completed (pruned ids per host, result ok, seconds)."""
    keep = site.profile.deploy.keep_releases
    pruned = close_out(site, record,
                       state={rid: {"state": "good", "activated_at": now_iso(), "activated_by": who(), **state}},
                       prune=keep, per_host=frm)
    for h in site.hosts:
        report["hosts"][h]["pruned"] = pruned.get(h, [])
    report["result"] = "ok"
    report["seconds"] = round(time.monotonic() - t_start, 3)
    return report


def releases(profile, opts: Options) -> dict:
    """Per host: every complete release with base, patches, when, who, state (a fact)."""
    site = open_site(profile, opts)
    try:
        facts = gather_facts(site)
    finally:
        site.close()
    out = {"schema": "dsv4ctl.releases/1", "hosts": {}}
    for h, f in facts.items():
        rows = []
        for rid in sorted(f.releases, key=lambda r: (f.when(r), r), reverse=True):
            m = f.releases[rid]
            st = f.state.get("releases", {}).get(rid, {})
            rows.append({"id": rid, "base_ref": m.get("base_ref"), "base_commit": m.get("base_commit"),
                         "patches": [p["name"] for p in m.get("patches", [])],
                         "when": f.when(rid), "who": st.get("activated_by") or st.get("pushed_by") or m.get("built_by"),
                         "state": f.release_state(rid), "recorded_state": st.get("state"),
                         "promoted_at": st.get("promoted_at"), "failed_check": st.get("failed_check"),
                         "evidence": st.get("evidence")})
        out["hosts"][h] = {"root": f.root, "current": f.current, "previous": f.previous,
                           "lock": f.lock and holder_text(f.lock), "releases": rows}
    return out


def rollback(profile, opts: Options, to: str | None = None) -> dict:
    """Activate an older release on every host (default: the newest good one present on all),
    with the same gate; a failing gate puts the hosts back where they were (exit 3)."""
    site = open_site(profile, opts)
    try:
        facts = gather_facts(site)
        target = choose_rollback_target(facts, to)
        if opts.dry_run:
            lines = []
            for h in site.hosts:
                f, p = facts[h], site.paths[h]
                lines.append(f"{h}: lock {p.lock}")
                lines.append(f"{h}: switch {p.current}: {f.current or '(none)'} -> {target} (previous -> {f.current})")
                lines.append(f"{h}: restart this host's groups from {p.release(target)}/launch.json")
            lines.append("gate: every worker's /health, then a 1-token chat completion through the router")
            lines.append("on gate failure or interrupt: every host back to its current release")
            return {"schema": "dsv4ctl.rollback/1", "dry_run": True, "release": target, "actions": lines}
        try:
            acquire_locks(site, f"rollback to {target}")
            target = choose_rollback_target(site.facts, to)
            old_current = {h: site.facts[h].current for h in site.hosts}
            rec = {"action": "rollback", "release": target}
            try:
                ok, why, old = switch_with_gate(site, {h: target for h in site.hosts}, what="rollback")
            except KeyboardInterrupt:
                close_out(site, {**rec, "result": "interrupted", "detail": "hosts put back"})
                raise
            if not ok:
                close_out(site, {**rec, "result": "failed", "detail": why[:2000]})
                raise RemoteError(f"rollback to {target} failed its health gate; hosts put back on "
                                  f"{', '.join(sorted({o or '(none)' for o in old_current.values()}))}: {why}")
            close_out(site, {**rec, "result": "ok"},
                      state={target: {"state": "good", "activated_at": now_iso(), "activated_by": who()}})
            return {"schema": "dsv4ctl.rollback/1", "release": target, "result": "ok",
                    "hosts": {h: {"from": old_current[h], "to": target} for h in site.hosts}}
        finally:
            release_locks(site)
    finally:
        site.close()
