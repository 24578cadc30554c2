"""``start`` / ``stop`` / ``restart``: the servers of the active release, acted on under the deploy
lock, gated like a deploy, audited on every host (the core: :mod:`dsv4ctl.deploy.servers`)."""

from __future__ import annotations

from .servers import ServerAction, plan_servers, read_alive, server_steps
from .site import Site


def _active_spec(site: Site) -> tuple[dict, dict[str, str], dict[str, dict]]:
    """(spec, {host: release}, {host: launch spec}) of what the hosts run: each group's entry from
    the first host (profile order) whose active release launches it."""
    spec: dict = {}
    rid_of, spec_of = {}, {}
    for h in site.nodes:                # a node of a shared root: its owner's facts
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
        if h not in site.nodes:
            raise InputError(f"no host {h!r} in the profile (hosts: {', '.join(site.nodes)})")


def batches(actions: list[ServerAction], size: int | None) -> list[list[ServerAction]]:
    """``actions`` in batches of ``size`` servers (None or 0: one batch), in order (pure)."""
    if not size or size >= len(actions):
        return [actions] if actions else []
    return [actions[i:i + size] for i in range(0, len(actions), size)]


def _what(how: str, groups, hosts) -> str:
    """The lock holder's ``what`` of a start/stop/restart run."""
    return f"{how} " + (",".join(groups) if groups else "all groups") + (f" on {','.join(hosts)}" if hosts else "")


def _raise_lost(site: Site, fails: list, how: str, part: list[ServerAction], rec: dict, why: str,
                groups: list[str] | None, hosts: list[str] | None) -> None:
    """After a failed gate: nothing when every host answers. Else a host was lost (no verdict on
    the servers, :mod:`dsv4ctl.deploy.netloss`): every host that answers is closed (result
    ``unreachable``), the locks that can go are dropped, and RemoteError (exit 3) names the lost
    hosts, the locks left and the command that runs it again."""
    import shlex
    from ..errors import RemoteError
    from .engine import close_all, release_locks
    from .netloss import locks_text, lost_in_gate, probe, profile_arg, with_break_lock
    lost = {**lost_in_gate(fails), **probe(site)}
    if not lost:
        return
    close_all(site, {**rec, "result": "unreachable", "detail": f"{how}: health gate: {why}"[:2000]})
    release_locks(site)
    names = sorted(lost)
    again = f"dsv4ctl {how} {profile_arg(site)}" + "".join(f" -g {shlex.quote(g)}" for g in groups or []) \
        + "".join(f" --host {shlex.quote(h)}" for h in hosts or [])
    raise RemoteError(f"{how} of {', '.join(a.server for a in part)} stopped during the health gate: "
                      f"{', '.join(names)} cannot be reached ({lost[names[0]]}); a lost host is no verdict on the "
                      f"servers; {locks_text(site)}. When {', '.join(names)} answer{'s' if len(names) == 1 else ''} "
                      f"again: {with_break_lock(site, again)}")


def _lock(site: Site, opts, what: str) -> None:
    """Take every host's deploy lock (``what`` names the run); a dry run only reads the facts,
    refuses held locks and uses the dry-run token."""
    from .engine import acquire_locks, refuse_held_locks
    from .site import gather_facts
    from .steps import DRY_RUN_TOKEN
    if opts.dry_run:
        gather_facts(site)
        refuse_held_locks(site)
        site.token = DRY_RUN_TOKEN
    else:
        acquire_locks(site, what)


def _one_release_each(actions: list[ServerAction], rid_of: dict[str, str]) -> None:
    """RemoteError (exit 3) for a server whose hosts run different releases (or none)."""
    from ..errors import RemoteError
    for a in actions:
        rids = {rid_of.get(h) for h in (*a.start, *a.stop)}
        if None in rids or len(rids) > 1:
            raise RemoteError(f"{a.server}: its hosts run different releases ("
                              + ", ".join(f"{h}: {rid_of.get(h) or 'none'}" for h in dict.fromkeys((*a.stop, *a.start)))
                              + "): deploy or roll back so that every node runs one")


def _stages(site: Site, how: str, spec: dict, rid_of: dict, spec_of: dict, actions: list[ServerAction],
            batch: int | None) -> tuple[list, list[tuple[list[ServerAction], list]]]:
    """(every step, [(batch, its steps)]): per batch its stops and starts and — unless ``how`` is
    stop — the health gate of the batch's groups plus the routers."""
    from .steps import gate_steps
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
    return steps, stages


def _detail(how: str, actions: list[ServerAction]) -> str:
    """The audit's one-line outcome of a run that does ``actions``."""
    done = ", ".join(f"{a.server} ({a.why})" if how == "start" else a.server for a in actions)
    return (f"{'stopped' if how == 'stop' else how + 'ed'} {done}" if actions else
            f"nothing to {how}: " + ("every selected server runs" if how == "start" else "no server selected"
                                     if how == "restart" else "no selected server runs"))


