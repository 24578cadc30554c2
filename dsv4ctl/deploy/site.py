"""The deploy site: the Deployment's hosts as the engine and the step builders see them —
transports (opened lazily), deploy roots, interpreters and the facts read from each host — plus
the small pure rules every phase shares (start order, launch commands, link bases)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import RemoteError
from ..hosts.layout import HostFacts, Paths, STATE_SCHEMA, owner_conflict, read_facts, render_launch
from ..profile.deployment import Deployment, as_deployment
from ..remote import Transport, connect, q, read_text, run_parallel


@dataclass
class Options:
    """Knobs shared by deploy / rollback / releases."""

    dry_run: bool = False
    accept_new_host_keys: bool = False
    health_timeout: float | None = None
    break_lock: bool = False
    offers_break_lock: bool = True                  # the command has --break-lock (a held lock's hint names it)
    connect_timeout: float = 10.0
    host_timeout: float | None = 3600.0
    cache: Path | None = None
    log: Callable[[str], None] = lambda s: None
    progress: Callable[[str, int, int], None] | None = None   # (host, bytes_done_pct, 100)
    force_failed: bool = False                      # activate a release recorded as failed (--force-failed)
    preflight: bool = True                          # lint + plan before anything (--no-preflight: False)
    trace: Callable[[object], None] | None = None   # called with every Step the engine executes
    steps: Callable[[list], None] | None = None     # called with the step list a run executes
    done: Callable[[object, float], None] | None = None   # called with every executed Step and its seconds
    message: str | None = None                      # deploy -m: why (audit records and the release's record)
    only: tuple | None = None                       # a limited deploy: only these hosts (deploy.limit.Limit.hosts)
    limit: str | None = None                        # its selection in words (-g decode --host h3), for the records


@dataclass
class Site:
    """One run's view of the hosts. ``profile`` is the :class:`Deployment`."""

    profile: Deployment
    opts: Options
    transports: dict[str, Transport] = field(default_factory=dict)
    paths: dict[str, Paths] = field(default_factory=dict)
    python: dict[str, str] = field(default_factory=dict)
    facts: dict[str, HostFacts] = field(default_factory=dict)
    token: str = ""
    unlocked: set = field(default_factory=set)
    close_errors: dict = field(default_factory=dict)         # host -> why its close-out failed (state not written)
    locked_steps: list = field(default_factory=list)        # the lock steps this run executed
    manifests: dict = field(default_factory=dict)           # release id -> MANIFEST.json (local cache)
    manifest_lock: threading.Lock = field(default_factory=threading.Lock)
    durations: list = field(default_factory=list)           # (Step, seconds) of every timed step, as they end
    restored: str = ""                                      # after an interrupt: how the put-back release is
    secrets: set | None = None                              # values no record may carry (steps.site_secrets)

    @property
    def hosts(self) -> list[str]:
        """The hosts whose deploy root this run locks, pushes to, switches and closes: every host,
        but of the hosts that share one root (``deploy.slurm.shared_root``) only its owner
        (:meth:`Deployment.root_owner`, the submit host)."""
        return [h for h in self.transports if self.profile.root_owner(h) == h
                or self.profile.root_owner(h) not in self.transports]

    @property
    def nodes(self) -> list[str]:
        """Every host of the run (the nodes a gate, a log or a process check reaches)."""
        return list(self.transports)

    @property
    def root_transports(self) -> dict[str, Transport]:
        """The transports of :attr:`hosts` (one per deploy root)."""
        return {h: self.transports[h] for h in self.hosts}

    def sharing(self, host: str) -> list[str]:
        """The hosts whose deploy root is ``host``'s shared root (``deploy.slurm.shared_root``:
        ``host`` is its owner), [] when ``host`` owns no shared root."""
        if host not in self.profile.shared_hosts or self.profile.root_owner(host) != host:
            return []
        return [h for h in self.transports if h in self.profile.shared_hosts]

    def shared_note(self, host: str) -> str:
        """`` (the shared root of h0, h1, ...)`` for a step on the owner of a shared root, else ''."""
        hs = self.sharing(host)
        return f" (the shared root of {', '.join(hs)})" if hs else ""

    def share_facts(self) -> None:
        """Give each host that shares its root with its owner the owner's facts (one object: a
        switch of the owner is the followers' too)."""
        for h in self.transports:
            o = self.profile.root_owner(h)
            if o != h and o in self.facts:
                self.facts[h] = self.facts[o]

    def close(self):
        for t in self.transports.values():
            t.close()


