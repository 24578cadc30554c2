"""Deploy / rollback execution: runs the steps :mod:`dsv4ctl.deploy.steps` builds, in order, on
the hosts' transports. ``--dry-run`` prints the same steps and runs none.

1. **lock** every host (``mkdir <root>/.lock``; a held lock fails fast naming the holder), its
   facts read in the same round trip;
2. **push** the release to ``releases/.incoming-<id>``, verified and renamed on the host
   (:mod:`dsv4ctl.deploy.push`) — a host only ever holds complete releases under that name;
3. **switch** every host: groups stopped, ``previous``/``current`` re-pointed by rename(2), the
   new release's groups started through the service backend;
4. **gate**: every worker's ``/health``, then a 1-token chat completion through the router; on
   failure (or interrupt) every switched host goes back to the release it ran;
5. **close**: state (good/failed), prune to ``keep_releases``, audit line, unlock.

A push failure on any host stops the deploy before any host is switched, so all hosts stay on
the same (old) release."""

from __future__ import annotations

import hashlib
import json
import shlex
import threading
import time

from ..errors import EXIT_REMOTE, DsvError, GateFailed, RemoteError
from ..hosts import health
from ..hosts.audit import now_iso
from ..hosts.layout import HostFacts, choose_rollback_target, owner_conflict, parse_facts
from ..hosts.lock import LOCK_HELD_CODE, held_error, holder_text, release_cmd
from ..profile.deployment import as_deployment
from ..remote import run_parallel, who
from ..remote.ops import framed
from .push import kill_rsyncs, push_host, rsync_user_args
from .release import (Release, build_release, private_groups, launch_spec, release_environment, release_inputs,
                      resolve_base, sha256_file)
from .netloss import (UNREACHABLE, Activation, finish_command, locks_left, locks_text, lost_in_gate, lost_message,
                      probe, where_now, with_break_lock)
from .service import (check_reachable, gate_alive, gate_answering, gate_start_wait, keeps_job_records, log_tail_cmd,
                      service_for)
from .site import (Options, Site, api_key, gather_facts, health_timeout, open_site, progress_interval, raise_failed,
                   read_spec, state_doc)
from .steps import (DRY_RUN_TOKEN, RunSteps, Step, close_step, deploy_steps, lock_step, nothing_to_do, revert_steps,
                    rollback_steps)

__all__ = ["Options", "deploy", "rollback", "releases", "launch_spec", "release_inputs"]


def trace(site: Site, step: Step) -> None:
    """Report ``step`` as executed (``Options.trace``; tests compare it with the listing)."""
    if site.opts.trace is not None:
        site.opts.trace(step)


def step_done(site: Site, step: Step, seconds: float) -> None:
    """Record that ``step`` ended after ``seconds`` (the run's ``steps`` with ``duration_s``;
    ``Options.done``: the run log)."""
    site.durations.append((step, seconds))
    if site.opts.done is not None:
        site.opts.done(step, seconds)


def step_results(site: Site) -> list[dict]:
    """The steps this run executed and timed: phase, host, stage, summary, ``duration_s`` (wall
    time of the step on its host; a gate step: until its target answered, a chat step counted
    from the workers' health). In run order: (stage, phase) as they first ended, then hosts in
    profile order (hosts of one phase run in parallel and end in any order)."""
    first: dict = {}
    for s, _ in site.durations:
        first.setdefault((s.stage, s.phase), len(first))
    order = {h: i for i, h in enumerate(site.nodes)}
    timed = sorted(site.durations, key=lambda x: (first[(x[0].stage, x[0].phase)], order.get(x[0].host, len(order))))
    return [{"phase": s.phase, "host": s.host, "stage": s.stage, "summary": s.summary, "duration_s": round(d, 3)}
            for s, d in timed]


def run_host_step(site: Site, step: Step, *, timeout: float, input: bytes | None = None, check: bool = True):
    """Run a host step's command on its host's transport (the one place a step's command runs)."""
    trace(site, step)
    t0 = time.monotonic()
    try:
        return site.transports[step.host].run(step.cmd, input=input, timeout=timeout, check=check)
    finally:
        step_done(site, step, time.monotonic() - t0)


# -- lock --------------------------------------------------------------------------------------

def refuse_held_locks(site: Site) -> None:
    """A dry run says what the run would: a deploy lock another run or an operator holds is the
    run's LockHeld (exit 3, the same words and hint), unless ``--break-lock`` is given (the run
    then judges it under its own rules, :func:`acquire_locks`). Reads the facts already gathered."""
    if site.opts.break_lock:
        return
    for h in site.hosts:
        f = site.facts.get(h)
        if f is not None and f.lock:
            raise held_error(h, site.paths[h].lock, json.dumps(f.lock), can_break=site.opts.offers_break_lock,
                             profile=str(site.profile.path))


def _holder_now(t, lock: str, out: str) -> str:
    """The holder record of a held ``lock`` as the lock command printed it (``out``); when that
    names no process (the lock was taken an instant before, by a run that has not written its
    ``holder.json`` yet: another host's lock of this same run when the hosts share one deploy
    root), read once more after 0.5 s."""
    import time
    from ..hosts.lock import held_cmd, parse_holder
    if parse_holder(out).get("pid"):
        return out
    time.sleep(0.5)
    again = t.run(held_cmd(lock), check=False, timeout=30)
    return again.out if again.code == LOCK_HELD_CODE else out


def acquire_locks(site: Site, what: str) -> dict[str, HostFacts]:
    """Run every host's lock step (lock + facts in one round trip). A held lock → LockHeld
    (exit 3) naming its holder; locks taken so far are released. ``--break-lock`` removes a
    stale lock first (audited with the old holder: the facts are read first for that)."""
    import secrets
    site.token = secrets.token_hex(8)
    if site.opts.break_lock and not site.facts:
        gather_facts(site)
    if site.opts.break_lock:
        from ..hosts.lock import LockHeld, is_manual
        manual = [h for h in site.hosts if site.facts.get(h) and is_manual(site.facts[h].lock)]
        if manual:     # a lock taken by hand is not stale: only `lock release` removes it
            h = manual[0]
            raise LockHeld(f"{h}: --break-lock does not remove a lock taken by hand: {holder_text(site.facts[h].lock)}; "
                           f"dsv4ctl lock release {shlex.quote(str(site.profile.path))} when the work it names is done")
        from ..hosts.lock import holder_liveness
        for h in site.hosts:        # a run that still runs is no stale lock (lock release --force's rule)
            held = site.facts.get(h) and site.facts[h].lock
            state, why = holder_liveness(held) if held else ("", "")
            if state == "alive":
                raise LockHeld(f"{h}: --break-lock does not remove the lock of a run that still runs: "
                               f"{holder_text(held)}; {why} (stop it and it gives the lock back)")
    steps = {h: lock_step(site, h, what) for h in site.hosts}

    def lock(t):
        st = steps[t.name]
        r = run_host_step(site, st, timeout=120, check=False)
        p = site.paths[t.name]
        if r.code == LOCK_HELD_CODE:
            raise held_error(t.name, p.lock, _holder_now(t, p.lock, r.out), can_break=site.opts.offers_break_lock,
                             profile=str(site.profile.path))
        if r.code != 0:
            raise t.fail(r, f"lock {p.lock}")
        return parse_facts(t.name, p.root, r.out)

    # an interrupt lets every lock command finish (the caller's release_locks then sees them all)
    res = run_parallel(site.root_transports, lock, timeout=site.opts.connect_timeout + 120, finish_on_interrupt=True)
    site.locked_steps = list(steps.values())
    if not all(r.ok for r in res.values()):
        release_locks(site, [h for h, r in res.items() if r.ok])
        raise_failed(res, "locking")
    site.facts = {h: r.value for h, r in res.items()}
    site.share_facts()
    conflict = owner_conflict(site.facts, site.profile.name)
    if conflict is not None:            # another profile's root: give the locks back, change nothing
        release_locks(site)
        raise conflict
    try:
        check_reachable(site)           # where servers run answers (the Slurm controller), or nothing changes
    except BaseException:
        release_locks(site)
        raise
    return site.facts


