"""``dsv4ctl deploy`` / ``rollback`` / ``releases``: thin CLI over :mod:`dsv4ctl.deploy.engine`."""

from __future__ import annotations

import shlex
from typing import Optional

import typer

from ..render import console, dump_json, markdown_table, rich_table
from ..signals import terminate_as_interrupt
from .options import duration_option

_P = typer.Argument(None, help="Profile path or shipped name; required (or DSV4CTL_PROFILE): the command acts on hosts.")


def _opts(**kw):
    import sys
    from ..deploy.engine import Options
    verbose = kw.pop("verbose", False)
    quiet = kw.pop("quiet", False)
    secrets = kw.pop("secrets", frozenset())
    runlog = kw.pop("runlog", None)
    o = Options(**kw)
    from ..deploy.steps import mask_secrets
    o.log = (lambda s: None) if quiet else \
        (lambda s: print(f"dsv4ctl: {mask_secrets(s, secrets)}", file=sys.stderr, flush=True))

    started: dict[int, dict] = {}       # id(step) -> its run-log entry (duration_s added when it ends)

    def trace(st) -> None:
        if runlog is not None:
            started[id(st)] = {"phase": st.phase, "host": st.host, "stage": st.stage,
                               "summary": mask_secrets(st.summary, secrets)}
            runlog.steps.append(started[id(st)])
        if verbose and not quiet:
            print(f"dsv4ctl: step {mask_secrets(st.line(True), secrets)}", file=sys.stderr, flush=True)

    def done(st, seconds: float) -> None:
        if id(st) in started:
            started[id(st)]["duration_s"] = round(seconds, 3)
        if verbose and not quiet:
            print(f"dsv4ctl: done {st.host}: {st.phase} in {seconds:.2f} s", file=sys.stderr, flush=True)
    if not o.dry_run:
        o.trace, o.done = trace, done
    return o


class _RunLog:
    """One JSON line per mutating run in ``<state>/runs.jsonl`` (:func:`dsv4ctl.resources.state_root`):
    when, who, the command, the profile, the steps it executed, the outcome and exit code; secret
    values masked. Written whatever the outcome (best effort: a failure to write is ignored)."""

    def __init__(self, command: str, profile, secrets, dry_run: bool):
        self.command, self.profile, self.secrets, self.dry_run = command, profile, secrets, dry_run
        self.steps: list[dict] = []
        self.result: dict = {}

    def __enter__(self):
        return self

    def __exit__(self, et, e, tb):
        if self.dry_run:
            return False
        from ..deploy.runlog import append_run
        from ..deploy.steps import mask_secrets
        from ..errors import DsvError
        code = 0 if et is None else (e.exit_code if isinstance(e, DsvError) else 130 if et is KeyboardInterrupt else 1)
        append_run({"command": self.command, "profile": str(self.profile.path), "exit_code": code,
                    "error": "interrupted" if et is KeyboardInterrupt else mask_secrets(str(e), self.secrets) if e else None,
                    **self.result, "steps": self.steps}, self.secrets)
        return False


_QUIET = typer.Option(False, "--quiet", "-q", help="Print only errors and the verdict.")


def _out(rep: dict, secrets) -> str:
    """The ``--json`` document with every secret value masked."""
    from ..deploy.steps import mask_secrets
    return mask_secrets(dump_json(rep), secrets)


#: The longest health wait a run accepts (s): a day (options.MAX_SECONDS, the bound of every wait
#: option). nan, inf, 0 and negatives are refused.
from .options import MAX_SECONDS as MAX_HEALTH_TIMEOUT  # noqa: E402


def check_health_timeout(value, option: str = "--health-timeout"):
    """``value`` (seconds) when it is None or a finite number in (0, a day], else InputError
    (exit 2, before anything is read or locked): ``nan`` used to wait forever holding every
    host's lock, ``-5`` was accepted. The rule is :func:`dsv4ctl.commands.options.duration`."""
    from .options import duration
    return duration(value, option, hi=MAX_HEALTH_TIMEOUT)


