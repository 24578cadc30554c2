"""``dsv4ctl deploy`` / ``rollback`` / ``releases``: thin CLI over :mod:`dsv4ctl.deploy.engine`."""

from __future__ import annotations

from typing import Optional

import typer

from ..render import console, dump_json, markdown_table, rich_table

_P = typer.Argument(None, help="Profile path or shipped name (default: the embedded dsv4-flash-8xb200-pd).")


def _opts(**kw):
    import sys
    from ..deploy.engine import Options
    o = Options(**kw)
    o.log = lambda s: print(f"dsv4ctl: {s}", file=sys.stderr, flush=True)
    return o


def _profile(arg):
    from ..profile import load_profile
    from ..resources import resolve_profile
    return load_profile(resolve_profile(arg))


class _Interrupted:
    """Turn KeyboardInterrupt into DsvError(exit 130): typer maps a bare KeyboardInterrupt to an
    exit code that ``cli.main`` does not see when ``standalone_mode=False``."""

    def __enter__(self):
        return self

    def __exit__(self, et, e, tb):
        if et is KeyboardInterrupt:
            from ..errors import EXIT_INTERRUPTED, DsvError
            raise DsvError("interrupted", exit_code=EXIT_INTERRUPTED) from e
        return False


def _sigterm_as_interrupt():
    import signal

    def h(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, h)


class _Progress:
    """rich progress bars for pushes (stderr, only on a terminal)."""

    def __init__(self):
        import sys
        self.on = sys.stderr.isatty()
        self.tasks = {}
        self.p = None
        if self.on:
            from rich.progress import BarColumn, Progress, TextColumn
            self.p = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                              console=console(stderr=True), transient=True)

    def __call__(self, host, done, total):
        if not self.p:
            return
        if host not in self.tasks:
            self.tasks[host] = self.p.add_task(f"push {host}", total=total)
        self.p.update(self.tasks[host], completed=done)

    def __enter__(self):
        if self.p:
            self.p.start()
        return self

    def __exit__(self, *a):
        if self.p:
            self.p.stop()


def deploy(
    profile: Optional[str] = _P,
    tree: Optional[str] = typer.Option(None, "--tree", help="Local SGLang git checkout (default: sglang.tree)."),
    base: Optional[str] = typer.Option(None, "--base", help="Base ref (default: sglang.base_ref)."),
    patch: list[str] = typer.Option([], "--patch", help="Patch file, in order (repeatable; default: sglang.series)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the actions per host; change nothing."),
    accept_new: bool = typer.Option(False, "--accept-new-host-keys", help="Add unknown SSH host keys to known_hosts (like OpenSSH accept-new); changed keys are always refused."),
    health_timeout: Optional[float] = typer.Option(None, "--health-timeout", help="Seconds to wait for health (default: deploy.health_timeout_s)."),
    break_lock: bool = typer.Option(False, "--break-lock", help="Remove a stale deploy lock first (audited)."),
    as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.deploy/1 JSON report."),
) -> None:
    """Build a release (base + patch series + serve configs), push it to every host (delta),
    switch `current` atomically, restart, gate on health; roll back automatically on failure.

    Exit 0 deployed · 1 rolled back (names host, group, last log lines) · 2 bad input ·
    3 SSH/lock/push failure (no host switched) · 130 interrupted (hosts rolled back)."""
    from ..deploy import engine
    p = _profile(profile)
    _sigterm_as_interrupt()
    with _Interrupted(), _Progress() as prog:
        opts = _opts(dry_run=dry_run, accept_new_host_keys=accept_new, health_timeout=health_timeout,
                     break_lock=break_lock, progress=prog)
        rep = engine.deploy(p, opts, tree=tree, base_ref=base, patches=patch or None)
    if as_json:
        print(dump_json(rep))
    elif dry_run:
        print(f"dry run: deploy {rep['release']} (nothing changed)")
        for line in rep["actions"]:
            print(f"  {line}")
    else:
        rows = []
        for h, r in rep["hosts"].items():
            push = r.get("push", {})
            rows.append([h, r["from"] or "-", rep["release"],
                         "present" if push.get("skipped") else f"{push.get('bytes_sent', 0):,}",
                         ",".join(r.get("pruned") or []) or "-"])
        console().print(rich_table(f"deployed {rep['release']} in {rep['seconds']:.1f} s",
                                   ["host", "from", "to", "bytes sent", "pruned"], rows, right=(3,)))


def rollback(
    profile: Optional[str] = _P,
    to: Optional[str] = typer.Option(None, "--to", help="Release id (default: the newest good release present on all hosts)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the actions per host; change nothing."),
    accept_new: bool = typer.Option(False, "--accept-new-host-keys", help="Add unknown SSH host keys (accept-new)."),
    health_timeout: Optional[float] = typer.Option(None, "--health-timeout", help="Seconds to wait for health."),
    break_lock: bool = typer.Option(False, "--break-lock", help="Remove a stale deploy lock first (audited)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Switch every host to an older release (atomic), restart, gate on health.

    Exit 0 ok · 2 no such release on every host · 3 SSH/lock failure or the gate failed (hosts put back)."""
    from ..deploy import engine
    p = _profile(profile)
    _sigterm_as_interrupt()
    with _Interrupted():
        rep = engine.rollback(p, _opts(dry_run=dry_run, accept_new_host_keys=accept_new, health_timeout=health_timeout,
                                       break_lock=break_lock), to=to)
    if as_json:
        print(dump_json(rep))
    elif dry_run:
        print(f"dry run: rollback to {rep['release']} (nothing changed)")
        for line in rep["actions"]:
            print(f"  {line}")
    else:
        print(f"rolled back to {rep['release']} on {', '.join(rep['hosts'])}")


def releases(
    profile: Optional[str] = _P,
    accept_new: bool = typer.Option(False, "--accept-new-host-keys", help="Add unknown SSH host keys (accept-new)."),
    as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.releases/1 JSON document."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown."),
) -> None:
    """Per host: release id, base, patches, when, who, state (active / previous / good / failed / pushed)."""
    from ..deploy import engine
    rep = engine.releases(_profile(profile), _opts(accept_new_host_keys=accept_new))
    if as_json:
        print(dump_json(rep))
        return
    headers = ["host", "release", "state", "base", "patches", "when", "who"]
    rows = []
    for h, hr in rep["hosts"].items():
        for r in hr["releases"]:
            rows.append([h, r["id"], r["state"], f"{r['base_ref']} ({(r['base_commit'] or '')[:10]})",
                         len(r["patches"]), r["when"], r["who"] or "-"])
        if not hr["releases"]:
            rows.append([h, "-", "no releases", "", "", "", ""])
    if markdown:
        print(markdown_table(headers, rows))
    else:
        console().print(rich_table("releases", headers, rows))
    for h, hr in rep["hosts"].items():
        if hr["lock"]:
            print(f"{h}: deploy lock held by {hr['lock']}")


def register(app: typer.Typer) -> None:
    app.command("deploy")(deploy)
    app.command("rollback")(rollback)
    app.command("releases")(releases)