def release_locks(site: Site, hosts: list[str] | None = None) -> None:
    """Drop the locks this run holds (only when the token matches); best effort. The hosts it
    reached join ``site.unlocked`` (the others' locks remain: :func:`netloss.locks_left`)."""
    hs = [h for h in (hosts if hosts is not None else site.hosts) if h not in site.unlocked]
    if not hs or not site.token:      # no token yet: this run has taken no lock (never match another's)
        return

    def unlock(t):
        t.run(release_cmd(site.paths[t.name].lock, site.token), timeout=30)
    res = run_parallel({h: site.transports[h] for h in hs}, unlock, timeout=60)
    site.unlocked |= {h for h, r in res.items() if r.ok}


# -- verify ------------------------------------------------------------------------------------

def run_verify(site: Site, steps: list[Step]) -> str:
    """Run verify steps (hosts in parallel; read only: an interrupt stops them at once). Returns
    "" when every target is intact, else the drift (or the error) per host, one line. A host
    with several steps (an image site: the release folder, then the release inside its image)
    runs them in rounds, one step per host each: every listed step runs."""
    rounds: list[list[Step]] = []
    seen: dict[str, int] = {}
    for s in steps:
        i = seen[s.host] = seen.get(s.host, -1) + 1
        if i == len(rounds):
            rounds.append([])
        rounds[i].append(s)
    return "; ".join(d for d in (_verify_round(site, r) for r in rounds) if d)


def _verify_round(site: Site, steps: list[Step]) -> str:
    """:func:`run_verify` of at most one step per host."""
    from .drift import drift_text, verify_releases
    by_host = {s.host: s for s in steps}

    def body(t):
        st = by_host[t.name]
        trace(site, st)
        t0 = time.monotonic()
        try:
            if st.extra.get("image"):           # the release inside its image (dsv4ctl.deploy.image)
                from .drift import parse_verify
                from .image import expected_image, verify_image_host
                r = verify_image_host(t, site, st.extra["rid"], expected_image(site, st.extra["rid"]))
                return parse_verify(t.name, r.code, r.out, r.err)
            return verify_releases(t, site.python[t.name], [site.paths[t.name].release(st.extra["rid"])])
        finally:
            step_done(site, st, time.monotonic() - t0)
    res = run_parallel({h: site.transports[h] for h in by_host}, body, timeout=site.opts.host_timeout)
    out = []
    for h, r in res.items():
        if not r.ok:
            out.append(f"{h}: {r.error}")
        elif drift_text(r.value):
            out.append(f"{h}: {drift_text(r.value)}")
    return "; ".join(out)


def run_envs(site: Site, steps: list[Step]) -> str:
    """Run environment steps (hosts in parallel; an interrupt stops each host's build at once:
    its process group is signalled, the build kills uv and removes its staging folder). Returns
    "" when every host has the environment, else ``host: why`` per failed host, ``; ``-joined
    (the last lines uv printed)."""
    if not steps:
        return ""
    by_host = {s.host: s for s in steps}

    def body(t):
        st = by_host[t.name]
        r = run_host_step(site, st, timeout=site.opts.host_timeout or 3600, check=False)
        if r.code != 0:
            tail = [ln.strip() for ln in (r.err or r.out).splitlines() if ln.strip()][-2:]
            raise RemoteError(f"building environment {st.extra['digest']} failed (exit {r.code})"
                              + (": " + " / ".join(tail)[:600] if tail else ""))
        return r.out.strip().splitlines()[-1:] == ["@env built"]
    res = run_parallel({h: site.transports[h] for h in by_host}, body, timeout=site.opts.host_timeout)
    for h, r in res.items():
        if r.ok and r.value:
            site.opts.log(f"{h}: built environment {by_host[h].extra['digest']}")
    return "; ".join(f"{h}: {r.error}" for h, r in res.items() if not r.ok)


def env_error(site: Site, rid: str, why: str, rec: dict, per_host: dict | None, action: str = "deploy") -> None:
    """After :func:`run_envs`: nothing when ``why`` is empty; else the run is closed as failed
    (no host was switched) and a RemoteError (exit 3) says which hosts could not build it."""
    if not why:
        return
    close_all(site, {**rec, "result": "failed", "detail": "environment: " + why[:1500]}, per_host=per_host)
    raise RemoteError(f"{action} of {rid} stopped before any host was switched: {why}")


def drift_error(rid: str, why: str) -> RemoteError:
    """The refusal of a switch onto a drifted release (exit 3). An environment that drifted is
    rebuilt from its lock by the next run once its folder is removed: the message says so."""
    env = (" An environment that drifted (env ...) is rebuilt from the release's lock by the next deploy or "
           "rollback once its folder is removed on that host: chmod -R u+w ROOT/envs/DIGEST && rm -rf "
           "ROOT/envs/DIGEST.") if " env " in f" {why}" or ": env " in why or ", env " in why else ""
    return RemoteError(f"release {rid} differs from its manifest (edited on the host?): {why}; no host was "
                       "switched (dsv4ctl verify lists the drift of every release)." + env)


# -- switch and gate ---------------------------------------------------------------------------

def run_switches(site: Site, steps: list[Step], switched: list[str]) -> dict[str, str]:
    """Run switch steps, hosts in parallel; an interrupt lets every host finish its switch.
    Appends each host that ran to ``switched`` (even when its command failed: it may be half
    switched). Returns {host: error} of the hosts whose switch failed."""
    lock = threading.Lock()
    by_host = {s.host: s for s in steps}

    def act(t):
        st = by_host[t.name]
        try:
            run_host_step(site, st, timeout=300)
            f = site.facts[t.name]
            f.current, f.previous = st.extra["rid"], st.extra["prev"]
        finally:
            with lock:
                switched.append(t.name)
    res = run_parallel({h: site.transports[h] for h in by_host}, act, timeout=site.opts.host_timeout,
                       finish_on_interrupt=True)
    return {h: r.error for h, r in res.items() if not r.ok}