def _profile(arg):
    from .common import load_deployment_arg
    return load_deployment_arg(arg, acts_on_hosts=True)


class _Interrupted:
    """Turn KeyboardInterrupt (Ctrl-C, or SIGTERM/SIGHUP: :func:`_sigterm_as_interrupt`) into
    DsvError(exit 130): typer maps a bare KeyboardInterrupt to an exit code that ``cli.main``
    does not see when ``standalone_mode=False``. Every error message leaves with the known
    ``secrets`` masked (a gate failure quotes server log lines and HTTP bodies, which may echo a
    key back)."""

    def __init__(self, secrets=frozenset()):
        self.secrets = secrets

    def __enter__(self):
        return self

    def __exit__(self, et, e, tb):
        from ..errors import EXIT_INTERRUPTED, DsvError
        if et is KeyboardInterrupt:
            raise DsvError("interrupted", exit_code=EXIT_INTERRUPTED) from e
        if isinstance(e, DsvError) and self.secrets:
            from ..deploy.steps import mask_secrets
            e.args = (mask_secrets(str(e), self.secrets),) + tuple(e.args[1:])
        return False


def _print_actions(title: str, rep: dict, verbose: bool = False, secrets=frozenset()) -> None:
    """A ``--dry-run`` listing: the title, then each step indented (``verbose``: with its exact
    command, secret values masked)."""
    from ..deploy.steps import Step, mask_secrets
    print(title)
    if not verbose or "steps" not in rep:
        for line in rep["actions"]:
            print(f"  {mask_secrets(line, secrets)}")
        return
    head = [a for a in rep["actions"] if not a.startswith(tuple(f"{s['host']}: " for s in rep["steps"]))
            and not a.startswith(("on a failed", "  "))]
    for line in head:
        print(f"  {line}")
    for s in rep["steps"]:
        print("  " + mask_secrets(Step(**s).line(True), secrets))
    if rep.get("on_failure"):
        print("  on a failed gate, check or an interrupt, instead (the hosts that switched):")
        for s in rep["on_failure"]:
            print("    " + mask_secrets(Step(**s).line(True), secrets))


_VERBOSE = typer.Option(False, "--verbose", "-v", help="With --dry-run: every exact command; in a run: each step as it runs, and its duration when it ends (secret values masked).")


