"""``dsv4ctl lock status|acquire|release``: thin CLI over :mod:`dsv4ctl.deploy.hostlock`."""

from __future__ import annotations

from typing import Optional

import typer

from ..errors import RemoteError
from ..render import console, dump_json, rich_table

_P = typer.Argument(None, help="Profile path or shipped name; required (or DSV4CTL_PROFILE): the command reads hosts.")
_ACCEPT = typer.Option(False, "--accept-new-host-keys", help="Add unknown SSH host keys (accept-new).")


def _profile(arg):
    from .common import load_deployment_arg
    return load_deployment_arg(arg, acts_on_hosts=True)


def _opts(accept_new: bool):
    from ..deploy.site import Options
    return Options(accept_new_host_keys=accept_new)


def _status(dep, accept_new: bool) -> dict:
    """Every host's lock, read only (what a ``--dry-run`` decides on)."""
    from ..deploy.hostlock import status as lock_status
    return lock_status(dep, _opts(accept_new))


def status(
    profile: Optional[str] = _P,
    accept_new: bool = _ACCEPT,
    as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.lock/1 JSON document."),
) -> None:
    """Per host: the deploy lock, free or held — who holds it, for what (a manual lock's
    message), since when and how long; a lock older than an hour is flagged as possibly stale, a
    run's lock whose process is gone (checked on this machine when it ran here) as dead, with the
    command that frees it.

    Exit 0 · 2 bad input · 3 a host could not be read."""
    from ..deploy.hostlock import status as lock_status
    from ..hosts.lock import age_text
    dep = _profile(profile)
    rep = lock_status(dep, _opts(accept_new))
    lost = {h: r["error"] for h, r in rep["hosts"].items() if r.get("error")}
    if as_json:
        print(dump_json(rep))
        _raise_lost(lost)
        return
    rows = []
    for h, r in rep["hosts"].items():
        if r.get("error"):
            rows.append([h, "not read", r["error"], ""])
            continue
        if not r["held"]:
            rows.append([h, "free", "", ""])
            continue
        kind = "held (by hand)" if r["manual"] else ("held (run is dead)" if r.get("process") == "dead" else "held")
        rows.append([h, kind, r["text"],
                     age_text(r["age_s"]) + (" (stale?)" if r["stale"] else "")])
    console().print(rich_table("deploy locks", ["host", "lock", "holder", "age"], rows))
    print_lock_hints(rep, str(dep.path))
    _raise_lost(lost)


def _raise_lost(lost: dict) -> None:
    """Exit 3 after the hosts that were read are shown, naming the ones that were not."""
    if lost:
        from ..errors import RemoteError
        raise RemoteError(f"reading the locks failed on {len(lost)} host(s): "
                          + "; ".join(f"{h}: {why}" for h, why in lost.items()))


def print_lock_hints(rep: dict, profile: str) -> None:
    """Below the table: each run's lock whose process is dead or cannot be checked, with the
    command that frees it."""
    from ..hosts.lock import release_hint
    for h, r in rep["hosts"].items():
        if r.get("process") == "dead":
            print(f"{h}: that run is dead ({r['why']}): {release_hint(profile)}")
        elif r.get("process") == "unknown" and r.get("stale"):
            print(f"{h}: older than an hour and {r['why']}: if that run is gone, "
                  f"{release_hint(profile, dead_override=True)}")


def acquire(
    profile: Optional[str] = _P,
    message: str = typer.Option(..., "--message", "-m", metavar="TEXT", help="Why (shown to everyone a deploy or restart refuses, and audited)."),
    accept_new: bool = _ACCEPT,
    dry_run: bool = typer.Option(False, "--dry-run", help="Read every host's lock and say what would be taken; take nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.lock/1 JSON document (action acquire)."),
) -> None:
    """Take the deploy lock of every host by hand (all or none), with a message: deploys,
    rollbacks, promotions, start/stop/restart and --remote changes are refused, naming who and
    why, until `lock release`.

    Exit 0 locked · 2 bad input (an empty message) · 3 a host's lock is held (nothing taken) or
    SSH failed."""
    from ..deploy.hostlock import acquire as lock_acquire
    from ..signals import terminate_as_interrupt
    from .options import message as check_message
    msg = check_message(message)
    dep = _profile(profile)
    if dry_run:
        got = _status(dep, accept_new)["hosts"]
        _raise_lost({h: r["error"] for h, r in got.items() if r.get("error")})     # the run could not take it
        held = {h: r for h, r in got.items() if r["held"]}
        if held:
            h, r = next(iter(held.items()))
            raise RemoteError(f"{h}: the lock is held: {r['text']}; lock acquire would take nothing (dry run)")
        rep = {"schema": "dsv4ctl.lock/1", "action": "acquire", "dry_run": True, "message": msg, "hosts": sorted(dep.hosts)}
    else:
        terminate_as_interrupt()        # SIGTERM/SIGHUP: the locks taken so far are given back, exit 130
        rep = lock_acquire(dep, _opts(accept_new), msg)
    if as_json:
        print(dump_json(rep))
        return
    print(f"{'dry run: would lock' if dry_run else 'locked'} {', '.join(rep['hosts'])}: {rep['message']}")


def release(
    profile: Optional[str] = _P,
    force: bool = typer.Option(False, "--force", help="Also remove a lock held by a run (deploy, rollback, ...) whose "
                               "process is gone (checked on this machine when it ran here; a live one is refused)."),
    dead: bool = typer.Option(False, "--yes-it-is-dead", help="With --force: the holder's process cannot be checked "
                              "(it ran on another machine) or you vouch it is gone: remove it anyway (audited)."),
    message: Optional[str] = typer.Option(None, "--message", "-m", metavar="TEXT", help="Why (recorded in every host's audit log; shown by audit)."),
    accept_new: bool = _ACCEPT,
    dry_run: bool = typer.Option(False, "--dry-run", help="Read every host's lock and say what would be released; release nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.lock/1 JSON document (action release)."),
) -> None:
    """Release the manual deploy locks of every host (audited with the old holder). A lock held
    by a run is left alone unless --force, and then only when its process is gone: checked on
    this machine when the run was started here (a live one is refused); a holder on another
    machine needs --force --yes-it-is-dead. Nothing is released when one host refuses.

    Exit 0 released (or none was held) · 2 bad input (--yes-it-is-dead without --force) · 3 a run
    holds a lock (without --force; its process still runs; or it cannot be checked) or SSH failed."""
    from ..deploy.hostlock import release as lock_release
    from ..errors import InputError
    from .options import message as check_message
    if dead and not force:
        raise InputError("--yes-it-is-dead goes with --force (it vouches for the holder of a run's lock)")
    rep = lock_release(_profile(profile), _opts(accept_new), force, dead, dry_run, check_message(message))
    if as_json:
        print(dump_json(rep))
        return
    if not rep["hosts"]:
        print("no lock held")
    for h in rep["hosts"]:
        print(f"{h}: {'dry run: would release' if dry_run else 'released'} the lock held by {rep['holders'][h]}")


def register(app: typer.Typer) -> None:
    """Add the ``lock`` group (``status``, ``acquire``, ``release``) to the root app."""
    sub = typer.Typer(help="The deploy lock of every host by hand: status, acquire -m MSG, release.",
                      no_args_is_help=True)
    sub.command("status")(status)
    sub.command("acquire")(acquire)
    sub.command("release")(release)
    app.add_typer(sub, name="lock")