def run_server_steps(site: Site, steps: list[Step]) -> list[str]:
    """Run ``steps``: every ``stop`` (hosts in parallel), then every ``start``. Returns the
    errors (one per failed host; the starts are not run after a failed stop)."""
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


def run_gate(site: Site, steps: list[Step], timeout: float | None = None) -> list:
    """Run the gate steps (:func:`dsv4ctl.hosts.health.gate`); [] = healthy. A worker whose
    process has exited fails at once (its service backend's alive command), as does a
    multi-node server when the process of any of its nodes has."""
    for s in steps:
        trace(site, s)
    workers, chat = [], []
    model = "default"
    for s in steps:
        h, g = s.host, s.extra["group"]
        alive = gate_alive(site, h, g, s.extra.get("nodes", []))
        tgt = health.Target(h, g, s.extra["url"], alive,
                            api_key(site.profile, g) if s.extra["kind"] == "chat" else None)
        if s.extra["kind"] == "health":
            workers.append(tgt)
        else:
            chat.append(tgt)
            model = s.extra["model"]
    wait = health_timeout(site) if timeout is None else timeout
    pending = gate_start_wait(site, steps, timeout, progress_interval())    # queue time is not start time
    if pending:
        return pending
    site.opts.log(f"health: waiting for {len(workers)} worker(s) and {len(chat)} chat target(s) "
                  f"(timeout {wait:g} s)")
    t0, ended, status = time.monotonic(), {}, {}
    ticker = _GateProgress(site, workers, ended, status, t0, wait)
    try:
        with ticker:
            fails = health.gate(workers, chat, wait, model, ended=ended, status=status)
        return fails or gate_answering(site, steps)      # with Slurm: the new job answers, not a leftover
    finally:
        t1 = max([ended[k] for k in ended if k[0] == "health"], default=t0)
        for s in steps:
            k = (s.extra["kind"], s.host, s.extra["group"])
            start = t0 if s.extra["kind"] == "health" else t1
            step_done(site, s, max(0.0, ended.get(k, time.monotonic()) - start))


class _GateProgress:
    """While a health gate waits: every :func:`progress_interval` s one line through
    ``site.opts.log`` (nothing with ``-q``) — N/M workers ready, elapsed / timeout, and for each
    worker still waiting its host, what its /health says and the last line of its server log."""

    def __init__(self, site: Site, workers: list, ended: dict, status: dict, t0: float, wait: float):
        self.site, self.workers, self.ended, self.status, self.t0, self.wait = site, workers, ended, status, t0, wait
        self.stop = threading.Event()
        self.thread = None

    def __enter__(self):
        if self.workers:
            self.thread = threading.Thread(target=self._run, daemon=True, name="gate-progress")
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        return False

    def _run(self) -> None:
        every = progress_interval()
        while not self.stop.wait(every):
            waiting = [t for t in self.workers if ("health", t.host, t.group) not in self.ended]
            if not waiting or self.stop.is_set():
                return
            parts = []
            for t in waiting:
                tail = log_tail(self.site, t.host, t.group, 1)
                parts.append(f"{t.group} on {t.host}: {self.status.get((t.host, t.group), 'no answer yet')}"
                             + (f", log: {tail[-1][:160]}" if tail else ""))
            if self.stop.is_set():
                return
            self.site.opts.log(f"health: {len(self.workers) - len(waiting)}/{len(self.workers)} worker(s) ready, "
                               f"{time.monotonic() - self.t0:.0f} s of {self.wait:g} s; " + "; ".join(parts))


def dead_servers(site: Site, gates: list[Step]) -> str:
    """After a failed check: the failure text (:func:`failure_text`) of every node whose server
    process has exited, over the servers of the gate steps ``gates``, or "" when all run. A server that died while it was being checked is a verdict on the release, not a
    check that could not run."""
    from types import SimpleNamespace
    out = []
    for s in gates:
        if s.extra.get("kind") != "health":
            continue
        g = s.extra["group"]
        nodes = [s.host, *s.extra.get("nodes", [])]
        for rank, h in enumerate(nodes):
            cmd = service_for(site, h).alive_cmd(site.paths[h], g)
            if site.transports[h].run(cmd, check=False, timeout=30).code != 0:
                what = (f"the server process of node {rank} (of {len(nodes)}) exited" if len(nodes) > 1
                        else "the server process exited")
                out.append(SimpleNamespace(host=h, group=g, reason=what))
    return failure_text(site, out) if out else ""


def log_tail(site: Site, host: str, group: str, n: int = 8) -> list[str]:
    try:
        r = site.transports[host].run(log_tail_cmd(site.paths[host], group, n), check=False, timeout=30)
        return [ln for ln in r.out.splitlines() if ln.strip() and not ln.startswith("=== dsv4ctl start")]
    except DsvError:
        return []


def failure_text(site: Site, fails: list) -> str:
    """``host H group G: reason; last log lines: ...`` per failure (no log of a host not reached)."""
    out = []
    for fl in fails:
        if str(fl.reason).startswith(UNREACHABLE):
            out.append(f"host {fl.host} group {fl.group}: {fl.reason}")
            continue
        tail = log_tail(site, fl.host, fl.group)
        out.append(f"host {fl.host} group {fl.group}: {fl.reason}; last log lines: "
                   + (" | ".join(tail[-5:]) if tail else "(empty log)"))
    return "; ".join(out)


def switch_with_gate(site: Site, switches: list[Step], gates: list[Step], reverts: list[Step]) -> Activation:
    """Run ``switches``, then ``gates``. On a failure or an interrupt the hosts that switched run
    their ``reverts`` step (back on the release they ran, restarted) and the old release is
    gated again (the outcome is added to the reason). A host that cannot be reached
    (:mod:`dsv4ctl.deploy.netloss`) makes the failure no verdict: it is in ``lost``, a host that
    could not be put back in ``stranded``, and the old release is gated only on the servers whose
    every node answers. Returns an :class:`~dsv4ctl.deploy.netloss.Activation`."""
    switched: list[str] = []
    back = {s.host: s for s in reverts}
    fails: list = []
    try:
        errors = run_switches(site, switches, switched)
        if errors:
            reason, phase = "activation failed: " + "; ".join(errors.values()), "activation"
        else:
            fails = run_gate(site, gates)
            if not fails:
                return Activation(True)
            reason, phase = failure_text(site, fails), "health gate"
    except KeyboardInterrupt:
        revert(site, [back[h] for h in switched])
        wait_restored(site, [back[h] for h in switched])
        raise
    except BaseException:
        revert(site, [back[h] for h in switched])
        raise
    lost = {**lost_in_gate(fails), **probe(site)}
    act = Activation(False, reason, phase, verdict=not lost, lost=lost)
    act.stranded = revert(site, [back[h] for h in switched])
    act.unsure = {h for h in errors if h in act.stranded}     # switched or not: never confirmed
    act.lost.update(probe(site, [h for h in act.stranded if h not in act.lost]))
    old_gate = revert_gate(site, [back[h] for h in switched], act.lost)
    if old_gate:
        fails = run_gate(site, old_gate)
        again = "healthy again" + (" on the servers whose hosts answer" if act.lost else "")
        act.why += (f" (the previous release is {again})" if not fails else
                    f" (after rolling back, still unhealthy: {failure_text(site, fails)})")
    return act