def _run_stage(site: Site, how: str, actions: list[ServerAction], stages: list, index: int, rec: dict,
               groups, hosts, pending: list) -> None:
    """Run batch ``stages[index]``: its stops, then (only if every stop ran) its starts, then its
    gate. ``pending`` holds the starts an interrupt must still run (emptied once they begin).
    RemoteError (exit 3) for a failed stop/start or a lost host, GateFailed (exit 1) for an
    unhealthy server; every host's audit is closed first."""
    from ..errors import GateFailed, RemoteError
    from .engine import close_all, failure_text, run_gate, run_server_steps
    part, st = stages[index]
    if how != "stop":
        pending[:] = [s for s in st if s.phase == "start"]
    errors = run_server_steps(site, [s for s in st if s.phase == "stop"])
    if not errors:
        # every host's start runs to its end once begun (an interrupt waits for
        # it): from here on nothing is left to start again
        pending[:] = []
        errors = run_server_steps(site, [s for s in st if s.phase == "start"])
    if errors:
        why = "; ".join(errors)
        close_all(site, {**rec, "result": "failed", "detail": f"{how}: {why}"[:2000]})
        raise RemoteError(f"{how} of {', '.join(a.server for a in part)} failed: {why}")
    gates = [s for s in st if s.phase == "gate"]
    fails = run_gate(site, gates) if gates else []
    if fails:
        why = failure_text(site, fails)
        _raise_lost(site, fails, how, part, rec, why, groups, hosts)
        close_all(site, {**rec, "result": "failed", "detail": f"{how}: health gate: {why}"[:2000]})
        rest = len(actions) - sum(len(p) for p, _ in stages[:index + 1])
        raise GateFailed(f"{how} of {', '.join(a.server for a in part)}: not healthy: {why}"
                         + (f" ({rest} later server(s) left as they were)" if rest else ""))


def _run(site: Site, opts, how: str, actions: list[ServerAction], stages: list, rec: dict, groups, hosts) -> None:
    """Every batch in order (:func:`_run_stage`). On an interrupt between a batch's stop and its
    start the stopped servers are started again (not gated), the audits closed ``interrupted``
    and the interrupt raised again."""
    from .engine import close_all, run_server_steps
    pending: list = []        # started after an interrupt: a stop never leaves a server down
    try:
        for i in range(len(stages)):
            _run_stage(site, how, actions, stages, i, rec, groups, hosts, pending)
    except KeyboardInterrupt:
        again = ""
        if pending:      # interrupted between its stop and its start: start it again
            from ..remote.transport import signals_held
            with signals_held():
                errs = run_server_steps(site, pending)
            names = ", ".join(s.extra["started"] for s in pending)
            again = (f"; started again (not gated): {names}" if not errs else
                     f"; could not start again: {'; '.join(errs)}")
            opts.log(f"interrupted: {again[2:]}")
        close_all(site, {**rec, "result": "interrupted", "detail": f"interrupted during {how}{again}"})
        raise


def _locked(site: Site, opts, how: str, groups, hosts, batch) -> dict:
    """The run under the locks (:func:`lifecycle` without the locking): plan, then the dry run's
    report or the run's."""
    from ..errors import RemoteError
    from .engine import run_close
    from .steps import close_step
    spec, rid_of, spec_of = _active_spec(site)
    select(site, spec, groups, hosts)
    alive = read_alive(site, spec, [h for h in site.nodes if h in rid_of])
    actions = plan_servers(spec, alive, how, groups, hosts)
    _one_release_each(actions, rid_of)
    steps, stages = _stages(site, how, spec, rid_of, spec_of, actions, batch)
    detail = _detail(how, actions)
    rec = {"action": how, "release": ",".join(sorted(set(rid_of.values()))) or None,
           "groups": sorted({a.group for a in actions}),
           **({"message": opts.message} if opts.message else {})}
    closes = [close_step(site, h, {**rec, "result": "ok", "detail": detail}) for h in site.hosts]
    report = {"schema": "dsv4ctl.lifecycle/1", "action": how, "dry_run": opts.dry_run,
              "servers": [{"server": a.server, "group": a.group, "stop": list(a.stop), "start": list(a.start),
                           "why": a.why} for a in actions]}
    if opts.dry_run:
        from .steps import listing, lock_step
        locks = [lock_step(site, h, _what(how, groups, hosts)) for h in site.hosts]
        return {**report, "actions": [detail] + listing(locks + steps + closes),
                "steps": [s.to_dict() for s in locks + steps + closes]}
    if opts.steps is not None:
        from .steps import RunSteps
        opts.steps(RunSteps(site.locked_steps + steps + closes, []))
    opts.log(detail)
    _run(site, opts, how, actions, stages, rec, groups, hosts)
    run_close(site, closes)
    if site.close_errors:
        h, why = sorted(site.close_errors.items())[0]
        raise RemoteError(f"{how} done ({detail}), but recording it failed on {h}: {why}; "
                          "free space on the host, then check with dsv4ctl audit")
    return {**report, "result": "ok", "detail": detail}


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
    from .engine import release_locks
    from .site import open_site
    site = open_site(profile, opts)
    try:
        _lock(site, opts, _what(how, groups, hosts))
        try:
            return _locked(site, opts, how, groups, hosts, batch)
        finally:
            if not opts.dry_run:
                release_locks(site)
    finally:
        site.close()