class _Progress:
    """Push progress: rich bars on a terminal (stderr); otherwise one plain line per host at most
    every :func:`dsv4ctl.deploy.engine.progress_interval` s (``DSV4CTL_PROGRESS_S``) and when
    it ends, so a CI log shows a long push moving."""

    def __init__(self):
        import sys
        import time
        self.on = sys.stderr.isatty()
        self.tasks = {}
        self.p = None
        self.last: dict[str, float] = {}
        self.t0 = time.monotonic()
        if self.on:
            from rich.progress import BarColumn, Progress, TextColumn
            self.p = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                              console=console(stderr=True), transient=True)

    def __call__(self, host, done, total):
        if not self.p:
            import sys
            import time
            from ..deploy.engine import progress_interval
            now = time.monotonic()
            last = self.last.setdefault(host, now)
            if last < 0:
                return                   # its last line was printed
            if done >= total:            # the end, shown only for a push that showed progress
                if host in self.tasks:
                    print(f"dsv4ctl: push {host}: 100 %, {now - self.t0:.0f} s", file=sys.stderr, flush=True)
                self.last[host] = -1.0
            elif now - last >= progress_interval():
                self.tasks[host] = True
                self.last[host] = now
                print(f"dsv4ctl: push {host}: {100 * done // max(total, 1)} %, {now - self.t0:.0f} s", file=sys.stderr,
                      flush=True)
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
    health_timeout: Optional[float] = duration_option(None, "--health-timeout", help="How long to wait for health (900, 90s, 15m; at most 1d; default: deploy.health_timeout_s)."),
    break_lock: bool = typer.Option(False, "--break-lock", help="Remove a stale deploy lock first (audited)."),
    promote: bool = typer.Option(False, "--promote", help="Promotion pipeline: preflight (config lint + plan), push, canary, check smoke, check load (the profile's check: gate), the rest, mark good."),
    canary: Optional[str] = typer.Option(None, "--canary", help="With --promote: GROUP or HOST switched first (default: the decode group's host, else the first server group's)."),
    concurrency: Optional[str] = typer.Option(None, "--concurrency", help="With --promote: load gate concurrency (default: check.concurrency)."),
    max_corruption: Optional[float] = typer.Option(None, "--max-corruption", help="With --promote: gate on the 95 % Wilson upper bound (default: check.max_corruption)."),
    turns: Optional[int] = typer.Option(None, "--turns", help="With --promote: turns per load session (default: check.turns)."),
    min_requests: Optional[int] = typer.Option(None, "--min-requests", help="With --promote: turns per load level at least (default: check load's)."),
    no_compare: bool = typer.Option(False, "--no-compare", help="With --promote: no paired A/B against the running release when the SGLang version, patch series or environment changes (the upgrade gate; default: run it)."),
    force_failed: bool = typer.Option(False, "--force-failed", help="Activate a release recorded as failed anyway (audited; it stays active, never good)."),
    no_preflight: bool = typer.Option(False, "--no-preflight", help="Skip the config lint + plan preflight (audited)."),
    message: Optional[str] = typer.Option(None, "--message", "-m", help="Why this deploy (recorded in every host's audit log and the release's record; shown by releases)."),
    group: list[str] = typer.Option([], "--group", "-g", help="Only the hosts of this group (repeatable): only they switch and restart; every group on them must be named (or the host given)."),
    host: list[str] = typer.Option([], "--host", help="Only this host (repeatable): every group on it switches; a multi-node server only whole."),
    allow_mixed_pd: bool = typer.Option(False, "--allow-mixed-pd", help="With -g/--host: let prefill and decode end on different releases (recorded)."),
    as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.deploy/1 JSON report."),
    verbose: bool = _VERBOSE,
    quiet: bool = _QUIET,
) -> None:
    """Build a release (base + patch series + serve configs, and with sglang.environment the hashed
    lock of its Python environment, which every host builds with uv before the switch), push it to
    every host (delta), switch `current` atomically, restart, gate on health; roll back
    automatically on failure.

    Every deploy first runs config lint + plan on the serve configs it ships (--no-preflight skips
    it). The release ends `active` (health gate passed); `good` needs a promotion gate (--promote
    or `dsv4ctl promote`). A release recorded as failed is refused unless --promote or
    --force-failed.

    Upgrade gate: when --promote ships another SGLang version, patch series or environment than the
    running release, the canary and a server still on the running release get the same
    known-answer workload (`check load --compare`, paired turn by turn; PD or one host: through the
    router before and after the canary switch) and a significant rise of
    corrupted or wrong-argument calls (one-sided exact McNemar, p < 0.05) fails the promotion with
    the per-class differences and their 95 % intervals. It is sized to see +1 % over a 1 % baseline
    with power 0.8 (1,984 pairs; check.compare in the profile); --no-compare skips it.

    -g GROUP / --host HOST limit the deploy to those hosts: only they are pushed, switched,
    restarted and gated (the others keep their release). A host has one active release, so every
    group on a chosen host switches: -g G on a host that also runs H needs -g H (or --host); a
    multi-node server switches whole; a PD deployment's prefill and decode must end on one release
    (-g decode alone is refused unless --allow-mixed-pd); a router alone on its host may switch by
    itself. Not with --promote nor deploy.backend slurm.

    Exit 0 deployed · 1 rolled back (names host, group, last log lines; with --promote: the
    failing check, evidence kept), the preflight plan failed, or the release is recorded as failed
    · 2 bad input (or a preflight lint error) · 3 SSH/lock/push failure (no host switched), or a
    host lost during the switch, gate or close (the release not marked failed; the message names
    where each host is, the locks left and the command that finishes the job) · 130 interrupted
    (hosts rolled back)."""
    from ..deploy import engine
    po, message = _checked_args(health_timeout, message, no_preflight,
                                promote, canary, concurrency, max_corruption, turns, min_requests, no_compare)
    p = _profile(profile)
    lim = _limit(p, group, host, allow_mixed_pd, po)
    from ..deploy.steps import deployment_secrets
    secrets = deployment_secrets(p)
    terminate_as_interrupt()
    with _Interrupted(secrets), _Progress() as prog, _RunLog("deploy" + (" --promote" if po else "") + (" --force-failed" if force_failed else "") + (f" {lim.words}" if lim else ""), p, secrets, dry_run) as runlog:
        opts = _opts(secrets=secrets, dry_run=dry_run, accept_new_host_keys=accept_new, health_timeout=health_timeout,
                     break_lock=break_lock, progress=None if quiet else prog, verbose=verbose, quiet=quiet,
                     force_failed=force_failed, preflight=not no_preflight, runlog=runlog,
                     message=message, only=lim.hosts if lim else None, limit=lim.words if lim else None)
        rep = engine.deploy(p, opts, tree=tree, base_ref=base, patches=patch or None, promote=po)
        runlog.result = {"release": rep.get("release"), "state": rep.get("state")}
    if lim:
        rep["limited"] = {"hosts": list(lim.hosts), "groups": list(lim.groups), "selection": lim.words,
                          "mixed_pd": lim.mixed_pd}
    _print_deploy(rep, lim, po, as_json, dry_run, quiet, verbose, secrets)