def revert(site: Site, steps: list[Step]) -> dict[str, str]:
    """Run revert (switch-back) steps; failures are logged and returned ({host: error}: those
    hosts could not be put back)."""
    site.opts.log(f"rolling back {', '.join(sorted(s.host for s in steps)) or 'no host'} to the previous release")
    errors = run_switches(site, steps, [])
    if errors:
        site.opts.log("rollback failed on: " + "; ".join(errors.values()))
    return errors


#: How long an interrupted run waits for the release it put back to be healthy (s, at most).
RESTORE_WAIT_S = 120.0


def wait_restored(site: Site, reverts: list[Step]) -> str:
    """After an interrupt put ``reverts``' hosts back: wait (at most ``RESTORE_WAIT_S`` s, or the
    health timeout when shorter) for the restored release's gate and say so; a second interrupt
    stops waiting. The outcome goes to ``site.restored`` (the close record's detail adds it)."""
    gates = revert_gate(site, reverts)
    if not gates:
        site.restored = ""
        return ""
    t = min(health_timeout(site), RESTORE_WAIT_S)
    site.opts.log(f"interrupted: waiting up to {t:g} s for the restored release to be healthy "
                  "(interrupt again to stop waiting)")
    try:
        fails = run_gate(site, gates, timeout=t)
    except KeyboardInterrupt:
        site.restored = "restored release not waited for (second interrupt)"
        site.opts.log(site.restored)
        return site.restored
    site.restored = ("restored release healthy" if not fails
                     else f"restored release not healthy after {t:g} s: {failure_text(site, fails)}")
    site.opts.log(site.restored)
    return site.restored


def revert_gate(site: Site, reverts: list[Step], lost=()) -> list[Step]:
    """The gate of the release the reverted hosts run again (none when they ran nothing). With
    hosts ``lost``: only the health of the servers whose every node answers (no chat through
    the router: a server with a lost node cannot serve it)."""
    from .steps import gate_steps
    spec = next((site.facts[s.host].current_launch for s in reverts if site.facts[s.host].current_launch), None)
    gates = gate_steps(site, spec) if spec else []
    if not lost:
        return gates
    return [s for s in gates if s.extra["kind"] == "health" and not {s.host, *s.extra.get("nodes", [])} & set(lost)]


# -- close -------------------------------------------------------------------------------------

def run_close(site: Site, steps: list[Step]) -> dict[str, list[str]]:
    """Run close steps (hosts in parallel): apply the step's release event
    (:func:`dsv4ctl.deploy.states.transition`, timed now) and pruning to the host's state document,
    send it on stdin. Returns {host: pruned ids}; failures are logged and kept in
    ``site.close_errors`` (a success path turns them into exit 3: :func:`raise_close_errors`)."""
    from .states import transition
    by_host = {s.host: s for s in steps}
    at, by = now_iso(), who()

    def body(t):
        st = by_host[t.name]
        f = site.facts[t.name]
        if st.extra.get("event"):
            rid, ev, info = st.extra["event"]
            recs = f.state.setdefault("releases", {})
            recs[rid] = transition(recs.get(rid), ev, at=at, by=by, force_failed=site.opts.force_failed,
                                   rid=rid, host=t.name, **info)
        for r in st.extra.get("prune", []):
            f.releases.pop(r, None)
            f.state.get("releases", {}).pop(r, None)
        run_host_step(site, st, input=framed(state_doc(f)), timeout=900)
        return st.extra.get("prune", [])
    res = run_parallel({h: site.transports[h] for h in by_host}, body, timeout=960)
    for h, r in res.items():
        if not r.ok:
            site.opts.log(f"warning: {r.error}")
            site.close_errors[h] = r.error
    site.unlocked |= {h for h, r in res.items() if r.ok}     # the others: release_locks tries again
    return {h: (r.value if r.ok else []) for h, r in res.items()}


def raise_close_errors(site: Site, rid: str, again: str = "run the same command again") -> None:
    """RemoteError (exit 3) when a success close-out failed on a host (a full disk, or the host
    cannot be reached): the release runs there but its state and audit record could not be
    written (the old state.json stays). A host that does not answer is named as such, with the
    lock left there and ``again`` (how to run the command again) with ``--break-lock``."""
    if not site.close_errors:
        return
    h, why = sorted(site.close_errors.items())[0]
    more = f" (and {len(site.close_errors) - 1} more host(s))" if len(site.close_errors) > 1 else ""
    release_locks(site)
    lost = probe(site, sorted(site.close_errors))
    if lost:
        raise RemoteError(f"{rid} is running, but {', '.join(lost)} cannot be reached to record it ({lost[min(lost)]}): "
                          f"its state and audit record were not written there; {locks_text(site)}. When "
                          f"{', '.join(lost)} answer{'s' if len(lost) == 1 else ''} again: "
                          + with_break_lock(site, again))
    raise RemoteError(f"{rid} is running, but recording the outcome failed on {h}{more}: {why}; "
                      "free space on the host, then run the same command again")


def raise_lost(site: Site, act: Activation, head: str, rid: str, record: dict, finish: str,
               per_host: dict | None = None) -> None:
    """Nothing when ``act`` is a verdict (every host answered when it failed). Else a host was
    lost: close every host that answers with ``record`` (result ``unreachable``) and the
    ``interrupted`` event on ``rid`` (its state is kept: not marked failed), drop the locks that
    can be dropped, and RemoteError (exit 3): :func:`netloss.lost_message` with ``finish``."""
    if act.verdict:
        return
    lost = "; ".join(act.lost.values())
    close_all(site, {**record, "result": "unreachable", "detail": f"{act.phase}: {lost}; {act.why}"[:2000]},
              event=(rid, "interrupted", {"interrupted_during": act.phase, "fault": f"unreachable: {lost}"[:1000]}),
              per_host=per_host)
    release_locks(site)
    raise RemoteError(lost_message(site, head, act, finish, rid))


