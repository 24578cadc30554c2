"""Pure summaries for ``dsv4ctl check load``: per-level corruption rates with Wilson intervals,
latency percentiles, throughput, /metrics deltas, the gate verdict and A/B comparisons.

Document schema ``dsv4ctl.check.load/1`` (see docs/check.md). No I/O."""

from __future__ import annotations

import json
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


def example(rec: dict) -> dict:
    """One record as a gate example: {rid, response_id, expected, got, reason}.

    ``expected`` = {requires_tool (bool), tool (name or None)[, expected_calls (as the record has
    it, when present)]}; ``got`` = {http_status, finish_reason, tool_calls [{name, arguments}],
    content_excerpt (≤ 300 characters, None if no content), stream}."""
    expected = {"requires_tool": rec.get("requires_tool"), "tool": rec.get("tool")}
    if "expected_calls" in rec:
        expected["expected_calls"] = rec["expected_calls"]
    return {"rid": rec.get("rid"), "response_id": rec.get("response_id"), "expected": expected,
            "got": {"http_status": rec.get("http_status"), "finish_reason": rec.get("finish_reason"),
                    "tool_calls": rec.get("tool_calls") or [], "content_excerpt": rec.get("content_excerpt"),
                    "stream": rec.get("stream")},
            "reason": rec.get("reason")}


def crash_turn_indexes(records: Sequence[dict], crash: Optional[dict]) -> set[int]:
    """Indexes (in ``records``) of the crash's turns: the connection-error turns from the crash's
    first turn (``crash["turn"]``, 1-based) to the end of the level. Empty without a crash."""
    if not crash:
        return set()
    return {i for i in range(crash["turn"] - 1, len(records)) if records[i].get("connection_error")}


def summarize_level(records: Sequence[dict], *, url: str, concurrency: int, duration_s: float,
                    itl_gaps: Sequence[float], max_corruption: float,
                    metrics: Optional[dict] = None, crash: Optional[dict] = None,
                    client_cpu_s: Optional[float] = None, gateway: Optional[dict] = None) -> dict:
    """One level's summary.

    Every issued turn is in ``turns``. Turns of a crash (``crash`` as
    :attr:`dsv4ctl.check.driver.LevelRun.crash`; its turns per :func:`crash_turn_indexes`) are
    ``crash_turns``: errors, not corruption, left out of ``corrupted``, ``classes``, ``rate`` and the
    Wilson interval (all over ``turns − crash_turns``). Every other failed turn (errors and stalls
    included) counts as corrupted. ``pass`` is True iff the level did not crash and the Wilson 95 %
    upper bound ≤ ``max_corruption``. ``examples`` = {class: :func:`example` of the first record of
    that class in finishing order}, classes seen only, in ``classify.CLASSES`` order. Crash
    fields: ``crashed`` (bool), ``crash_reason``, ``crash_started_at`` (Unix s), ``crash_turn``
    (1-based position among the level's turns in finishing order), ``crash_rid`` (None without a
    crash), ``crash_turns`` (0 without). ``gateway``: the gateway's own counters over the level
    (:func:`dsv4ctl.check.gateway.gateway_delta`: retries, retries_by_worker_type,
    retries_exhausted, circuit_breaker_failures, circuit_breakers_open), None when not scraped;
    turns the gateway retried to success are ``ok`` here: ``gateway.retries`` says how many
    failures the corruption rate does not see. ``pd_failures_per_min``: PD aborts per minute of the
    level: ``transfer_failed`` / ``bootstrap_failed`` / ``aborted`` as the client saw them (the
    classes ``pd_transfer_failed`` / ``pd_bootstrap_failed`` / ``pd_aborted``) and ``server_transfer_failed`` /
    ``server_bootstrap_failed`` from the servers' counters (None when not scraped: SGLang counts
    failures a gateway retried to success too)."""
    skip = crash_turn_indexes(records, crash)
    assessed = [r for i, r in enumerate(records) if i not in skip]
    n = len(assessed)
    by_class = {c: 0 for c in C.CLASSES}
    examples: dict[str, dict] = {}
    for r in assessed:
        if r["class"] != C.OK:
            by_class[r["class"]] += 1
            if r["class"] not in examples:
                examples[r["class"]] = example(r)
    examples = {c: examples[c] for c in C.CLASSES if c in examples}
    bad = sum(by_class.values())
    lo, hi = wilson(bad, n)
    per_class = {c: {"count": k, "rate": round(k / n, 6) if n else None,
                     "wilson95": [round(x, 6) for x in wilson(k, n)]} for c, k in by_class.items()}
    ttft = [r["ttft_s"] for r in records if r["class"] == C.OK and r.get("ttft_s") is not None]
    e2e = [r["e2e_s"] for r in records if r["class"] == C.OK and r.get("e2e_s") is not None]
    tokens = sum(r.get("completion_tokens") or 0 for r in records)
    total = len(records)
    per_min = (lambda k: round(60.0 * k / duration_s, 3)) if duration_s > 0 else (lambda k: None)
    server = metrics or {}
    pd = {"transfer_failed": per_min(by_class[C.PD_TRANSFER]), "bootstrap_failed": per_min(by_class[C.PD_BOOTSTRAP]),
          "aborted": per_min(by_class[C.PD_ABORTED]),
          "server_transfer_failed": per_min(server["sglang:num_transfer_failed_reqs_total"])
          if "sglang:num_transfer_failed_reqs_total" in server else None,
          "server_bootstrap_failed": per_min(server["sglang:num_bootstrap_failed_reqs_total"])
          if "sglang:num_bootstrap_failed_reqs_total" in server else None}
    return {
        "url": url, "concurrency": concurrency, "turns": total, "corrupted": bad,
        "rate": round(bad / n, 6) if n else None, "wilson95": [round(lo, 6), round(hi, 6)],
        "pass": crash is None and hi <= max_corruption + 1e-12, "stuck": by_class[C.STUCK], "classes": per_class,
        "streaming_turns": sum(1 for r in records if r.get("stream")),
        "duration_s": round(duration_s, 3),
        "requests_per_s": round(total / duration_s, 3) if duration_s > 0 else None,
        "client_cpu_ms_per_request": round(1e3 * client_cpu_s / total, 3) if client_cpu_s is not None and total else None,
        "output_tokens_per_s": round(tokens / duration_s, 1) if duration_s > 0 else None,
        "ttft_s": _pcts(ttft), "itl_s": _pcts(itl_gaps), "e2e_s": _pcts(e2e),
        "metrics": metrics, "gateway": gateway, "pd_failures_per_min": pd,
        "crashed": crash is not None, "crash_reason": crash["reason"] if crash else None,
        "crash_started_at": crash["started_at"] if crash else None,
        "crash_turn": crash["turn"] if crash else None, "crash_rid": crash["rid"] if crash else None,
        "crash_turns": len(skip), "examples": examples,
    }


