"""``dsv4ctl check smoke`` and ``dsv4ctl check load``: thin CLI over :mod:`dsv4ctl.check`.

Exit codes (issue 6): 0 pass, 1 a check or the corruption gate failed, 2 usage or connection error.
aiohttp, rich and jsonschema are imported inside the commands."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Tuple

import typer

from ..errors import EXIT_INTERRUPTED, EXIT_USAGE, DsvError, GateFailed, InputError
from ..render import console, dump_json, markdown_table, printable, rich_table

check_app = typer.Typer(help="Tool-call correctness checks: smoke (endpoints) and load (corruption gate).",
                        no_args_is_help=True)


def _profile_targets(profile: str):
    from ..check.targets import from_profile
    from .common import load_deployment_arg
    prof = load_deployment_arg(profile)
    return prof, from_profile(prof)


from .options import MAX_ANSWER_WORDS, MAX_MIN_REQUESTS, MAX_TURNS  # noqa: E402  (the limits' one home)
from .options import concurrency_levels as _parse_levels  # noqa: E402
from .options import duration as _duration  # noqa: E402
from .options import duration_option  # noqa: E402


def check_secrets(api_key: Optional[str], dep=None) -> set[str]:
    """The secret values a check's output must not show: the bearer ``api_key`` (every spelling:
    :func:`dsv4ctl.deploy.steps.secret_spellings`) and, with a profile, its Deployment's
    (:func:`dsv4ctl.deploy.steps.deployment_secrets`)."""
    from ..deploy.steps import deployment_secrets, secret_spellings
    out = secret_spellings([api_key]) if api_key else set()
    return out | deployment_secrets(dep) if dep is not None else out


def masked(x, secrets: set[str]):
    """``x`` (a check's lines, document or per-turn record: dicts, lists, strings) with every
    string masked as in logs (:func:`dsv4ctl.deploy.steps.mask_secrets`: the ``secrets`` and, as a
    second net, ``Authorization: Bearer X``, ``--api-key X``, ``API_KEY=X``): a server that echoes
    request headers back (in an error body, a model id) never gets the key printed, in tables,
    JSON, records or error lines."""
    from ..deploy.steps import mask_secrets
    if isinstance(x, str):
        return mask_secrets(x, secrets)
    if isinstance(x, dict):     # keys and the document's own vocabulary are dsv4ctl's, never a server's
        return {k: v if k in OWN_FIELDS and isinstance(v, str) else masked(v, secrets) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [masked(v, secrets) for v in x]
    return x


OWN_FIELDS = frozenset({"schema", "event", "class", "outcome", "role", "mode", "condition", "state", "source",
                        "verdict", "level"})
"""Fields whose string values are dsv4ctl's own words (a class, an outcome, a schema id): not
masked, so a short API key that happens to spell one (``ok``) cannot corrupt the document."""


class MaskedRecords:
    """A file-like sink for ``check load``'s per-turn JSON lines that masks every string of each
    record (:func:`masked`) before passing the line on to ``out`` (the ``--records`` file, or a
    :class:`dsv4ctl.report.csvout.TurnsCsvWriter`)."""

    def __init__(self, out, secrets: set[str]):
        self.out, self.secrets = out, secrets
        masked("", secrets)     # import the masking code now: mid-run, out of descriptors, it could not be

    def write(self, text: str) -> int:
        """Mask and pass on the JSON lines of ``text``; returns ``len(text)``."""
        import json
        lines = [json.dumps(masked(json.loads(ln), self.secrets), ensure_ascii=False) + "\n"
                 for ln in text.splitlines() if ln.strip()]
        self.out.write("".join(lines))
        return len(text)

    def close(self) -> None:
        """Close ``out``."""
        self.out.close()


def _profile_key(dep, api_key: Optional[str]) -> Optional[str]:
    """``api_key`` (``--api-key`` / DSV4CTL_API_KEY), else the profile's serve configs' ``api-key``
    (:func:`dsv4ctl.deploy.site.api_key`, as ``deploy --promote`` sends it)."""
    if api_key is not None:
        return api_key
    from ..deploy.site import api_key as serve_config_key
    return serve_config_key(dep)


def check_api_key(key: Optional[str], where: str = "--api-key / DSV4CTL_API_KEY") -> None:
    """A bearer token must be printable ASCII (it goes into an HTTP header); the key itself is
    never echoed."""
    if key is not None and not all(0x21 <= ord(c) <= 0x7e for c in key):
        raise InputError(f"{where}: must be printable ASCII without spaces or control characters "
                         "(a trailing newline from a YAML '|' block?; key not shown)")


class _RecordsFile:
    """A ``--records`` / ``--turns-csv`` file opened for a run, its content left as it was until
    the run's first turn record (:meth:`start` empties a regular file then): a run that never sends
    a turn (cannot connect, the key refused, Ctrl-C before the first answer) leaves an operator's
    earlier records as they were, and removes a file it made (:meth:`abandon`). Writability is
    proved when it is opened (a full disk or /dev/full fails here, before any load is sent):
    a regular file gets one "\n" past its end and is cut back to its size; a pipe gets the "\n".
    InputError if it cannot be opened or written."""

    def __init__(self, path: Path):
        import os
        import stat
        made = not os.path.lexists(path)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as e:
            raise InputError(f"--records {path}: {e.strerror or e}") from None
        try:
            st = os.fstat(fd)
            self.regular = stat.S_ISREG(st.st_mode)
            if self.regular:
                os.pwrite(fd, b"\n", st.st_size)
                os.ftruncate(fd, st.st_size)
            else:
                os.write(fd, b"\n")
        except OSError as e:
            os.close(fd)
            if made:
                self._unlink(path)
            raise InputError(f"--records {path}: not writable: {e.strerror or e}") from None
        self.path, self.made = path, made and self.regular
        self.f = os.fdopen(fd, "w", encoding="utf-8", buffering=1)   # line-buffered: records survive a crash

    @staticmethod
    def _unlink(path: Path) -> None:
        import os
        try:
            os.unlink(path)
        except OSError:
            pass

    def start(self) -> None:
        """The first record comes: empty a regular file (an earlier run's records go now)."""
        if self.regular:
            self.f.truncate(0)

    def abandon(self) -> None:
        """No record came: close, and remove the file when this run made it."""
        self.f.close()
        if self.made:
            self._unlink(self.path)


class _OnFirstRecord:
    """The per-turn sink chain (:func:`_record_sinks`), built when the first turn record is
    written: each :class:`_RecordsFile` is emptied then, the --turns-csv header written then.
    Closed before any record, every file is abandoned as it was found."""

    def __init__(self, files: list, build):
        self.files, self.build, self.sink, self.closed = files, build, None, False

    def write(self, text: str) -> int:
        if self.sink is None:
            for f in self.files:
                f.start()
            self.sink = self.build()
        return self.sink.write(text)

    def close(self) -> None:
        """Close the chain (or abandon the files when nothing was written); once."""
        if self.closed:
            return
        self.closed = True
        if self.sink is not None:
            self.sink.close()
        else:
            for f in self.files:
                f.abandon()


def _connect_error(message: str, what: str) -> DsvError:
    """Exit 2 with the one line of a connection / discovery failure (:mod:`dsv4ctl.check.driver`
    words it: "cannot connect to HOST:PORT (connection refused)", "HOST:PORT refuses the API key
    (HTTP 401 ...)")."""
    from ..render import printable
    return DsvError(f"{what}: " + printable(message).replace("\n", " "), exit_code=EXIT_USAGE)


def smoke_release(dep, expect_version: Optional[str]) -> tuple[Optional[str], str]:
    """(the SGLang release every worker must report, where that comes from): ``--expect-version``
    (checked: a supported release, ``v0.5.22`` is 0.5.22), else the profile's release (its tree's
    own version, else ``sglang.version``: :func:`dsv4ctl.plan.sglang_version.resolve_version`),
    else None: any supported release passes. InputError (exit 2) for an unsupported one."""
    if expect_version is not None:
        from ..plan.versions import rules_for
        return rules_for(expect_version, "--expect-version").version, "--expect-version"
    if dep is None:
        return None, "any supported release (no profile, no --expect-version)"
    from ..plan.sglang_version import resolve_version
    choice = resolve_version(dep)
    return choice.version, choice.source


def release_line(rel: dict) -> str:
    """The smoke output's release line: the SGLang versions the workers reported with their output
    paths, and the release expected (and where that came from)."""
    seen = ", ".join(f"{v} ({rel['output_paths'].get(v) or 'unsupported'} output path)" for v in rel["seen"]) or "none reported"
    want = f"{rel['expected']} ({rel['source']})" if rel["expected"] else rel["source"]
    return printable(f"SGLang seen: {seen}; expected: {want}")


@check_app.command("smoke")
def smoke(
    url: Optional[str] = typer.Argument(None, help="Server or router URL (http://host:port)."),
    profile: Optional[str] = typer.Option(None, "--profile", "-p", help="Profile: workers from its server groups, entry = its router."),
    worker: Optional[list[str]] = typer.Option(None, "--worker", metavar="URL",
                                               help="A worker behind the URL (repeat): health and server_info are read from it, not from the URL (default: the URL itself, or the workers a gateway at the URL lists)."),
    model: Optional[str] = typer.Option(None, "--model", help="Model name (default: the first of /v1/models)."),
    timeout: float = duration_option(60.0, "--timeout", help="How long each probe may take for its complete answer (and without progress) before it fails (60, 90s, 5m; at most 1d)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="DSV4CTL_API_KEY", show_default=False,
                                          help="Bearer token for servers started with --api-key (or DSV4CTL_API_KEY; with --profile else the serve config's api-key); never printed."),
    expect_version: Optional[str] = typer.Option(None, "--expect-version", metavar="VERSION",
                                                 help="The SGLang release every worker must report (0.5.18-0.5.23; default with --profile: the version of the profile's tree, else its sglang.version; with a URL: any supported release, the one seen is reported)."),
    as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.check.smoke/1 JSON document."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown."),
) -> None:
    """/health on every worker, /v1/models, /server_info (version, parsers, disaggregation, HiCache as
    running; read from the workers, never from a gateway: a PD gateway at the URL is reported as a
    "router" line), one chat and one known-answer tool call (JSON and SSE) through the entry URL, then
    probes: a known-answer request replayed from the prefix cache and after /flush_cache (same calls),
    tool_choice none / required / named, an over-length prompt that must get a 4xx, a prompt
    between the KV pool's limit and the context length that must get a 4xx too (over_pool), and
    usage.prompt_tokens against the bytes sent.

    Exit 0 all pass, 1 a check failed, 2 usage error, the entry URL unreachable or the API key
    refused (HTTP 401/403)."""
    import asyncio

    from ..check.smoke import Worker, release_seen, run_smoke
    from ..check.targets import normalize_url

    if (url is None) == (profile is None):
        raise InputError("check smoke: give a URL or --profile (not both)")
    if worker and profile:
        raise InputError("check smoke: --worker goes with a URL (with --profile the workers are its server groups)")
    _duration(timeout, "--timeout")
    check_api_key(api_key)
    dep = None
    if profile:
        dep, t = _profile_targets(profile)
        entry = t.load_entry("check smoke --profile {profile}", "chats sent to the prefill alone never decode",
                             "dsv4ctl check smoke http://ROUTER:PORT")
        workers = t.workers
        api_key = _profile_key(dep, api_key)
        check_api_key(api_key)
    else:
        entry = normalize_url(url)
        workers = [Worker(name=u, url=u) for u in dict.fromkeys(normalize_url(w) for w in worker or [])]
    expect, source = smoke_release(dep, expect_version)
    secrets = check_secrets(api_key, dep)
    from ..check.driver import ConnectError
    try:
        lines, reachable = asyncio.run(run_smoke(entry, workers, model=model, timeout=timeout, api_key=api_key,
                                                 expect_version=expect))
    except ConnectError as e:       # this machine failed (descriptors, DNS, the API key): no verdict
        raise _connect_error(masked(str(e), secrets), "check smoke") from None
    except KeyboardInterrupt:
        raise DsvError("interrupted", exit_code=EXIT_INTERRUPTED) from None
    lines = masked(lines, secrets)
    doc = {"schema": "dsv4ctl.check.smoke/1", "entry": entry, "pass": all(x["status"] != "fail" for x in lines),
           "sglang": release_seen(lines, expect, source), "checks": lines}
    headers = ["check", "target", "status", "reason"]
    rows = [[printable(str(c)) for c in (x["check"], x["target"], x["status"], x["reason"])] for x in lines]
    if as_json:
        print(dump_json(doc))
    elif markdown:
        print(f"## dsv4ctl check smoke: {entry}\n")
        print(markdown_table(headers, rows))
        print(f"\n{release_line(doc['sglang'])}")
    else:
        con = console()
        t = rich_table(f"dsv4ctl check smoke: {entry}", headers, [])
        for r in rows:
            style = {"pass": "green", "fail": "bold red", "skip": "yellow"}[r[2]]
            t.add_row(r[0], r[1], f"[{style}]{r[2]}[/]", r[3])
        con.print(t)
        print(release_line(doc["sglang"]))
    if not reachable:
        why = next((x["reason"] for x in lines if x["check"] == "models" and x["status"] == "fail"), f"{entry} unreachable")
        raise DsvError(f"check smoke: {why}", exit_code=EXIT_USAGE)
    if not doc["pass"]:
        failed = [f"{x['check']} {x['target']}: {x['reason']}" for x in lines if x["status"] == "fail"]
        raise GateFailed(f"check smoke: {len(failed)} check(s) failed: {failed[0]}")


@check_app.command("load")
def load(
    url: Optional[str] = typer.Argument(None, help="Server or router URL (http://host:port)."),
    profile: Optional[str] = typer.Option(None, "--profile", "-p", help="Profile: traffic to its router; /metrics from its servers; defaults from its check: section."),
    compare: Optional[Tuple[str, str]] = typer.Option(None, "--compare", metavar="URL_A URL_B",
                                                      help="Run the same load against two URLs (e.g. HiCache on vs off) and test the difference."),
    concurrency: Optional[str] = typer.Option(None, "--concurrency", "-c", help="Concurrent sessions, or a sweep 1,20,40,60,80 (default 64; at most 64 levels of at most 4096)."),
    turns: Optional[int] = typer.Option(None, "--turns", help="Turns per session, 1..10000 (default 8; the last is a long answer)."),
    min_requests: Optional[int] = typer.Option(None, "--min-requests", help="Turns per level at least (default: enough for 0 failures to pass the gate, 381 at 1 %)."),
    stream: str = typer.Option("mixed", "--stream", help="on | off | mixed (even sessions stream)."),
    stall_timeout: Optional[float] = duration_option(None, "--stall-timeout", help="How long without a byte before a turn is stuck (60, 90s, 2m; at most 1d; default: the profile's check.stall_timeout_s, else 60)."),
    turn_timeout: float = duration_option(600.0, "--turn-timeout", help="How long one turn's complete answer may take before it is stuck (600, 90s, 10m; at most 1d)."),
    max_duration: Optional[float] = duration_option(None, "--max-duration", help="How long a level may run (300, 90s, 15m, 2h; at most 1d): then it issues no new turn (turns in flight finish); a capped level says so and judges what it has (default: no cap)."),
    max_corruption: Optional[float] = typer.Option(None, "--max-corruption", help="Gate: the 95 % Wilson upper bound of the corruption rate must be <= this (default 0.01)."),
    records: Optional[Path] = typer.Option(None, "--records", help="Write per-turn records (JSONL, with request ids) here."),
    metrics: bool = typer.Option(True, "--metrics/--no-metrics", help="Scrape /metrics before and after each level."),
    gateway_metrics: Optional[str] = typer.Option(None, "--gateway-metrics", metavar="URL",
                                                  help="The gateway's own Prometheus URL (http://router:29000/metrics): its retries and circuit-breaker failures per level (default with --profile: the entry router's prometheus_host/prometheus_port, the first router group, which gets the traffic; other routers are not scraped)."),
    model: Optional[str] = typer.Option(None, "--model", help="Model name (default: the first of /v1/models)."),
    answer_words: int = typer.Option(150, "--answer-words", help="Length of the final long answer turn (words)."),
    thinking: bool = typer.Option(False, "--thinking", help="Ask for thinking (chat_template_kwargs.thinking); an answer without reasoning_content is then reasoning_in_content."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="DSV4CTL_API_KEY", show_default=False,
                                          help="Bearer token for servers started with --api-key (or DSV4CTL_API_KEY; with --profile else the serve config's api-key); never printed or written to records."),
    as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.check.load/1 JSON document."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown."),
    csv: bool = typer.Option(False, "--csv", help="Print CSV: one row per URL and level (rate, Wilson bounds, latency percentiles, class counts)."),
    turns_csv: Optional[Path] = typer.Option(None, "--turns-csv", help="Write one CSV row per turn here (the --records fields)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also a line on stderr for every turn that is not ok, as it is classified (class, reason, request id)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar; as text only the verdict line (--json, --markdown, --csv unchanged)."),
) -> None:
    """N concurrent multi-turn agent sessions with tools; every turn classified; corruption rate per
    class and level with a 95 % Wilson interval; gate on its upper bound. A level where the server
    stops answering (K = max(8, sessions) consecutive connection errors) is a crash: the ramp stops
    there and the gate fails.

    Exit 0 gate passed, 1 gate failed or the server crashed, 2 usage or connection error, or the
    API key refused (HTTP 401/403 before the server took it)."""
    import asyncio
    import sys

    from ..check.driver import BadResponse, ConnectError, ensure_fd_limit
    from ..check.load import run_load

    if as_json + markdown + csv > 1:
        raise InputError("check load: --json, --markdown and --csv exclude each other")
    a = _load_args(url, profile, compare, concurrency, turns, min_requests, max_corruption, stall_timeout,
                   turn_timeout, max_duration, stream, answer_words, metrics, gateway_metrics, api_key)
    secrets = check_secrets(a.api_key, a.dep)
    # SIGTERM/SIGHUP before the load's own handlers are in place (opening --records, the first
    # connections) are an interrupt too, never a silent death (exit -15 with no message)
    from ..signals import terminate_as_interrupt
    terminate_as_interrupt()
    rec_file = _record_sinks(records, turns_csv, verbose, secrets)
    settings = {"urls": a.urls, "concurrency": a.levels, "turns": a.turns, "min_requests": a.min_requests,
                "stream": stream, "stall_timeout_s": a.stall, "turn_timeout_s": turn_timeout,
                "answer_words": answer_words, "thinking": thinking, "records": str(records) if records else None,
                "gateway_metrics": a.gateway_metrics, "gateway_scope": a.gateway_scope, "max_duration_s": max_duration}
    try:
        ensure_fd_limit(max(a.levels))
    except ValueError as e:
        raise InputError(f"check load: {e}") from None
    try:
        doc = asyncio.run(run_load(a.urls, a.levels, a.turns, a.min_requests, stream, a.stall, answer_words, a.max_c,
                                   model, metrics, a.metric_urls, rec_file,
                                   _Progress if progress and not quiet and sys.stderr.isatty() else None, settings,
                                   a.api_key, turn_timeout, thinking, a.gateway_metrics, max_duration))
    except (ConnectError, BadResponse) as e:
        if rec_file:
            rec_file.close()    # no turn ran: an earlier run's records stay, a file this run made goes
        raise _connect_error(masked(str(e), secrets), "check load") from None
    except KeyboardInterrupt:
        # raised here as a DsvError: typer turns a KeyboardInterrupt into a return value of 130 in
        # non-standalone mode, which the CLI entry point does not pass on
        wrote = rec_file is not None and rec_file.sink is not None     # else the file is as it was
        raise DsvError("interrupted" + (f" (records so far in {records})" if records and wrote else ""),
                       exit_code=EXIT_INTERRUPTED) from None
    except OSError as e:        # writing --records failed mid-run (disk full)
        raise InputError(f"--records {records}: write failed: {e.strerror or e}") from None
    finally:
        if rec_file:
            try:
                rec_file.close()
            except OSError:     # line-buffered: only the part of a line that failed is lost
                pass
    doc = masked(doc, secrets)
    if csv:
        from ..report.csvout import load_levels_csv
        print(load_levels_csv(doc), end="")
    elif quiet and not (as_json or markdown):
        print(_verdict_line(doc))
    else:
        _print_load(doc, as_json, markdown)
    _load_gate(doc, a.max_c, records)