def _checked_args(health_timeout, message, no_preflight, *promote_args):
    """(promotion options or None, the checked --message) of ``deploy``'s arguments, checked in
    this order: --health-timeout, the --promote options (:func:`_promote_opts`), --message,
    --no-preflight with --promote. InputError (exit 2) for the first bad one."""
    from ..errors import InputError
    from .options import message as check_message
    check_health_timeout(health_timeout)
    po = _promote_opts(*promote_args)
    message = check_message(message)
    if po is not None and no_preflight:
        raise InputError("--no-preflight cannot go with --promote: the promotion pipeline always runs its preflight")
    return po, message


def _print_deploy(rep: dict, lim, po, as_json: bool, dry_run: bool, quiet: bool, verbose: bool, secrets) -> None:
    """Print a deploy's report: the JSON document, a dry run's actions, one line (--quiet), or the
    per-host table (from, to, bytes sent, pruned) and, with --promote, the promotion's checks."""
    if as_json:
        print(_out(rep, secrets))
    elif dry_run:
        _print_actions(f"dry run: deploy {'--promote ' if po else ''}{rep['release']}"
                       + (f" to {', '.join(lim.hosts)} only ({lim.words})" if lim else "") + " (nothing changed)",
                       rep, verbose, secrets)
    elif quiet:
        print(f"deployed {rep['release']} ({rep.get('state') or 'unchanged'})")
    else:
        rows = []
        for h, r in rep["hosts"].items():
            push = r.get("push", {})
            rows.append([h, r["from"] or "-", rep["release"],
                         "present" if push.get("skipped") else f"{push.get('bytes_sent', 0):,}",
                         ",".join(r.get("pruned") or []) or "-"])
        console().print(rich_table(f"deployed {rep['release']}" + (f" to {', '.join(lim.hosts)} only ({lim.words})" if lim else "")
                                   + f" in {rep['seconds']:.1f} s",
                                   ["host", "from", "to", "bytes sent", "pruned"], rows, right=(3,)))
        if po:
            pr = rep["promotion"]
            print(f"promoted {rep['release']}: canary {', '.join(pr['canary'])}; "
                  + ", ".join(f"check {c['check']} pass" for c in pr["checks"])
                  + f"; marked good; evidence in {pr['evidence']}")


