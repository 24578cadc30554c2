"""``dsv4ctl watch``: continuous known-answer probes and Prometheus metrics (core: :mod:`dsv4ctl.watch`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from ..errors import GateFailed, InputError, RemoteError
from ..render import dump_json, printable
from .options import duration_option

DEFAULT_LISTEN = "127.0.0.1:9477"
ARTIFACTS = ("rules", "dashboard", "unit")


def _listen(text: str) -> tuple[str, int]:
    from ..profile.deployment import parse_host_port
    try:
        host, port = parse_host_port(text)
    except ValueError as e:
        raise InputError(f"--listen {text!r}: {e} (expected HOST:PORT, e.g. {DEFAULT_LISTEN})") from None
    return host.strip("[]"), port


#: Options that never go into the printed unit's ExecStart (a unit is the continuous watch).
NOT_IN_UNIT = ("profile", "profile_opt", "print_", "once", "as_json", "runbook_url", "scrape_job")


def _unit_args(ctx: typer.Context) -> tuple[str, ...]:
    """The watch options given on this command line (besides the profile, ``--print``, ``--once``
    and ``--json``), as words for the unit's ExecStart: ``dsv4ctl watch P --listen A --print unit``
    prints a unit that runs ``dsv4ctl watch P --listen A``. ``--log`` becomes an absolute path."""
    import os
    out: list[str] = []
    for p in ctx.command.params:
        source = ctx.get_parameter_source(p.name)
        if p.param_type_name != "option" or p.name in NOT_IN_UNIT or getattr(source, "name", "") != "COMMANDLINE":
            continue
        opt, value = max(p.opts, key=len), ctx.params[p.name]
        if p.is_flag:
            out += [opt] if value else []
        else:
            for v in (value if p.multiple else [value]):
                out += [opt, os.path.abspath(str(v)) if p.name == "log" else str(v)]
    return tuple(out)


def _artifact(kind: str, profile_arg: Optional[str], slo: float, unit_args: tuple[str, ...] = (),
              rules_args: Optional[dict] = None) -> str:
    """The text of a shipped artifact: the Prometheus rules (for the profile's SLO; ``rules_args``:
    ``runbook_url`` and ``job`` of :func:`dsv4ctl.watch.rules.render_rules`), the Grafana
    dashboard, or the systemd unit (for this profile, with the watch options of this command
    line: ``unit_args``, see :func:`_unit_args`). InputError for a bad runbook URL or job name."""
    from ..resources import data_path
    if kind == "rules":
        from ..watch.rules import render_rules
        try:
            return render_rules(slo=slo, profile=profile_arg, **(rules_args or {}))
        except ValueError as e:
            flag = "--runbook-url" if str(e).startswith("runbook URL") else "--scrape-job"
            raise InputError(f"{flag}: {e}") from None
    if kind == "dashboard":
        return data_path("watch", "dashboard.json").read_text()
    from ..watch.unit import render_unit
    try:
        return render_unit(profile_arg, extra_args=unit_args)
    except ValueError as e:
        raise InputError(f"--print unit: {e}") from None


def watch(ctx: typer.Context,
          profile: Optional[str] = typer.Argument(None, help="Profile path or shipped name; required (or DSV4CTL_PROFILE)."),
          once: bool = typer.Option(False, "--once", help="One round (every target probed and scraped once), then exit."),
          as_json: bool = typer.Option(False, "--json", help="With --once: print the dsv4ctl.watch/1 JSON document."),
          interval: str = duration_option("10s", "--interval", lo=1, hi=86400, keep_text=True, help="Time between probes of one target (at least 1s: one probe per second per target, one in flight)."),
          listen: str = typer.Option(DEFAULT_LISTEN, "--listen", help="HOST:PORT of watch's own /metrics."),
          scrape_every: str = duration_option("15s", "--scrape-every", lo=1, hi=86400, keep_text=True, help="Time between scrapes of the servers' and routers' /metrics (1s..1d)."),
          release_every: str = duration_option("60s", "--release-every", lo=5, hi=86400, keep_text=True, help="Time between reads of each host's active release (SSH; 5s..1d)."),
          no_releases: bool = typer.Option(False, "--no-releases", help="Do not read releases over SSH (the release label stays 'unknown')."),
          stall_timeout: Optional[str] = duration_option(None, "--stall-timeout", lo=1, hi=3600, keep_text=True, help="A probe without progress this long is stuck (1s..1h; default: the profile's check.stall_timeout_s)."),
          on_alert: list[str] = typer.Option([], "--on-alert", help="[CONDITION=]RUNBOOK: run RUNBOOK when CONDITION (corruption, stuck; default corruption) holds. Dry run unless --auto."),
          auto: bool = typer.Option(False, "--auto", help="With --on-alert: run the runbook for real (--yes), not --dry-run."),
          alert_window: str = duration_option("1h", "--alert-window", lo=12, hi=7 * 86400, keep_text=True, help="Long window of the in-process corruption burn (12s..7d; short: 1/12 of it); at most one --on-alert run per condition per window."),
          settle: Optional[str] = duration_option(None, "--settle", lo=0, hi=7 * 86400, zero=True, keep_text=True, help="With --auto: no run on a release activated this recently by a deploy watch did not make (0..7d; default: the short burn window, 1/12 of --alert-window)."),
          log: Optional[Path] = typer.Option(None, "--log", help="Append every event as a JSON line to this file."),
          print_: Optional[str] = typer.Option(None, "--print", help="Print a shipped artifact and exit: rules (Prometheus rules for the profile's SLO; without a profile the embedded default's, 0.01), dashboard (Grafana JSON; its ratio panels read the rules' recorded series), unit (systemd unit running watch for this profile with the other options given here, e.g. --listen)."),
          runbook_url: Optional[str] = typer.Option(None, "--runbook-url", metavar="URL", help="With --print rules: the page of alert runbooks each alert's runbook_url links into (URL#alertname; default: the project's docs/alerts.md on GitHub)."),
          scrape_job: Optional[str] = typer.Option(None, "--scrape-job", metavar="JOB", help="With --print rules: Prometheus' job_name that scrapes this watch (DSV4WatchDown/DSV4WatchAbsent read its up series; default dsv4ctl-watch)."),
          verbose: bool = typer.Option(False, "--verbose", "-v", help="Also an event line for every ok probe (default: only probes not ok, alerts, releases)."),
          quiet: bool = typer.Option(False, "--quiet", "-q", help="No event lines on stderr."),
          accept_new: bool = typer.Option(False, "--accept-new-host-keys", help="Add unknown SSH host keys (accept-new).")) -> None:
    """Probe the deployment continuously with known-answer tool calls (the gate's classifier)
    through each router and to each colocated server, scrape SGLang's and the routers' /metrics,
    and serve watch's own Prometheus /metrics (probes by class, target and release: corrupted by the
    classes of docs/check.md, language_mix among them; failed: http_error, pd_transfer_failed,
    pd_bootstrap_failed, pd_aborted, stuck, auth_refused, client_error; latency; the release). It never changes the deployment unless
    --on-alert ... --auto says so, and then only on evidence about the release the hosts run:
    the corruption burn is per release, and before a run watch takes the deploy lock and reads
    what every host runs (not another release since, not within --settle of a deploy it did not
    make).

    Exit 0 stopped by SIGTERM (or --once: every probe ok) · 1 --once: a probe corrupted, stuck or
    failed · 2 bad input (a profile with nothing to probe, an interval under 1s, an unknown
    runbook) · 3 --listen cannot be bound, or --once could not reach any target · 130 SIGINT/SIGHUP
    (and SIGTERM during --once or before probing starts)."""
    import asyncio
    import signal

    from ..signals import terminate_as_interrupt
    # until the event loop's own handlers are in place (and while the profile loads), SIGTERM and
    # SIGHUP stop it like Ctrl-C: "interrupted", exit 130, never a death by signal
    terminate_as_interrupt()
    from ..watch import model as M
    from ..watch.run import Watcher, WatchOptions
    from .common import load_deployment_arg

    if print_ is not None and print_ not in ARTIFACTS:
        raise InputError(f"--print {print_!r}: expected one of {', '.join(ARTIFACTS)}")
    every, scrape, rel, window, settle_s = _durations(interval, scrape_every, release_every, alert_window, settle)
    _check_flags(once=once, as_json=as_json, print_=print_, auto=auto, on_alert=on_alert, no_releases=no_releases,
                 rules_only={"--runbook-url": runbook_url, "--scrape-job": scrape_job})
    dep = load_deployment_arg(profile, acts_on_hosts=print_ is None or print_ == "unit")
    if print_ == "unit" and once:
        raise InputError("--print unit writes the continuous watch as a service: --once does not go into it")
    from ..resources import runbook_names
    actions = M.parse_on_alert(on_alert, runbook_names())
    stall = _stall_timeout(dep, stall_timeout)
    listen_at = None if once else _listen(listen)
    if print_ == "rules" or "corruption" in actions:
        _burnable(dep)
    if print_ is not None:
        rules_args = {k: v for k, v in (("runbook_url", runbook_url), ("job", scrape_job)) if v is not None}
        _print_artifact(ctx, print_, profile, log, dep, rules_args)
        return
    key, secrets = _api_key(dep)
    events = _Events(_open_log(log), log, secrets, quiet=quiet, json_round=once and as_json)
    opts = WatchOptions(interval=every, stall_timeout=stall, release_every=rel, scrape_every=scrape,
                        listen=listen_at, api_key=key, slo=dep.check.max_corruption,
                        alert_window=window, on_alert=actions, auto=auto, settle=settle_s, read_releases=not no_releases,
                        accept_new_host_keys=accept_new, profile_arg=str(dep.path), emit=events.emit,
                        turn_timeout=max(stall * 5, 60.0), every_probe=verbose)
    w = Watcher(dep, opts)
    try:
        code = asyncio.run(_main(w, once=once, as_json=as_json, secrets=secrets))
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)      # stopping already: a second signal changes nothing
        events.close()
    if code:
        raise typer.Exit(code)


def _durations(interval: str, scrape_every: str, release_every: str, alert_window: str,
               settle: Optional[str]) -> tuple[float, float, float, float, Optional[float]]:
    """``(interval, scrape, release, alert window, settle)`` in seconds from the duration options
    (InputError out of their ranges; ``settle`` None when not given)."""
    from ..commands.options import duration
    from ..watch import model as M
    every = duration(interval, "--interval", lo=M.MIN_INTERVAL, hi=86400)
    scrape = duration(scrape_every, "--scrape-every", lo=1, hi=86400)
    rel = duration(release_every, "--release-every", lo=5, hi=86400)
    window = duration(alert_window, "--alert-window", lo=12, hi=7 * 86400)
    settle_s = None if settle is None else duration(settle, "--settle", lo=0, hi=7 * 86400, zero=True)
    return every, scrape, rel, window, settle_s


def _check_flags(*, once: bool, as_json: bool, print_: Optional[str], auto: bool, on_alert: list[str],
                 no_releases: bool, rules_only: Optional[dict] = None) -> None:
    """InputError for option combinations that do not go together (``rules_only``: {flag: value
    or None} of the options that only go with ``--print rules``)."""
    for flag, value in (rules_only or {}).items():
        if value is not None and print_ != "rules":
            raise InputError(f"{flag} goes with --print rules (it is written into the rule file)")
    if as_json and not once and print_ is None:
        raise InputError("--json needs --once (the continuous watch serves /metrics instead)")
    if auto and not on_alert:
        raise InputError("--auto needs --on-alert RUNBOOK (what to run)")
    if once and on_alert:
        raise InputError("--on-alert needs the continuous watch (an alert condition holds over a window, not one round)")
    if auto and no_releases:
        raise InputError("--auto needs the release reads (not --no-releases): they read the deploy lock a run must wait for")


def _stall_timeout(dep, stall_timeout: Optional[str]) -> float:
    """Seconds without progress after which a probe is stuck: ``--stall-timeout``, else the
    profile's ``check.stall_timeout_s`` (InputError outside 1..3600)."""
    from ..commands.options import duration
    if stall_timeout is not None:
        return duration(stall_timeout, "--stall-timeout", lo=1, hi=3600)
    stall = dep.check.stall_timeout_s
    if not 1 <= stall <= 3600:
        raise InputError(f"{dep.path}: check.stall_timeout_s {stall!r}: watch needs 1..3600 seconds "
                         "(or give --stall-timeout)")
    return stall