def open_site(profile, opts: Options) -> Site:
    """Transports (not yet connected) and deploy roots for every host of the Deployment (a
    Profile is resolved first): every node of every server (``opts.only``: those hosts alone)."""
    dep = as_deployment(profile)
    s = Site(dep, opts)
    for name, h in dep.hosts.items():
        if opts.only is not None and name not in opts.only:
            continue
        s.transports[name] = connect(h, accept_new_host_keys=opts.accept_new_host_keys,
                                     connect_timeout=opts.connect_timeout, hosts=dep.hosts,
                                     record_host_keys=not opts.dry_run)
        s.paths[name] = Paths(dep.host_root(name), node=dep.node_tag(name))
        s.python[name] = dep.deploy.python
    return s


def raise_failed(res: dict, what: str, cls=RemoteError):
    bad = [r for r in res.values() if not r.ok]
    if bad:
        raise cls(f"{what} failed on {len(bad)} host(s): " + "; ".join(r.error for r in bad))


def gather_facts(site: Site) -> dict[str, HostFacts]:
    """Read every host's facts in parallel; RemoteError naming each failing host. A deploy root
    that belongs to another profile is refused (:func:`~dsv4ctl.hosts.layout.owner_conflict`,
    exit 2): every command that reads facts this way changes hosts, or is its dry run."""
    res = run_parallel(site.root_transports, lambda t: read_facts(t, site.paths[t.name].root),
                       timeout=site.opts.connect_timeout + 60)
    raise_failed(res, "reading host state")
    site.facts = {h: r.value for h, r in res.items()}
    site.share_facts()
    conflict = owner_conflict(site.facts, site.profile.name)
    if conflict is not None:
        raise conflict
    return site.facts



def progress_interval() -> float:
    """Seconds between health-wait progress lines: ``DSV4CTL_PROGRESS_S`` when set (> 0), else 5 s
    on a terminal and 30 s otherwise (a CI log gets a line per half minute of a 900-s wait)."""
    import os
    import sys
    try:
        v = float(os.environ.get("DSV4CTL_PROGRESS_S", ""))
        if v > 0:
            return v
    except ValueError:
        pass
    return 5.0 if sys.stderr.isatty() else 30.0


def health_timeout(site: Site) -> float:
    if site.opts.health_timeout is not None:
        return site.opts.health_timeout
    return site.profile.deploy.health_timeout_s


def spec_servers(s: dict) -> list[list[str]]:
    """The servers of a launch-spec entry, each its hosts in node-rank order: ``servers``, else
    one server on ``host``."""
    return s.get("servers") or [[s["host"]]]


def spec_hosts(s: dict) -> list[str]:
    """Every host a launch-spec entry runs on: each node of each server."""
    return [h for srv in spec_servers(s) for h in srv]


def host_groups(spec: dict, host: str) -> list[str]:
    """Groups of ``spec`` on ``host`` in start order: servers first, then the router; by name
    (the order does not depend on how the launch spec was read). A group has at most one server
    node on a host (the profile allows one node per host, and replicas use the same GPUs)."""
    return sorted((g for g, s in spec.items() if host in spec_hosts(s)),
                  key=lambda g: (spec[g]["role"] == "router", g))


@dataclass(frozen=True)
class NodeOf:
    """Where ``host`` is in a launch-spec entry: ``replica`` (0-based), ``rank`` (SGLang
    ``--node-rank``), ``nnodes`` and ``node0`` (the host whose address is ``--dist-init-addr``)."""

    replica: int
    rank: int
    nnodes: int
    node0: str


def node_of(s: dict, host: str) -> NodeOf:
    """:class:`NodeOf` of ``host`` in launch-spec entry ``s`` (a one-host entry: rank 0 of 1).
    KeyError when ``host`` does not run it."""
    for r, srv in enumerate(spec_servers(s)):
        if host in srv:
            return NodeOf(r, srv.index(host), len(srv), srv[0])
    raise KeyError(host)


def node_args(site: Site, s: dict, host: str, dist_init_port: str | None = None) -> str:
    """SGLang's multi-node options for ``host``'s node of ``s``, shell-quoted:
    ``--nnodes N --node-rank I --dist-init-addr ADDRESS:PORT`` (ADDRESS: node 0's host address,
    bracketed when IPv6; SGLang 0.5.23 ``server_args.py``), or "" for a one-node server. They
    follow the serve config on the command line, so they win over any value it has.
    ``dist_init_port``: a shell variable (``$DSV4_DIST_INIT_PORT``: a Slurm job's own port) in
    place of the spec's port, left for the shell to expand."""
    n = node_of(s, host)
    if n.nnodes <= 1:
        return ""
    addr = site.profile.hosts[n.node0].address
    addr = f"[{addr}]" if ":" in addr else addr
    words = " ".join(q(w) for w in ("--nnodes", str(n.nnodes), "--node-rank", str(n.rank), "--dist-init-addr"))
    if dist_init_port is not None:
        return f'{words} "{addr}:{dist_init_port}"'
    return f"{words} {q(addr + ':' + str(s['dist_init_port']))}"


