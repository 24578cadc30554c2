"""The Prometheus rule file shipped with ``dsv4ctl watch`` (``dsv4ctl/data/watch/rules.yml`` is
:func:`render_rules` with its defaults; ``python scripts/gen_watch_rules.py`` rewrites it).

Pure: text in, text out, no I/O. Metric names come from :mod:`.metrics`.

Two groups:

- ``dsv4ctl-watch-corruption``: per ``(target, release)`` and per window of :data:`WINDOWS`, the
  probes answered (``dsv4ctl:probe_count:increase5m`` …, probes judged ``ok`` or corrupted:
  failed probes, http_error and stuck, have no answer to judge; the minimum-sample guard of the
  burn-rate alerts), the probes judged corrupted (``dsv4ctl:probe_corrupted:increase5m`` …) and
  the corrupted share of the answered ones (``dsv4ctl:probe_corruption:ratio_rate5m`` …, a ratio
  0..1, the same share as the watch's in-process ``--on-alert corruption`` condition);
  ``dsv4ctl:probe_corruption:slo`` is the SLO itself (a ratio, for dashboards); then the two
  burn-rate alerts that read them (in the same group, so they see this round's values).
- ``dsv4ctl-watch-alerts``: the other alerts, among them the two about watch itself
  (``DSV4WatchDown``: Prometheus' ``up`` of the watch's scrape job is 0; ``DSV4WatchAbsent``: the
  job has no target at all): a dead watch serves no probe results, so no other alert could fire.

Every alert of :data:`ALERTS` has the label ``severity`` (``page`` or ``ticket``) and the
annotations ``summary``, ``description``, ``runbook_url`` (the alert's section of the alert
runbook page, :data:`DEFAULT_RUNBOOK_URL` or the operator's copy: ``URL#alertname`` in lower
case, the anchor GitHub gives the alert's heading in docs/alerts.md) and, where a shipped runbook
fits (:data:`RUNBOOKS`), ``runbook`` (the command to run; ``PROFILE`` stands for the operator's
profile).

The counters watch re-exports from SGLang and the PD gateway (``..._total``) are read with
``increase()``: a fall (the server restarted) is a counter reset to PromQL.

The corruption alerts are multi-window burn-rate alerts on the error budget ``slo`` (a ratio of
corrupted probes; the profile's ``check.max_corruption``, default 0.01): the long window says the
budget is really burning, the short one that it still is (the alert resolves soon after the fault
is gone). ``scale`` multiplies every window and ``for:`` duration, so tests compress an hour into
a minute (``scale=1/60``); the recorded names keep their nominal windows (``…_rate1h`` is the
scaled hour), so dashboards work with a scaled file too.
"""

from __future__ import annotations

import math
import re

import yaml

from .metrics import (CORRUPTED, FAILED, GATEWAY_CIRCUIT_OPEN, GATEWAY_RETRIES, PROBES, RELEASE, SCRAPE_UP,
                      SGLANG_GENERATED, SGLANG_RUNNING, SGLANG_TOKEN_USAGE, SGLANG_TRANSFER_FAILED, STUCK_NOW)

DEFAULT_SLO = 0.01
"""Default error budget: a fraction (0..1) of known-answer probes that may be corrupted (1 %);
the profile's ``check.max_corruption`` default."""

WINDOWS: dict[str, int] = {"5m": 300, "30m": 1800, "1h": 3600, "6h": 21600}
"""Recorded windows: nominal name (used in the recorded metric names) -> seconds (before ``scale``)."""

FAST_BURN = 10.0
"""Fast burn: the corruption ratio is over ``FAST_BURN`` x the SLO (a 30-day budget gone in 3 days)."""
FAST_LONG, FAST_SHORT = "1h", "5m"
"""Fast burn windows (keys of :data:`WINDOWS`): both must be over the threshold."""
FAST_FOR = 120
"""Fast burn ``for:``, seconds."""
SLOW_BURN = 3.0
"""Slow burn: over ``SLOW_BURN`` x the SLO (a 30-day budget gone in 10 days)."""
SLOW_LONG, SLOW_SHORT = "6h", "30m"
"""Slow burn windows (keys of :data:`WINDOWS`)."""
SLOW_FOR = 900
"""Slow burn ``for:``, seconds."""
MIN_PROBES = 10
"""Minimum-sample guard: a burn-rate alert needs at least this many probes answered in its long
window (a handful of probes says nothing about a 1 % budget)."""

