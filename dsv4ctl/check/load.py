"""The load run of ``check load`` (and of ``deploy --promote`` and runbooks through it): concurrent
multi-turn tool-call sessions per level against one URL or two (A/B), every turn classified,
/metrics deltas, the gate document. No CLI here: the command parses, calls :func:`run_load`,
renders."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Optional


async def run_load(urls: list[str], levels: list[int], turns: int, min_requests: int, stream: str, stall: float,
                   answer_words: int, max_c: float, model: Optional[str], metrics: bool,
                   metric_urls: Optional[list[str]], rec_file, progress, settings: dict, api_key: Optional[str] = None,
                   turn_timeout: float = 600.0, thinking: bool = False,
                   gateway_metrics: Optional[str] = None, max_duration: Optional[float] = None) -> dict:
    """Run ``levels`` (concurrent sessions) of ``turns`` against each of ``urls`` (two: an A/B
    comparison), at least ``min_requests`` turns per level, classify every turn, scrape /metrics
    (of ``metric_urls``, else the URL) before and after each level; return the
    ``dsv4ctl.check.load/1`` document (:func:`dsv4ctl.check.report.build_doc`).

    ``rec_file``: a text file for one JSON line per turn, or None; ``progress``: None, or a factory
    ``progress(total) -> obj`` with ``update(description=..., advance=..., bad=...)`` and ``stop()``.
    Raises ConnectError/BadResponse (:mod:`dsv4ctl.check.driver`) when a URL cannot be used
    (:class:`~dsv4ctl.check.driver.AuthRefused`, a ConnectError: the server refuses the API key),
    KeyboardInterrupt on Ctrl-C or SIGTERM (every session stopped first). ``thinking``: requests ask for
    thinking (:func:`dsv4ctl.check.driver.run_level`). ``gateway_metrics``: the gateway's own
    Prometheus URL (e.g. ``http://router:29000/metrics``), scraped before and after each level
    (:mod:`dsv4ctl.check.gateway`; each level's ``gateway``), or None. ``max_duration``: seconds a
    level may run before it issues no new turn (each level's ``capped_by_max_duration``).

    With two URLs each level's comparison has ``paired`` too: the turns paired by session and
    place, the one-sided exact McNemar test of B against A and the per-class differences with
    95 % intervals (:func:`dsv4ctl.check.paired.compare_paired`; the upgrade gate of
    ``deploy --promote`` judges it).

    A crashed level (:func:`dsv4ctl.check.driver.run_level`) stops the ramp: with ``--compare`` the
    other URL still runs that level (no comparison is made for it), then no higher level is run
    against any URL; the skipped levels are the document's ``not_run``."""
    import uuid

    from . import driver as D
    from . import report as R

    run = _LoadRun(urls=urls, levels=levels, turns=turns, targets={c: max(c * turns, min_requests) for c in levels},
                   stream=stream, answer_words=answer_words, max_c=max_c, metrics=metrics, metric_urls=metric_urls,
                   rec_file=rec_file, run_id=uuid.uuid4().hex[:8], turn_timeout=turn_timeout, thinking=thinking,
                   gateway_metrics=gateway_metrics, max_duration=max_duration)
    intr = _Interrupt()
    try:
        async with D.make_client(max(levels), stall, api_key) as http:
            await run.ramp(http, model, progress, intr)
    except asyncio.CancelledError:
        if intr.fired:
            raise KeyboardInterrupt from None
        raise
    finally:
        intr.remove()
        if run.prog is not None:
            run.prog.stop()
    settings = dict(settings, run_id=run.run_id, models=run.models, output_paths=run.paths)
    return R.build_doc(run.summaries, max_corruption=max_c, settings=settings, comparisons=run.comparisons,
                       not_run=run.not_run)


class _Interrupt:
    """Ctrl-C, SIGTERM (kill, systemd, a runbook's stop) and SIGHUP while the load runs: set
    ``fired`` (every session stops before its next turn) and cancel the running task (what is in
    flight; aiohttp may turn the cancellation of a read into a timeout, so the flag is what ends
    the run). Installed on creation, in the running event loop; :meth:`remove` takes it away."""

    def __init__(self) -> None:
        from ..signals import STOPPING
        self.fired = False
        self.task = asyncio.current_task()
        self.loop = asyncio.get_running_loop()
        self.signals = STOPPING
        for sig in STOPPING:
            try:
                self.loop.add_signal_handler(sig, self.fire)
            except (NotImplementedError, RuntimeError, ValueError):   # not the main thread / no signals here
                pass

    def fire(self) -> None:
        """The signal handler."""
        self.fired = True
        self.task.cancel()

    def remove(self) -> None:
        """Take the handlers away again."""
        for sig in self.signals:
            try:
                self.loop.remove_signal_handler(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass


@dataclass
class _LoadRun:
    """One :func:`run_load`: its options (as there) and what the levels produced so far."""

    urls: list[str]
    levels: list[int]
    turns: int
    targets: dict[int, int]
    stream: str
    answer_words: int
    max_c: float
    metrics: bool
    metric_urls: Optional[list[str]]
    rec_file: Any
    run_id: str
    turn_timeout: float
    thinking: bool
    gateway_metrics: Optional[str]
    max_duration: Optional[float]
    models: dict[str, str] = field(default_factory=dict)
    paths: dict[str, Optional[str]] = field(default_factory=dict)   # each URL's output path (known answers)
    summaries: list[dict] = field(default_factory=list)
    comparisons: list[dict] = field(default_factory=list)
    not_run: list[int] = field(default_factory=list)
    key_accepted: dict[str, bool] = field(default_factory=dict)   # the server took the API key (see run_level)
    prog: Any = None
    bad: int = 0

    def on_record(self, rec: dict) -> None:
        """One turn's record: counted, written to the records file, shown in the progress bar."""
        if rec["class"] != "ok":
            self.bad += 1
        if self.rec_file:
            self.rec_file.write(json.dumps(rec, ensure_ascii=False) + "\n")
        if self.prog is not None:
            self.prog.update(advance=1, bad=self.bad)

    async def ramp(self, http, model: Optional[str], progress, intr: _Interrupt) -> None:
        """Every level against every URL, in order; a crashed level ends the ramp (the other URL of
        a comparison still runs it; the higher levels are ``not_run``)."""
        from . import driver as D
        from . import report as R
        self.key_accepted = {u: False for u in self.urls}
        for u in self.urls:
            self.models[u] = model or await D.discover_model(http, u)
            self.paths[u] = await D.discover_output_path(http, u)
        if progress:
            self.prog = progress(sum(self.targets.values()) * len(self.urls))
        for li, c in enumerate(self.levels):
            pair, records = [], []
            for i, u in enumerate(self.urls):
                s, recs = await self.level(http, i, u, c, intr)
                pair.append(s)
                records.append(recs)
            if len(pair) == 2 and not any(x["crashed"] for x in pair):
                from .paired import compare_paired
                self.comparisons.append({**R.compare_levels(pair[0], pair[1]),
                                         "paired": compare_paired(records[0], records[1])})
            if any(x["crashed"] for x in pair):
                self.not_run = self.levels[li + 1:]     # don't hammer a dead server with more sessions
                break

    async def level(self, http, i: int, u: str, c: int, intr: _Interrupt) -> tuple[dict, list]:
        """Level ``c`` against URL ``u`` (the ``i``-th), between /metrics and gateway scrapes: its
        summary (:func:`dsv4ctl.check.report.summarize_level`) and its per-turn records (the
        paired A/B of :mod:`dsv4ctl.check.paired` pairs them)."""
        from . import driver as D
        from . import report as R
        from .gateway import gateway_delta, scrape_gateway
        scrape = self.metric_urls if self.metric_urls is not None else [u]
        gw = self.gateway_metrics
        before = await _scrape(http, scrape) if self.metrics else None
        gw_before = await scrape_gateway(http, gw) if gw else None
        if self.prog is not None:
            self.prog.update(description=f"{u} c={c}")
        lv = await D.run_level(http, u, self.models[u], c, self.turns, self.targets[c], self.stream, self.answer_words,
                               self.on_record, self.run_id, "-" + "ab"[i] if len(self.urls) == 2 else "",
                               stop=lambda: intr.fired, turn_timeout=self.turn_timeout, thinking=self.thinking,
                               key_accepted=self.key_accepted[u], max_duration=self.max_duration,
                               output_path=self.paths.get(u))
        self.key_accepted[u] = lv.key_accepted
        if intr.fired:
            raise KeyboardInterrupt
        after = await _scrape(http, scrape) if self.metrics else None
        gw_after = await scrape_gateway(http, gw) if gw else None
        s = R.summarize_level(lv.records, url=u, concurrency=c, duration_s=lv.duration_s,
                              itl_gaps=lv.itl_gaps, max_corruption=self.max_c,
                              metrics=R.metrics_delta(before, after), crash=lv.crash,
                              client_cpu_s=lv.client_cpu_s, gateway=gateway_delta(gw_before, gw_after))
        s["capped_by_max_duration"] = lv.capped
        self.summaries.append(s)
        if lv.crash is not None and self.prog is not None:
            self.prog.update(description=f"{u} c={c} CRASHED")
        return s, lv.records


async def _scrape(http, urls: list[str]):
    """Summed /metrics counters of ``urls``; None when one of them has none."""
    from .driver import scrape_metrics
    total: dict = {}
    for u in urls:
        m = await scrape_metrics(http, u)
        if m is None:
            return None
        for k, v in m.items():
            total[k] = total.get(k, 0.0) + v
    return total