def _print_artifact(ctx: typer.Context, kind: str, profile: Optional[str], log: Optional[Path], dep,
                    rules_args: Optional[dict] = None) -> None:
    """``--print KIND``: write the artifact to stdout (InputError for a ``--log`` in no folder;
    ``rules_args`` as :func:`_artifact`)."""
    import os
    if log is not None and not os.path.isdir(os.path.dirname(os.path.abspath(log)) or "/"):
        raise InputError(f"--log {str(log)!r}: no such folder")
    # a profile file is named by its absolute path (a unit runs from /); a shipped name stays a name
    given = profile if profile is not None else os.environ.get("DSV4CTL_PROFILE") or None
    # without one, the rules' runbook commands say PROFILE (the embedded example is not one to act on)
    arg = os.path.abspath(given) if given and os.path.isfile(given) else given
    sys.stdout.write(_artifact(kind, arg, dep.check.max_corruption, _unit_args(ctx) if kind == "unit" else (),
                               rules_args))


def _api_key(dep) -> tuple[Optional[str], list[str]]:
    """``(API key, secrets to mask)`` for the probes (InputError for a key that cannot be sent)."""
    from ..deploy.site import api_key
    from .check import check_api_key, check_secrets
    key = api_key(dep)
    check_api_key(key, "the API key (DSV4CTL_API_KEY or a serve config's api-key)")
    return key, check_secrets(key, dep)


