"""``dsv4ctl lock status|acquire|release``: the deploy lock of every host, by hand (Kamal's
``lock``). A manual lock is the same ``<root>/.lock`` a deploy takes (:mod:`dsv4ctl.hosts.lock`),
its holder's ``what`` is ``lock acquire: MESSAGE``: every deploy, rollback, promotion, restart or
``--remote`` change is refused naming who holds it and why, until ``lock release``."""

from __future__ import annotations

import secrets

from ..errors import RemoteError
from ..hosts.audit import append_cmd, record_fields
from ..hosts.lock import (LOCK_HELD_CODE, MANUAL_PREFIX, age_s, age_text, held_error, holder, holder_liveness,
                          holder_text, is_manual, parse_holder, release_hint, take_cmd)
from ..remote import q, run_parallel
from .site import Site, open_site, raise_failed


STALE_S = 3600.0
"""A lock older than this is reported as possibly stale (a deploy's longest phase, the health
wait, is 900 s by default)."""


def read_cmd(lock: str) -> str:
    """Read-only shell: ``free``, or ``held`` and the holder.json on the next line."""
    return (f"if [ -d {q(lock)} ]; then echo held; cat {q(lock + '/holder.json')} 2>/dev/null || echo '{{}}'; "
            f"else echo free; fi")


def parse_read(text: str) -> dict | None:
    """The holder dict when :func:`read_cmd` says held (``{}`` if unreadable), None when free (pure)."""
    lines = text.strip().splitlines()
    if not lines or lines[0] != "held":
        return None
    return parse_holder("\n".join(lines[1:]))


def _read(site: Site, partial: bool = False):
    """{host: holder dict or None (free)}; RemoteError naming the hosts that could not be read,
    or with ``partial`` ``({host: ...} of the hosts read, {host: why} of the others)``."""
    res = run_parallel(site.root_transports, lambda t: parse_read(t.run(read_cmd(site.paths[t.name].lock), timeout=60).out),
                       timeout=site.opts.connect_timeout + 60)
    if partial:
        return ({h: res[h].value for h in site.hosts if res[h].ok},
                {h: res[h].error for h in site.hosts if not res[h].ok})
    raise_failed(res, "reading the locks")
    return {h: res[h].value for h in site.hosts}


def status(profile, opts) -> dict:
    """``dsv4ctl.lock/1``: per host ``held``, ``holder`` (who, what, message, pid, since), ``age_s``,
    ``manual``, ``stale`` (older than :data:`STALE_S`) and for a run's lock ``process``
    (``alive``/``dead``/``unknown``, :func:`dsv4ctl.hosts.lock.holder_liveness`) and ``why``.
    A host that cannot be read is ``{"held": None, "error": why}`` (the others are still shown;
    the command exits 3 after printing them)."""
    site = open_site(profile, opts)
    try:
        got, lost = _read(site, partial=True)
    finally:
        site.close()
    hosts = {h: {"held": None, "error": why} for h, why in lost.items()}
    for h, hd in got.items():
        if hd is None:
            hosts[h] = {"held": False}
            continue
        a = age_s(hd)
        hosts[h] = {"held": True, "holder": {k: v for k, v in hd.items() if k != "token"},
                    "text": holder_text(hd), "age_s": None if a is None else round(a),
                    "manual": is_manual(hd), "stale": a is not None and a > STALE_S}
        if not is_manual(hd):
            hosts[h]["process"], hosts[h]["why"] = holder_liveness(hd)
    return {"schema": "dsv4ctl.lock/1", "hosts": hosts}


def acquire(profile, opts, message: str) -> dict:
    """Take every host's lock with ``message`` (all or none: a host whose lock is held gives the
    others back; LockHeld, exit 3, naming the holder and its age). Each host's audit gets
    ``lock acquire`` with the message."""
    site = open_site(profile, opts)
    token = "manual-" + secrets.token_hex(8)
    doc = {**holder(MANUAL_PREFIX + message, token), "message": message}
    taken: list[str] = []

    def take(t):
        p = site.paths[t.name]
        rec = record_fields(t.name, "lock acquire", "ok", message)
        r = t.run(f"mkdir -p {q(p.root)} && " + take_cmd(p.lock, doc, append_cmd(p.audit, rec)), timeout=60, check=False)
        if r.code == LOCK_HELD_CODE:
            raise held_error(t.name, p.lock, r.out, can_break=False, profile=str(site.profile.path))
        if r.code != 0:
            raise t.fail(r, f"lock {p.lock}")
        taken.append(t.name)
        return True
    try:
        try:
            res = run_parallel(site.root_transports, take, timeout=site.opts.connect_timeout + 60, finish_on_interrupt=True)
        except KeyboardInterrupt:
            from ..remote.transport import signals_held
            with signals_held():            # all or none: what was taken goes back
                _give_back(site, taken, token, "lock acquire interrupted")
            raise
        if not all(r.ok for r in res.values()):
            _give_back(site, taken, token, "another host's lock could not be taken")
            raise_failed(res, "locking")
    finally:
        site.close()
    return {"schema": "dsv4ctl.lock/1", "action": "acquire", "message": message, "hosts": sorted(taken)}