@dataclass
class _LoadArgs:
    """``check load``'s resolved source and gate: the URLs, the profile's Deployment (None without
    ``--profile``), its /metrics and gateway URLs, and each option with the profile's (else the
    built-in) default filled in and checked."""

    urls: list[str]
    dep: Any
    metric_urls: Optional[list[str]]
    gateway_metrics: Optional[str]
    gateway_scope: Optional[str]
    levels: list[int]
    turns: int
    max_c: float
    stall: float
    min_requests: int
    api_key: Optional[str]


def _load_args(url, profile, compare, concurrency, turns, min_requests, max_corruption, stall_timeout, turn_timeout,
               max_duration, stream, answer_words, metrics, gateway_metrics, api_key) -> _LoadArgs:
    """Exactly one source (URL, --profile, --compare), its defaults, every option checked
    (InputError, exit 2)."""
    from ..check import report as R
    from ..check.targets import normalize_url
    from ..profile.deployment import CheckSettings
    from .options import fraction, integer
    sources = sum(x is not None for x in (url, profile, compare))
    if sources != 1:
        raise InputError("check load: give exactly one of URL, --profile, --compare URL_A URL_B")
    defaults, dep, metric_urls, gateway_scope = CheckSettings(), None, None, None
    if profile:
        dep, t = _profile_targets(profile)
        defaults = dep.check
        api_key = _profile_key(dep, api_key)
        urls = [t.load_entry()]
        metric_urls = [w.url for w in t.workers]
        if gateway_metrics is None and metrics:
            gateway_metrics = t.gateway_metrics
            gateway_scope = t.gateway_scope()
    elif compare:
        urls = [normalize_url(compare[0]), normalize_url(compare[1])]
        if urls[0] == urls[1]:
            raise InputError("--compare needs two different URLs")
    else:
        urls = [normalize_url(url)]
    levels = _parse_levels(concurrency if concurrency is not None else defaults.concurrency_arg)
    turns = turns if turns is not None else defaults.turns
    max_c = max_corruption if max_corruption is not None else defaults.max_corruption
    stall = stall_timeout if stall_timeout is not None else defaults.stall_timeout_s
    integer(turns, "--turns", 1, MAX_TURNS)
    fraction(max_c, "--max-corruption")
    _duration(stall, "--stall-timeout")
    _duration(turn_timeout, "--turn-timeout")
    if max_duration is not None:
        _duration(max_duration, "--max-duration")
    check_api_key(api_key)
    if stream not in ("on", "off", "mixed"):
        raise InputError(f"--stream {stream!r}: expected on, off or mixed")
    integer(answer_words, "--answer-words", 1, MAX_ANSWER_WORDS)
    if gateway_metrics is not None:
        gateway_metrics = normalize_url(gateway_metrics)
    if min_requests is None:
        min_requests = R.min_requests_for_gate(max_c) if max_c > 0 else 0
    else:
        integer(min_requests, "--min-requests", 0, MAX_MIN_REQUESTS)
    return _LoadArgs(urls, dep, metric_urls, gateway_metrics, gateway_scope, levels, turns, max_c, stall,
                     min_requests, api_key)