def _limit(dep, group, host, allow_mixed_pd, po):
    """The checked :class:`dsv4ctl.deploy.limit.Limit` of ``-g``/``--host`` (None: every host);
    InputError (exit 2) with --promote, with deploy.backend slurm, or by the rules of the limit."""
    from ..errors import InputError
    if not group and not host:
        if allow_mixed_pd:
            raise InputError("--allow-mixed-pd goes with -g/--host (a deploy of every host leaves nothing mixed)")
        return None
    if po is not None:
        raise InputError("-g/--host cannot go with --promote: its canary is the limited first step (--canary)")
    from ..deploy.service import limits_supported
    if not limits_supported(dep):
        raise InputError("-g/--host: a limited deploy is not supported with deploy.backend slurm (deploy every group)")
    from ..deploy.limit import limit_deploy
    return limit_deploy(dep, list(group), list(host), allow_mixed_pd)


def _promote_opts(promote, canary, concurrency, max_corruption, turns, min_requests, no_compare=False):
    from ..errors import InputError
    extra = {"--canary": canary, "--concurrency": concurrency, "--max-corruption": max_corruption,
             "--turns": turns, "--min-requests": min_requests, "--no-compare": no_compare or None}
    if not promote:
        used = [k for k, v in extra.items() if v is not None]
        if used:
            raise InputError(f"{used[0]} needs --promote")
        return None
    from .options import MAX_MIN_REQUESTS, MAX_TURNS, concurrency_levels, fraction, integer
    integer(turns, "--turns", 1, MAX_TURNS)
    fraction(max_corruption, "--max-corruption")
    integer(min_requests, "--min-requests", 0, MAX_MIN_REQUESTS)
    concurrency_levels(concurrency)
    from ..deploy.promote import PromoteOptions
    return PromoteOptions(canary=canary, concurrency=concurrency, max_corruption=max_corruption, turns=turns,
                          min_requests=min_requests, compare=not no_compare)


