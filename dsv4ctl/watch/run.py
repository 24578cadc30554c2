"""The ``dsv4ctl watch`` process: probe loops, scrapes, release reads, its own ``/metrics``, and
``--on-alert`` runbook runs (asyncio; aiohttp client and server; SSH reads in worker threads).

Nothing here raises for the deployment's trouble: a server that restarts, a router that is
down, a host that cannot be reached show up as metrics and event lines; only bad input (exit 2)
and a listen address that cannot be bound (exit 3) end the process. SIGTERM, SIGINT and SIGHUP
stop it cleanly: probes in flight are cancelled, the metrics listener closes."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import aiohttp

from ..check import expect as E
from ..check import classify as C
from ..check.classify import tool_specs
from ..check.driver import ClientSideError, make_client, read_capped, run_turn
from ..check.gateway import client_retries, parse_gateway_metrics
from ..check.workload import TOOLS
from ..errors import RemoteError
from . import model as M
from .metrics import RELEASE_KEEP, WatchMetrics
from .scrape import parse_sglang

SCRAPE_MAX = 8 << 20          # bytes of one /metrics body read at most
UNKNOWN = "unknown"           # release label before the first successful read
FIRST_READ_WAIT = 15.0        # seconds the probes wait for the first release read at start-up


@dataclass
class WatchOptions:
    """How one watch runs. Seconds everywhere. ``listen``: (host, port) of its own ``/metrics``
    (None: not served, e.g. ``--once``); ``on_alert``: {condition: runbook}; ``auto``: run them
    for real (else ``--dry-run``); ``settle``: seconds after a deploy watch did not make during
    which ``--auto`` does not act on that release (None: the short burn window, ``alert_window``
    / 12); ``emit``: called with every event (a JSON-able dict); ``every_probe``: an event for
    every probe (``-v``), not only for those not ok."""

    interval: float = M.DEFAULT_INTERVAL
    stall_timeout: float = 60.0
    turn_timeout: float = 300.0
    release_every: float = M.DEFAULT_RELEASE_EVERY
    scrape_every: float = 15.0
    listen: Optional[tuple[str, int]] = None
    api_key: Optional[str] = None
    slo: float = 0.01
    alert_window: float = 3600.0
    on_alert: dict = field(default_factory=dict)
    auto: bool = False
    settle: Optional[float] = None
    read_releases: bool = True
    accept_new_host_keys: bool = False
    profile_arg: str = ""
    emit: Callable[[dict], None] = lambda e: None
    every_probe: bool = False


def action_outcome(auto: bool, code: int) -> str:
    """How an ``--on-alert`` runbook run ended, from its exit code (``runbook run``: 0 completed,
    1 a step failed, or with ``--dry-run`` a step says the run would stop): ``completed`` /
    ``failed`` for ``--auto``; ``dry_run`` (it would run through), ``dry_run_would_stop`` (it
    would stop at a step: a finding of the dry run, not a failure of watch) or ``failed`` (any
    other exit: bad input, interrupted) for a dry run."""
    if auto:
        return "completed" if code == 0 else "failed"
    return {0: "dry_run", 1: "dry_run_would_stop"}.get(code, "failed")


DECIDE_AGAIN_S = 30.0     # seconds before a condition --auto did not act on is decided again


def decide_on(facts: dict, releases: list, own_runs: list, settle_s: float, now: Optional[float] = None
              ) -> tuple[str, str]:
    """Whether ``--auto`` may act (pure): ``facts`` {host: HostFacts} read under the deploy lock,
    ``releases`` the releases the evidence is about, ``own_runs`` [start, end] UTC seconds of
    this watch's own runbook runs, ``settle_s`` the settle window, ``now`` UTC seconds. Returns
    (``act`` | ``skipped_stale`` | ``skipped_settling``, why)."""
    import datetime as dt
    now = time.time() if now is None else now
    running = {h: f.current for h, f in facts.items()}
    if len(releases) != 1 or set(running.values()) != set(releases):
        runs = ", ".join(f"{h}: {r or 'none'}" for h, r in sorted(running.items()))
        return "skipped_stale", (f"the evidence is about release {', '.join(releases) or '(none known)'}; "
                                 f"the hosts run {runs} now")
    rid = releases[0]
    for h, f in sorted(facts.items()):
        at = f.state.get("releases", {}).get(rid, {}).get("activated_at")
        try:
            t = dt.datetime.fromisoformat(str(at).replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue          # no activation on record: nothing to settle from
        if now - t < settle_s and not any(a <= t <= b for a, b in own_runs):
            return "skipped_settling", (f"{rid} was activated on {h} at {at}, {max(0.0, now - t):.0f} s ago, by a "
                                        f"deploy this watch did not make (settle window {settle_s:g} s)")
    return "act", f"every host runs {rid}, the release the evidence is about"


class Watcher:
    """One watch over a resolved Deployment's :func:`~.model.targets`."""

    def __init__(self, dep, opts: WatchOptions, metrics: Optional[WatchMetrics] = None):
        self.dep = dep
        self.opts = opts
        self.m = metrics or WatchMetrics()
        self.targets = M.targets(dep)
        self.model = {t.name: self._served_model(t) for t in self.targets}
        self.release: dict[str, tuple[str, str]] = {t.name: (UNKNOWN, UNKNOWN) for t in self.targets}
        self.locks: dict[str, Optional[dict]] = {}
        self.labels = M.ReleaseLabels(keep=RELEASE_KEEP)
        self.burn = M.BurnWindow(slo=opts.slo, long_s=opts.alert_window, short_s=opts.alert_window / 12)
        self.gate = M.ActionGate(window_s=opts.alert_window)
        self.in_flight: dict[str, float] = {}
        self._release_key: dict[str, tuple] = {}
        self._series: dict[tuple, set] = {}     # (target, release) -> {(metric, labels)} of its probe series
        self.n = 0
        self.last: dict[str, dict] = {}
        self._bad_run: dict[str, int] = {}        # target -> probes not ok in a row (for the "recovered" event)
        self.last_stuck: dict[str, float] = {}   # target -> seconds its last finished probe took, when stuck
        self.scraped: dict[str, dict] = {}
        self.stop = asyncio.Event()
        self._actions: set = set()
        self._first_read: Optional[asyncio.Event] = None
        self._site = None                # the site of a release read in flight
        self._children: set = set()      # --on-alert runbook processes running
        self._action_tasks: set = set()  # their tasks (cancelled, and waited for, when watch stops)
        self._held: set = set()          # conditions whose run waits for a held deploy lock (said once)
        self._read_failed: set = set()   # hosts whose last release read failed (said once)
        self.evidence: dict[str, list] = {}   # condition -> the releases its evidence is about
        self._own_runs: list = []        # [start, end] UTC seconds of this watch's --auto runbook runs
        self._decided: dict = {}         # condition -> (monotonic, skip outcome) of the last decision
        self.specs = tool_specs(TOOLS)
        for t in self.targets:
            if t.probe:
                self._zeros(t.name, t.role, UNKNOWN)
                self.labels.activate(t.name, UNKNOWN)

    def _served_model(self, t: M.Target) -> str:
        groups = [self.dep.group(t.name.split("#")[0])] if t.role != "router" else self.dep.servers()
        for g in groups:
            try:
                return g.served_model
            except Exception:      # an unreadable serve config was reported by the resolver already
                continue
        return "default"

    # --- probes ----------------------------------------------------------------------------
    async def probe(self, http: aiohttp.ClientSession, t: M.Target) -> dict:
        """One known-answer probe of ``t``; updates the metrics; returns its record
        {target, release, class, outcome, reason, rid, stream, ttft_s, e2e_s}."""
        n = self.n
        self.n += 1
        s = M.probe_session(n)
        spec = s.spec()
        rid = f"dsv4ctl-watch-{os.getpid()}-{n}"
        release, _ = self.release[t.name]
        started = time.monotonic()
        self.in_flight[t.name] = started
        try:
            result, timing = await run_turn(http, t.url + "/v1/chat/completions", s.request(self.model[t.name], rid),
                                            s.stream, self.opts.turn_timeout)
            v = E.judge(result, requires_tool=True, tools=self.specs, expected=spec.expected_calls,
                        tool_choice=spec.tool_choice)
            cls, reason = v.cls, v.reason
            if result.http_status in (401, 403):
                cls = M.AUTH_REFUSED
        except ClientSideError as e:           # this machine's trouble (descriptors, DNS): not the server's
            cls, reason, timing = M.CLIENT_ERROR, str(e), {"ttft_s": None, "e2e_s": None}
        finally:
            self.in_flight.pop(t.name, None)
        rec = {"target": t.name, "release": release, "class": cls, "outcome": M.outcome(cls), "reason": reason,
               "rid": rid, "stream": s.stream, "ttft_s": timing.get("ttft_s"), "e2e_s": timing.get("e2e_s")}
        if True:
            self._count(self.m.probes, (t.name, t.role, release))
            if rec["outcome"] == "corrupted":
                self._count(self.m.corrupted, (t.name, t.role, release, cls))
            elif rec["outcome"] == "failed":
                self._count(self.m.failed, (t.name, t.role, release, cls))
            self._observe(t, release, timing)
            if rec["outcome"] != "failed":      # the burn of the release the probe was sent to
                self.burn.add((t.name, release), time.monotonic(), rec["outcome"] == "corrupted")
        prev_bad = self._bad_run.get(t.name, 0)
        self._bad_run[t.name] = 0 if rec["outcome"] == "ok" else prev_bad + 1
        if rec["outcome"] == "ok" and prev_bad:
            self.opts.emit({"event": "recovered", "target": t.name, "rid": rid, "after": prev_bad})
        self.last[t.name] = rec
        if cls == C.STUCK:
            self.last_stuck[t.name] = time.monotonic() - started
        else:
            self.last_stuck.pop(t.name, None)
        if t.probe:
            self.m.stuck_now.labels(t.name).set(1 if t.name in self.stuck() else 0)
        if rec["outcome"] != "ok" or self.opts.every_probe:
            self.opts.emit({"event": "probe", **rec})
        return rec

    def _observe(self, t: M.Target, release: str, timing: dict) -> None:
        """The probe's TTFT and end-to-end seconds (``timing``: ``ttft_s``, ``e2e_s``, None when not
        measured) into the latency histograms of (target, release), dropped with its other series."""
        self._zeros(t.name, t.role, release)
        for metric, key in ((self.m.ttft, "ttft_s"), (self.m.e2e, "e2e_s")):
            if timing.get(key) is not None:
                metric.labels(t.name, t.role, release).observe(timing[key])
                self._series[(t.name, release)].add((metric, (t.name, t.role, release)))

    def _count(self, metric, labels: tuple) -> None:
        self._zeros(labels[0], labels[1], labels[2])
        metric.labels(*labels).inc()
        self._series[(labels[0], labels[2])].add((metric, labels))

    def _zeros(self, target: str, role: str, release: str) -> None:
        """Create every probe series of (target, release) at 0 on first use: a counter born at 1
        is invisible to ``rate()``/``increase()``, so a first corruption of a class would be
        missed by the rules."""
        key = (target, release)
        if key in self._series:
            return
        keys = {(self.m.probes, (target, role, release))}
        keys |= {(self.m.corrupted, (target, role, release, c)) for c in C.CLASSES if c not in M.FAILED_CLASSES}
        keys |= {(self.m.failed, (target, role, release, c)) for c in M.FAILED_CLASSES}
        for metric, labels in keys:
            metric.labels(*labels).inc(0)
        self._series[key] = keys

    async def _probe_loop(self, http: aiohttp.ClientSession, t: M.Target) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            self.m.rounds.inc()
            await self._guarded(self.probe(http, t), f"probe of {t.name}")
            await self._guarded(self.evaluate(), "alert evaluation")
            await self._sleep(max(0.0, self.opts.interval - (time.monotonic() - t0)))

    async def _guarded(self, coro, what: str):
        """Await ``coro``; an unexpected exception is an event and a metric, never the end of a
        loop (a watch that stops probing silently is worse than one that crashes)."""
        try:
            return await coro
        except asyncio.CancelledError:
            raise
        except Exception as e:                 # noqa: BLE001 - reported, the loop goes on
            self.m.internal_errors.inc()
            self.opts.emit({"event": "internal_error", "where": what, "error": f"{type(e).__name__}: {str(e)[:200]}"})
            return None

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.stop.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            pass

    def stuck(self, now: Optional[float] = None) -> dict[str, float]:
        """Targets that are stuck now: {target: seconds}: a probe in flight longer than the stall
        timeout (its age), or the last finished probe ended ``stuck`` (no progress within the stall
        timeout; its duration) and no probe has finished since."""
        now = time.monotonic() if now is None else now
        out = {k: v for k, v in self.last_stuck.items()}
        out.update({k: now - t0 for k, t0 in self.in_flight.items() if now - t0 > self.opts.stall_timeout})
        return out

    async def _ticker(self) -> None:
        while not self.stop.is_set():
            stuck = self.stuck()
            for t in self.targets:
                if t.probe:
                    self.m.stuck_now.labels(t.name).set(1 if t.name in stuck else 0)
            await self._guarded(self.evaluate(), "alert evaluation")
            await self._sleep(1.0)

    # --- scrapes ---------------------------------------------------------------------------
    async def scrape(self, http: aiohttp.ClientSession, t: M.Target) -> dict:
        """One ``/metrics`` scrape of ``t``: {up, error?, ...gauges}; updates the metrics."""
        doc: dict = {"up": False}
        try:
            async with http.get(t.metrics_url, timeout=aiohttp.ClientTimeout(total=10)) as r:
                if r.status != 200:
                    doc["error"] = f"HTTP {r.status}" + (" (started without --enable-metrics?)"
                                                         if r.status == 404 and t.source == "sglang" else "")
                else:
                    text = (await read_capped(r, SCRAPE_MAX)).decode("utf-8", "replace")
                    if t.source == "sglang":
                        # a big page takes seconds to parse: not on the event loop the probes time on
                        g = await asyncio.to_thread(parse_sglang, text)
                        doc.update({k: (v if v is None or math.isfinite(v) else None) for k, v in (
                            ("running", g.running), ("queued", g.queued), ("generation_tokens", g.generated),
                            ("token_usage", g.token_usage), ("transfer_failed", g.transfer_failed))})
                        self.m.running.labels(t.name).set(g.running)
                        self.m.queued.labels(t.name).set(g.queued)
                        self.m.generated.labels(t.name).set(g.generated)
                        if g.token_usage is not None:
                            self.m.token_usage.labels(t.name).set(g.token_usage)
                        self.m.transfer_failed.labels(t.name).set(g.transfer_failed)
                    else:
                        gw = await asyncio.to_thread(parse_gateway_metrics, text)
                        for metric, key in ((self.m.gw_retries, "retries"), (self.m.gw_exhausted, "retries_exhausted")):
                            for wt, v in gw[key].items():
                                metric.labels(t.name, wt).set(v)
                        self.m.gw_open.labels(t.name).set(len(gw["cb_open"]))
                        doc.update({"retries": client_retries(gw["retries"]),
                                    "retries_exhausted": client_retries(gw["retries_exhausted"]),
                                    "circuit_open": sorted(gw["cb_open"])})
                    doc["up"] = True
        except asyncio.TimeoutError:
            doc["error"] = "no answer within 10 s"
        except (aiohttp.ClientError, OSError, ValueError) as e:
            doc["error"] = f"{type(e).__name__}: {str(e)[:160]}"
        self.m.scrape_up.labels(t.name, t.source).set(1 if doc["up"] else 0)
        self.scraped[t.name] = doc
        return doc

    async def _scrape_loop(self, http: aiohttp.ClientSession) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            await self._guarded(asyncio.gather(*(self.scrape(http, t) for t in self.targets if t.metrics_url)), "scrape")
            await self._sleep(max(0.0, self.opts.scrape_every - (time.monotonic() - t0)))   # a period, not a gap

    # --- releases (SSH) --------------------------------------------------------------------
    def read_releases(self) -> None:
        """Blocking: read every target host's facts (one SSH command each); set the release
        labels and lock holders. A host that cannot be read keeps its last labels and counts a
        read error."""
        from ..deploy.site import Options, open_site
        from ..hosts.layout import read_facts
        from ..remote import run_parallel
        hosts = sorted({t.host for t in self.targets})
        site = open_site(self.dep, Options(accept_new_host_keys=self.opts.accept_new_host_keys, dry_run=True))
        self._site = site              # closed by stop(): a read in flight ends at once
        try:
            if self.stop.is_set():
                return
            res = run_parallel({h: site.transports[h] for h in hosts},
                               lambda tr: read_facts(tr, site.paths[tr.name].root), timeout=60)
        finally:
            self._site = None
            site.close()
        if self.stop.is_set():
            return
        for h, r in res.items():
            if not r.ok:
                self.m.release_errors.labels(h).inc()
                # its deploy lock is unknown again: an --auto run must not act on a stale "free"
                self.locks.pop(h, None)
                if h not in self._read_failed:      # said once until a read works again
                    self._read_failed.add(h)
                    self.opts.emit({"event": "release_read_failed", "host": h, "error": r.error})
                continue
            if h in self._read_failed:
                self._read_failed.discard(h)
                self.opts.emit({"event": "release_read_recovered", "host": h})
            f = r.value
            self.locks[h] = f.lock
            for t in self.targets:
                if t.host != h:
                    continue
                rid = f.current or "none"
                state = (f.recorded(f.current) or "pushed") if f.current else "none"
                self._set_release(t, h, rid, state)

    def _set_release(self, t: M.Target, host: str, rid: str, state: str) -> None:
        old = self.release[t.name]
        if old == (rid, state):
            return
        self.release[t.name] = (rid, state)
        key = self._release_key.get(t.name)
        if key is not None:
            self.m.release.remove(*key)
        self._release_key[t.name] = (t.name, host, rid, state)
        self.m.release.labels(t.name, host, rid, state).set(1)
        if t.probe:
            self._zeros(t.name, t.role, rid)
        for gone in self.labels.activate(t.name, rid):
            self._forget(t, gone)
        self.opts.emit({"event": "release", "target": t.name, "host": host, "release": rid, "state": state,
                        "was": old[0]})

    def _forget(self, t: M.Target, release: str) -> None:
        """Remove ``release``'s probe series of ``t`` (bounded memory; see :class:`~.model.ReleaseLabels`)."""
        for metric, labels in self._series.pop((t.name, release), ()):
            metric.remove(*labels)

    async def _release_loop(self) -> None:
        while not self.stop.is_set():
            try:
                await asyncio.to_thread(self.read_releases)
            except Exception as e:       # never the end of watch: counted, said, retried
                self.locks.clear()       # every lock unknown again (an --auto run waits)
                for h in {t.host for t in self.targets}:
                    self.m.release_errors.labels(h).inc()
                self.opts.emit({"event": "release_read_failed", "host": "*", "error": f"{type(e).__name__}: {e}"})
            if self._first_read is not None:
                self._first_read.set()
            await self._sleep(self.opts.release_every)

    # --- --on-alert ------------------------------------------------------------------------
    def conditions(self, now: Optional[float] = None) -> dict[str, str]:
        """Alert conditions holding now: {condition: why}. ``corruption`` holds only for the
        release a target runs now (as the last release read saw it): an earlier release's
        corrupted probes are evidence about that release, never about the one that replaced it.
        :attr:`evidence` gets the releases each condition is about."""
        now = time.monotonic() if now is None else now
        out = {}
        burning = [(t, r, ratio, n) for t, r, ratio, n in self.burn.burning(now)
                   if t in self.release and self.release[t][0] == r]
        if burning:
            out["corruption"] = ", ".join(f"{t} {ratio:.0%} of probes corrupted (release {r}, {n} probes)"
                                          for t, r, ratio, n in burning)
            self.evidence["corruption"] = sorted({r for _, r, _, _ in burning})
        stuck = self.stuck(now)
        if stuck:
            out["stuck"] = ", ".join(f"{t} probe without progress for {s:.0f} s" for t, s in stuck.items())
            self.evidence["stuck"] = sorted({self.release[t][0] for t in stuck if t in self.release})
        return out

    async def evaluate(self) -> None:
        """Start the ``--on-alert`` runbook of every condition that holds and is due (one per
        condition per alert window; with ``--auto`` none while a host's deploy lock is held, and
        only after :meth:`decide` says so under the deploy lock)."""
        if not self.opts.on_alert:
            return
        now = time.monotonic()
        for cond, why in self.conditions(now).items():
            book = self.opts.on_alert.get(cond)
            if book is None or not self.gate.due(cond, now) or cond in self._actions:
                continue
            hosts = {t.host for t in self.targets}
            held = {h: l for h, l in self.locks.items() if l}
            unknown = sorted(h for h in hosts if h not in self.locks)
            if self.opts.auto and (held or unknown):       # a dry run changes nothing: it need not wait
                if cond not in self._held:     # said once per held lock, not on every evaluation
                    self._held.add(cond)
                    self.m.alert_actions.labels(cond, book, "skipped_lock").inc()
                    self.opts.emit({"event": "alert_action", "condition": cond, "runbook": book,
                                    "outcome": "skipped_lock", "why": why, "locked": sorted(held),
                                    "lock_unknown": unknown})
                continue
            if self.opts.auto and self._actions:
                continue       # one --auto action at a time: its decision's lock would stop the other's steps
            last = self._decided.get(cond)
            if self.opts.auto and last and now - last[0] < DECIDE_AGAIN_S:
                continue       # a decision said not now a moment ago: not a lock per evaluation
            self._held.discard(cond)
            self._actions.add(cond)
            task = asyncio.create_task(self._act(cond, book, why, list(self.evidence.get(cond, ()))))
            self._action_tasks.add(task)
            task.add_done_callback(lambda _t, c=cond: (self._actions.discard(c), self._action_tasks.discard(_t)))

    async def _act(self, cond: str, book: str, why: str, releases: list) -> None:
        """Run ``book`` for ``cond``: with ``--auto`` only when :meth:`decide` (under the deploy
        lock) says the evidence is about the release the hosts run now and it has settled."""
        if self.opts.auto:
            outcome, detail = await asyncio.to_thread(self.decide, releases)
            if outcome != "act":
                said = self._decided.get(cond, (0, None))[1] == outcome
                self._decided[cond] = (time.monotonic(), outcome)
                if not said:           # said once until the decision changes
                    self.m.alert_actions.labels(cond, book, outcome).inc()
                    self.opts.emit({"event": "alert_action", "condition": cond, "runbook": book, "outcome": outcome,
                                    "why": why, "detail": detail})
                return
        self._decided.pop(cond, None)
        self.gate.ran(cond, time.monotonic())
        await self._run_runbook(cond, book, why, releases[0] if len(releases) == 1 and releases[0] != UNKNOWN
                                else None)

    def decide(self, releases: list) -> tuple[str, str]:
        """Blocking, at decision time: take every host's deploy lock, read what each runs (one
        round trip, :func:`dsv4ctl.deploy.engine.acquire_locks`), give the locks back. Returns
        (``act`` | ``skipped_lock`` | ``skipped_stale`` | ``skipped_settling``, why): stale when
        the evidence is not about the one release every host runs now (a deploy since the last
        release read), settling when that release was activated less than the settle window ago
        by a deploy this watch did not make. The targets' release labels follow what was read."""
        from ..deploy.engine import acquire_locks, release_locks
        from ..deploy.site import Options, open_site
        from ..errors import DsvError
        site = open_site(self.dep, Options(accept_new_host_keys=self.opts.accept_new_host_keys))
        try:
            try:
                facts = acquire_locks(site, "watch --on-alert: read the running release")
            except DsvError as e:
                return "skipped_lock", str(e).splitlines()[0][:300]
            release_locks(site)
        finally:
            site.close()
        for t in self.targets:
            f = facts.get(t.host)
            if f is not None:
                self._set_release(t, t.host, f.current or "none",
                                  (f.recorded(f.current) or "pushed") if f.current else "none")
        return decide_on(facts, releases, self._own_runs, self.settle_s)

    @property
    def settle_s(self) -> float:
        """Seconds after a deploy watch did not make during which ``--auto`` waits."""
        return self.opts.alert_window / 12 if self.opts.settle is None else self.opts.settle

    async def _run_runbook(self, cond: str, book: str, why: str, release: Optional[str] = None) -> None:
        # the evidence goes with the run: steps that act on the running release (release.mark_failed)
        # check, under the deploy lock, that the hosts still run the release it is about
        argv = [sys.executable, "-m", "dsv4ctl", "runbook", "run", book, "-p", self.opts.profile_arg,
                *(["--release", release] if release else []), "--evidence", f"watch --on-alert {cond}: {why}"[:1000],
                "--yes" if self.opts.auto else "--dry-run"]
        self.opts.emit({"event": "alert_action", "condition": cond, "runbook": book, "outcome": "started",
                        "mode": "auto" if self.opts.auto else "dry_run", "why": why})
        proc = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self._children.add(proc)
        own = [time.time(), math.inf]          # a deploy made while it runs is this watch's own
        if self.opts.auto:
            self._own_runs[:] = self._own_runs[-7:] + [own]
        try:
            out, err = await proc.communicate()
        except asyncio.CancelledError:
            # watch is stopping: the runbook is interrupted like a Ctrl-C (it records the step as
            # interrupted, writes its report and audit record, exits 130), never left running alone
            await self._stop_child(proc)
            self.m.alert_actions.labels(cond, book, "interrupted").inc()
            self._run_log(argv, cond, book, "interrupted", proc.returncode, why)
            self.opts.emit({"event": "alert_action", "condition": cond, "runbook": book, "outcome": "interrupted",
                            "exit": proc.returncode, "mode": "auto" if self.opts.auto else "dry_run", "why": why})
            raise
        finally:
            self._children.discard(proc)
            own[1] = time.time()
        outcome = action_outcome(self.opts.auto, proc.returncode)
        # why it ended is on stderr (the verdict, an error); the step listing on stdout
        tail = (err if err.strip() else out).decode("utf-8", "replace").strip().splitlines()[-3:]
        self._run_log(argv, cond, book, outcome, proc.returncode, why)
        if self.opts.auto:          # the hosts' audit first: the event below means both are written
            await asyncio.to_thread(self._audit, cond, book, outcome, proc.returncode, why)
        self.m.alert_actions.labels(cond, book, outcome).inc()
        self.opts.emit({"event": "alert_action", "condition": cond, "runbook": book, "outcome": outcome,
                        "exit": proc.returncode, "mode": "auto" if self.opts.auto else "dry_run", "why": why,
                        "output_tail": tail})

    def _run_log(self, argv: list, cond: str, book: str, outcome: str, code, why: str) -> None:
        """The run in the local run log (``<state>/runs.jsonl``), dry runs included: what ran,
        why, how it ended; the API key masked."""
        from ..deploy.runlog import append_run
        append_run({"command": f"watch --on-alert {cond}: runbook run {book} {argv[-1]}",
                    "profile": str(self.dep.path), "exit_code": code, "outcome": outcome, "condition": cond,
                    "runbook": book, "mode": "auto" if self.opts.auto else "dry_run", "why": why},
                   [self.opts.api_key] if self.opts.api_key else [])

    @staticmethod
    async def _stop_child(proc, grace: float = 25.0) -> None:
        """SIGTERM ``proc``'s process group, SIGKILL after ``grace`` seconds."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                await asyncio.wait_for(proc.wait(), timeout=wait)
                return
            except asyncio.TimeoutError:
                continue

    def _audit(self, cond: str, book: str, outcome: str, code: int, why: str) -> None:
        """One audit record per target host: watch ran a runbook (best effort: a host that cannot
        be reached is said as an event)."""
        from ..deploy.site import Options, open_site
        from ..hosts.audit import append_cmd, audit_record
        from ..remote import run_parallel
        hosts = sorted({t.host for t in self.targets})
        site = open_site(self.dep, Options(accept_new_host_keys=self.opts.accept_new_host_keys))
        try:
            res = run_parallel({h: site.transports[h] for h in hosts}, lambda tr: tr.run(append_cmd(
                f"{site.paths[tr.name].root}/audit.jsonl", audit_record(
                    tr.name, "watch-on-alert", "ok" if code == 0 else "failed",
                    f"{cond}: ran runbook {book} ({why}); exit {code}", runbook=book, condition=cond))), timeout=60)
        finally:
            site.close()
        for h, r in res.items():
            if not r.ok:
                self.opts.emit({"event": "audit_failed", "host": h, "error": r.error})

    # --- the process -----------------------------------------------------------------------
    async def serve_metrics(self):
        """Start the ``/metrics`` listener on ``opts.listen``; RemoteError (exit 3) when the
        address cannot be bound. Returns the aiohttp runner (cleaned up by :meth:`run`)."""
        from aiohttp import web
        from prometheus_client import generate_latest
        from prometheus_client.exposition import CONTENT_TYPE_LATEST

        async def metrics(request):
            return web.Response(body=generate_latest(self.m.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def health(request):
            return web.Response(text="ok\n")
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/health", health)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        host, port = self.opts.listen
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as e:
            await runner.cleanup()
            raise RemoteError(f"--listen {host}:{port}: cannot listen ({e.strerror or e})") from None
        return runner

    async def run(self) -> None:
        """Until :attr:`stop` is set: one probe loop per probed target, the scrape loop, the
        release loop, the stuck/alert ticker and the metrics listener."""
        runner = await self.serve_metrics() if self.opts.listen else None
        self.opts.emit({"event": "started", "targets": [t.name for t in self.targets if t.probe],
                        "scraped": [t.name for t in self.targets if t.metrics_url],
                        "listen": (f"[{self.opts.listen[0]}]" if ":" in self.opts.listen[0] else self.opts.listen[0])
                        + f":{self.opts.listen[1]}" if self.opts.listen else None,
                        "interval_s": self.opts.interval})
        http = make_client(len(self.targets) * 2, self.opts.stall_timeout, self.opts.api_key)
        tasks = []
        if self.opts.read_releases:
            # the first read before the first probe (so its series carry the release), at most
            # FIRST_READ_WAIT seconds: an unreachable host must not hold the probes back
            self._first_read = asyncio.Event()
            tasks.append(asyncio.create_task(self._release_loop()))
            try:
                await asyncio.wait_for(self._first_read.wait(), timeout=FIRST_READ_WAIT)
            except asyncio.TimeoutError:
                pass
        tasks += [asyncio.create_task(self._probe_loop(http, t)) for t in self.targets if t.probe]
        tasks.append(asyncio.create_task(self._scrape_loop(http)))
        tasks.append(asyncio.create_task(self._ticker()))
        try:
            await self.stop.wait()
        finally:
            site = self._site
            if site is not None:       # an SSH read in flight ends now, not at its 60 s timeout
                try:
                    site.close()
                except Exception:      # noqa: BLE001 - closing is best effort
                    pass
            for task in tasks + list(self._action_tasks):
                task.cancel()
            await asyncio.gather(*tasks, *self._action_tasks, return_exceptions=True)
            await http.close()
            if runner is not None:
                await runner.cleanup()
            self.opts.emit({"event": "stopped", "probes": self.n})

    async def once(self) -> dict:
        """One round for cron or a pipeline: releases read once, every target scraped once and
        every probed target probed once (concurrently). Returns the ``dsv4ctl.watch/1`` document."""
        if self.opts.read_releases:
            try:
                await asyncio.to_thread(self.read_releases)
            except Exception as e:
                self.opts.emit({"event": "release_read_failed", "host": "*", "error": f"{type(e).__name__}: {e}"})
        self.m.rounds.inc()
        http = make_client(len(self.targets) * 2, self.opts.stall_timeout, self.opts.api_key)
        try:
            probes = await asyncio.gather(*(self.probe(http, t) for t in self.targets if t.probe))
            await asyncio.gather(*(self.scrape(http, t) for t in self.targets if t.metrics_url))
        finally:
            await http.close()
        return self.document(list(probes))

    def document(self, probes: list[dict]) -> dict:
        """The ``dsv4ctl.watch/1`` JSON document of a round: targets (role, url, release, state,
        probe record or None, scrape) and ``ok`` (every probe ok)."""
        by = {p["target"]: p for p in probes}
        return {"schema": "dsv4ctl.watch/1", "profile": self.dep.name,
                "ok": all(p["outcome"] == "ok" for p in probes),
                "targets": [{"name": t.name, "role": t.role, "url": t.url, "host": t.host,
                             "release": self.release[t.name][0], "state": self.release[t.name][1],
                             "probe": by.get(t.name), "scrape": self.scraped.get(t.name)} for t in self.targets]}


def event_line(e: dict) -> str:
    """One log line for an event (stderr, and the ``--log`` JSONL file gets the dict itself)."""
    kind = e.get("event")
    if kind == "probe":
        return f"watch: {e['target']}: probe {e['rid']} {e['outcome']} ({e['class']}: {e['reason']})"
    if kind == "release":
        return f"watch: {e['target']}: release {e['release']} ({e['state']}) on {e['host']}, was {e['was']}"
    if kind == "alert_action":
        last = (e.get("output_tail") or [""])[-1] if e.get("outcome") in ("failed", "dry_run_would_stop") else ""
        return (f"watch: on-alert {e['condition']}: runbook {e['runbook']} {e['outcome']}"
                + (f" (exit {e['exit']})" if "exit" in e else "") + (f": {e['why']}" if e.get("why") else "")
                + (f"; it said: {last}" if last else "") + (f"; {e['detail']}" if e.get("detail") else ""))
    if kind == "recovered":
        return f"watch: {e['target']}: probe {e['rid']} ok again after {e['after']} probe(s) not ok"
    if kind == "started":
        return (f"watch: probing {', '.join(e['targets'])} every {e['interval_s']:g} s"
                + (f"; metrics on http://{e['listen']}/metrics" if e.get("listen") else ""))
    if kind == "stopped":
        return f"watch: stopped after {e['probes']} probes"
    return "watch: " + json.dumps({k: v for k, v in e.items() if k != "event"} | {"event": kind}, sort_keys=True)