def _record_sinks(records: Optional[Path], turns_csv: Optional[Path], verbose: bool, secrets: set[str]):
    """The per-turn sink: --records (JSONL), --turns-csv, -v's stderr lines, chained and masked
    (records are masked as logs are: the key, echoed headers); None when nothing wants them. The
    files are opened (and proved writable) now, emptied at the first turn record
    (:class:`_OnFirstRecord`)."""
    rec = _RecordsFile(records) if records is not None else None
    try:
        tcsv = _RecordsFile(turns_csv) if turns_csv is not None else None
    except InputError:
        if rec is not None:
            rec.abandon()
        raise
    if rec is None and tcsv is None and not verbose:
        return None
    from ..report.csvout import TurnsCsvWriter
    masked("", secrets)     # imported now: at the first record, out of descriptors, it could not be

    def build():
        sink = rec.f if rec is not None else None
        if tcsv is not None:
            sink = TurnsCsvWriter(tcsv.f, also=sink)
        if verbose:
            sink = TurnLines(sink)
        return MaskedRecords(sink, secrets)
    return _OnFirstRecord([f for f in (rec, tcsv) if f is not None], build)


def _load_gate(doc: dict, max_c: float, records: Optional[Path]) -> None:
    """GateFailed (exit 1) for a crashed or failed load document, naming the level and why."""
    from ..check import report as R
    if doc.get("crash"):
        c = doc["crash"]
        raise GateFailed(f"check load: crashed at concurrency {c['concurrency']} ({c['url']}): {c['reason']}"
                         + (f"; levels not run: {', '.join(map(str, doc['not_run']))}" if doc["not_run"] else "")
                         + (f"; records in {records}" if records else ""))
    if not doc["pass"]:
        bad = [lv for lv in doc["levels"] if not lv["pass"]][0]
        raise GateFailed(
            f"check load: {bad['url']} c={bad['concurrency']}: corruption {R.fmt_pct(bad['rate'])} "
            f"(95 % Wilson upper bound {R.fmt_pct(bad['wilson95'][1])} > {R.fmt_pct(max_c)}, {bad['corrupted']}/{bad['turns']})"
            + (f"; {bad['turns']} turns cannot pass a {R.fmt_pct(max_c)} gate even with 0 corrupted: "
               f"it needs at least {R.min_requests_for_gate(max_c)} (--min-requests)"
               if bad["corrupted"] == 0 and max_c > 0 and bad["turns"] < R.min_requests_for_gate(max_c) else ""))


