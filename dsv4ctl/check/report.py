"""Pure summaries for ``dsv4ctl check load``: per-level corruption rates with Wilson intervals,
latency percentiles, throughput, /metrics deltas, the gate verdict and A/B comparisons.

Document schema ``dsv4ctl.check.load/1`` (see docs/check.md). No I/O."""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from . import classify as C
from .stats import fisher_exact, newcombe_diff, percentile, wilson

SCHEMA = "dsv4ctl.check.load/1"

COUNTERS = ("sglang:num_transfer_failed_reqs_total", "sglang:num_bootstrap_failed_reqs_total",
            "sglang:num_aborted_requests_total", "sglang:num_requests_total", "sglang:prompt_tokens_total",
            "sglang:cached_tokens_total", "sglang:generation_tokens_total")
GAUGES = ("sglang:cache_hit_rate", "sglang:num_running_reqs", "sglang:num_decode_transfer_queue_reqs",
          "sglang:token_usage")


def min_requests_for_gate(max_corruption: float, confidence: float = 0.95) -> int:
    """Smallest n for which 0 failures in n turns passes the gate (Wilson upper bound ≤ max):
    z²/(n+z²) ≤ m ⇔ n ≥ z²(1−m)/m (381 for 1 %). ValueError for max ≤ 0 or ≥ 1."""
    if not 0 < max_corruption < 1:
        raise ValueError("max_corruption must be in (0, 1) to derive a request count")
    from .stats import z_value
    z2 = z_value(confidence) ** 2
    return math.ceil(z2 * (1 - max_corruption) / max_corruption - 1e-9)


def _pcts(values: Sequence[float]) -> dict[str, Optional[float]]:
    return {k: (None if (v := percentile(values, q)) is None else round(v, 6))
            for k, q in (("p50", 50), ("p90", 90), ("p99", 99))}


def metrics_delta(before: Optional[dict], after: Optional[dict]) -> Optional[dict]:
    """Counter deltas and gauges after the run, plus the cache hit rate over the run
    (Δcached_tokens / Δprompt_tokens). None when either scrape is missing."""
    if before is None or after is None:
        return None
    out: dict[str, Any] = {}
    for name in COUNTERS:
        if name in after:
            out[name] = after[name] - before.get(name, 0.0)
    for name in GAUGES:
        if name in after:
            out[name] = after[name]
    dp = out.get("sglang:prompt_tokens_total")
    dc = out.get("sglang:cached_tokens_total")
    out["cache_hit_rate_during_run"] = round(dc / dp, 4) if dp and dc is not None else None
    return out


def summarize_level(records: Sequence[dict], *, url: str, concurrency: int, duration_s: float,
                    itl_gaps: Sequence[float], max_corruption: float,
                    metrics: Optional[dict] = None) -> dict:
    """One level's summary. Every issued turn is in the denominator (errors and stalls count as
    corrupted); ``pass`` is True iff the Wilson 95 % upper bound ≤ ``max_corruption``."""
    n = len(records)
    by_class = {c: 0 for c in C.CLASSES}
    for r in records:
        if r["class"] != C.OK:
            by_class[r["class"]] += 1
    bad = sum(by_class.values())
    lo, hi = wilson(bad, n)
    per_class = {c: {"count": k, "rate": round(k / n, 6) if n else None,
                     "wilson95": [round(x, 6) for x in wilson(k, n)]} for c, k in by_class.items()}
    ttft = [r["ttft_s"] for r in records if r["class"] == C.OK and r.get("ttft_s") is not None]
    e2e = [r["e2e_s"] for r in records if r["class"] == C.OK and r.get("e2e_s") is not None]
    tokens = sum(r.get("completion_tokens") or 0 for r in records)
    return {
        "url": url, "concurrency": concurrency, "turns": n, "corrupted": bad,
        "rate": round(bad / n, 6) if n else None, "wilson95": [round(lo, 6), round(hi, 6)],
        "pass": hi <= max_corruption + 1e-12, "stuck": by_class[C.STUCK], "classes": per_class,
        "streaming_turns": sum(1 for r in records if r.get("stream")),
        "duration_s": round(duration_s, 3),
        "requests_per_s": round(n / duration_s, 3) if duration_s > 0 else None,
        "output_tokens_per_s": round(tokens / duration_s, 1) if duration_s > 0 else None,
        "ttft_s": _pcts(ttft), "itl_s": _pcts(itl_gaps), "e2e_s": _pcts(e2e),
        "metrics": metrics,
    }


