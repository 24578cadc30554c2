"""Server processes of the active release: which run, and the steps that start, stop or restart
them (a deploy of the active release over dead servers, ``start``, ``stop``, ``restart``).

Host facts are a read-only command (:func:`alive_command`) and a pure parser
(:func:`parse_alive`); what to do is pure (:func:`plan_servers`); the steps are built by
:func:`server_steps` and run by :func:`run_server_steps` — the same steps ``--dry-run`` lists.

A server over several nodes is one unit: SGLang's node 0 cannot take a lost node back (it waits
in a collective), so a server with any node down is started whole — its nodes still running are
stopped first, every stop of a run before any start."""

from __future__ import annotations

from dataclasses import dataclass

from ..hosts.service import backend
from ..remote import q, run_parallel
from .site import Site, raise_failed, spec_servers, start_command
from .steps import Step

ALIVE_MARK = "@alive"


def alive_command(site: Site, host: str, groups: list[str]) -> str:
    """Read-only shell command printing ``@alive GROUP 1`` (its process runs) or ``0`` for each of
    ``groups`` on ``host``, by the host's service backend (pid file or systemd unit)."""
    f, p = site.facts[host], site.paths[host]
    svc = backend(site.profile.deploy.service, f.systemd)
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
            for h in (hosts or site.hosts)}
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
    start command and service backend a deploy uses."""
    stops: dict[str, list[str]] = {}
    starts: dict[str, list[str]] = {}
    for a in actions:
        for h in a.stop:
            stops.setdefault(h, []).append(a.group)
        for h in a.start:
            starts.setdefault(h, []).append(a.group)
    why = {(h, a.group): a.why for a in actions for h in (*a.stop, *a.start)}
    out = []
    for h in [h for h in site.hosts if h in stops]:
        svc = backend(site.profile.deploy.service, site.facts[h].systemd)
        gs = stops[h]
        out.append(Step("stop", h, f"stop {', '.join(gs)} ({svc.name})",
                        " && ".join(f"( {svc.stop_cmd(site.paths[h], g)} )" for g in gs), stage))
    for h in [h for h in site.hosts if h in starts]:
        svc = backend(site.profile.deploy.service, site.facts[h].systemd)
        spec, rid = spec_of[h], rid_of[h]
        gs = sorted(starts[h], key=lambda g: (spec[g]["role"] == "router", g))
        out.append(Step("start", h, f"start {', '.join(f'{g} ({why[(h, g)]})' for g in gs)} from {rid} ({svc.name})",
                        " && ".join(f"( {svc.start_cmd(site.paths[h], g, rid, start_command(site, h, rid, g, spec[g]), spec[g].get('env', {}))} )"
                                    for g in gs), stage))
    return out


def run_server_steps(site: Site, steps: list[Step]) -> list[str]:
    """Run ``steps``: every ``stop`` (hosts in parallel), then every ``start``. Returns the
    errors (one per failed host; the starts are not run after a failed stop)."""
    from .engine import run_host_step
    for phase in ("stop", "start"):
        by_host = {s.host: s for s in steps if s.phase == phase}
        if not by_host:
            continue
        res = run_parallel({h: site.transports[h] for h in by_host},
                           lambda t: run_host_step(site, by_host[t.name], timeout=300),
                           timeout=site.opts.host_timeout, finish_on_interrupt=True)
        errors = [r.error for r in res.values() if not r.ok]
        if errors:
            return errors
    return []


def converge_steps(site: Site, rid: str, spec: dict) -> tuple[list[ServerAction], list[Step]]:
    """A deploy of ``rid`` when it is already active on every host: the servers of its launch
    spec ``spec`` that are not running (read now) and the steps that start them ([] when all
    run). A deploy converges: it never says "nothing to do" over a dead server."""
    actions = plan_servers(spec, read_alive(site, spec), "start")
    return actions, server_steps(site, {h: rid for h in site.hosts}, {h: spec for h in site.hosts}, actions)


def _active_spec(site: Site) -> tuple[dict, dict[str, str], dict[str, dict]]:
    """(spec, {host: release}, {host: launch spec}) of what the hosts run: each group's entry from
    the first host (profile order) whose active release launches it."""
    spec: dict = {}
    rid_of, spec_of = {}, {}
    for h in site.hosts:
        f = site.facts[h]
        if f.current and f.current_launch:
            rid_of[h], spec_of[h] = f.current, f.current_launch
            for g, s in f.current_launch.items():
                spec.setdefault(g, s)
    return spec, rid_of, spec_of


def select(site: Site, spec: dict, groups: list[str] | None, hosts: list[str] | None) -> None:
    """InputError (exit 2) for a group no active release launches or a host not in the profile,
    naming the known ones."""
    from ..errors import InputError
    for g in groups or []:
        if g not in spec:
            raise InputError(f"no group {g!r} in the active release (groups: {', '.join(sorted(spec)) or 'none: deploy first'})")
    for h in hosts or []:
        if h not in site.hosts:
            raise InputError(f"no host {h!r} in the profile (hosts: {', '.join(site.hosts)})")


def batches(actions: list[ServerAction], size: int | None) -> list[list[ServerAction]]:
    """``actions`` in batches of ``size`` servers (None or 0: one batch), in order (pure)."""
    if not size or size >= len(actions):
        return [actions] if actions else []
    return [actions[i:i + size] for i in range(0, len(actions), size)]


def lifecycle(profile, opts, how: str, groups: list[str] | None = None, hosts: list[str] | None = None,
              batch: int | None = None) -> dict:
    """``start`` / ``stop`` / ``restart`` the servers of the active release (``dsv4ctl.lifecycle/1``
    report). Locks every host, reads which servers run (:func:`read_alive`), plans
    (:func:`plan_servers`: ``groups``/``hosts`` select), then per batch of ``batch`` servers
    (default all): stops, starts and — for start/restart — the health gate of the batch's groups
    plus the chat probe through the routers; the next batch only after a healthy one. Every
    host's audit gets the outcome. Errors: InputError (exit 2: unknown group/host), RemoteError
    (exit 3: SSH, lock, a stop/start command failed, hosts of one server on different releases),
    GateFailed (exit 1: a started server not healthy; later batches untouched)."""
    from ..errors import GateFailed, RemoteError
    from .engine import acquire_locks, close_all, failure_text, release_locks, run_close, run_gate
    from .site import gather_facts, open_site
    from .steps import DRY_RUN_TOKEN, close_step, gate_steps
    site = open_site(profile, opts)
    try:
        if opts.dry_run:
            gather_facts(site)
            site.token = DRY_RUN_TOKEN
        else:
            what = f"{how} " + (",".join(groups) if groups else "all groups") + (f" on {','.join(hosts)}" if hosts else "")
            acquire_locks(site, what)
        try:
            spec, rid_of, spec_of = _active_spec(site)
            select(site, spec, groups, hosts)
            alive = read_alive(site, spec, [h for h in site.hosts if h in rid_of])
            actions = plan_servers(spec, alive, how, groups, hosts)
            for a in actions:
                rids = {rid_of.get(h) for h in (*a.start, *a.stop)}
                if None in rids or len(rids) > 1:
                    raise RemoteError(f"{a.server}: its hosts run different releases ("
                                      + ", ".join(f"{h}: {rid_of.get(h) or 'none'}" for h in dict.fromkeys((*a.stop, *a.start)))
                                      + "): deploy or roll back so that every node runs one")
            routers = {g: s for g, s in spec.items() if s["role"] == "router"}
            steps, stages = [], []
            parts = batches(actions, batch)
            for i, part in enumerate(parts):
                stage = f"batch {i + 1}/{len(parts)}" if len(parts) > 1 else ""
                st = server_steps(site, rid_of, spec_of, part, stage)
                if how != "stop":
                    gspec = {**{a.group: spec[a.group] for a in part}, **routers}
                    st += gate_steps(site, gspec, stage=stage)
                steps += st
                stages.append((part, st))
            done = ", ".join(f"{a.server} ({a.why})" if how == "start" else a.server for a in actions)
            detail = (f"{'stopped' if how == 'stop' else how + 'ed'} {done}" if actions else
                      f"nothing to {how}: " + ("every selected server runs" if how == "start" else "no server selected"
                                               if how == "restart" else "no selected server runs"))
            rec = {"action": how, "release": ",".join(sorted(set(rid_of.values()))) or None}
            closes = [close_step(site, h, {**rec, "result": "ok", "detail": detail}) for h in site.hosts]
            report = {"schema": "dsv4ctl.lifecycle/1", "action": how, "dry_run": opts.dry_run,
                      "servers": [{"server": a.server, "group": a.group, "stop": list(a.stop), "start": list(a.start),
                                   "why": a.why} for a in actions]}
            if opts.dry_run:
                from .steps import listing
                return {**report, "actions": [detail] + listing(steps + closes),
                        "steps": [s.to_dict() for s in steps + closes]}
            if opts.steps is not None:
                from .steps import RunSteps
                opts.steps(RunSteps(site.locked_steps + steps + closes, []))
            opts.log(detail)
            try:
                for part, st in stages:
                    errors = run_server_steps(site, st)
                    if errors:
                        why = "; ".join(errors)
                        close_all(site, {**rec, "result": "failed", "detail": f"{how}: {why}"[:2000]})
                        raise RemoteError(f"{how} of {', '.join(a.server for a in part)} failed: {why}")
                    gates = [s for s in st if s.phase == "gate"]
                    fails = run_gate(site, gates) if gates else []
                    if fails:
                        why = failure_text(site, fails)
                        close_all(site, {**rec, "result": "failed", "detail": f"{how}: health gate: {why}"[:2000]})
                        rest = len(actions) - sum(len(p) for p, _ in stages[:stages.index((part, st)) + 1])
                        raise GateFailed(f"{how} of {', '.join(a.server for a in part)}: not healthy: {why}"
                                         + (f" ({rest} later server(s) left as they were)" if rest else ""))
            except KeyboardInterrupt:
                close_all(site, {**rec, "result": "interrupted", "detail": f"interrupted during {how}"})
                raise
            run_close(site, closes)
            return {**report, "result": "ok", "detail": detail}
        finally:
            if not opts.dry_run:
                release_locks(site)
    finally:
        site.close()


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