def raise_gate_failed(site: Site, act: Activation, head: str, back: str, finish: str, code: int | None = None) -> None:
    """After a verdict's close-out: GateFailed naming where every host is. When a host could not
    be put back or a lock could not be dropped (exit 3): where each host is, the locks left and
    ``finish``; else ``head`` + ``back`` (exit ``code``, default 1)."""
    release_locks(site)
    if not act.stranded and not locks_left(site):
        raise GateFailed(f"{head}{back}: {act.why}", code)
    stuck = sorted(set(act.stranded) | set(locks_left(site)))
    why = act.stranded.get(stuck[0]) or site.close_errors.get(stuck[0]) or "its lock could not be dropped"
    raise GateFailed(f"{head} failed its {act.phase}, but not every host was put back ({why}). Hosts now: {where_now(site, act)}; "
                     f"{locks_text(site)}. When {', '.join(stuck)} answer{'s' if len(stuck) == 1 else ''} again: "
                     f"{with_break_lock(site, finish)}. Gate: {act.why}", EXIT_REMOTE)


def close_all(site: Site, record: dict, *, event: tuple | None = None, cleanup: str | None = None,
              per_host: dict[str, dict] | None = None) -> dict[str, list[str]]:
    """Close every host with ``record`` (+ ``per_host`` fields), the release ``event`` and no
    pruning: the failure and interrupt paths, whose record says what went wrong."""
    steps = [close_step(site, h, {**record, **(per_host or {}).get(h, {})}, event=event, cleanup=cleanup)
             for h in site.hosts]
    return run_close(site, steps)


# -- deploy ------------------------------------------------------------------------------------

def deploy(profile, opts: Options, *, tree=None, base_ref=None, patches=None, promote=None) -> dict:
    """Build, push, activate, gate. Returns a report dict (``dsv4ctl.deploy/1``).

    ``promote`` (a :class:`dsv4ctl.deploy.promote.PromoteOptions`) turns on the promotion
    pipeline of :mod:`dsv4ctl.deploy.promote`: preflight before anything, then canary, checks,
    the rest, ``good``. Raises InputError (bad inputs, nothing changed), RemoteError (a host
    failed before any switch, or locks: a held lock refuses before the release is built),
    VerdictError (a preflight plan failed), GateFailed (a subclass: the gate or a promotion
    check failed; every switched host was rolled back)."""
    t_start = time.monotonic()
    rsync_user_args()
    dep = as_deployment(profile)
    tree_p, base_ref, pl, configs, spec, ident = release_inputs(dep, tree, base_ref, patches)
    if dep.sglang.image is not None:
        from .image import check_base
        check_base(dep.sglang.image)
    pre = None
    if promote is not None:
        # what the release is built from, for the upgrade gate (a dry run builds in a throw-away folder)
        promote.built_from = {"base_commit": resolve_base(tree_p, base_ref),
                              "patches": [[p.name, sha256_file(p)] for p in pl], "series": ident}
        promote.prepare(dep, opts.log)
    elif opts.preflight:
        from .preflight import preflight
        pre = preflight(dep)
        opts.log(f"preflight: {pre['summary']}")
    site = open_site(dep, opts)
    try:
        if opts.dry_run or not opts.break_lock:
            # a held lock refuses before anything is built (the lock step below takes it for real)
            gather_facts(site)
            refuse_held_locks(site)
        if dep.sglang.image is not None:       # the hosts can give the containers their GPUs
            from .image import gpu_preflight
            gpu_preflight(site, spec)
        if opts.dry_run:
            rid = _trial_build(tree_p, base_ref, pl, configs, spec, ident, opts, release_environment(dep))
            refuse(site, rid, promote is not None)
            site.token = DRY_RUN_TOKEN
            servers = None
            if promote is None and nothing_to_do(site, rid):
                from .servers import converge_steps
                servers = converge_steps(site, rid, spec)[1]
            run = promote.steps(site, rid, spec, locked=False) if promote is not None else \
                deploy_steps(site, rid, spec, locked=False, extra=_record_extras(site, rid, promote), servers=servers)
            doc = {"schema": "dsv4ctl.deploy/1", "dry_run": True, "release": rid,
                   "actions": run.lines(), "steps": [s.to_dict() for s in run.steps],
                   "on_failure": [s.to_dict() for s in run.on_failure]}
            if promote is not None:
                doc["promote"] = True
                pre = promote.preflight
            from .image import gpu_preflight_lines
            doc["actions"] = ([f"preflight: {pre['summary'] if pre else 'skipped (--no-preflight)'}"]
                              + gpu_preflight_lines(site, spec) + doc["actions"])
            return doc
        t_build = time.monotonic()
        rel = build_release(tree_p, base_ref, pl, configs, spec, cache=opts.cache, who=who(), series_identity=ident,
                            private=private_groups(dep), environment=release_environment(dep))
        opts.build_seconds = round(time.monotonic() - t_build, 3)
        opts.log(f"built {rel.id}: base {base_ref} ({rel.meta['base_commit'][:12]}), {len(pl)} patch(es), "
                 f"{len(rel.files)} files, {rel.bytes / 2**20:.1f} MiB")
        try:       # release_locks only drops locks holding this run's token: safe whatever happened
            acquire_locks(site, f"deploy {rel.id}")
            refuse(site, rel.id, promote is not None)
            return _deploy_locked(site, rel, t_start, promote)
        finally:
            release_locks(site)
    finally:
        site.close()


def _trial_build(tree_p, base_ref, pl, configs, spec, ident, opts: Options, environment: bytes | None = None) -> str:
    """The id of the release a run would build. A dry run proves the release builds (every patch
    applies) the way the run will build it: a checked release of the same inputs in the local
    cache is proof; otherwise it is built in a throw-away folder (the cache is not touched; the
    build is deterministic, so the id is the run's). InputError (exit 2) naming the patch that
    does not apply."""
    import tempfile
    from pathlib import Path
    from .release import cached_build, default_cache, input_key
    key = input_key(resolve_base(tree_p, base_ref), [(p.name, sha256_file(p)) for p in pl],
                    {g: hashlib.sha256(b).hexdigest() for g, b in configs.items()}, spec, ident)
    rel = cached_build(Path(opts.cache or default_cache()), key)
    if rel is not None:
        return rel.id
    with tempfile.TemporaryDirectory(prefix="dsv4ctl-dry-run-") as tmp:
        return build_release(tree_p, base_ref, pl, configs, spec, cache=Path(tmp) / "releases", series_identity=ident,
                             environment=environment).id


def refuse(site: Site, rid: str, gated: bool, how: str = "deploy") -> None:
    """Refused (exit 1, nothing changed) when ``rid`` is recorded as failed on a host and neither a
    promotion gate (``gated``) nor ``--force-failed`` lets it run again."""
    from .states import Refused, refusals
    bad = [] if gated else refusals(site.facts, rid, site.opts.force_failed)
    if bad:
        hint = "gate it again with deploy --promote, or" if how == "deploy" else "or"
        raise Refused(bad[0] + f"; {hint} activate it anyway with --force-failed (recorded; it stays active, "
                      "never good)" + (f" (+{len(bad) - 1} more host(s))" if len(bad) > 1 else ""))


def _announce(site: Site, run: RunSteps) -> None:
    """Hand the run's full step list (the lock steps it ran, then the rest) to ``Options.steps``."""
    if site.opts.steps is not None:
        site.opts.steps(RunSteps(site.locked_steps + run.steps, run.on_failure))


