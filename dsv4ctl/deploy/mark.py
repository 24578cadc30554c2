"""Mark the running release failed from outside a deploy: what a runbook step does when it
observes a crash or a stall, so a plain ``deploy`` of that release is refused afterwards (exit 1,
naming when and why) instead of re-activating it without a word."""

from __future__ import annotations

from .site import Options, open_site
from .steps import close_step


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