STUCK_FOR = 120
"""``DSV4ProbeStuck``: seconds with at least one probe in flight past the stall timeout."""
FAILING_FRACTION = 0.5
"""``DSV4ProbesFailing``: fraction (0..1) of a target's probes without a judged answer (http_error,
stuck) over :data:`FAILING_WINDOW` above which it fires."""
FAILING_WINDOW = 300
"""``DSV4ProbesFailing`` rate window, seconds."""
FAILING_FOR = 300
"""``DSV4ProbesFailing`` ``for:``, seconds."""
STALL_WINDOW = 120
"""``DSV4SchedulerStall``: seconds over which the generated-token count must not change while
requests are running."""
STALL_FOR = 120
"""``DSV4SchedulerStall`` ``for:``, seconds."""
KV_FULL = 0.95
"""``DSV4KVPoolNearFull``: KV pool fraction in use (0..1, the largest over ranks) above which it fires."""
KV_FOR = 600
"""``DSV4KVPoolNearFull`` ``for:``, seconds."""
TRANSFER_WINDOW = 600
"""``DSV4PDTransferFailures``: seconds over which any new PD transfer/bootstrap failure fires it."""
NOT_PROMOTED_FOR = 1800
"""``DSV4ReleaseNotPromoted``: seconds a release may stay active without being promoted."""
RELEASE_FAILED_FOR = 60
"""``DSV4ActiveReleaseFailed`` ``for:``, seconds."""
GATEWAY_RETRY_WINDOW = 600
"""``DSV4GatewayRetrying``: seconds over which any client request the PD gateway re-sent fires it."""
CIRCUIT_OPEN_FOR = 120
"""``DSV4GatewayCircuitOpen`` ``for:``, seconds."""
SCRAPE_DOWN_FOR = 600
"""``DSV4WatchScrapeDown``: seconds of failed ``/metrics`` scrapes of a target."""
WATCH_DOWN_FOR = 120
"""``DSV4WatchDown``: seconds Prometheus' scrapes of watch's own ``/metrics`` fail (``up == 0``):
longer than the systemd unit's restart (``RestartSec=15`` and the start-up)."""
WATCH_ABSENT_FOR = 600
"""``DSV4WatchAbsent``: seconds the watch's scrape job has no target at all (``absent(up{...})``)."""

DEFAULT_JOB = "dsv4ctl-watch"
"""The Prometheus ``job_name`` that scrapes watch's ``/metrics`` (the ``up`` series of the watch
alerts; ``dsv4ctl watch --print rules --scrape-job NAME`` for another)."""
DEFAULT_RUNBOOK_URL = "https://github.com/dsv4ctl/dsv4ctl/blob/main/docs/alerts.md"
"""The page of alert runbooks every alert's ``runbook_url`` points into (``URL#alertname``):
docs/alerts.md of the project (``--print rules --runbook-url URL`` for a copy of your own)."""

ALERTS = ("DSV4ToolCallCorruptionFastBurn", "DSV4ToolCallCorruptionSlowBurn", "DSV4ProbeStuck",
          "DSV4ProbesFailing", "DSV4SchedulerStall", "DSV4KVPoolNearFull", "DSV4PDTransferFailures",
          "DSV4GatewayRetrying", "DSV4GatewayCircuitOpen", "DSV4ReleaseNotPromoted", "DSV4ActiveReleaseFailed",
          "DSV4WatchScrapeDown", "DSV4WatchDown", "DSV4WatchAbsent")
"""Every alert of the rule file, in file order."""

RUNBOOKS: dict[str, str] = {
    "DSV4ToolCallCorruptionFastBurn": "toolcall-corruption",
    "DSV4ToolCallCorruptionSlowBurn": "toolcall-corruption",
    "DSV4ProbeStuck": "scheduler-stall",
    "DSV4SchedulerStall": "scheduler-stall",
    "DSV4PDTransferFailures": "transfer-wedge",
    "DSV4ActiveReleaseFailed": "bad-release",
}
"""Alert -> the shipped runbook (``playbooks/NAME.yaml``) that handles it; alerts without one are
for a human (their description says what to look at)."""

