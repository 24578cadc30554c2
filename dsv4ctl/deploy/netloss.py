"""A host lost during an activation (switch, health gate, switch back, close): network loss is
not a verdict.

When a host stops answering over SSH in the middle of a deploy or rollback, the gate cannot
judge the release: a process check that cannot run says nothing about the release. So a run
that lost a host

* puts back every host that answers, and leaves the lost one where it was last seen;
* does not mark the release failed (a rollback's target neither): the release's record gets the
  ``interrupted`` event, as for an interrupt, with the fault;
* ends with a :class:`~dsv4ctl.errors.RemoteError` (exit 3) naming the lost hosts, which hosts
  run which release now, which locks remain, and the command that finishes the job once the
  hosts answer again.

A host counts as lost when the gate's process check on it could not run (:data:`UNREACHABLE`)
or when it does not run ``true`` right after the failure (:func:`probe`)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from ..remote import run_parallel

#: How a gate failure that could not reach a host starts (the process check raised over SSH).
UNREACHABLE = "cannot be reached"


@dataclass
class Activation:
    """What a switch + gate did. ``ok``; ``why``: the failure (and how the put-back release is);
    ``phase``: where it failed (``activation`` or ``health gate``); ``verdict``: the failure
    judges the release (every host answered when it failed); ``lost``: {host: why} hosts that did
    not answer (when it failed, or when they were to be put back); ``stranded``: {host: why}
    switched hosts that could not be put back; ``unsure``: those of them whose switch never
    confirmed either. Unpacks as ``ok, why``."""

    ok: bool
    why: str = ""
    phase: str = ""
    verdict: bool = False
    lost: dict = field(default_factory=dict)
    stranded: dict = field(default_factory=dict)
    unsure: set = field(default_factory=set)

    def __iter__(self):
        return iter((self.ok, self.why))


def probe(site, hosts: list[str] | None = None) -> dict[str, str]:
    """{host: why} of each of ``hosts`` (default: every host) that does not run ``true`` now (one
    round trip each, in parallel, at most the connect timeout + 10 s)."""
    hs = hosts if hosts is not None else site.hosts
    if not hs:
        return {}
    wait = site.opts.connect_timeout + 10
    res = run_parallel({h: site.transports[h] for h in hs}, lambda t: t.run("true", timeout=wait),
                       timeout=wait + 5)
    return {h: r.error for h, r in res.items() if not r.ok}


def lost_in_gate(fails: list) -> dict[str, str]:
    """{host: why} of the gate failures that are a host not reached (not a verdict); ``why``: the
    transport's error."""
    return {f.host: str(f.reason)[len(UNREACHABLE) + 2:] for f in fails if str(f.reason).startswith(UNREACHABLE + ": ")}


def where_now(site, act: Activation) -> str:
    """Which hosts run which release now (``h0, h2, h3 on A; h1 still on B (not switched
    back)``), from the facts the run keeps up to date."""
    on: dict[str, list[str]] = {}
    odd = []
    for h in site.hosts:
        cur = site.facts[h].current or "(none)"
        if h in act.unsure:
            odd.append(f"{h} unconfirmed (its switch did not finish)")
        elif h in act.stranded:
            odd.append(f"{h} still on {cur} (could not be switched back)")
        else:
            on.setdefault(cur, []).append(h)
    return "; ".join([f"{', '.join(hs)} on {r}" for r, hs in on.items()] + odd)


def locks_left(site) -> list[str]:
    """Hosts whose lock this run still holds (its close-out and unlock did not reach them)."""
    return [h for h in site.hosts if h not in site.unlocked]


def locks_text(site) -> str:
    """``lock left on h1 (ROOT/.lock)`` or ``no lock left``."""
    left = locks_left(site)
    if not left:
        return "no lock left"
    return "lock left on " + ", ".join(f"{h} ({site.paths[h].lock})" for h in left)


def profile_arg(site) -> str:
    """The profile as a command-line argument (its path, shell-quoted)."""
    return shlex.quote(str(site.profile.path))


def finish_command(site, how: str, target: str | None) -> str:
    """The command that finishes the job once the lost hosts answer: ``rollback --to TARGET``
    (``target``: the release the hosts that answer run), or ``how`` again when there is none
    (:func:`with_break_lock` adds ``--break-lock`` where a lock was left)."""
    if target:
        return f"dsv4ctl rollback {profile_arg(site)} --to {target}"
    return f"run the same {how} again"


def with_break_lock(site, command: str) -> str:
    """``command`` with ``--break-lock`` when this run left a lock (after its unlock ran); ``run
    the same deploy again with --break-lock`` for a command said in words."""
    if not locks_left(site):
        return command
    return command + (" --break-lock" if command.startswith("dsv4ctl ") else " with --break-lock")


def lost_message(site, head: str, act: Activation, finish: str, rid: str) -> str:
    """The one line a run that lost hosts ends with (exit 3): what stopped and where, the lost
    hosts and why, that ``rid`` is not marked failed, where every host is, the locks left and
    ``finish``."""
    lost = sorted(act.lost)
    why = act.lost[lost[0]]
    why = why if why.startswith(lost[0]) else f"{lost[0]}: {why}"
    return (f"{head} during the {act.phase}: {', '.join(lost)} cannot be reached ({why}); a lost host is no "
            f"verdict, {rid} is not marked failed. Hosts now: {where_now(site, act)}; {locks_text(site)}. "
            f"When {', '.join(lost)} answer{'s' if len(lost) == 1 else ''} again: {with_break_lock(site, finish)}")