def promote(
    release: str = typer.Argument(..., help="Release id (the active release on every host)."),
    profile: Optional[str] = _P,
    concurrency: Optional[str] = typer.Option(None, "--concurrency", help="Load gate concurrency (default: check.concurrency)."),
    max_corruption: Optional[float] = typer.Option(None, "--max-corruption", help="Gate on the 95 % Wilson upper bound (default: check.max_corruption)."),
    turns: Optional[int] = typer.Option(None, "--turns", help="Turns per load session (default: check.turns)."),
    min_requests: Optional[int] = typer.Option(None, "--min-requests", help="Turns per load level at least."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the steps; run and change nothing."),
    accept_new: bool = typer.Option(False, "--accept-new-host-keys", help="Add unknown SSH host keys (accept-new)."),
    break_lock: bool = typer.Option(False, "--break-lock", help="Remove a stale deploy lock first (audited)."),
    message: Optional[str] = typer.Option(None, "--message", "-m", help="Why it is promoted (recorded in every host's audit log; shown by audit)."),
    as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.promote/1 JSON report."),
    verbose: bool = _VERBOSE,
    quiet: bool = _QUIET,
) -> None:
    """Mark the running release good by hand after check smoke + check load (the profile's gate)
    against the running deployment; the check reports are kept as evidence.

    Exit 0 marked good · 1 a check failed (the release is marked failed; evidence kept) · 2 not the
    active release on every host / bad input · 3 SSH or lock failure."""
    from ..deploy.promote import promote_by_hand
    from .options import message as check_message
    message = check_message(message)
    po = _promote_opts(True, None, concurrency, max_corruption, turns, min_requests)
    p = _profile(profile)
    from ..deploy.steps import deployment_secrets
    secrets = deployment_secrets(p)
    terminate_as_interrupt()
    with _Interrupted(secrets), _RunLog(f"promote {release}", p, secrets, dry_run) as runlog:
        rep = promote_by_hand(p, _opts(secrets=secrets, dry_run=dry_run, accept_new_host_keys=accept_new,
                                       break_lock=break_lock, verbose=verbose, quiet=quiet, runlog=runlog,
                                       message=message), release, po)
        runlog.result = {"release": release, "state": rep.get("result")}
    if as_json:
        print(_out(rep, secrets))
    elif dry_run:
        _print_actions(f"dry run: promote {release} (nothing run, nothing changed)", rep, verbose, secrets)
    else:
        print(f"promoted {release} on {', '.join(rep['hosts'])}: "
              + ", ".join(f"check {c['check']} pass" for c in rep["checks"]) + f"; evidence in {rep['evidence']}")


def rollback(
    profile: Optional[str] = _P,
    to: Optional[str] = typer.Option(None, "--to", metavar="RELEASE", help="Release id (default: the newest release built before the active one that passed its health gate on every host and was never marked failed)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the actions per host; change nothing."),
    accept_new: bool = typer.Option(False, "--accept-new-host-keys", help="Add unknown SSH host keys (accept-new)."),
    health_timeout: Optional[float] = duration_option(None, "--health-timeout", help="How long to wait for health (900, 90s, 15m; at most 1d; default: deploy.health_timeout_s)."),
    break_lock: bool = typer.Option(False, "--break-lock", help="Remove a stale deploy lock first (audited)."),
    force_failed: bool = typer.Option(False, "--force-failed", help="With --to: a release recorded as failed (audited; it stays active, never good)."),
    message: Optional[str] = typer.Option(None, "--message", "-m", metavar="TEXT", help="Why this rollback (recorded in every host's audit log; shown by audit)."),
    as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.rollback/1 JSON report."),
    verbose: bool = _VERBOSE,
    quiet: bool = _QUIET,
) -> None:
    """Switch every host to an older release (atomic), restart, gate on health.

    Without --to: the newest release built before the active one that passed its health gate on
    every host and was never marked failed (printed with why it was chosen).

    Exit 0 ok · 1 the release is recorded as failed (--force-failed) · 2 no such release on every
    host · 3 SSH/lock failure, the gate failed (hosts put back), or a host lost (the target not
    marked failed; where each host is, the locks left, the command that finishes the job) · 130
    interrupted (hosts put back)."""
    from ..deploy import engine
    from .options import message as check_message
    check_health_timeout(health_timeout)
    message = check_message(message)
    p = _profile(profile)
    from ..deploy.steps import deployment_secrets
    secrets = deployment_secrets(p)
    terminate_as_interrupt()
    with _Interrupted(secrets), _RunLog("rollback" + (f" --to {to}" if to else ""), p, secrets, dry_run) as runlog:
        rep = engine.rollback(p, _opts(secrets=secrets, dry_run=dry_run, accept_new_host_keys=accept_new,
                                       health_timeout=health_timeout, break_lock=break_lock, verbose=verbose,
                                       quiet=quiet, force_failed=force_failed, runlog=runlog, message=message), to=to,
                              command="dsv4ctl rollback" + (f" {shlex.quote(profile)}" if profile else ""))
        runlog.result = {"release": rep.get("release"), "state": rep.get("state")}
    if as_json:
        print(_out(rep, secrets))
    elif dry_run:
        _print_actions(f"dry run: rollback to {rep['release']} (nothing changed)", rep, verbose, secrets)
    else:
        print(f"rolled back to {rep['release']} on {', '.join(rep['hosts'])}")


def releases(
    profile: Optional[str] = _P,
    accept_new: bool = typer.Option(False, "--accept-new-host-keys", help="Add unknown SSH host keys (accept-new)."),
    as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.releases/1 JSON document."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown."),
) -> None:
    """Per host: release id, base, patches, when, who, state (active / previous / good / failed / pushed /
    ran: it passed its health gate once and is neither current nor previous now, never promoted),
    checks (promoted, or the check that failed with its reason and evidence).

    Exit 0 · 2 bad input · 3 a host could not be read (the others are still listed)."""
    from ..deploy import engine
    rep = engine.releases(_profile(profile), _opts(accept_new_host_keys=accept_new))
    down = {h: hr["error"] for h, hr in rep["hosts"].items() if hr.get("error")}
    if as_json:
        print(dump_json(rep))
        if down:
            from ..errors import RemoteError
            raise RemoteError(f"releases: {len(down)} host(s) could not be read: {next(iter(down.values()))}")
        return
    headers = ["host", "release", "state", "base", "patches", "when", "who", "checks"]
    rows = []
    for h, hr in rep["hosts"].items():
        for r in hr["releases"]:
            checks = (f"failed: {r['failed_check']}" + (f" ({r['failure'][:80]})" if r.get("failure") else "")
                      + (f", evidence {r['evidence']}" if r.get("evidence") else "")
                      if r.get("recorded_state") == "failed" and r.get("failed_check")
                      else ("forced after failing" if r.get("forced_at") else "promoted" if r.get("promoted_at") else "-"))
            if r.get("change"):         # a serve-config change (hicache --remote, config set --remote)
                what = f"{r['change']} (from {r['derived_from']})"
                checks = what if checks == "-" else f"{what}; {checks}"
            if r.get("message"):
                checks += f'; "{r["message"][:80]}"'
            if r.get("slurm_jobs"):     # deploy.backend: slurm (dsv4ctl's job records)
                from ..hosts.slurmrecord import jobs_text
                checks += "; slurm jobs: " + jobs_text(r["slurm_jobs"])

            rows.append([h, r["id"], r["state"], f"{r['base_ref']} ({(r['base_commit'] or '')[:10]})",
                         len(r["patches"]), r["when"], r["who"] or "-", checks])
        if hr.get("error"):
            rows.append([h, "-", "UNREACHABLE", "", "", "", "", hr["error"][:80]])
        elif not hr["releases"]:
            rows.append([h, "-", "no releases", "", "", "", "", ""])
    if markdown:
        print(markdown_table(headers, rows))
    else:
        console().print(rich_table("releases", headers, rows))
    for h, hr in rep["hosts"].items():
        if hr["lock"]:
            print(f"{h}: deploy lock held by {hr['lock']}")
    if down:
        from ..errors import RemoteError
        raise RemoteError(f"releases: {len(down)} host(s) could not be read: {next(iter(down.values()))}")