def compare_levels(a: dict, b: dict, alpha: float = 0.05) -> dict:
    """A/B at one concurrency: rates, difference A−B with Newcombe's 95 % interval, Fisher exact
    two-sided p, and ``significant`` = p < alpha. Over the assessed turns (``turns − crash_turns``;
    the caller makes no comparison for a crashed level)."""
    na, nb = a["turns"] - a.get("crash_turns", 0), b["turns"] - b.get("crash_turns", 0)
    d, lo, hi = newcombe_diff(a["corrupted"], na, b["corrupted"], nb)
    p = fisher_exact(a["corrupted"], na, b["corrupted"], nb)
    return {"concurrency": a["concurrency"], "url_a": a["url"], "url_b": b["url"], "rate_a": a["rate"],
            "rate_b": b["rate"], "difference": round(d, 6), "difference_ci95": [round(lo, 6), round(hi, 6)],
            "fisher_p": p, "significant": p < alpha}


def build_doc(levels: Sequence[dict], *, max_corruption: float, settings: dict,
              comparisons: Sequence[dict] = (), not_run: Sequence[int] = ()) -> dict:
    """The ``dsv4ctl.check.load/1`` document; ``pass`` = no level crashed and every level passes
    the gate. ``crash`` = None, or the first crashed level's {url, concurrency, reason, started_at
    (Unix s), turn, rid}; ``not_run`` = the concurrency levels skipped because the ramp stopped
    there (ascending as given)."""
    crashed = [lv for lv in levels if lv.get("crashed")]
    crash = None
    if crashed:
        c = crashed[0]
        crash = {"url": c["url"], "concurrency": c["concurrency"], "reason": c["crash_reason"],
                 "started_at": c["crash_started_at"], "turn": c["crash_turn"], "rid": c["crash_rid"]}
    return {"schema": SCHEMA, "max_corruption": max_corruption, "settings": settings,
            "pass": crash is None and all(lv["pass"] for lv in levels), "levels": list(levels),
            "comparisons": list(comparisons), "crash": crash, "not_run": list(not_run)}