SLO_RECORD = "dsv4ctl:probe_corruption:slo"
"""Recorded: the SLO of the rule file (a ratio, no labels)."""


def _known(window: str) -> str:
    if window not in WINDOWS:
        raise KeyError(f"window {window!r}: the recorded windows are {', '.join(WINDOWS)}")
    return window


def ratio_record(window: str) -> str:
    """Recorded name of the corruption ratio over nominal ``window`` (a key of :data:`WINDOWS`):
    ``dsv4ctl:probe_corruption:ratio_rate5m``. KeyError for another window."""
    return f"dsv4ctl:probe_corruption:ratio_rate{_known(window)}"


def count_record(window: str) -> str:
    """Recorded name of the probes answered (judged ``ok`` or corrupted; failed probes left out)
    over nominal ``window``: ``dsv4ctl:probe_count:increase5m``. KeyError for another window."""
    return f"dsv4ctl:probe_count:increase{_known(window)}"


def corrupted_record(window: str) -> str:
    """Recorded name of the probes judged corrupted (any class) over nominal ``window``:
    ``dsv4ctl:probe_corrupted:increase5m``. KeyError for another window."""
    return f"dsv4ctl:probe_corrupted:increase{_known(window)}"


RECORDS = ((SLO_RECORD,) + tuple(count_record(w) for w in WINDOWS) + tuple(corrupted_record(w) for w in WINDOWS)
           + tuple(ratio_record(w) for w in WINDOWS))
"""Every recorded metric name of the rule file, in file order."""


def duration(seconds: float) -> str:
    """A Prometheus duration for ``seconds`` rounded to the millisecond: ``3600`` -> ``1h``,
    ``90`` -> ``1m30s``, ``0.5`` -> ``500ms``. ValueError under 1 ms (Prometheus has no smaller
    unit), for a negative number, infinity or NaN."""
    if not math.isfinite(seconds) or round(seconds * 1000) < 1:
        raise ValueError(f"duration {seconds!r} s is under 1 ms: Prometheus cannot express it")
    ms = round(seconds * 1000)
    out = ""
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        n, ms = divmod(ms, size)
        if n:
            out += f"{n}{unit}"
    return out


def _num(x: float) -> str:
    """A number for PromQL and text: ``0.1``, ``0.03``, ``10`` (12 significant digits, so
    ``3 * 0.007`` is ``0.021``)."""
    return format(x, ".12g")


def _pct(x: float) -> str:
    """A ratio as a percentage for text: ``0.01`` -> ``1%``."""
    return format(x * 100, ".6g") + "%"


class _Dumper(yaml.SafeDumper):
    """SafeDumper writing multi-line strings (long PromQL) as ``|`` blocks."""


def _str(dumper: yaml.SafeDumper, s: str):
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)


_Dumper.add_representer(str, _str)