def _open_log(log: Optional[Path]):
    """``--log``'s file opened to append (None without one); InputError for a FIFO or a file that
    cannot be opened."""
    import os
    import stat as _stat
    if log is None:
        return None
    try:
        if os.path.exists(log) and _stat.S_ISFIFO(os.stat(log).st_mode):
            raise InputError(f"--log {log}: a FIFO (watch appends JSON lines to a file)")
        return open(log, "a", encoding="utf-8")
    except OSError as e:
        raise InputError(f"--log {log}: {e.strerror or e}") from None


class _Events:
    """Where watch's events go: masked, as JSON lines to ``--log`` (a write failure is said once,
    then events go to stderr only) and as lines on stderr (not with ``--quiet``; not the probes of
    a ``--once --json`` round)."""

    def __init__(self, log_file, log: Optional[Path], secrets: list[str], *, quiet: bool, json_round: bool) -> None:
        self.log_file, self.log, self.secrets = log_file, log, secrets
        self.quiet, self.json_round = quiet, json_round
        self.log_broken: list[str] = []

    def emit(self, e: dict) -> None:
        """One event (a dict with ``event``)."""
        from .check import masked
        from ..watch.run import event_line
        e = masked(e, self.secrets)              # a server that echoes the Authorization header back
        if self.log_file is not None:
            import json
            from ..hosts.audit import now_iso
            try:
                self.log_file.write(json.dumps({"ts": now_iso(), **e}, ensure_ascii=False, sort_keys=True) + "\n")
                self.log_file.flush()
            except OSError as err:          # a full disk: say so once, keep probing, events on stderr
                self.log_broken.append(str(err))
                try:
                    self.log_file.close()
                except OSError:
                    pass
                self.log_file = None
                print(f"watch: --log {self.log}: cannot write ({err.strerror or err}); events go to stderr only",
                      file=sys.stderr, flush=True)
        if not self.quiet and not (self.json_round and e.get("event") == "probe"):
            print(printable(event_line(e)), file=sys.stderr, flush=True)

    def close(self) -> None:
        """Close the log file (if still open)."""
        if self.log_file is not None:
            try:
                self.log_file.close()
            except OSError:
                pass


