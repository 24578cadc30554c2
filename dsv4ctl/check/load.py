"""The load run of ``check load`` (and of ``deploy --promote`` and runbooks through it): concurrent
multi-turn tool-call sessions per level against one URL or two (A/B), every turn classified,
/metrics deltas, the gate document. No CLI here: the command parses, calls :func:`run_load`,
renders."""

from __future__ import annotations

from typing import Optional


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

    A crashed level (:func:`dsv4ctl.check.driver.run_level`) stops the ramp: with ``--compare`` the
    other URL still runs that level (no comparison is made for it), then no higher level is run
    against any URL; the skipped levels are the document's ``not_run``."""
    import json
    import uuid

    from . import driver as D
    from . import report as R
    from .gateway import gateway_delta, scrape_gateway

    run_id = uuid.uuid4().hex[:8]
    targets = {c: max(c * turns, min_requests) for c in levels}
    bad = 0
    # Ctrl-C: stop every session before its next turn and cancel what is in flight (aiohttp may
    # turn the cancellation of a read into a timeout, so the flag is what ends the run).
    import asyncio
    import signal

    from ..signals import STOPPING
    interrupted = False
    main_task = asyncio.current_task()
    loop = asyncio.get_running_loop()

    def on_sigint() -> None:
        nonlocal interrupted
        interrupted = True
        main_task.cancel()
    for sig in STOPPING:     # SIGTERM (kill, systemd, a runbook's stop) and SIGHUP like Ctrl-C
        try:
            loop.add_signal_handler(sig, on_sigint)
        except (NotImplementedError, RuntimeError, ValueError):   # not the main thread / no signals here
            pass

    def on_record(rec: dict) -> None:
        nonlocal bad
        if rec["class"] != "ok":
            bad += 1
        if rec_file:
            rec_file.write(json.dumps(rec, ensure_ascii=False) + "\n")
        if prog is not None:
            prog.update(advance=1, bad=bad)

    summaries: list[dict] = []
    comparisons: list[dict] = []
    not_run: list[int] = []
    prog = None
    try:
        async with D.make_client(max(levels), stall, api_key) as http:
            models = {}
            key_accepted = {u: False for u in urls}     # the server took the API key (see run_level)
            for u in urls:
                models[u] = model or await D.discover_model(http, u)
            if progress:
                prog = progress(sum(targets.values()) * len(urls))
            for li, c in enumerate(levels):
                pair = []
                for i, u in enumerate(urls):
                    scrape = metric_urls if metric_urls is not None else [u]
                    before = await _scrape(http, scrape) if metrics else None
                    gw_before = await scrape_gateway(http, gateway_metrics) if gateway_metrics else None
                    if prog is not None:
                        prog.update(description=f"{u} c={c}")
                    lv = await D.run_level(http, u, models[u], c, turns, targets[c], stream, answer_words,
                                           on_record, run_id, "-" + "ab"[i] if len(urls) == 2 else "",
                                           stop=lambda: interrupted, turn_timeout=turn_timeout, thinking=thinking,
                                           key_accepted=key_accepted[u], max_duration=max_duration)
                    key_accepted[u] = lv.key_accepted
                    if interrupted:
                        raise KeyboardInterrupt
                    after = await _scrape(http, scrape) if metrics else None
                    gw_after = await scrape_gateway(http, gateway_metrics) if gateway_metrics else None
                    s = R.summarize_level(lv.records, url=u, concurrency=c, duration_s=lv.duration_s,
                                          itl_gaps=lv.itl_gaps, max_corruption=max_c,
                                          metrics=R.metrics_delta(before, after), crash=lv.crash,
                                          client_cpu_s=lv.client_cpu_s, gateway=gateway_delta(gw_before, gw_after))
                    s["capped_by_max_duration"] = lv.capped
                    summaries.append(s)
                    pair.append(s)
                    if lv.crash is not None and prog is not None:
                        prog.update(description=f"{u} c={c} CRASHED")
                if len(pair) == 2 and not any(x["crashed"] for x in pair):
                    comparisons.append(R.compare_levels(pair[0], pair[1]))
                if any(x["crashed"] for x in pair):
                    not_run = levels[li + 1:]     # don't hammer a dead server with more sessions
                    break
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    finally:
        for sig in STOPPING:
            try:
                loop.remove_signal_handler(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        if prog is not None:
            prog.stop()
    settings = dict(settings, run_id=run_id, models=models)
    return R.build_doc(summaries, max_corruption=max_c, settings=settings, comparisons=comparisons,
                       not_run=not_run)


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