class _Scaled:
    """The arguments of one rule file (``slo``, ``scale``, ``min_window``: see
    :func:`render_rules`) and the helpers every rule is written with: scaled durations, range
    windows, counted series, an alert dict."""

    by = "sum by (target, release)"
    where = "{{ $labels.target }} (release {{ $labels.release }})"

    def __init__(self, slo: float, scale: float, min_window: float, runbook_url: str = DEFAULT_RUNBOOK_URL,
                 job: str = DEFAULT_JOB) -> None:
        self.slo, self.scale, self.min_window = slo, scale, min_window
        self.runbook_url, self.job = runbook_url, job
        self.slo_text = f"the SLO of {_pct(slo)} corrupted tool calls"

    def d(self, seconds: float) -> str:
        """A scaled duration (a ``for:`` or a window named in text)."""
        return duration(seconds * self.scale)

    def r(self, seconds: float) -> str:
        """A range selector's window: scaled, but never under ``min_window`` (a compressed 2m
        stall window of 2 s holds two 1 s samples: one late scrape reads as a stall)."""
        return duration(max(seconds * self.scale, self.min_window))

    def w(self, window: str) -> str:
        """The range window of a recorded window (a key of :data:`WINDOWS`)."""
        return self.r(WINDOWS[window])

    def counted(self, metric: str, win: str) -> str:
        """``metric``'s increase over ``win`` per (target, release): a counter that has no series
        yet for a (target, release) (the class counters appear at their first probe of that
        class) counts 0 there, not nothing."""
        by, w = self.by, self.w(win)
        return f"{by} (increase({metric}[{w}]))\nor 0 * {by} (increase({PROBES}[{w}]))"

    def alert(self, name: str, expr: str, for_s: float, severity: str, summary: str, description: str) -> dict:
        """One alert rule (``for:`` scaled and left out when 0; ``runbook`` from :data:`RUNBOOKS`;
        ``runbook_url`` the alert's section of the runbook page)."""
        a: dict = {"alert": name, "expr": expr}
        if for_s:
            a["for"] = self.d(for_s)
        a["labels"] = {"severity": severity}
        a["annotations"] = {"summary": summary, "description": description}
        if name in RUNBOOKS:
            a["annotations"]["runbook"] = f"dsv4ctl runbook run {RUNBOOKS[name]} PROFILE"
        a["annotations"]["runbook_url"] = runbook_url(name, self.runbook_url)
        return a

    def burn(self, name: str, factor: float, long: str, short: str, for_s: int, severity: str, speed: str) -> dict:
        """A multi-window burn-rate alert: the corruption ratio over ``factor`` x the SLO in both
        windows, with the minimum-sample guard on the long one."""
        thr = _num(factor * self.slo)
        where, w = self.where, self.w
        return self.alert(
            name,
            f"(\n  {ratio_record(long)} > {thr}\n  and {ratio_record(short)} > {thr}\n)\n"
            f"and {count_record(long)} >= {MIN_PROBES}\n",
            for_s, severity,
            f"Tool-call corruption on {where} burns the error budget {speed}",
            f"{{{{ $value | humanizePercentage }}}} of the known-answer probes to {where} were corrupted over "
            f"the last {w(long)}, and more than {_pct(factor * self.slo)} over the last {w(short)}: "
            f"{_num(factor)}x {self.slo_text}.")


def runbook_url(alert: str, base: str = DEFAULT_RUNBOOK_URL) -> str:
    """The ``runbook_url`` of ``alert``: ``base#alert`` in lower case (GitHub's anchor of the
    alert's heading in docs/alerts.md): ``DSV4WatchDown`` -> ``...alerts.md#dsv4watchdown``."""
    return f"{base}#{alert.lower()}"


_JOB = re.compile(r"[A-Za-z0-9_.:/-]{1,200}")
# no control characters (C0, DEL, C1: YAML refuses them, the rule file would not load) and 2,000 at most
_URL = re.compile(r"https?://[^\s#\"'{}<>\\`\x00-\x1f\x7f-\x9f]{1,1992}")


def _check_names(runbook_url: str, job: str) -> None:
    """ValueError for a runbook page that is not an http(s) URL of at most 2,000 characters without
    a fragment, quotes, braces, white space or control characters, or a job name outside
    letters, digits and ``_.:/-``."""
    if not isinstance(runbook_url, str) or not _URL.fullmatch(runbook_url):
        raise ValueError(f"runbook URL {runbook_url!r}: expected an http:// or https:// URL (2,000 characters "
                         f"at most) without '#', quotes, braces, spaces or control characters (each alert adds "
                         f"#its-name), e.g. {DEFAULT_RUNBOOK_URL}")
    if not isinstance(job, str) or not _JOB.fullmatch(job):
        raise ValueError(f"scrape job {job!r}: expected 1-200 letters, digits or _ . : / - "
                         f"(the job_name of Prometheus' scrape config for watch, e.g. {DEFAULT_JOB})")


def _check_args(slo: float, scale: float) -> None:
    """ValueError for an ``slo`` outside (0, 1) or a ``scale`` that is not a finite number > 0."""
    if isinstance(slo, bool) or not isinstance(slo, (int, float)) or not 0 < slo < 1:
        raise ValueError(f"slo must be a ratio strictly between 0 and 1 (0.01 = 1 %), got {slo!r}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a finite number > 0 (1 = real time, 1/60 = an hour in a minute), got {scale!r}")