def _deploy_locked(site: Site, rel: Release, t_start: float, promote=None, *, action: str = "deploy",
                   restart: frozenset | None = None, record: dict | None = None) -> dict:
    """A deploy (or ``action``) of built release ``rel`` under the locks: the run's steps announced,
    then either the converging run (``rel`` already active everywhere: verify, start what does not
    run) or ship (:func:`_ship`) and then the promotion pipeline or activation (:func:`_activate`).
    The ``dsv4ctl.deploy/1`` report; errors as :func:`deploy`."""
    opts = site.opts
    report = {"schema": "dsv4ctl.deploy/1", "release": rel.id, "base_ref": rel.meta["base_ref"],
              "base_commit": rel.meta["base_commit"], "files": len(rel.files), "bytes": rel.bytes,
              "build_seconds": getattr(opts, "build_seconds", None),
              "hosts": {h: {"from": site.facts[h].current} for h in site.hosts}}
    old_current = {h: site.facts[h].current for h in site.hosts}
    frm = {h: {"from": c} for h, c in old_current.items()}
    extra = {**_record_extras(site, rel.id, promote), **(record or {})}
    base_rec = {"action": action, "release": rel.id, **extra}
    spec = json.loads((rel.path / "launch.json").read_text())
    converge = promote is None and nothing_to_do(site, rel.id)
    started, servers = [], None
    if converge:
        from .servers import converge_steps
        started, servers = converge_steps(site, rel.id, spec)
    run = promote.steps(site, rel.id, spec) if promote is not None else \
        deploy_steps(site, rel.id, spec, extra=extra, action=action, restart=restart, servers=servers)
    _announce(site, run)
    if converge:
        return _converge(site, rel.id, run, started, base_rec, frm, report, t_start)
    _ship(site, rel, run, base_rec, frm, report)
    if promote is not None:
        return promote.run_locked(site, rel, spec, run, report, frm, t_start)
    return _activate(site, rel.id, spec, run, action, restart, base_rec, frm, old_current, report, t_start)


def _converge(site: Site, rid: str, run: RunSteps, started: list, base_rec: dict, frm: dict, report: dict,
              t_start: float) -> dict:
    """``rid`` is already the active release on every host: its environments checked, the hosts
    verified against its manifest (drift: the audits closed ``failed``, exit 3), the servers that
    do not run started (``started``), the audits closed. The report: nothing pushed or pruned."""
    env_error(site, rid, run_envs(site, run.of("env")), base_rec, frm)
    drift = run_verify(site, run.of("verify"))
    if drift:
        close_all(site, {**base_rec, "result": "failed", "detail": "verify: " + drift[:1500]}, per_host=frm)
        raise drift_error(rid, drift)
    if started:
        _start_active(site, rid, run, started, base_rec, frm)
    else:
        site.opts.log(f"{rid} is already the active release on every host, matches its manifest and every "
                      "server runs: nothing to do")
    run_close(site, run.of("close"))
    raise_close_errors(site, rid)
    report.update(result="ok", unchanged=not started, started=[a.server for a in started],
                  steps=step_results(site), seconds=round(time.monotonic() - t_start, 3))
    for h in site.hosts:
        report["hosts"][h].update(push={"skipped": True, "bytes_sent": 0, "files_transferred": 0}, pruned=[])
    return report


def _push_all(site: Site, rel: Release, run: RunSteps, base_rec: dict, frm: dict, report: dict) -> None:
    """Push ``rel`` to every host in parallel (each push step traced and timed; an interrupt stops
    the rsyncs and waits for every push thread). A failed push: the audits closed ``failed``,
    the pushed release cleaned up, RemoteError (exit 3, no host switched). Adds each host's push
    result and ``push_seconds`` to ``report``."""
    opts = site.opts
    pushes = {s.host: s for s in run.of("push")}
    t0 = time.monotonic()

    def push(t):
        trace(site, pushes[t.name])
        t1 = time.monotonic()
        try:
            return push_host(t, site, rel)
        finally:
            step_done(site, pushes[t.name], time.monotonic() - t1)
    with _stop_pushes_on_interrupt():
        # an interrupt stops the rsyncs at once, then waits for every push thread to end
        # (each tells its host-side script to give up): the close-out must not race them
        res = run_parallel(site.root_transports, push, timeout=opts.host_timeout, finish_on_interrupt=True)
    report["push_seconds"] = round(time.monotonic() - t0, 3)
    bad = [r for r in res.values() if not r.ok]
    if bad:
        why = "; ".join(r.error for r in bad)
        close_all(site, {**base_rec, "result": "failed", "detail": "push: " + why[:1500]}, cleanup=rel.id,
                  per_host=frm)
        raise RemoteError(f"deploy of {rel.id} stopped before any host was switched: push failed on {why}")
    for h, r in res.items():
        report["hosts"][h]["push"] = r.value
        opts.log(f"{h}: " + ("release already present" if r.value["skipped"] else
                             f"pushed {r.value['files_transferred']} files, {r.value['bytes_sent']:,} bytes sent, "
                             f"verified ({r.value['hashed']} hashed) in {r.value['seconds']:.1f} s"))


def _ship(site: Site, rel: Release, run: RunSteps, base_rec: dict, frm: dict, report: dict) -> None:
    """Everything before the switch, in order: push (:func:`_push_all`), the environments, the
    images, verify against the manifest. A failure closes the audits ``failed`` and raises (exit
    3, no host switched); an interrupt kills the rsyncs, closes them ``interrupted`` naming the
    phase, cleans up the release and raises again."""
    phase = "push"
    try:
        _push_all(site, rel, run, base_rec, frm, report)
        phase = "environment build"
        env_error(site, rel.id, run_envs(site, run.of("env")), base_rec, frm)
        phase = "image"
        from .image import run_images
        shipped = run_images(site, rel, run.of("image"), trace, step_done, _stop_pushes_on_interrupt)
        if shipped:
            close_all(site, {**base_rec, "result": "failed", "detail": "image: " + shipped[:1500]}, per_host=frm)
            raise RemoteError(f"deploy of {rel.id} stopped before any host was switched: image {shipped}")
        phase = "verify"
        drift = run_verify(site, run.of("verify"))
        if drift:
            close_all(site, {**base_rec, "result": "failed", "detail": "verify: " + drift[:1500]}, per_host=frm)
            raise drift_error(rel.id, drift)
    except KeyboardInterrupt:
        kill_rsyncs()
        close_all(site, {**base_rec, "result": "interrupted", "detail": f"interrupted during {phase}; no host switched"},
                  cleanup=rel.id, per_host=frm)
        raise


