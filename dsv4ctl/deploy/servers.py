"""Server processes of a release: which run, and the steps that start, stop or restart them (a
deploy of the active release over dead servers, ``start``, ``stop``, ``restart``: run by
:mod:`dsv4ctl.deploy.lifecycle`), and which groups a switch between two releases restarts.

Host facts are a read-only command (:func:`alive_command`) and a pure parser
(:func:`parse_alive`); what to do is pure (:func:`plan_servers`, :func:`changed_groups`); the
steps are built by :func:`server_steps` and run by :func:`dsv4ctl.deploy.engine.run_server_steps`
— the same steps ``--dry-run`` lists.

A server over several nodes is one unit: SGLang's node 0 cannot take a lost node back (it waits
in a collective), so a server with any node down is started whole — its nodes still running are
stopped first, every stop of a run before any start."""

from __future__ import annotations

from dataclasses import dataclass

from ..remote import q, run_parallel
from .service import service_for, submit_host
from .site import Site, raise_failed, spec_servers, start_command
from .steps import Step

ALIVE_MARK = "@alive"


def alive_command(site: Site, host: str, groups: list[str]) -> str:
    """Read-only shell command printing ``@alive GROUP 1`` (its process runs) or ``0`` for each of
    ``groups`` on ``host``, by the host's service backend (pid file or systemd unit)."""
    p = site.paths[host]
    svc = service_for(site, host)
    return "; ".join(f"if {svc.alive_cmd(p, g)}; then echo {ALIVE_MARK} {q(g)} 1; else echo {ALIVE_MARK} {q(g)} 0; fi"
                     for g in groups) or "true"


def parse_alive(text: str, groups: list[str]) -> dict[str, bool]:
    """{group: process running} from :func:`alive_command`'s output (pure). A group without a
    line counts as not running (the command was cut short)."""
    seen = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == ALIVE_MARK and parts[2] in ("0", "1"):
            seen[parts[1]] = parts[2] == "1"
    return {g: seen.get(g, False) for g in groups}


def read_alive(site: Site, spec: dict, hosts: list[str] | None = None) -> dict[str, dict[str, bool]]:
    """{host: {group: running}} for every server node and router of launch spec ``spec`` (hosts
    in parallel, one round trip each). RemoteError naming the hosts that could not be read."""
    want = {h: sorted(g for g, s in spec.items() if h in {x for srv in spec_servers(s) for x in srv})
            for h in (hosts or site.nodes)}
    want = {h: gs for h, gs in want.items() if gs}

    def one(t):
        r = t.run(alive_command(site, t.name, want[t.name]), timeout=60, check=False)
        return parse_alive(r.out, want[t.name])
    res = run_parallel({h: site.transports[h] for h in want}, one, timeout=site.opts.connect_timeout + 60)
    raise_failed(res, "reading which servers run")
    return {h: r.value for h, r in res.items()}


@dataclass(frozen=True)
class ServerAction:
    """What happens to one server: ``group``, its ``server`` name (``G``, or ``G#R`` for replica
    R), ``stop``: its hosts whose process is stopped first, ``start``: its hosts started (node-rank
    order), ``why``: a few words (``not running``, ``node 1 (h3) not running``, ``restart``)."""

    group: str
    server: str
    stop: tuple[str, ...]
    start: tuple[str, ...]
    why: str


def plan_servers(spec: dict, alive: dict[str, dict[str, bool]], how: str = "start",
                 groups: list[str] | None = None, hosts: list[str] | None = None) -> list[ServerAction]:
    """The server actions of ``how`` over launch spec ``spec`` (pure).

    ``alive``: {host: {group: running}} (:func:`read_alive`); ``groups``/``hosts``: only servers
    of these groups / with a node on these hosts (None: all). ``how``:

    * ``start`` — each server with a node not running: a one-node server is started; a server
      over several nodes is started whole (its running nodes stopped first). Running servers
      are left alone.
    * ``restart`` — every selected server: every node stopped, then started.
    * ``stop`` — every selected server: every node stopped.

    Order: groups by name, replicas in order. ValueError for another ``how``."""
    if how not in ("start", "restart", "stop"):
        raise ValueError(f"how: {how!r}")
    out = []
    for g in sorted(spec):
        if groups is not None and g not in groups:
            continue
        servers = spec_servers(spec[g])
        for r, nodes in enumerate(servers):
            if hosts is not None and not set(nodes) & set(hosts):
                continue
            name = g if len(servers) == 1 else f"{g}#{r}"
            up = [alive.get(h, {}).get(g, False) for h in nodes]
            if how == "stop":
                out.append(ServerAction(g, name, tuple(h for h, a in zip(nodes, up) if a), (), "stop"))
            elif how == "restart":
                out.append(ServerAction(g, name, tuple(h for h, a in zip(nodes, up) if a), tuple(nodes), "restart"))
            elif not all(up):
                down = [f"node {i} ({h})" for i, (h, a) in enumerate(zip(nodes, up)) if not a]
                why = "not running" if len(nodes) == 1 or len(down) == len(nodes) else \
                    f"{', '.join(down)} not running"
                out.append(ServerAction(g, name, tuple(h for h, a in zip(nodes, up) if a), tuple(nodes), why))
    return out