def _records(k: _Scaled) -> list[dict]:
    """The recording rules, in the order of :data:`RECORDS`."""
    by, w, counted = k.by, k.w, k.counted
    records: list[dict] = [{"record": SLO_RECORD, "expr": f"vector({_num(k.slo)})"}]
    # answered: probes with a judged answer (probes_total counts failed ones too: http_error, PD failures, stuck)
    records += [{"record": count_record(win), "expr": (
        f"{by} (increase({PROBES}[{w(win)}]))\n- (\n  " + counted(FAILED, win).replace("\n", "\n  ") + "\n)\n")}
        for win in WINDOWS]
    records += [{"record": corrupted_record(win), "expr": counted(CORRUPTED, win) + "\n"} for win in WINDOWS]
    # corrupted share of the answered probes (NaN when none was answered: no burn-rate alert then;
    # DSV4ProbesFailing says why)
    records += [{"record": ratio_record(win), "expr": f"{corrupted_record(win)} / {count_record(win)}"}
                for win in WINDOWS]
    return records


def _server_alerts(k: _Scaled) -> list[dict]:
    """The alerts about the servers' answers and state: the two burn-rate alerts, stuck and
    failing probes, a scheduler stall, a nearly full KV pool, PD transfer failures."""
    alert, d, r = k.alert, k.d, k.r
    return [
        k.burn("DSV4ToolCallCorruptionFastBurn", FAST_BURN, FAST_LONG, FAST_SHORT, FAST_FOR, "page", "fast"),
        k.burn("DSV4ToolCallCorruptionSlowBurn", SLOW_BURN, SLOW_LONG, SLOW_SHORT, SLOW_FOR, "ticket", "slowly"),
        alert("DSV4ProbeStuck", f"{STUCK_NOW} > 0", STUCK_FOR, "page",
              "Probes stuck on {{ $labels.target }}",
              "{{ $value }} probe(s) to {{ $labels.target }} have made no progress for longer than the stall "
              f"timeout, for {d(STUCK_FOR)} (a scheduler stall, or on PD a wedged KV transfer: "
              "dsv4ctl runbook run transfer-wedge PROFILE)."),
        alert("DSV4ProbesFailing",
              f"sum by (target) (rate({FAILED}[{r(FAILING_WINDOW)}]))\n"
              f"/ sum by (target) (rate({PROBES}[{r(FAILING_WINDOW)}]))\n"
              f"> {_num(FAILING_FRACTION)}\n",
              FAILING_FOR, "page",
              "Most probes to {{ $labels.target }} fail",
              "{{ $value | humanizePercentage }} of the probes to {{ $labels.target }} got no judged answer "
              f"(HTTP error, refused connection or stuck) over the last {d(FAILING_WINDOW)}: "
              "dsv4ctl diagnose PROFILE says why."),
        # SGLang's generated-token counter: increase() reads a restart (the count falls) as a reset,
        # so the tokens after it are progress; only a count that does not grow for the whole window fires
        alert("DSV4SchedulerStall",
              f"{SGLANG_RUNNING} > 0\nand increase({SGLANG_GENERATED}[{r(STALL_WINDOW)}]) == 0\n",
              STALL_FOR, "page",
              "Scheduler stall on {{ $labels.target }}",
              "{{ $labels.target }} has {{ $value }} running request(s) and generated no token for "
              f"{d(STALL_WINDOW)}."),
        alert("DSV4KVPoolNearFull", f"{SGLANG_TOKEN_USAGE} > {_num(KV_FULL)}", KV_FOR, "ticket",
              "KV pool of {{ $labels.target }} nearly full",
              "{{ $value | humanizePercentage }} of the KV pool of {{ $labels.target }} (the fullest rank) "
              f"is in use, over {_pct(KV_FULL)} for {d(KV_FOR)}: requests queue or are retracted "
              "(dsv4ctl plan PROFILE for the pool sizes)."),
        # SGLang's counters summed over ranks: increase() treats a fall (a server restart) as a
        # counter reset; delta() would go negative at a restart and hide the failures after it.
        # (A restart of some of the ranks only counts the other ranks' totals once.)
        alert("DSV4PDTransferFailures",
              f"increase({SGLANG_TRANSFER_FAILED}[{r(TRANSFER_WINDOW)}]) > 0", 0, "ticket",
              "PD KV transfer failures on {{ $labels.target }}",
              "{{ $labels.target }} counted {{ $value | printf \"%.0f\" }} failed PD KV transfer or bootstrap "
              f"request(s) over the last {d(TRANSFER_WINDOW)}."),
    ]