class _Progress:
    """The load run's progress bar on stderr (rich)."""

    def __init__(self, total: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        self.p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("corrupted {task.fields[bad]}"), TimeElapsedColumn(),
                          console=console(stderr=True), transient=False)
        self.task = self.p.add_task("check load", total=total, bad=0)
        self.p.start()

    def update(self, **kw) -> None:
        self.p.update(self.task, **kw)

    def stop(self) -> None:
        self.p.stop()


def _verdict_line(doc: dict) -> str:
    """The gate's verdict line of a load document (its text output ends with it; ``-q`` prints it alone)."""
    from ..check import report as R
    crash = doc.get("crash")
    return (f"gate (95 % Wilson upper bound <= {R.fmt_pct(doc['max_corruption'])}): "
            + ("pass" if doc["pass"] else "FAIL")
            + (f" (crashed at concurrency {crash['concurrency']})" if crash else ""))


class TurnLines:
    """``check load -v``: a sink for the per-turn JSON lines (behind :class:`MaskedRecords`, so
    masked) that prints a line on stderr for each turn not ok and passes the lines on to ``out``
    (the --records/--turns-csv sink, or None)."""

    def __init__(self, out=None):
        self.out = out

    def write(self, text: str) -> int:
        import json
        import sys
        for ln in text.splitlines():
            if not ln.strip():
                continue
            r = json.loads(ln)
            if r.get("class") != "ok":
                print(printable(f"check load: {r.get('url')} c={r.get('concurrency')} session {r.get('session')} "
                                f"turn {r.get('turn')}: {r.get('class')} ({r.get('reason')}) rid {r.get('rid')}"),
                      file=sys.stderr, flush=True)
        if self.out is not None:
            self.out.write(text)
        return len(text)

    def close(self) -> None:
        if self.out is not None:
            self.out.close()