def compare_levels(a: dict, b: dict, alpha: float = 0.05) -> dict:
    """A/B at one concurrency: rates, difference A−B with Newcombe's 95 % interval, Fisher exact
    two-sided p, and ``significant`` = p < alpha."""
    d, lo, hi = newcombe_diff(a["corrupted"], a["turns"], b["corrupted"], b["turns"])
    p = fisher_exact(a["corrupted"], a["turns"], b["corrupted"], b["turns"])
    return {"concurrency": a["concurrency"], "url_a": a["url"], "url_b": b["url"], "rate_a": a["rate"],
            "rate_b": b["rate"], "difference": round(d, 6), "difference_ci95": [round(lo, 6), round(hi, 6)],
            "fisher_p": p, "significant": p < alpha}


def build_doc(levels: Sequence[dict], *, max_corruption: float, settings: dict,
              comparisons: Sequence[dict] = ()) -> dict:
    """The ``dsv4ctl.check.load/1`` document; ``pass`` = every level passes the gate."""
    return {"schema": SCHEMA, "max_corruption": max_corruption, "settings": settings,
            "pass": all(lv["pass"] for lv in levels), "levels": list(levels),
            "comparisons": list(comparisons)}


def fmt_pct(x: Optional[float], digits: int = 2) -> str:
    """A fraction as a percentage string (``0.15`` → ``15.00 %``); ``-`` for None."""
    return "-" if x is None else f"{100 * x:.{digits}f} %"


def fmt_ms(x: Optional[float]) -> str:
    """Seconds as milliseconds with one decimal; ``-`` for None."""
    return "-" if x is None else f"{1000 * x:.1f}"


def level_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    """The main table: one row per (URL, concurrency)."""
    headers = ["url", "conc", "turns", "corrupted", "rate", "95 % Wilson", "gate", "stuck", "top class",
               "req/s", "TTFT p50/p99 ms", "ITL p50/p99 ms", "e2e p50/p99 ms"]
    rows = []
    for lv in doc["levels"]:
        top = max(((k, v["count"]) for k, v in lv["classes"].items()), key=lambda kv: kv[1])
        rows.append([lv["url"], str(lv["concurrency"]), str(lv["turns"]), str(lv["corrupted"]), fmt_pct(lv["rate"]),
                     f"{fmt_pct(lv['wilson95'][0])} – {fmt_pct(lv['wilson95'][1])}",
                     "pass" if lv["pass"] else "FAIL", str(lv["stuck"]),
                     f"{top[0]} ({top[1]})" if top[1] else "-", f"{lv['requests_per_s']}",
                     f"{fmt_ms(lv['ttft_s']['p50'])} / {fmt_ms(lv['ttft_s']['p99'])}",
                     f"{fmt_ms(lv['itl_s']['p50'])} / {fmt_ms(lv['itl_s']['p99'])}",
                     f"{fmt_ms(lv['e2e_s']['p50'])} / {fmt_ms(lv['e2e_s']['p99'])}"])
    return headers, rows


def class_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    """Per-class counts, one column per level (only classes seen anywhere)."""
    seen = [c for c in C.CLASSES if any(lv["classes"][c]["count"] for lv in doc["levels"])]
    headers = ["class"] + [f"{lv['url']} c={lv['concurrency']}" for lv in doc["levels"]]
    rows = [[f"{c} ({C.DESCRIPTIONS[c]})"] + [f"{lv['classes'][c]['count']} ({fmt_pct(lv['classes'][c]['rate'])})"
                                               for lv in doc["levels"]] for c in seen]
    return headers, rows


def compare_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    """The A/B table: one row per concurrency level."""
    headers = ["conc", "rate A", "rate B", "A − B", "95 % CI (Newcombe)", "Fisher p", "significant"]
    rows = [[str(c["concurrency"]), fmt_pct(c["rate_a"]), fmt_pct(c["rate_b"]), fmt_pct(c["difference"]),
             f"{fmt_pct(c['difference_ci95'][0])} – {fmt_pct(c['difference_ci95'][1])}",
             f"{c['fisher_p']:.3g}", "yes" if c["significant"] else "no"] for c in doc["comparisons"]]
    return headers, rows


def metric_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    """The /metrics table: one row per (URL, level, metric) that was scraped."""
    headers = ["url", "conc", "metric", "value"]
    rows = []
    for lv in doc["levels"]:
        for k, v in (lv.get("metrics") or {}).items():
            if v is not None:
                rows.append([lv["url"], str(lv["concurrency"]), k, f"{v:g}" if isinstance(v, float) else str(v)])
    return headers, rows