def server_steps(site: Site, rid_of: dict[str, str], spec_of: dict[str, dict], actions: list[ServerAction],
                 stage: str = "") -> list[Step]:
    """Steps for ``actions``: one ``stop`` step per host with something to stop, then one
    ``start`` step per host with something to start (servers before routers on a host), each
    from the host's release ``rid_of[host]`` and its launch spec ``spec_of[host]`` — the same
    start command and service backend a deploy uses. A start step's ``extra["started"]`` says
    what it starts, in words (``decode (not running) on h1``)."""
    stops: dict[str, list[str]] = {}
    starts: dict[str, list[str]] = {}
    for a in actions:
        for h in a.stop:
            stops.setdefault(h, []).append(a.group)
        for h in a.start:
            starts.setdefault(h, []).append(a.group)
    why = {(h, a.group): a.why for a in actions for h in (*a.stop, *a.start)}
    sub, only = _submit_actions(site, spec_of, actions, stops, starts, why)
    out = []

    def service(h: str, spec: dict | None, stop_spec: dict | None):
        svc = service_for(site, h, spec, stop_spec)
        if h == sub:
            svc.only = only         # the submit host acts for these replicas only
        return svc
    for h in [h for h in site.hosts if h in stops]:
        svc = service(h, spec_of.get(h), spec_of.get(h))
        gs = stops[h]
        out.append(Step("stop", h, f"stop {', '.join(gs)} ({svc.name})",
                        " && ".join(f"( {svc.stop_cmd(site.paths[h], g)} )" for g in gs), stage))
    for h in [h for h in site.hosts if h in starts]:
        svc = service(h, spec_of[h], None)
        spec, rid = spec_of[h], rid_of[h]
        gs = sorted(starts[h], key=lambda g: (spec[g]["role"] == "router", g))
        what = ", ".join(f"{g} ({why[(h, g)]})" for g in gs)
        cmd = lambda g: "" if h == sub else start_command(site, h, rid, g, spec[g])   # noqa: E731
        out.append(Step("start", h, f"start {what} from {rid} ({svc.name})",
                        " && ".join(f"( {svc.start_cmd(site.paths[h], g, rid, cmd(g), spec[g].get('env', {}))} )"
                                    for g in gs), stage, extra={"started": f"{what} on {h}"}))
    return out


def _submit_actions(site: Site, spec_of: dict, actions: list[ServerAction], stops: dict, starts: dict,
                    why: dict) -> tuple[str | None, dict[str, set[int]]]:
    """With ``deploy.slurm.submit_host`` (the Slurm backend submitting from one host): add the
    server groups of ``actions`` to the submit host's stops and starts (it cancels and submits
    their jobs; the nodes' own steps stop only what ran before Slurm and make log folders).
    Returns (the submit host or None, {group: the replicas it acts for})."""
    sub = submit_host(site)
    only: dict[str, set[int]] = {}
    if sub is None or sub not in site.transports:
        return None, only
    for a in actions:
        spec = spec_of.get(sub) or next(iter(spec_of.values()), {})
        if (spec.get(a.group) or {}).get("role") == "router":
            continue
        r = int(a.server.split("#", 1)[1]) if "#" in a.server else 0
        only.setdefault(a.group, set()).add(r)
        for hosts, into in ((a.stop, stops), (a.start, starts)):
            if hosts and a.group not in into.setdefault(sub, []):
                into[sub].append(a.group)
        why.setdefault((sub, a.group), a.why)
    return sub, only


def converge_steps(site: Site, rid: str, spec: dict) -> tuple[list[ServerAction], list[Step]]:
    """A deploy of ``rid`` when it is already active on every host: the servers of its launch
    spec ``spec`` that are not running (read now) and the steps that start them ([] when all
    run). A deploy converges: it never says "nothing to do" over a dead server."""
    nodes = site.nodes          # every node's process (a node of a shared root is none of site.hosts)
    actions = plan_servers(spec, read_alive(site, spec, nodes), "start", hosts=nodes)
    return actions, server_steps(site, {h: rid for h in nodes}, {h: spec for h in nodes}, actions)


def changed_groups(cur_manifest: dict, tgt_manifest: dict, cur_spec: dict, tgt_spec: dict) -> frozenset | None:
    """The groups a switch between two releases must restart (pure): None (every group) when the
    SGLang tree differs (any file or link under ``tree/``, or a path outside ``tree/``,
    ``configs/`` and ``launch.json``); else the groups whose launch-spec entry (command, port,
    env, nodes) or ``configs/G.yaml`` differ, and those in only one release. Manifests are
    ``MANIFEST.json`` documents ({"files": {path: [sha256, size, mode]}, "links": {path: target}})."""
    def split(man):
        files, links = man.get("files", {}), man.get("links", {})
        rest = {p: (v[0] if isinstance(v, (list, tuple)) else v) for p, v in files.items()
                if not p.startswith("configs/") and p != "launch.json"}
        rest.update({p: ("link", t) for p, t in links.items()})
        return rest, {p: (v[0] if isinstance(v, (list, tuple)) else v) for p, v in files.items() if p.startswith("configs/")}
    cur_rest, cur_cfg = split(cur_manifest)
    tgt_rest, tgt_cfg = split(tgt_manifest)
    if cur_rest != tgt_rest:
        return None
    return frozenset(g for g in set(cur_spec) | set(tgt_spec)
                     if cur_spec.get(g) != tgt_spec.get(g) or cur_cfg.get(f"configs/{g}.yaml") != tgt_cfg.get(f"configs/{g}.yaml"))