async def _main(w, *, once: bool, as_json: bool, secrets: list[str]) -> int:
    """Run the watcher ``w`` with the loop's signal handlers: one round (``once``, its verdict
    raised by :func:`_once_verdict`; 130 when interrupted) or until a signal (0 on SIGTERM, else
    130)."""
    import asyncio
    import signal
    loop = asyncio.get_running_loop()
    got: list[int] = []
    current = asyncio.current_task()

    def stop(sig: signal.Signals) -> None:
        got.append(sig)
        w.stop.set()
        if once and current is not None:
            current.cancel()            # one round: an interrupt ends it (exit 130)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop, sig)
    if once:
        try:
            doc = await w.once()
        except asyncio.CancelledError:
            return 130
        _once_verdict(doc, as_json, secrets)
        return 0
    await w.run()
    return 0 if not got or got[0] == signal.SIGTERM else 130


def _once_verdict(doc: dict, as_json: bool, secrets: list[str]) -> None:
    """Print a ``--once`` round (JSON or a table, secrets masked); InputError when every probed
    target refuses the API key, RemoteError when none could be reached, GateFailed when a probe
    was not ok."""
    from .check import masked
    doc = masked(doc, secrets)
    if as_json:
        print(dump_json(doc))
    else:
        _print_round(doc)
    probes = [t["probe"] for t in doc["targets"] if t["probe"]]
    if probes and all(p["class"] in AUTH_CLASSES for p in probes):
        raise InputError("watch --once: every probed target refuses the API key ("
                         + "; ".join(f"{p['target']}: {p['reason']}" for p in probes)
                         + "): set DSV4CTL_API_KEY or the serve config's api-key")
    if probes and all(_unreachable(p) for p in probes):
        raise RemoteError("watch --once: no probed target could be reached: "
                          + "; ".join(f"{p['target']}: {p['reason']}" for p in probes))
    if not doc["ok"]:
        bad = [p for p in probes if p["outcome"] != "ok"]
        raise GateFailed(f"{len(bad)} of {len(probes)} probes not ok: "
                         + "; ".join(f"{p['target']} {p['class']}" for p in bad))