_GROUPS = typer.Option([], "--group", "-g", help="Only this group's servers (repeatable; default: every group).")
_L_DRY = typer.Option(False, "--dry-run", help="Print the steps per host; change nothing.")
_L_ACCEPT = typer.Option(False, "--accept-new-host-keys", help="Add unknown SSH host keys (accept-new).")
_L_HEALTH = duration_option(None, "--health-timeout", help="How long to wait for health (900, 90s, 15m; at most 1d; default: deploy.health_timeout_s).")
_L_BREAK = typer.Option(False, "--break-lock", help="Remove a stale deploy lock first (audited).")
_L_JSON = typer.Option(False, "--json", help="Print the dsv4ctl.lifecycle/1 JSON report.")
_HOSTS = typer.Option([], "--host", help="Only servers with a node on this host (repeatable; a multi-node server is acted on whole).")
_L_MESSAGE = typer.Option(None, "--message", "-m", metavar="TEXT", help="Why (recorded in every host's audit log; shown by audit, and by status for a stopped server).")


def _lifecycle(how: str, profile, group, host, batch, dry_run, accept_new, health_timeout, break_lock, as_json,
               verbose, quiet, message=None) -> None:
    """The body of start / stop / restart (:func:`dsv4ctl.deploy.lifecycle.lifecycle`)."""
    from ..deploy.lifecycle import lifecycle
    from .options import integer
    from .options import message as check_message
    check_health_timeout(health_timeout)
    integer(batch, "--batch", 1, 10_000)
    message = check_message(message)
    p = _profile(profile)
    from ..deploy.steps import deployment_secrets
    secrets = deployment_secrets(p)
    terminate_as_interrupt()
    cmd = how + "".join(f" -g {g}" for g in group) + "".join(f" --host {h}" for h in host) + (f" --batch {batch}" if batch else "")
    with _Interrupted(secrets), _RunLog(cmd, p, secrets, dry_run) as runlog:
        rep = lifecycle(p, _opts(secrets=secrets, dry_run=dry_run, accept_new_host_keys=accept_new,
                                 health_timeout=health_timeout, break_lock=break_lock, verbose=verbose, quiet=quiet,
                                 runlog=runlog, message=message), how, list(group) or None, list(host) or None, batch)
        runlog.result = {"servers": [x["server"] for x in rep["servers"]]}
    if as_json:
        print(_out(rep, secrets))
    elif dry_run:
        _print_actions(f"dry run: {how} (nothing changed)", rep, verbose, secrets)
    else:
        print(rep["detail"])


