"""A PD gateway in front of the workers: recognising one, and its own Prometheus metrics.

Two gateways are in use with SGLang 0.5.23 (both Rust, both on PyPI; observed on 0.3.2 / 1.13.0):

* ``sglang-router`` (``python -m sglang_router.launch_router``): ``GET /server_info`` is 404,
  ``GET /get_server_info`` answers ``{"router_manager": true, "routers_count": N, "workers_count": M}``;
* ``smg`` (``python -m smg.launch_router``): ``GET /server_info`` is 404, ``GET /get_server_info``
  is forwarded to one worker of its choice (any worker: not evidence about a particular one).

Both answer ``GET /workers`` with ``{"workers": [{"url", "worker_type" ("prefill" | "decode" |
"regular"), "is_healthy", "bootstrap_port", ...}]}``; an SGLang server has no ``/workers``. Both
serve Prometheus text on their own listener (``--prometheus-host/--prometheus-port``); the series
dsv4ctl reads (names as both versions export them):

* ``smg_worker_retries_total{worker_type, endpoint}``: attempts the gateway re-sent. In PD a retry
  re-sends the pair, counted once under ``prefill`` and once under ``decode``: client requests
  retried = the ``decode`` (+ ``regular``) count;
* ``smg_worker_retries_exhausted_total{worker_type, endpoint}``: requests that failed after the
  last retry (the client saw the error);
* ``smg_worker_cb_outcomes_total{worker, outcome}`` (``outcome`` success | failure): the circuit
  breaker's view of each attempt; ``smg_worker_cb_state{worker}``: 0 closed, else open/half-open.

A turn the gateway retried to success is ``ok`` to the client: a gateway that retries hides
failures from the corruption rate. :func:`gateway_delta` says how many.

Pure functions here; :func:`scrape_gateway` does the one GET.
"""

from __future__ import annotations

from typing import Any, Optional

RETRIES = "smg_worker_retries_total"
RETRIES_EXHAUSTED = "smg_worker_retries_exhausted_total"
CB_OUTCOMES = "smg_worker_cb_outcomes_total"
CB_STATE = "smg_worker_cb_state"
WORKER_TYPES = ("prefill", "decode", "regular")
"""The ``worker_type`` values the gateways use; any other is not counted (labels stay bounded)."""
MAX_OPEN_LISTED = 64
"""Workers with an open circuit breaker listed at most (a larger fleet is not listed further)."""


def identify_gateway(server_info_status: Optional[int], get_server_info: Any, workers_doc: Any) -> Optional[dict]:
    """Pure: what the entry URL is, from its answers to ``GET /server_info`` (status), ``GET
    /get_server_info`` (decoded JSON or None) and ``GET /workers`` (decoded JSON or None).

    Returns None for something that is not a gateway (an SGLang server: ``/server_info`` 200, or
    no ``/workers`` list), else ``{"kind": "sglang-router" | "gateway", "summary": str, "workers":
    [{"url": str, "worker_type": str, "is_healthy": bool | None, "bootstrap_port": int | None}]}``.
    ``kind`` is ``sglang-router`` when ``/get_server_info`` says ``router_manager``; ``gateway``
    otherwise (smg forwards ``/get_server_info`` to one worker, so its answer names no gateway)."""
    ws = workers_doc.get("workers") if isinstance(workers_doc, dict) else None
    manager = isinstance(get_server_info, dict) and get_server_info.get("router_manager") is True
    if server_info_status == 200 or (not isinstance(ws, list) and not manager):
        return None
    workers = []
    for w in ws if isinstance(ws, list) else []:
        if isinstance(w, dict) and isinstance(w.get("url"), str):
            bp = w.get("bootstrap_port")
            workers.append({"url": w["url"].rstrip("/"), "worker_type": str(w.get("worker_type") or "regular"),
                            "is_healthy": w.get("is_healthy") if isinstance(w.get("is_healthy"), bool) else None,
                            "bootstrap_port": bp if isinstance(bp, int) and not isinstance(bp, bool) else None})
    listing = ", ".join(f"{w['worker_type']} {w['url']}" for w in workers) or "no workers listed"
    if manager:
        summary = (f"sglang-router (/get_server_info: router_manager, routers_count "
                   f"{get_server_info.get('routers_count')}, workers_count {get_server_info.get('workers_count')}); "
                   f"/workers: {listing}")
        kind = "sglang-router"
    else:
        summary = (f"a gateway (/server_info HTTP {server_info_status}, /workers lists workers; its "
                   f"/get_server_info is one worker's, not judged): {listing}")
        kind = "gateway"
    return {"kind": kind, "summary": summary, "workers": workers}