def _burnable(dep) -> None:
    """InputError (exit 2) when the profile's ``check.max_corruption`` (the SLO) leaves the
    corruption burn alerts nothing to measure: 0 (no error budget to burn) or a budget whose fast
    burn (:data:`dsv4ctl.watch.rules.FAST_BURN` x SLO) is 100 % or more (it could never fire)."""
    from ..watch.rules import FAST_BURN
    slo = dep.check.max_corruption
    if not 0 < slo < 1 / FAST_BURN:
        raise InputError(f"{dep.path}: check.max_corruption {slo:g}: the corruption burn alerts need an error "
                         f"budget above 0 and below {1 / FAST_BURN:g} (they fire at {FAST_BURN:g}x it)")


AUTH_CLASSES = ("auth_refused",)


def _unreachable(p: dict) -> bool:
    """A probe that found nothing to talk to: refused/reset connections, or this machine's own
    failure (DNS, descriptors: ``client_error``)."""
    return p["class"] == "client_error" or (p["class"] == "http_error" and p["reason"].startswith(
        ("ClientConnectorError", "ClientOSError", "ServerDisconnectedError")))


def _print_round(doc: dict) -> None:
    from ..render import console, rich_table
    rows = []
    for t in doc["targets"]:
        p, s = t["probe"], t["scrape"] or {}
        rows.append([t["name"], t["role"], t["release"], t["state"],
                     "-" if p is None else p["class"], "-" if p is None or p["e2e_s"] is None else f"{p['e2e_s']:.2f}",
                     "up" if s.get("up") else (s.get("error") or "-")])
    console().print(rich_table(f"watch {doc['profile']}", ["target", "role", "release", "state", "probe", "e2e s",
                                                           "metrics"], rows))


def register(app: typer.Typer) -> None:
    """Add ``watch`` to the root app."""
    app.command("watch")(watch)
