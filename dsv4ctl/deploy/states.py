"""The release state machine: the one place a release's recorded state (``state.json`` on each
host, ``releases.<id>``) changes.

States: ``pushed`` (complete and verified on the host) -> ``active`` (switched to, health gate
passed) -> ``good`` (a promotion gate passed: ``deploy --promote`` or ``dsv4ctl promote``); any ->
``failed`` (a health gate or a check failed; the reason and evidence are kept). An interrupt
(Ctrl-C, SIGTERM, SIGHUP) is not a verdict: the ``interrupted`` event keeps the state and records
when and where, so the same command can simply be run again.

====================  ========  ========  ===========  ========  ===========
from \\ event          pushed    healthy   gate_passed  failed    interrupted
====================  ========  ========  ===========  ========  ===========
(no record)           pushed    active    good         failed    pushed
pushed                pushed    active    good         failed    pushed
active                active    active    good         failed    active
good                  good      good      good         failed    good
failed                failed    refused*  good         failed    failed
====================  ========  ========  ===========  ========  ===========

\\* a plain deploy or rollback of a failed release is refused (:class:`Refused`, exit 1) unless
the operator forces it (``--force-failed``): then it is ``active`` (never ``good``), the failure
stays on record and the forcing is recorded. Only a passed gate writes ``good``. A default
``rollback`` picks the newest release built before the active one that passed its health gate
(``active`` or ``good``) on every host and was never marked failed
(:func:`dsv4ctl.hosts.layout.choose_rollback_target`)."""

from __future__ import annotations

from ..errors import VerdictError

STATES = ("pushed", "active", "good", "failed")
EVENTS = ("pushed", "healthy", "gate_passed", "failed", "interrupted")


class Refused(VerdictError):
    """A failed release may not be activated without ``--force-failed`` (exit 1)."""


def failure_text(rid: str, host: str, rec: dict) -> str:
    """``r… failed on H at T: what (reason); evidence E`` from a failed record."""
    what = rec.get("failed_check") or "health gate"
    why = rec.get("failure") or ""
    ev = rec.get("evidence")
    return (f"release {rid} failed on {host} at {rec.get('failed_at', '?')}: {what}"
            + (f" ({why[:300]})" if why else "") + (f"; evidence {ev}" if ev else ""))


def transition(record: dict | None, event: str, *, at: str, by: str, force_failed: bool = False,
               rid: str = "?", host: str = "?", **info) -> dict:
    """The record after ``event`` (a new dict; ``record`` is not changed). ``at``: UTC time
    (``now_iso``), ``by``: the operator; ``info``: fields the event carries (``failed_check``,
    ``failure``, ``evidence``). Raises :class:`Refused` for ``healthy`` on a failed release
    without ``force_failed``; ValueError for an unknown event."""
    if event not in EVENTS:
        raise ValueError(f"unknown release event {event!r}")
    rec = dict(record or {})
    cur = rec.get("state")
    if event == "pushed":
        if cur is None:
            rec.update(state="pushed", pushed_at=at, pushed_by=by)
        return rec
    if event == "healthy":
        if cur == "failed":
            if not force_failed:
                raise Refused(failure_text(rid, host, rec) + "; gate it again (deploy --promote), or activate it "
                              "anyway with --force-failed (recorded)")
            rec.update(state="active", forced_at=at, forced_by=by)
        elif cur != "good":
            rec["state"] = "active"
        rec.update(activated_at=at, activated_by=by, **info)
        return rec
    if event == "interrupted":
        if cur is None:
            rec.update(state="pushed", pushed_at=at, pushed_by=by)
        rec.update(interrupted_at=at, interrupted_by=by, **info)
        return rec
    if event == "gate_passed":
        rec.update(state="good", promoted_at=at, promoted_by=by, **info)
        return rec
    rec.update(state="failed", failed_at=at, **info)
    return rec


def next_state(record: dict | None, event: str, force_failed: bool = False) -> str:
    """The state :func:`transition` would give (for listings); ``refused`` when it would refuse."""
    try:
        return transition(record, event, at="", by="", force_failed=force_failed)["state"]
    except Refused:
        return "refused"


def refusals(facts: dict, rid: str, force_failed: bool) -> list[str]:
    """Why activating ``rid`` is refused, per host whose record says it failed (``facts``: host ->
    HostFacts); [] when it may go (none failed, or ``force_failed``)."""
    if force_failed:
        return []
    return [failure_text(rid, h, f.state.get("releases", {}).get(rid, {})) for h, f in facts.items()
            if f.state.get("releases", {}).get(rid, {}).get("state") == "failed"]