def _gateway_release_alerts(k: _Scaled) -> list[dict]:
    """The alerts about the PD gateway (retries, an open circuit breaker), the active release
    (not promoted, marked failed) and watch's own scrapes."""
    alert, d, r = k.alert, k.d, k.r
    return [
        # the gateway's counters (increase() as above); a PD retry re-sends the pair and is
        # counted under prefill and decode: decode (+ regular, not PD) is the client requests re-sent
        alert("DSV4GatewayRetrying",
              f'sum by (target) (increase({GATEWAY_RETRIES}{{worker_type!="prefill"}}[{r(GATEWAY_RETRY_WINDOW)}])) > 0',
              0, "ticket",
              "PD gateway {{ $labels.target }} is re-sending requests",
              "{{ $labels.target }} re-sent {{ $value | printf \"%.0f\" }} request(s) to its workers over the last "
              f"{d(GATEWAY_RETRY_WINDOW)}: a request retried to success is ok to its client and to the probes, so "
              "the corruption rate does not count the failures it hides (dsv4ctl diagnose PROFILE)."),
        alert("DSV4GatewayCircuitOpen", f"{GATEWAY_CIRCUIT_OPEN} > 0", CIRCUIT_OPEN_FOR, "ticket",
              "PD gateway {{ $labels.target }} holds a worker out",
              "{{ $labels.target }} has held the circuit breaker of {{ $value }} worker(s) open for "
              f"{d(CIRCUIT_OPEN_FOR)}: it sends them nothing, so the others carry the load (dsv4ctl diagnose PROFILE)."),
        # states: pushed, active (health gate passed), good (promoted), failed, none (no release
        # active on the host); failed releases page on their own (DSV4ActiveReleaseFailed)
        alert("DSV4ReleaseNotPromoted", f'{RELEASE}{{state!~"good|failed|none"}} == 1', NOT_PROMOTED_FOR, "ticket",
              "Release {{ $labels.release }} on {{ $labels.target }} is not promoted",
              "Release {{ $labels.release }} (state {{ $labels.state }}) has been active on "
              "{{ $labels.target }} (host {{ $labels.host }}) for "
              f"{d(NOT_PROMOTED_FOR)} without being promoted: dsv4ctl promote {{{{ $labels.release }}}} PROFILE "
              "after checking it (or deploy --promote), else dsv4ctl rollback PROFILE."),
        alert("DSV4ActiveReleaseFailed", f'{RELEASE}{{state="failed"}} == 1', RELEASE_FAILED_FOR, "page",
              "Active release {{ $labels.release }} on {{ $labels.target }} is marked failed",
              "{{ $labels.target }} (host {{ $labels.host }}) runs release {{ $labels.release }}, which is "
              "recorded as failed: roll back to the last good release."),
        alert("DSV4WatchScrapeDown", f"{SCRAPE_UP} == 0", SCRAPE_DOWN_FOR, "ticket",
              "dsv4ctl watch cannot scrape {{ $labels.target }}",
              "The {{ $labels.source }} /metrics of {{ $labels.target }} has not answered dsv4ctl watch for "
              f"{d(SCRAPE_DOWN_FOR)}: the SGLang gauges of this target are stale."),
    ]


def _watch_alerts(k: _Scaled) -> list[dict]:
    """The alerts about watch itself, from Prometheus' own ``up`` of the watch's scrape job
    (``k.job``): its scrapes fail (watch dead, hung or unreachable) or the job has no target."""
    sel = f'up{{job="{k.job}"}}'
    blind = "no probe result reaches Prometheus, so no corruption or stall alert can fire"
    return [
        k.alert("DSV4WatchDown", f"{sel} == 0", WATCH_DOWN_FOR, "page",
                "dsv4ctl watch {{ $labels.instance }} is down",
                "Prometheus has not scraped dsv4ctl watch at {{ $labels.instance }} (job {{ $labels.job }}) for "
                f"{k.d(WATCH_DOWN_FOR)}: {blind} (on its host: systemctl status 'dsv4ctl-watch@*' and the unit's journal)."),
        k.alert("DSV4WatchAbsent", f"absent({sel})", WATCH_ABSENT_FOR, "ticket",
                f"No dsv4ctl watch is scraped (job {k.job})",
                f"Prometheus has had no target in job {k.job} for {k.d(WATCH_ABSENT_FOR)}: {blind} "
                "(the scrape config or its service discovery lost watch, or the job is named otherwise: "
                "dsv4ctl watch PROFILE --print rules --scrape-job NAME)."),
    ]