def _give_back(site: Site, hosts: list[str], token: str, why: str) -> None:
    """Release this run's lock on ``hosts`` (only where it still holds it) and audit it there, so
    the ``lock acquire ok`` record is followed by what undid it."""
    def back(t):
        p = site.paths[t.name]
        rec = record_fields(t.name, "lock release", "ok", f"given back: {why}")
        t.run(f"if grep -q {q(token)} {q(p.lock + '/holder.json')} 2>/dev/null; then rm -rf {q(p.lock)} && "
              f"{append_cmd(p.audit, rec)}; fi", timeout=30)
    if hosts:
        run_parallel({h: site.transports[h] for h in list(hosts)}, back, timeout=site.opts.connect_timeout + 30)


def release_refusal(got: dict[str, dict | None], profile: str, *, force: bool, dead: bool) -> RemoteError | None:
    """Why ``lock release`` must release nothing (pure but for the local process check), None
    when it may go on. A run's lock (not taken by hand) needs ``force``; then its process must be
    known gone (:func:`dsv4ctl.hosts.lock.holder_liveness`): a live one is refused, one that cannot
    be checked (another machine, an older holder record) needs ``dead`` (``--yes-it-is-dead``),
    which overrides both. The first such host is named, with the command that would go on."""
    for h, hd in got.items():
        if hd is None or is_manual(hd):
            continue
        held = f"{h}: the lock is held by a run, not by lock acquire: {holder_text(hd)}, {age_text(age_s(hd))} old"
        if dead:
            continue
        state, why = holder_liveness(hd)
        if not force:
            then = {"dead": f"that run is dead ({why}): {release_hint(profile)}",
                    "alive": f"that run is still going: {why}",
                    "unknown": f"if that run is gone: {release_hint(profile, dead_override=True)}; {why}"}[state]
            return RemoteError(f"{held}; nothing released ({then})")
        if state == "alive":
            return RemoteError(f"{held}; nothing released: {why} (stop it and it gives the lock back; if that is "
                               f"a reused pid you can vouch for: {release_hint(profile, dead_override=True)})")
        if state == "unknown":
            return RemoteError(f"{held}; nothing released: {why} (if you are sure it is gone: "
                               f"{release_hint(profile, dead_override=True)})")
    return None


def release(profile, opts, force: bool = False, dead: bool = False, dry_run: bool = False,
            message: str | None = None) -> dict:
    """Remove the manual locks of every host (audited ``lock release`` with the old holder). A lock
    a run holds (a deploy, a rollback, …) is only removed with ``force`` and when its process is
    known gone, or with ``dead`` (the operator vouches for it: ``--yes-it-is-dead``) —
    nothing is removed otherwise (:func:`release_refusal`: RemoteError, exit 3, naming it). A lock
    re-taken between the read and the removal is left alone (removal matches the holder's token).
    ``dry_run``: the same read and refusal, nothing removed. ``message``: why (``-m``, in each
    audit record)."""
    site = open_site(profile, opts)
    try:
        got = _read(site)
        refusal = release_refusal(got, str(site.profile.path), force=force, dead=dead)
        if refusal is not None:
            raise RemoteError(str(refusal) + (" (dry run)" if dry_run else ""))
        held = {h: hd for h, hd in got.items() if hd is not None}
        if not dry_run:
            _remove(site, held, dead, message)
    finally:
        site.close()
    return {"schema": "dsv4ctl.lock/1", "action": "release", **({"dry_run": True} if dry_run else {}),
            "hosts": sorted(held), "holders": {h: holder_text(hd) for h, hd in held.items()}}


def _remove(site: Site, held: dict[str, dict], dead: bool, message: str | None = None) -> None:
    """Remove each host's lock in ``held`` (only while its holder is the one read), audited."""
    def rm(t):
        p, hd = site.paths[t.name], held[t.name]
        vouched = " (--yes-it-is-dead)" if dead and not is_manual(hd) else ""
        rec = record_fields(t.name, "lock release", "ok", f"removed lock held by {holder_text(hd)}{vouched}"
                            + (f": {hd['message']}" if hd.get("message") else ""),
                            **({"message": message} if message else {}))
        tok = hd.get("token")
        if tok:
            cmd = (f"if grep -q {q(tok)} {q(p.lock + '/holder.json')} 2>/dev/null; then rm -rf {q(p.lock)} && "
                   f"{append_cmd(p.audit, rec)}; fi")
        else:       # an unreadable holder.json: only with --force --yes-it-is-dead (it is no manual lock)
            cmd = f"rm -rf {q(p.lock)} && {append_cmd(p.audit, rec)}"
        t.run(cmd, timeout=60)
        return True
    res = run_parallel({h: site.transports[h] for h in held}, rm, timeout=site.opts.connect_timeout + 60,
                       finish_on_interrupt=True)
    raise_failed(res, "releasing the locks")