def _activate(site: Site, rid: str, spec: dict, run: RunSteps, action: str, restart: frozenset | None,
              base_rec: dict, frm: dict, old_current: dict, report: dict, t_start: float) -> dict:
    """Switch every host to ``rid`` and gate on health, rolling back on a failed gate or an
    interrupt (audits closed ``rolled-back`` / ``interrupted``, the release's event recorded). A
    lost host: RemoteError (exit 3) naming the command that finishes; an unhealthy server:
    GateFailed (exit 1). Then the release is marked active and the audits closed (the report)."""
    t_act = time.monotonic()
    try:
        act = switch_with_gate(site, run.of("switch"), run.of("gate"),
                               revert_steps(site, site.hosts, rid, spec, restart=restart))
    except KeyboardInterrupt:
        close_all(site, {**base_rec, "result": "interrupted", "detail": "interrupted during activation; rolled back"
                         + (f"; {site.restored}" if site.restored else "")},
                  event=(rid, "interrupted", {"interrupted_during": "activation"}),
                  per_host=frm)
        raise
    if not act.ok:
        olds = {o for o in old_current.values()}
        finish = finish_command(site, action, next(iter(olds)) if len(olds) == 1 else None)
        raise_lost(site, act, f"{action} of {rid} stopped", rid, base_rec, finish, frm)
        close_all(site, {**base_rec, "result": "rolled-back", "detail": act.why[:2000]},
                  event=(rid, "failed", {"failed_check": "health gate", "failure": act.why[:1000]}), per_host=frm)
        back = sorted({o or "(none)" for o in olds})
        raise_gate_failed(site, act, f"{action} of {rid}",
                          f" rolled back to {', '.join(back)} on all hosts ({', '.join(site.hosts)})", finish)
    report["activate_seconds"] = round(time.monotonic() - t_act, 3)
    return finish_good(site, rid, run.of("close"), report, t_start, f"run the same {action} again",
                       run.of("image-prune"))


def _start_active(site: Site, rid: str, run: RunSteps, started: list, base_rec: dict, frm: dict) -> None:
    """The active release ``rid`` with servers not running (``started``: their actions): run the
    start steps, then the whole health gate. A start that fails → RemoteError (exit 3); a gate
    that fails → GateFailed (exit 1): the release is not marked failed (it passed its gate when
    it was activated; a dead server is more often the host than the release). Either way, and on
    an interrupt, every host's audit says so and the locks go."""
    names = ", ".join(a.server + f" ({a.why})" for a in started)
    site.opts.log(f"{rid} is the active release on every host, but not every server runs: starting {names}")
    try:
        errors = run_server_steps(site, run.of("stop") + run.of("start"))
        if errors:
            why = "; ".join(errors)
            close_all(site, {**base_rec, "result": "failed", "detail": "start: " + why[:1500]}, per_host=frm)
            raise RemoteError(f"{rid} is active, but starting {names} failed: {why}")
        fails = run_gate(site, run.of("gate"))
    except KeyboardInterrupt:
        close_all(site, {**base_rec, "result": "interrupted", "detail": f"interrupted while starting {names}"},
                  per_host=frm)
        raise
    if fails:
        why = failure_text(site, fails)
        lost = {**lost_in_gate(fails), **probe(site)}
        raise_lost(site, Activation(False, why, "health gate", verdict=not lost, lost=lost), f"starting {names} of {rid}",
                   rid, base_rec, "run the same deploy again", frm)
        close_all(site, {**base_rec, "result": "failed", "detail": f"started {names}; health gate: {why}"[:2000]},
                  per_host=frm)
        raise GateFailed(f"{rid} is active and {names} was started, but did not pass the health gate "
                         f"(the release is not marked failed): {why}")


class _stop_pushes_on_interrupt:
    """While pushes run: SIGINT/SIGTERM/SIGHUP terminate the rsync children first, then raise
    KeyboardInterrupt as usual (main thread only; the previous handlers come back after)."""

    def __enter__(self):
        import signal
        self.old = {}
        if threading.current_thread() is not threading.main_thread():
            return self
        from ..signals import STOPPING
        for sig in STOPPING:
            old = signal.getsignal(sig)
            if not callable(old) and sig != signal.SIGINT:
                continue          # SIGTERM/SIGHUP not handled as an interrupt here: leave them alone
            self.old[sig] = old

            def h(signum, frame, old=old):
                kill_rsyncs()
                if callable(old):
                    old(signum, frame)
                raise KeyboardInterrupt
            signal.signal(sig, h)
        return self

    def __exit__(self, *a):
        import signal
        for sig, old in self.old.items():
            signal.signal(sig, old)
        return False


def _record_extras(site: Site, rid: str, promote) -> dict:
    """Audit fields of a deploy that an operator forced (``--force-failed`` on a failed release,
    ``--no-preflight``) and its ``-m`` message."""
    out = {}
    if site.opts.force_failed and any(f.recorded(rid) == "failed" for f in site.facts.values()):
        out["forced_failed"] = True
    if promote is None and not site.opts.preflight:
        out["preflight"] = "skipped"
    if site.opts.message:
        out["message"] = site.opts.message
    if site.opts.limit:
        out["limited"] = site.opts.limit
    return out


def finish_good(site: Site, rid: str, closes: list[Step], report: dict, t_start: float,
                again: str = "run the same command again", prunes: list[Step] = ()) -> dict:
    """Run the success close-out (the release event of the steps: ``healthy`` -> active, or
    ``gate_passed`` -> good), prune, audit, unlock; then the ``image-prune`` steps ``prunes``
    (:func:`dsv4ctl.deploy.image.prune_local`: the control machine's copies of the releases
    pruned). Returns ``report`` completed (pruned ids per host, ``local_pruned``, result ok,
    the release's state, seconds). ``again``: :func:`raise_close_errors`."""
    pruned = run_close(site, closes)
    raise_close_errors(site, rid, again)
    for h in site.hosts:
        report["hosts"][h]["pruned"] = pruned.get(h, [])
    for st in prunes:
        from .image import prune_local
        trace(site, st)
        t0 = time.monotonic()
        if (local := prune_local(site, rid, pruned)):
            report["local_pruned"] = local
        step_done(site, st, time.monotonic() - t0)
    report["steps"] = step_results(site)
    report["result"] = "ok"
    report["state"] = site.facts[site.hosts[0]].recorded(rid)
    report["seconds"] = round(time.monotonic() - t_start, 3)
    return report


# -- releases, rollback ------------------------------------------------------------------------