def start(
    profile: Optional[str] = _P,
    group: list[str] = _GROUPS,
    host: list[str] = _HOSTS,
    dry_run: bool = _L_DRY,
    accept_new: bool = _L_ACCEPT,
    health_timeout: Optional[float] = _L_HEALTH,
    break_lock: bool = _L_BREAK,
    message: Optional[str] = _L_MESSAGE,
    as_json: bool = _L_JSON,
    verbose: bool = _VERBOSE,
    quiet: bool = _QUIET,
) -> None:
    """Start the servers of the active release that are not running (running ones are left
    alone; a multi-node server with a node down is started whole), then gate them on health.

    Exit 0 started (or every server runs) · 1 a started server is not healthy · 2 bad input ·
    3 SSH/lock failure, a start command failed, or a server's hosts run different releases ·
    130 interrupted."""
    _lifecycle("start", profile, group, host, None, dry_run, accept_new, health_timeout, break_lock, as_json,
               verbose, quiet, message)


def stop(
    profile: Optional[str] = _P,
    group: list[str] = _GROUPS,
    host: list[str] = _HOSTS,
    dry_run: bool = _L_DRY,
    accept_new: bool = _L_ACCEPT,
    break_lock: bool = _L_BREAK,
    message: Optional[str] = _L_MESSAGE,
    as_json: bool = _L_JSON,
    verbose: bool = _VERBOSE,
    quiet: bool = _QUIET,
) -> None:
    """Stop the selected servers of the active release (SIGTERM to the process group, then
    SIGKILL; systemd units stopped). The release stays active: `start` or `deploy` brings them back.

    Exit 0 stopped (or none ran) · 2 bad input · 3 SSH/lock failure or a stop command failed ·
    130 interrupted."""
    _lifecycle("stop", profile, group, host, None, dry_run, accept_new, None, break_lock, as_json, verbose, quiet, message)


def restart(
    profile: Optional[str] = _P,
    group: list[str] = _GROUPS,
    host: list[str] = _HOSTS,
    batch: Optional[int] = typer.Option(None, "--batch", help="Rolling: restart this many servers at a time, each batch healthy before the next (default: all at once)."),
    dry_run: bool = _L_DRY,
    accept_new: bool = _L_ACCEPT,
    health_timeout: Optional[float] = _L_HEALTH,
    break_lock: bool = _L_BREAK,
    message: Optional[str] = _L_MESSAGE,
    as_json: bool = _L_JSON,
    verbose: bool = _VERBOSE,
    quiet: bool = _QUIET,
) -> None:
    """Restart the selected servers of the active release (every node of a multi-node server),
    gated on health like a deploy; with --batch N, N servers at a time, stopping at the first
    batch that is not healthy.

    Exit 0 restarted · 1 a restarted server is not healthy (later batches untouched) · 2 bad input ·
    3 SSH/lock failure or a stop/start command failed · 130 interrupted."""
    _lifecycle("restart", profile, group, host, batch, dry_run, accept_new, health_timeout, break_lock, as_json,
               verbose, quiet, message)


def register(app: typer.Typer) -> None:
    app.command("deploy")(deploy)
    app.command("start")(start)
    app.command("stop")(stop)
    app.command("restart")(restart)
    app.command("rollback")(rollback)
    app.command("releases")(releases)
    app.command("promote")(promote)
