"""``dsv4ctl diagnose``: why a group is not serving, from evidence that needs no working server
(log tails, process state, nvidia-smi) plus what HTTP still answers (:mod:`dsv4ctl.diagnose`)."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from ..errors import EXIT_REMOTE, DsvError, InputError, VerdictError
from .options import duration_option, since_option


def diagnose(profile: Optional[str] = typer.Argument(None, help="Profile path or shipped name (or DSV4CTL_PROFILE)."),
             group: Optional[list[str]] = typer.Option(None, "--group", "-g", help="Only this server group (repeatable)."),
             since: Optional[str] = since_option("Log lines from this time on, earlier processes included: this long ago (90s, 15m, 2h, 1d) or an ISO date or time (2026-12-01T16:00:00Z; UTC when no zone). Default: only what each server's current process wrote since its last start."),
             window: float = duration_option(5.0, "--window", zero=True, hi=300, help="Time between the two /metrics reads (5, 500ms, 1m; 0..5m)."),
             lines: int = typer.Option(400, "--lines", "-n", help="Log lines read per group (1..100000)."),
             as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.diagnose/1 document (README)."),
             accept_new: bool = typer.Option(False, "--accept-new-host-keys", help="Add unknown SSH host keys (accept-new)."),
             api_key: Optional[str] = typer.Option(None, "--api-key", envvar="DSV4CTL_API_KEY", show_default=False,
                                                   help="Bearer token for /server_info (or DSV4CTL_API_KEY).")) -> None:
    """Collect each group's log tail, process state, nvidia-smi, /health, /server_info and a
    /metrics delta (one parallel round per host), then name the cause with its evidence line and
    the runbook to run. Works with the server down. --since is taken in each host's time (its
    clock is read in the same round trip; more than a minute off: a warning line).

    Exit 0 every group healthy (or stopped on purpose) · 1 a finding · 2 bad input · 3 a host could not be read."""
    from ..hosts.clock import skew_warning
    from ..diagnose.run import diagnose_deployment, diagnosis_lines
    from ..render import dump_json
    from .common import load_deployment_arg
    from .options import duration, since as parse_since

    duration(window, "--window", zero=True, hi=300)
    if not 1 <= lines <= 100000:
        raise InputError(f"--lines {lines}: expected 1..100000")
    when = parse_since(since) if since else None
    dep = load_deployment_arg(profile, acts_on_hosts=True)
    servers = {g.name for g in dep.servers()}
    for g in group or []:
        if g not in servers:
            raise InputError(f"--group {g!r}: not a server group of {dep.name} ({', '.join(sorted(servers))})")
    doc = diagnose_deployment(dep, list(dict.fromkeys(group)) if group else None, since=when, window=window,
                              lines=lines, accept_new_host_keys=accept_new, api_key=api_key)
    for h, hd in doc["hosts"].items():
        warn = skew_warning(h, float("inf") if hd.get("clock_unusable") else hd.get("clock_offset_s"))
        if warn:
            print(warn, file=sys.stderr)
    import shlex
    prof = shlex.quote(str(dep.profile.path))       # hints run as typed: the profile as given
    if as_json:
        print(dump_json(doc))
    else:
        for ln in diagnosis_lines(doc, prof):
            print(ln)
    down = [h for h, d in doc["hosts"].items() if d["error"]]
    if down:
        raise DsvError(f"diagnose: {len(down)} host(s) could not be read: {doc['hosts'][down[0]]['error']}", EXIT_REMOTE)
    if not doc["ok"]:
        bad = [f for f in doc["findings"] if f["rule"] not in ("healthy", "stopped")]
        raise VerdictError(f"diagnose: {bad[0]['group']}: {bad[0]['cause']}"
                           + (f" (run: dsv4ctl runbook run {bad[0]['runbook']} {prof})" if bad[0]["runbook"] else ""),
                           label="diagnosis")


def register(app: typer.Typer) -> None:
    """Add ``diagnose`` to the root app."""
    app.command("diagnose")(diagnose)