def start_command(site: Site, host: str, rid: str, group: str, s: dict, dist_init_port: str | None = None) -> str:
    """The launch command of ``group`` on ``host`` from its template. ``{node_args}`` is
    :func:`node_args`; a template without it gets them at its end. ``{python}`` is the release's
    own environment's interpreter (``ROOT/envs/<digest>/bin/python``) when its launch spec names
    one (``python_env``), else the profile's ``deploy.python``; in a release image, the image's
    environment (``/opt/dsv4ctl/envs/<digest>/bin/python``) or ``sglang.image.python``."""
    p = site.paths[host]
    rd = p.release(rid)
    na = node_args(site, s, host, dist_init_port)
    py = f"{p.env(s['python_env'])}/bin/python" if s.get("python_env") else site.python[host]
    c = s.get("container")
    if c is not None:          # a release image: its own paths and interpreter inside the container
        from ..hosts.container import image_dir, image_env
        rd = image_dir(rid)
        py = f"{image_env(s['python_env'])}/bin/python" if s.get("python_env") else c.get("python") or "python3"
    values = {"python": py, "release": rd, "tree": f"{rd}/tree",
              "config": f"{rd}/configs/{group}.yaml", "port": s["port"], "group": group, "root": p.root,
              "address": site.profile.hosts[host].address,
              "router_args": " ".join(q(w) for w in s.get("router_args", [])), "node_args": na}
    cmd = render_launch(s["cmd"], values)
    cmd = cmd if not na or "{node_args}" in s["cmd"] else f"{cmd} {na}"
    if c is not None:
        from ..hosts.container import run_command
        return run_command(site_image(site, s), p.root, rid, group, node_of(s, host).rank, c,
                           (c.get("devices") or {}).get(host, []), (s.get("env") or {}).keys(), cmd)
    return cmd


def site_image(site: Site, s: dict | None = None):
    """How a host runs images: the profile's ``sglang.image`` (runtime, store, arguments), else
    (a release image run by a profile that no longer names one) the defaults on the base of the
    launch-spec entry ``s``."""
    img = site.profile.sglang.image
    if img is not None or s is None:
        return img
    from ..profile.deployment import ImageSettings
    return ImageSettings(base=(s.get("container") or {}).get("base", ""))


def read_spec(t: Transport, site: Site, rid: str) -> dict:
    txt = read_text(t, site.paths[t.name].release(rid) + "/launch.json", default=None)
    if txt is None:
        raise RemoteError(f"{t.name}: release {rid} has no launch.json")
    return json.loads(txt)


def link_bases(f: HostFacts, rid: str, limit: int = 19) -> list[str]:
    """Release ids to hard-link unchanged files from: current, previous, then newest others."""
    order = [r for r in (f.current, f.previous) if r and r in f.releases and r != rid]
    others = sorted((r for r in f.releases if r not in order and r != rid), key=lambda r: f.when(r), reverse=True)
    return (order + others)[:limit]


def state_doc(f: HostFacts) -> bytes:
    f.state["schema"] = STATE_SCHEMA
    return (json.dumps(f.state, indent=1, sort_keys=True) + "\n").encode()




def api_key(dep, group: str | None = None) -> str | None:
    """The bearer token a gate or check sends to the servers: ``DSV4CTL_API_KEY``, else the
    ``api-key`` of ``group``'s serve config, else (a router, or no group) that of the first server
    group with one, decode and colocated groups first (SGLang 0.5.23 ``srt/utils/auth.py``: with
    ``--api-key`` every endpoint but ``/health*``, ``/ready*``, ``/metrics*`` needs it). Never
    printed: :func:`dsv4ctl.deploy.steps.deployment_secrets` holds it."""
    import os
    env = os.environ.get("DSV4CTL_API_KEY")
    if env:
        return env

    def of(g):
        if g is None or not g.is_server or g.serve_config_path is None:
            return None
        try:
            v = g.serve.data.get("api-key")
        except Exception:
            return None
        return str(v) if v not in (None, "", False) else None
    if group is not None and of(dep.groups.get(group)):
        return of(dep.groups.get(group))
    order = sorted(dep.servers(), key=lambda g: (g.role not in ("decode", "colocated"), g.name))
    return next((k for k in (of(g) for g in order) if k), None)