def crash_lines(doc: dict) -> list[str]:
    """Human lines about a crash (empty without one): ``crashed at concurrency N (url): reason``,
    where it started, and the levels not run."""
    c = doc.get("crash")
    if not c:
        return []
    import datetime
    when = datetime.datetime.fromtimestamp(c["started_at"], datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") \
        if c.get("started_at") is not None else "?"
    out = [f"crashed at concurrency {c['concurrency']} ({c['url']}): {c['reason']}",
           f"  from turn {c['turn']} of the level (rid {c['rid']}) at {when}; "
           "crash turns are errors, not in the corruption rate"]
    if doc.get("not_run"):
        out.append("  ramp stopped: level(s) not run: " + ", ".join(str(x) for x in doc["not_run"]))
    return out


def _short(text: Optional[str], n: int = 80) -> str:
    if not text:
        return "-"
    from ..render import clip
    return clip(" ".join(str(text).split()), n)


def _example_cells(ex: dict) -> tuple[str, str]:
    """(expected, got) of an example as short text."""
    e, g = ex["expected"], ex["got"]
    exp = (f"tool {e['tool']}" if e.get("requires_tool") else "an answer, no tool call") \
        + (f", expected_calls {_short(json.dumps(e['expected_calls'], ensure_ascii=False), 80)}"
           if "expected_calls" in e else "")
    calls = ", ".join(f"{c.get('name')}({_short(c.get('arguments'), 40)})" for c in g["tool_calls"]) or "none"
    got = (f"HTTP {g['http_status'] if g['http_status'] is not None else '-'}, finish_reason "
           f"{g['finish_reason'] or '-'}, tool calls {calls}, content {_short(g['content_excerpt'], 60)}")
    return exp, got


def example_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    """One row per (level, class seen): count, the example's rid, response_id, what was expected
    and what came back (shortened; the JSON document has it whole)."""
    headers = ["url", "conc", "class", "count", "rid", "response_id", "expected", "got", "reason"]
    rows = []
    for lv in doc["levels"]:
        for cls, ex in (lv.get("examples") or {}).items():
            exp, got = _example_cells(ex)
            rows.append([lv["url"], str(lv["concurrency"]), cls, str(lv["classes"][cls]["count"]),
                         str(ex["rid"]), str(ex["response_id"] or "-"), exp, got, _short(ex["reason"], 100)])
    return headers, rows


def example_lines(doc: dict) -> list[str]:
    """:func:`example_rows` as indented lines for a terminal (request ids are never cut)."""
    out = []
    for lv in doc["levels"]:
        for cls, ex in (lv.get("examples") or {}).items():
            exp, got = _example_cells(ex)
            out += [f"{lv['url']} c={lv['concurrency']} {cls} ({lv['classes'][cls]['count']} turns): "
                    f"rid {ex['rid']}, response_id {ex['response_id'] or '-'}",
                    f"    expected: {exp}", f"    got: {got}", f"    reason: {_short(ex['reason'], 160)}"]
    return out


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
                     "CRASHED" if lv.get("crashed") else "pass" if lv["pass"] else "FAIL", str(lv["stuck"]),
                     f"{top[0]} ({top[1]})" if top[1] else "-", f"{lv['requests_per_s']}",
                     f"{fmt_ms(lv['ttft_s']['p50'])} / {fmt_ms(lv['ttft_s']['p99'])}",
                     f"{fmt_ms(lv['itl_s']['p50'])} / {fmt_ms(lv['itl_s']['p99'])}",
                     f"{fmt_ms(lv['e2e_s']['p50'])} / {fmt_ms(lv['e2e_s']['p99'])}"])
    return headers, rows


def class_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    """Per-class counts, one column per level (only classes seen anywhere; a document written
    before a class existed has no entry for it: 0 there)."""
    none = {"count": 0, "rate": None}
    seen = [c for c in C.CLASSES if any(lv["classes"].get(c, none)["count"] for lv in doc["levels"])]
    headers = ["class"] + [f"{lv['url']} c={lv['concurrency']}" for lv in doc["levels"]]
    rows = [[f"{c} ({C.DESCRIPTIONS[c]})"] + [f"{lv['classes'].get(c, none)['count']} "
                                               f"({fmt_pct(lv['classes'].get(c, none)['rate'])})"
                                               for lv in doc["levels"]] for c in seen]
    return headers, rows


def gateway_lines(doc: dict) -> list[str]:
    """One line per level whose gateway metrics were scraped: retries (hidden from the corruption
    rate), retries exhausted, circuit-breaker failures and open breakers; first, with a profile,
    whose gateway metrics were scraped (``settings.gateway_scope``)."""
    scope = (doc.get("settings") or {}).get("gateway_scope")
    out = [scope] if scope else []
    for lv in doc["levels"]:
        g = lv.get("gateway")
        if not g:
            continue
        by = ", ".join(f"{t} {n}" for t, n in sorted(g["retries_by_worker_type"].items()))
        out.append(f"gateway at {lv['url']} c={lv['concurrency']}: {g['retries']} request(s) retried by the gateway"
                   + (f" ({by})" if by else "")
                   + (" - failures the corruption rate does not count" if g["retries"] else "")
                   + f"; {g['retries_exhausted']} retries exhausted; {g['circuit_breaker_failures']} circuit-breaker "
                   f"failure(s)" + (f"; open: {', '.join(g['circuit_breakers_open'])}" if g["circuit_breakers_open"] else ""))
    return out


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