def rules(slo: float = DEFAULT_SLO, scale: float = 1.0, min_window: float = 0.0,
          runbook_url: str = DEFAULT_RUNBOOK_URL, job: str = DEFAULT_JOB) -> dict:
    """The rule file as a dict (``{"groups": [{"name", "rules": [...]}, ...]}``); arguments and
    ValueError as :func:`render_rules`."""
    _check_args(slo, scale)
    _check_names(runbook_url, job)
    k = _Scaled(slo, scale, min_window, runbook_url, job)
    records = _records(k)
    alerts = _server_alerts(k) + _gateway_release_alerts(k) + _watch_alerts(k)
    assert tuple(a["alert"] for a in alerts) == ALERTS
    # the burn-rate alerts read the recorded ratios: in the same group, evaluated after them in the
    # same round (groups run independently, a second group would see the previous round's values)
    return {"groups": [{"name": "dsv4ctl-watch-corruption", "rules": records + alerts[:2]},
                       {"name": "dsv4ctl-watch-alerts", "rules": alerts[2:]}]}


def render_rules(slo: float = DEFAULT_SLO, scale: float = 1.0, min_window: float = 0.0,
                 profile: str | None = None, runbook_url: str = DEFAULT_RUNBOOK_URL, job: str = DEFAULT_JOB) -> str:
    """The Prometheus rule file (YAML text, stable key order, ends in a newline) for error budget
    ``slo`` (a fraction of corrupted probes, strictly between 0 and 1; 0.01 = 1 %) with every
    window and ``for:`` duration multiplied by ``scale`` (> 0; ``1/60`` turns 1h into 1m);
    ``min_window`` (seconds) is the shortest range-selector window a scaled file uses (0: none),
    so a compressed window still holds several scrapes. ``profile``: the profile the commands in
    the annotations name (``dsv4ctl watch PROFILE --print rules``), else the word ``PROFILE``.
    ``runbook_url``: the page of alert runbooks (each alert's ``runbook_url`` is its
    ``#alertname`` there); ``job``: Prometheus' ``job_name`` scraping watch (the watch alerts).

    Raises ValueError for ``slo`` outside (0, 1), ``scale`` <= 0 (or not finite), a scale that
    makes a duration shorter than 1 ms, a runbook page that is not an http(s) URL without a
    fragment, or a job name outside letters, digits and ``_.:/-``."""
    doc = rules(slo, scale, min_window, runbook_url, job)
    if profile is None:
        head = (f"# Prometheus rules of dsv4ctl watch: dsv4ctl.watch.rules.render_rules(slo={_num(slo)}, "
                f"scale={_num(scale)}).\n# Generated (python scripts/gen_watch_rules.py): do not edit.\n")
    else:
        import shlex
        extra = "".join(f" {flag} {shlex.quote(v)}" for flag, v, default in (
            ("--scrape-job", job, DEFAULT_JOB), ("--runbook-url", runbook_url, DEFAULT_RUNBOOK_URL)) if v != default)
        head = (f"# Prometheus rules of dsv4ctl watch for {profile} (SLO {_num(slo)}: its check.max_corruption).\n"
                f"# Printed by: dsv4ctl watch {shlex.quote(profile)} --print rules{extra}\n")
    if profile is not None and ("{{" in profile or "}}" in profile):
        profile_word = None     # Prometheus would expand it as a template: the annotations keep PROFILE
    else:
        profile_word = profile
    if profile_word is not None:
        import shlex
        word = shlex.quote(profile_word)
        for group in doc["groups"]:
            for rule in group["rules"]:
                for k, v in (rule.get("annotations") or {}).items():
                    if k == "runbook_url":
                        continue        # the operator's URL, never rewritten
                    rule["annotations"][k] = re.sub(r"\bPROFILE\b", lambda m: word, v)
    text = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True)
    return head + text