def _print_load(doc: dict, as_json: bool, markdown: bool) -> None:
    from ..check import report as R
    if as_json:
        print(dump_json(doc))
        return
    tables = [("corruption per level", R.level_rows(doc)), ("classes", R.class_rows(doc))]
    if doc["comparisons"]:
        tables.append(("A/B comparison (A = first URL)", R.compare_rows(doc)))
    tables.append(("/metrics over each level", R.metric_rows(doc)))
    verdict = _verdict_line(doc)
    notes = R.crash_lines(doc) + R.gateway_lines(doc)
    rec = (doc.get("settings") or {}).get("records")
    if rec:
        notes.append(f"records: {rec}")
    examples_title = "one example per class (the JSON document has them whole)"
    if markdown:
        print(f"## dsv4ctl check load (run {doc['settings']['run_id']})\n")
        for title, (h, rows) in tables + [(examples_title, R.example_rows(doc))]:
            rows = [[printable(c) for c in row] for row in rows]
            if rows:
                print(f"### {title}\n\n{markdown_table(h, rows)}\n")
        for line in notes:
            print(f"{line}  ")
        if notes:
            print()
        print(f"**{verdict}**")
        return
    from rich.markup import escape
    con = console()
    for title, (h, rows) in tables:
        if rows:
            con.print(rich_table(f"dsv4ctl check load: {title}", h, [[printable(str(c)) for c in r] for r in rows]))
    ex = R.example_lines(doc)
    if ex:
        con.print(f"dsv4ctl check load: {examples_title}", style="italic")
        for line in ex:
            con.print(escape(printable(line)), soft_wrap=True, highlight=False)
    for line in notes:
        con.print(escape(line), style="bold red" if line.startswith("crashed") else None, soft_wrap=True,
                  highlight=False)
    from ..report.terminal import load_spark_lines
    print("\n".join(load_spark_lines(doc)))
    con.print(f"[{'green' if doc['pass'] else 'bold red'}]{escape(verdict)}[/]")


def register(app: typer.Typer) -> None:
    """Add the ``check`` group (smoke, load) to the root app."""
    app.add_typer(check_app, name="check")