def parse_gateway_metrics(text: str) -> dict[str, Any]:
    """Pure: the gateway series dsv4ctl reads from Prometheus text ``text``:
    ``{"retries": {worker_type: n}, "retries_exhausted": {worker_type: n}, "cb_failures": n,
    "cb_open": [worker URL, ...]}`` (counts summed over the other labels). ValueError for text that
    is not Prometheus exposition format."""
    import math
    from prometheus_client.parser import text_string_to_metric_families
    out: dict[str, Any] = {"retries": {}, "retries_exhausted": {}, "cb_failures": 0.0, "cb_open": []}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                v = float(s.value)
                if not math.isfinite(v) or v < 0:      # not a count (NaN, Inf, a negative): left out
                    continue
                if s.name in (RETRIES, RETRIES_EXHAUSTED):
                    key = "retries" if s.name == RETRIES else "retries_exhausted"
                    wt = s.labels.get("worker_type") or "regular"
                    if wt not in WORKER_TYPES:          # bounded labels: only the gateways' own types
                        continue
                    out[key][wt] = out[key].get(wt, 0.0) + v
                elif s.name == CB_OUTCOMES and s.labels.get("outcome") == "failure":
                    out["cb_failures"] += v
                elif s.name == CB_STATE and v != 0 and s.labels.get("worker") \
                        and len(out["cb_open"]) < MAX_OPEN_LISTED:
                    out["cb_open"].append(s.labels["worker"])
    except (IndexError, TypeError, KeyError) as e:
        raise ValueError(f"not Prometheus text: {e}") from None
    return out


def client_retries(by_type: dict[str, float]) -> int:
    """Client requests re-sent: the decode (PD) plus regular (non-PD) attempts; prefill only when
    nothing else was counted (a PD retry is counted under both prefill and decode)."""
    n = by_type.get("decode", 0.0) + by_type.get("regular", 0.0)
    return int(round(n if n or not by_type else by_type.get("prefill", 0.0)))


def gateway_delta(before: Optional[dict], after: Optional[dict]) -> Optional[dict]:
    """Pure: what the gateway did during a level, from two :func:`parse_gateway_metrics` results
    (None when either is None): ``{"retries": client requests re-sent (int), "retries_by_worker_type":
    {type: int}, "retries_exhausted": int, "circuit_breaker_failures": int, "circuit_breakers_open":
    [worker URL] (after the level)}``. Counters that went down (a gateway restart) count from 0."""
    if before is None or after is None:
        return None

    def d(a: float, b: float) -> int:
        return int(round(b - a if b >= a else b))
    by_type = {t: d(before["retries"].get(t, 0.0), v) for t, v in after["retries"].items()}
    by_type = {t: n for t, n in by_type.items() if n}
    exhausted = {t: d(before["retries_exhausted"].get(t, 0.0), v) for t, v in after["retries_exhausted"].items()}
    return {"retries": client_retries(by_type), "retries_by_worker_type": by_type,
            "retries_exhausted": client_retries({t: n for t, n in exhausted.items() if n}),
            "circuit_breaker_failures": d(before["cb_failures"], after["cb_failures"]),
            "circuit_breakers_open": sorted(after["cb_open"])}


async def scrape_gateway(http, url: str) -> Optional[dict]:
    """``GET url`` (the gateway's Prometheus endpoint, e.g. ``http://router:29000/metrics``) parsed
    by :func:`parse_gateway_metrics`; None when unreachable, not 200, over the size limit or not
    Prometheus text (the level's ``gateway`` is then null)."""
    import asyncio

    import aiohttp

    from . import classify as C
    from .driver import read_capped
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=10)) as r:
            if r.status != 200:
                return None
            text = (await read_capped(r, C.MAX_JSON_BODY)).decode("utf-8", "replace")
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, C.ProtocolError):
        return None
    try:
        return parse_gateway_metrics(text)
    except ValueError:
        return None
