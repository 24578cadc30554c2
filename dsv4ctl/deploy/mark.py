"""Mark the running release failed from outside a deploy: what a runbook step does when it
observes a crash or a stall, so a plain ``deploy`` of that release is refused afterwards (exit 1,
naming when and why) instead of re-activating it without a word; and what the ``bad-release``
runbook does before it rolls back (:func:`mark_for_rollback`: only a release the evidence is
about, only when a release marked good is there to go back to)."""

from __future__ import annotations

from ..errors import VerdictError
from .site import Options, open_site
from .steps import close_step


class NotRolledBack(VerdictError):
    """:func:`mark_for_rollback` changed nothing: the hosts do not run the release the evidence is
    about, or no release marked good is there to roll back to (exit 1)."""


def mark_running_failed(profile, opts: Options | None = None, *, hosts: list[str] | None = None, check: str,
                        failure: str, evidence: list[str] = ()) -> dict[str, str]:
    """Under every selected host's deploy lock (``hosts``: default all), record the release that
    host runs as ``failed`` (:func:`dsv4ctl.deploy.states.transition`: ``failed_check`` =
    ``check``, ``failure``, up to five ``evidence`` lines) with an audit line ``mark-failed``.
    A host without an active release, or whose release is already recorded failed, is left as
    it is (its lock released, no audit line). Returns {host: release marked}. RemoteError (exit
    3) when a host cannot be read or its lock is held."""
    from .engine import acquire_locks, raise_close_errors, release_locks, run_close
    opts = opts or Options()
    site = open_site(profile, opts)
    if hosts:
        keep = [h for h in site.hosts if h in hosts]
        site.transports = {h: site.transports[h] for h in keep}
    marked: dict[str, str] = {}
    try:
        acquire_locks(site, f"mark the running release failed ({check})")
        try:
            steps = []
            for h in site.hosts:
                f = site.facts[h]
                rid = f.current
                rec = {"action": "mark-failed", "release": rid, "result": "ok", "detail": f"{check}: {failure}"[:1500]}
                if rid and f.recorded(rid) != "failed":
                    marked[h] = rid
                    ev = (rid, "failed", {"failed_check": check, "failure": failure[:1000],
                                          "evidence": list(evidence)[:5]})
                    steps.append(close_step(site, h, rec, event=ev))
            if steps:
                run_close(site, steps)
            raise_close_errors(site, ", ".join(sorted(set(marked.values()))) or "-")
        finally:
            release_locks(site)
    finally:
        site.close()
    return marked


def rollback_choice(facts: dict, expect: str | None) -> tuple[str, str, str]:
    """(the release every host runs, the newest release marked good built before it, why) from
    facts (pure). NotRolledBack when the hosts run different releases or none, when ``expect``
    is given and they run another one, or when no release is marked good on every host."""
    from ..errors import InputError
    from ..hosts.layout import choose_rollback_target
    running = {h: f.current for h, f in facts.items()}
    runs = ", ".join(f"{h}: {r or 'none'}" for h, r in sorted(running.items()))
    if len(set(running.values())) != 1 or None in running.values():
        raise NotRolledBack(f"the hosts do not run one release ({runs}): nothing marked, nothing rolled back")
    rid = next(iter(running.values()))
    if expect is not None and rid != expect:
        raise NotRolledBack(f"the evidence is about release {expect}, but the hosts run {rid} now (a deploy since): "
                            "nothing marked, nothing rolled back")
    try:
        target, why = choose_rollback_target(facts, good_only=True)
    except InputError as e:
        raise NotRolledBack(f"{e}; {rid} stays active and is not marked") from None
    return rid, target, why


def mark_for_rollback(profile, opts: Options | None = None, *, expect: str | None, check: str, failure: str,
                      evidence: list[str] = ()) -> dict:
    """Before the ``bad-release`` rollback, under every host's deploy lock (read in the same round
    trip as it is taken): :func:`rollback_choice` (one release runs everywhere, ``expect`` when
    given, and a release marked good is there to go back to; else NotRolledBack, exit 1, nothing
    changed), then that release is recorded ``failed`` on every host with ``check``, ``failure``
    and the ``evidence`` (audit line ``mark-failed``). Returns {"release", "rollback_to", "why",
    "marked_failed": {host: release}}. RemoteError (exit 3) when a host cannot be read or its
    lock is held."""
    from .engine import acquire_locks, raise_close_errors, release_locks, run_close
    site = open_site(profile, opts or Options())
    try:
        facts = acquire_locks(site, f"mark the running release failed ({check})")
        try:
            rid, target, why = rollback_choice(facts, expect)
            ev = (rid, "failed", {"failed_check": check, "failure": failure[:1000], "evidence": list(evidence)[:5]})
            rec = {"action": "mark-failed", "release": rid, "result": "ok",
                   "detail": f"{check}: {failure}; rolling back to {target}"[:1500]}
            marked = {h: rid for h in site.hosts if facts[h].recorded(rid) != "failed"}
            if marked:
                run_close(site, [close_step(site, h, rec, event=ev) for h in marked])
            raise_close_errors(site, rid)
        finally:
            release_locks(site)
    finally:
        site.close()
    return {"release": rid, "rollback_to": target, "why": why, "marked_failed": marked}