def releases(profile, opts: Options) -> dict:
    """Per host: every complete release with base, patches, when, who, state, and for a failed
    one the check, reason and evidence (a fact); with ``deploy.backend: slurm`` also
    ``slurm_jobs``, the jobs this host submitted for it with their recorded final states
    (:func:`dsv4ctl.hosts.slurmrecord.release_jobs`: they outlive Slurm's MinJobAge). A host
    that cannot be read is listed with its ``error`` and the others still are."""
    from ..hosts.layout import read_facts
    from ..hosts.slurmrecord import parse_records, records_cmd, release_jobs
    site = open_site(profile, opts)
    slurm = keeps_job_records(site.profile)
    try:
        res = run_parallel(site.root_transports, lambda t: read_facts(t, site.paths[t.name].root),
                           timeout=opts.connect_timeout + 60)
        recs = run_parallel(site.root_transports, lambda t: parse_records(t.run(records_cmd(site.paths[t.name].root),
                                                                           timeout=60).out),
                            timeout=opts.connect_timeout + 60) if slurm else {}
    finally:
        site.close()
    out = {"schema": "dsv4ctl.releases/1", "hosts": {}}
    for h, r in res.items():
        if not r.ok:
            out["hosts"][h] = {"root": site.paths[h].root, "error": r.error, "current": None, "previous": None,
                               "lock": None, "releases": []}
            continue
        f = r.value
        rows = []
        for rid in sorted(f.releases, key=lambda r: (f.when(r), r), reverse=True):
            m = f.releases[rid]
            st = f.state.get("releases", {}).get(rid, {})
            rows.append({"id": rid, "base_ref": m.get("base_ref"), "base_commit": m.get("base_commit"),
                         "patches": [p["name"] for p in m.get("patches", [])],
                         "when": f.when(rid), "who": st.get("activated_by") or st.get("pushed_by") or m.get("built_by"),
                         "state": f.release_state(rid), "recorded_state": st.get("state"),
                         "promoted_at": st.get("promoted_at"), "failed_at": st.get("failed_at"),
                         "failed_check": st.get("failed_check"), "failure": st.get("failure"),
                         "forced_at": st.get("forced_at"), "evidence": st.get("evidence"),
                         "message": st.get("message"), "derived_from": m.get("derived_from"),
                         "change": m.get("change")})
            if slurm:         # the Slurm jobs submitted for it on this host (hosts/slurmrecord.py)
                rows[-1]["slurm_jobs"] = release_jobs(recs[h].value if recs[h].ok else [], rid)
        out["hosts"][h] = {"root": f.root, "current": f.current, "previous": f.previous,
                           "lock": f.lock and holder_text(f.lock), "releases": rows}
    return out


def target_spec(site: Site, target: str) -> dict:
    """The launch spec of release ``target`` (its ``launch.json`` on the first host: a fact)."""
    res = run_parallel(site.root_transports, lambda t: read_spec(t, site, target), timeout=120)
    raise_failed(res, "reading launch specs")
    return next(iter(res.values())).value


def rollback_restart(site: Site, target: str, spec: dict) -> frozenset | None:
    """The groups a rollback to ``target`` (launch spec ``spec``) restarts: when every host runs
    one release, :func:`dsv4ctl.deploy.servers.changed_groups` of its manifest and launch spec
    against the target's (a serve-config-only difference restarts only that group); else, or
    when a manifest cannot be read, None (every group). The choice is logged."""
    from .servers import changed_groups
    from .push import _base_manifest
    currents = {site.facts[h].current for h in site.hosts}
    if len(currents) != 1 or None in currents:
        return None
    cur = currents.pop()
    if cur == target:       # rolling back to the active release restarts it (as it always did)
        return None
    t = site.transports[site.hosts[0]]
    cur_man, tgt_man = _base_manifest(t, site, cur), _base_manifest(t, site, target)
    cur_spec = site.facts[site.hosts[0]].current_launch
    if not cur_man or not tgt_man or cur_spec is None:
        return None
    groups = changed_groups(cur_man, tgt_man, cur_spec, spec)
    if groups is not None:
        kept = sorted(set(spec) - groups)
        site.opts.log(f"{cur} and {target} differ only in the serve files of "
                      f"{', '.join(sorted(groups)) or 'no group'}: restarting only those"
                      + (f" ({', '.join(kept)} keep running)" if kept else ""))
    return groups


def rollback(profile, opts: Options, to: str | None = None, command: str = "dsv4ctl rollback PROFILE") -> dict:
    """Activate an older release on every host (default: :func:`choose_rollback_target`, the
    newest release built before the active one that passed its health gate everywhere and is not
    marked failed; the choice is logged), with the same gate; a failing gate puts the hosts back
    where they were (exit 3). ``command``: how the user runs rollback (hints print it)."""
    site = open_site(profile, opts)
    try:
        facts = gather_facts(site)
        target, why = choose_rollback_target(facts, to, command)
        if to is None:
            opts.log(f"rollback to {target}: {why}")
        refuse(site, target, False, "rollback")
        if opts.dry_run:
            refuse_held_locks(site)
            site.token = DRY_RUN_TOKEN
            spec = target_spec(site, target)
            run = rollback_steps(site, target, spec, locked=False, extra=_record_extras(site, target, True),
                                 restart=rollback_restart(site, target, spec))
            return {"schema": "dsv4ctl.rollback/1", "dry_run": True, "release": target, "actions": run.lines(),
                    "steps": [s.to_dict() for s in run.steps], "on_failure": [s.to_dict() for s in run.on_failure]}
        try:
            acquire_locks(site, f"rollback to {target}")
            target = choose_rollback_target(site.facts, to, command)[0]
            refuse(site, target, False, "rollback")
            spec = target_spec(site, target)
            restart = rollback_restart(site, target, spec)
            run = rollback_steps(site, target, spec, extra=_record_extras(site, target, True), restart=restart)
            _announce(site, run)
            old_current = {h: site.facts[h].current for h in site.hosts}
            rec = {"action": "rollback", "release": target, **_record_extras(site, target, True)}
            try:
                env_error(site, target, run_envs(site, run.of("env")), rec, None, "rollback")
                drift = run_verify(site, run.of("verify"))
            except KeyboardInterrupt:
                close_all(site, {**rec, "result": "interrupted", "detail": "interrupted before any switch"})
                raise
            if drift:
                close_all(site, {**rec, "result": "failed", "detail": "verify: " + drift[:1500]})
                raise drift_error(target, drift)
            try:
                act = switch_with_gate(site, run.of("switch"), run.of("gate"),
                                       revert_steps(site, site.hosts, target, spec, restart=restart))
            except KeyboardInterrupt:
                close_all(site, {**rec, "result": "interrupted", "detail": "hosts put back"
                                 + (f"; {site.restored}" if site.restored else "")})
                raise
            again = f"{command} --to {target}"
            if not act.ok:
                raise_lost(site, act, f"rollback to {target} stopped", target, rec, again)
                close_all(site, {**rec, "result": "failed", "detail": act.why[:2000]},
                          event=(target, "failed", {"failed_check": "health gate (rollback)", "failure": act.why[:1000]}))
                raise_gate_failed(site, act, f"rollback to {target}", f" failed its health gate; hosts put back on "
                                  f"{', '.join(sorted({o or '(none)' for o in old_current.values()}))}", again,
                                  EXIT_REMOTE)
            run_close(site, run.of("close"))
            raise_close_errors(site, target, again)
            return {"schema": "dsv4ctl.rollback/1", "release": target, "result": "ok",
                    "state": site.facts[site.hosts[0]].recorded(target),
                    "hosts": {h: {"from": old_current[h], "to": target} for h in site.hosts}}
        finally:
            release_locks(site)
    finally:
        site.close()
