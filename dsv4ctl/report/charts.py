"""The report's charts, one pure builder per chart: a dsv4ctl JSON document in, an SVG string
out. Sizes are CSS pixels; every chart is 960 wide and as tall as its content.

Each ``<svg>`` has a ``<title>`` naming the chart and ``class="chart"``; legend labels have
``class="legend"`` (the browser test finds both)."""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

from . import svg as S
from .memory import COLOURS, LABELS, SEGMENTS, plan_bars
from .svg import Svg, esc, fmt_tick, nice_ticks

WIDTH = 960


def _pct(x: Optional[float], digits: int = 2) -> str:
    return "-" if x is None else f"{x * 100:.{digits}f} %"


def _y_axis(s: Svg, x0: float, y0: float, w: float, h: float, ymax: float, label: str,
            fmt: Callable[[float], str] = fmt_tick) -> Callable[[float], float]:
    """Grid lines, tick labels and the axis title of a value axis from 0 to ``ymax`` drawn in
    the box (x0, y0, w, h); returns value -> y."""
    ticks = nice_ticks(ymax)
    top = ticks[-1] or 1.0

    def y(v: float) -> float:
        return y0 + h - h * max(0.0, v) / top

    for t in ticks:
        s.line(x0, y(t), x0 + w, y(t), S.GRID)
        s.text(x0 - 6, y(t) + 4, fmt(t), size=11, anchor="end", fill=S.AXIS)
    s.line(x0, y0, x0, y0 + h, S.AXIS)
    s.line(x0, y0 + h, x0 + w, y0 + h, S.AXIS)
    s.text(x0 - 48, y0 + h / 2, label, size=12, anchor="middle", fill=S.AXIS, rotate=-90)
    return y


# -- plan: per-rank memory ------------------------------------------------------------------

def plan_memory_svg(doc: dict) -> str:
    """Stacked bar of GiB per group and set of identical ranks of a ``dsv4ctl.plan/2`` document
    against the GPU's memory: weights, pools, index-K as budgeted and over budget (hatched red),
    req_to_token, SGLang's activation reserve and the rest of the headroom; requests at the
    context length written on each bar; a bracket under it where SGLang's reserve should be,
    red where the headroom lacks it. An empty string when no group has ranks."""
    bars = plan_bars(doc)
    if not bars:
        return ""
    x0, x1 = 190, WIDTH - 30
    gpu = max((b.gpu_gib or 0.0) for b in bars)
    xmax = max([gpu] + [b.total_gib for b in bars])
    ticks = nice_ticks(xmax, 8)
    top = max(ticks[-1], xmax)
    row_h, bar_h, y_top = 92, 30, 66
    height = y_top + row_h * len(bars) + 30 + 70
    s = Svg(WIDTH, height, f"GPU memory per rank: {doc.get('profile', '')} ({doc.get('model', '')})")
    over_fill = s.hatch("over", COLOURS["index_k_over"])

    def x(v: float) -> float:
        return x0 + (x1 - x0) * v / top

    s.text(10, 22, f"GPU memory per rank, GiB — {doc.get('profile', '')} · {doc.get('model', '')} · "
                   f"SGLang {doc.get('sglang_version', '')}", size=15, weight="bold")
    s.text(10, 40, "as SGLang 0.5.23 allocates it; index-K over what SGLang budgeted in red", size=12, fill=S.AXIS)
    axis_y = y_top + row_h * len(bars) + 4
    for t in ticks:
        s.line(x(t), y_top - 4, x(t), axis_y, S.GRID)
        s.text(x(t), axis_y + 16, fmt_tick(t), size=11, anchor="middle", fill=S.AXIS)
    s.line(x0, axis_y, x1, axis_y, S.AXIS)
    s.text((x0 + x1) / 2, axis_y + 32, "GiB", size=12, anchor="middle", fill=S.AXIS)
    for i, b in enumerate(bars):
        top_y = y_top + row_h * i + 18
        s.text(x0 - 10, top_y + bar_h / 2 + 5, b.title, size=13, anchor="end", weight="bold")
        cum = 0.0
        for key, v in b.segments:
            if v <= 0:
                continue
            fill = over_fill if key == "index_k_over" else COLOURS[key]
            stroke = "#9ab89a" if key == "headroom_free" else None
            s.rect(x(cum), top_y, x(cum + v) - x(cum), bar_h, fill, stroke=stroke,
                   title=f"{b.title}: {LABELS[key]} {v:.3f} GiB")
            wpx = x(cum + v) - x(cum)
            if key != "index_k_over" and wpx > 36:
                dark = key in ("weights", "swa_latent", "c128_latent", "index_k_budget", "req_to_token", "states")
                s.text(x(cum) + wpx / 2, top_y + bar_h / 2 + 4, f"{v:.1f}", size=11, anchor="middle",
                       fill="white" if dark else S.TEXT)
            if key == "index_k_over":
                s.text(x(cum) + wpx / 2, top_y - 5, f"+{v:.2f} GiB over budget", size=11, anchor="middle",
                       fill=S.WARN, weight="bold")
            cum += v
        if b.gpu_gib:
            s.line(x(b.gpu_gib), top_y - 14, x(b.gpu_gib), top_y + bar_h + 4, S.TEXT, 2)
        # requests at context, written on the bar's right end (inside the axis)
        req = f"{b.requests:,} requests @ {b.context_length:,} tokens"
        s.text(x0 + 4, top_y - 5, req, size=12, weight="bold")
        # where SGLang's activation reserve should be: the last reserve GiB of the GPU
        if b.reserve_gib and b.gpu_gib:
            by = top_y + bar_h + 12
            ra, rb = x(b.gpu_gib - b.reserve_gib), x(b.gpu_gib)
            s.line(ra, by, rb, by, S.AXIS, 2)
            s.line(ra, by - 4, ra, by + 4, S.AXIS, 2)
            s.line(rb, by - 4, rb, by + 4, S.AXIS, 2)
            note = f"activation reserve {b.reserve_gib:.1f} GiB · headroom {b.headroom_gib:.3f} GiB"
            if b.reserve_short_gib > 0:
                s.line(ra, by, x(b.gpu_gib - max(0.0, b.headroom_gib)), by, S.WARN, 4)
                note += f" · {b.reserve_short_gib:.3f} GiB short"
            if b.headroom_gib < 0:
                note += f" · the pools run {-b.headroom_gib:.3f} GiB past the GPU"
            s.text(ra - 6, by + 4, note, size=11, anchor="end",
                   fill=S.WARN if b.reserve_short_gib > 0 else S.AXIS)
    if gpu:
        s.line(x(gpu), y_top - 8, x(gpu), axis_y, S.TEXT, 1, dash="2 3")
        s.text(x(gpu) - 4, y_top - 8, f"GPU {gpu:.2f} GiB", size=11, anchor="end", fill=S.TEXT, weight="bold")
    used = {k for b in bars for k, v in b.segments if v > 0}
    items = [(over_fill if k == "index_k_over" else COLOURS[k], LABELS[k]) for k, *_ in SEGMENTS if k in used]
    s.legend(10, axis_y + 56, items, WIDTH - 20)
    return str(s)


# -- load: corruption per level -------------------------------------------------------------

def _urls(doc: dict) -> list[str]:
    urls = list((doc.get("settings") or {}).get("urls") or [])
    for lv in doc["levels"]:
        if lv["url"] not in urls:
            urls.append(lv["url"])
    return urls


def _arm_names(urls: Sequence[str]) -> list[str]:
    """``A: url``, ``B: url`` for the two arms of a ``--compare``; the URLs as they are otherwise."""
    return [f"{'AB'[i]}: {u}" for i, u in enumerate(urls)] if len(urls) == 2 else list(urls)


def _levels(doc: dict) -> list[int]:
    out: list[int] = []
    for c in list((doc.get("settings") or {}).get("concurrency") or []) + [lv["concurrency"] for lv in doc["levels"]]:
        if c not in out:
            out.append(c)
    return out


def load_rate_svg(doc: dict) -> str:
    """Corruption rate per concurrency level of a ``dsv4ctl.check.load/1`` document: one point
    per URL and level with its 95 % Wilson interval, ``k/n`` written above, the gate as a dashed
    red line; levels not run (after a crash) are labelled so. Both arms of a ``--compare`` on
    one chart."""
    urls, levels = _urls(doc), _levels(doc)
    names = _arm_names(urls)
    by = {(lv["url"], lv["concurrency"]): lv for lv in doc["levels"]}
    gate = doc.get("max_corruption") or 0.0
    rated = [lv for lv in doc["levels"] if lv.get("rate") is not None]     # a crashed level may have none
    ymax = max([gate * 1.25] + [lv["wilson95"][1] for lv in rated]) * 1.12 or 0.01
    x0, y0, w, h = 80, 64, WIDTH - 120, 260
    s = Svg(WIDTH, y0 + h + 90, "Corruption rate per concurrency level")
    s.text(10, 22, "Corruption rate per concurrency level (95 % Wilson interval, k/n corrupted)", size=15, weight="bold")
    s.text(10, 40, f"gate: upper bound <= {_pct(gate)} · {'pass' if doc.get('pass') else 'FAIL'}",
           size=12, fill=S.OK if doc.get("pass") else S.WARN, weight="bold")
    y = _y_axis(s, x0, y0, w, h, ymax * 100, "corrupted turns, %")

    def yv(rate: float) -> float:
        return y(rate * 100)

    slot = w / max(1, len(levels))
    arms = len(urls)
    for j, c in enumerate(levels):
        cx = x0 + slot * (j + 0.5)
        s.text(cx, y0 + h + 18, f"{c:,}", size=12, anchor="middle")
        if c in (doc.get("not_run") or []):
            s.text(cx, y0 + h - 8, "not run", size=11, anchor="middle", fill=S.WARN)
    s.text(x0 + w / 2, y0 + h + 38, "concurrent sessions", size=12, anchor="middle", fill=S.AXIS)
    if gate:
        s.line(x0, yv(gate), x0 + w, yv(gate), S.WARN, 2, dash="7 5")
        s.text(x0 + w - 4, yv(gate) - 6, f"gate {_pct(gate)}", size=12, anchor="end", fill=S.WARN, weight="bold")
    for i, u in enumerate(urls):
        col = S.SERIES[i % len(S.SERIES)]
        off = (i - (arms - 1) / 2) * min(44, slot / (arms + 1))
        pts = []
        for j, c in enumerate(levels):
            lv = by.get((u, c))
            if lv is None:
                continue
            cx = x0 + slot * (j + 0.5) + off
            if lv.get("rate") is None:      # every turn of the level was the crash: nothing to rate
                s.text(cx, y0 + h - 8, "crashed", size=11, anchor="middle", fill=S.WARN, weight="bold")
                continue
            lo, hi = lv["wilson95"]
            s.line(cx, yv(lo), cx, yv(hi), col, 2)
            s.line(cx - 5, yv(lo), cx + 5, yv(lo), col, 2)
            s.line(cx - 5, yv(hi), cx + 5, yv(hi), col, 2)
            pts.append((cx, yv(lv["rate"])))
            tip = (f"{names[i]} c={c}: {lv['corrupted']}/{lv['turns']} = {_pct(lv['rate'])}, "
                   f"95 % Wilson {_pct(lo)} .. {_pct(hi)}")
            s.circle(cx, yv(lv["rate"]), 5, col, title=tip)
            s.text(cx, yv(hi) - 8, f"{lv['corrupted']}/{lv['turns']}", size=11, anchor="middle", fill=col)
            if lv.get("crashed"):
                s.text(cx, yv(hi) - 22, "crashed", size=11, anchor="middle", fill=S.WARN, weight="bold")
        if len(pts) > 1:
            s.polyline(pts, col, 1.5, dash="3 3")
    items = [(S.SERIES[i % len(S.SERIES)], n) for i, n in enumerate(names)]
    items += [(S.WARN, f"gate {_pct(gate)}")] if gate else []
    s.legend(10, y0 + h + 66, items, WIDTH - 20)
    return str(s)


def load_diff_svg(doc: dict) -> str:
    """For a ``--compare`` document: the difference of corruption rates A − B per level with
    Newcombe's 95 % interval, the zero line, and Fisher's p. Empty string without comparisons."""
    cmps = doc.get("comparisons") or []
    if not cmps:
        return ""
    lo_v = min([0.0] + [c["difference_ci95"][0] for c in cmps])
    hi_v = max([0.0] + [c["difference_ci95"][1] for c in cmps])
    span = (hi_v - lo_v) or 0.01
    lo_v, hi_v = lo_v - 0.1 * span, hi_v + 0.15 * span
    x0, y0, w, h = 80, 60, WIDTH - 120, 200
    s = Svg(WIDTH, y0 + h + 70, "Difference of corruption rates A - B per level")
    s.text(10, 22, "A − B: difference of corruption rates per level (95 % Newcombe interval; Fisher's p)", size=15,
           weight="bold")
    s.text(10, 40, f"A: {cmps[0]['url_a']} · B: {cmps[0]['url_b']}", size=12, fill=S.AXIS)

    def y(v: float) -> float:
        return y0 + h - h * (v - lo_v) / (hi_v - lo_v)

    step = nice_ticks(hi_v - lo_v, 5)
    st = step[1] if len(step) > 1 else 0.01
    t = st * math.floor(lo_v / st)
    while t <= hi_v:
        s.line(x0, y(t), x0 + w, y(t), S.GRID)
        s.text(x0 - 6, y(t) + 4, f"{t * 100:+.3g}", size=11, anchor="end", fill=S.AXIS)
        t += st
    s.line(x0, y(0), x0 + w, y(0), S.TEXT, 1.5)
    s.line(x0, y0, x0, y0 + h, S.AXIS)
    s.text(x0 - 48, y0 + h / 2, "A − B, percentage points", size=12, anchor="middle", fill=S.AXIS, rotate=-90)
    slot = w / len(cmps)
    for j, c in enumerate(cmps):
        cx = x0 + slot * (j + 0.5)
        lo, hi = c["difference_ci95"]
        col = S.WARN if c.get("significant") else S.SERIES[0]
        s.line(cx, y(lo), cx, y(hi), col, 2)
        s.line(cx - 6, y(lo), cx + 6, y(lo), col, 2)
        s.line(cx - 6, y(hi), cx + 6, y(hi), col, 2)
        s.circle(cx, y(c["difference"]), 5, col,
                 title=f"c={c['concurrency']}: {c['difference'] * 100:+.2f} pp [{lo * 100:+.2f}, {hi * 100:+.2f}], p={c['fisher_p']:.3g}")
        s.text(cx + 14, y(c["difference"]) + 4, f"{c['difference'] * 100:+.2f} pp  p={c['fisher_p']:.2g}", size=11,
               fill=col)
        s.text(cx, y0 + h + 18, f"{c['concurrency']:,}", size=12, anchor="middle")
    s.text(x0 + w / 2, y0 + h + 36, "concurrent sessions", size=12, anchor="middle", fill=S.AXIS)
    s.legend(10, y0 + h + 58, [(S.WARN, "significant (p < 0.05)"), (S.SERIES[0], "not significant")], WIDTH - 20)
    return str(s)


def load_classes_svg(doc: dict) -> str:
    """Stacked counts of corrupted turns per class, one bar per URL and level of a
    ``dsv4ctl.check.load/1`` document (the ``ok`` class is not drawn; ``n`` under each bar)."""
    urls, levels = _urls(doc), _levels(doc)
    by = {(lv["url"], lv["concurrency"]): lv for lv in doc["levels"]}
    classes: list[str] = []
    for lv in doc["levels"]:
        for k, v in lv["classes"].items():
            if v["count"] and k not in classes:
                classes.append(k)
    colour = {k: S.SERIES[(i + 2) % len(S.SERIES)] for i, k in enumerate(classes)}
    ymax = max([1] + [lv["corrupted"] for lv in doc["levels"]]) * 1.1
    x0, y0, w, h = 80, 48, WIDTH - 120, 220
    s = Svg(WIDTH, y0 + h + 110, "Corrupted turns per class and level")
    s.text(10, 22, "Corrupted turns per class and level (stacked counts)", size=15, weight="bold")
    y = _y_axis(s, x0, y0, w, h, ymax, "corrupted turns")
    names = _arm_names(urls)
    slot = w / max(1, len(levels))
    bw = min(46, slot / (len(urls) + 1))
    for j, c in enumerate(levels):
        for i, u in enumerate(urls):
            lv = by.get((u, c))
            bx = x0 + slot * (j + 0.5) + (i - len(urls) / 2) * (bw + 4) + 2
            if lv is None:
                continue
            cum = 0
            for k in classes:
                n = lv["classes"].get(k, {}).get("count", 0)
                if n:
                    s.rect(bx, y(cum + n), bw, y(cum) - y(cum + n), colour[k],
                           title=f"{names[i]} c={c}: {k} {n}")
                    cum += n
            s.text(bx + bw / 2, y(cum) - 4, str(cum), size=11, anchor="middle")
            if len(urls) > 1:
                s.text(bx + bw / 2, y0 + h + 14, "AB"[i] if len(urls) == 2 else str(i + 1), size=11,
                       anchor="middle", fill=S.AXIS)
        s.text(x0 + slot * (j + 0.5), y0 + h + (30 if len(urls) > 1 else 18), f"{c:,}", size=12, anchor="middle")
    if not classes:
        s.text(x0 + w / 2, y0 + h / 2, "no corrupted turns", size=14, anchor="middle", fill=S.OK)
    s.text(x0 + w / 2, y0 + h + 48, "concurrent sessions", size=12, anchor="middle", fill=S.AXIS)
    s.legend(10, y0 + h + 74, [(colour[k], k) for k in classes], WIDTH - 20)
    return str(s)


def load_latency_svg(doc: dict) -> str:
    """TTFT, ITL and end-to-end latency percentiles (p50, p90, p99, ms) per level of a
    ``dsv4ctl.check.load/1`` document: three panels, one line per percentile and URL (B
    dashed)."""
    urls, levels = _urls(doc), _levels(doc)
    by = {(lv["url"], lv["concurrency"]): lv for lv in doc["levels"]}
    metrics = (("ttft_s", "time to first token"), ("itl_s", "inter-token latency"), ("e2e_s", "end to end"))
    pcts = ("p50", "p90", "p99")
    pcol = {"p50": S.SERIES[0], "p90": S.SERIES[1], "p99": S.SERIES[3]}
    pw, ph, y0, gap = (WIDTH - 60) / 3 - 60, 200, 60, 60
    s = Svg(WIDTH, y0 + ph + 100, "Latency percentiles per level")
    s.text(10, 22, "Latency per level: p50 / p90 / p99, milliseconds", size=15, weight="bold")
    for m, (key, title) in enumerate(metrics):
        x0 = 60 + m * (pw + gap + 20)
        vals = [(lv.get(key) or {}).get(p) for lv in doc["levels"] for p in pcts]
        vmax = max([v * 1000 for v in vals if v is not None] + [0.001]) * 1.1
        s.text(x0 + pw / 2, y0 - 10, title, size=13, anchor="middle", weight="bold")
        y = _y_axis(s, x0, y0, pw, ph, vmax, "ms" if m == 0 else "")
        slot = pw / max(1, len(levels))
        for j, c in enumerate(levels):
            s.text(x0 + slot * (j + 0.5), y0 + ph + 16, f"{c:,}", size=11, anchor="middle")
        for i, u in enumerate(urls):
            for p in pcts:
                pts = []
                for j, c in enumerate(levels):
                    v = ((by.get((u, c)) or {}).get(key) or {}).get(p)
                    if v is not None:
                        pts.append((x0 + slot * (j + 0.5), y(v * 1000)))
                        s.circle(pts[-1][0], pts[-1][1], 3, pcol[p], title=f"{u} c={c} {title} {p}: {v * 1000:.1f} ms")
                if len(pts) > 1:
                    s.polyline(pts, pcol[p], 2, dash="6 4" if i == 1 else None)
        s.text(x0 + pw / 2, y0 + ph + 34, "concurrent sessions", size=11, anchor="middle", fill=S.AXIS)
    items = [(pcol[p], p) for p in pcts]
    if len(urls) == 2:
        items += [("#ffffff", "solid: A, dashed: B")]
    s.legend(10, y0 + ph + 70, items, WIDTH - 20)
    return str(s)


# -- smoke ------------------------------------------------------------------------------------

def smoke_svg(doc: dict) -> str:
    """One tile per check of a ``dsv4ctl.check.smoke/1`` document, coloured by status (pass
    green, fail red, skip amber), check name and target written in it."""
    checks = doc.get("checks") or []
    cols, tw, th = 4, (WIDTH - 20 - 3 * 8) / 4, 52
    rows = (len(checks) + cols - 1) // cols
    s = Svg(WIDTH, 50 + rows * (th + 8) + 40, "Smoke checks")
    n_fail = sum(1 for c in checks if c["status"] == "fail")
    s.text(10, 22, f"Smoke checks of {doc.get('entry', '')}: {len(checks) - n_fail}/{len(checks)} not failed",
           size=15, weight="bold")
    fill = {"pass": "#dff0d8", "fail": "#f8d7da", "skip": "#fff3cd"}
    edge = {"pass": S.OK, "fail": S.WARN, "skip": S.SKIP}
    for i, c in enumerate(checks):
        x, y = 10 + (i % cols) * (tw + 8), 40 + (i // cols) * (th + 8)
        st = c["status"] if c["status"] in fill else "skip"
        s.rect(x, y, tw, th, fill[st], stroke=edge[st], title=f"{c['check']} {c['target']}: {c['status']} {c['reason']}")
        s.text(x + 8, y + 20, f"{c['check']} · {c['status']}", size=13, weight="bold", fill=edge[st])
        reason = str(c.get("reason") or "")
        s.text(x + 8, y + 40, reason if len(reason) <= 34 else reason[:33] + "…", size=11)
    s.legend(10, 40 + rows * (th + 8) + 24, [(fill[k], k) for k in ("pass", "fail", "skip")], WIDTH - 20)
    return str(s)


# -- incident timeline ------------------------------------------------------------------------

STATUS_COLOURS = {"ran": S.OK, "failed": S.WARN, "skipped": "#bbbbbb", "declined": S.SKIP, "dry-run": S.SERIES[0]}


def incident_svg(doc: dict, short: Callable[[dict], str] = lambda r: "") -> str:
    """The timeline of a ``dsv4ctl.incident/1`` runbook run: one row per step event, a bar from
    its start to its end (seconds since the first step; at least 3 px wide), coloured by status
    (ran, failed, skipped, declined, dry-run), with the step, action and ``short(result)``."""
    tl = doc.get("timeline") or []
    t0 = min([e["started"] for e in tl] or [0.0])
    t1 = max([e["ended"] for e in tl] or [1.0])
    span = max(t1 - t0, 1e-3)
    x0, x1, row, y0 = 250, WIDTH - 30, 30, 60
    s = Svg(WIDTH, y0 + row * len(tl) + 90, f"Runbook timeline: {doc.get('playbook', '')}")
    done = "completed" if doc.get("completed") else f"stopped at {doc.get('failed_step') or 'a declined step'}"
    s.text(10, 22, f"Runbook {doc.get('playbook', '')} · run {doc.get('run_id', '')} · {done}", size=15, weight="bold")
    s.text(10, 40, f"who: {doc.get('who', '')} · profile: {doc.get('profile', '')}" + (" · dry run" if doc.get("dry_run") else ""),
           size=12, fill=S.AXIS)
    ticks = nice_ticks(span, 6)

    def x(t: float) -> float:
        return x0 + (x1 - x0) * t / (ticks[-1] or 1)

    bottom = y0 + row * len(tl)
    for t in ticks:
        s.line(x(t), y0 - 6, x(t), bottom, S.GRID)
        s.text(x(t), bottom + 16, fmt_tick(t), size=11, anchor="middle", fill=S.AXIS)
    s.text((x0 + x1) / 2, bottom + 34, "seconds since the first step", size=12, anchor="middle", fill=S.AXIS)
    for i, e in enumerate(tl):
        y = y0 + row * i
        col = STATUS_COLOURS.get(e["status"], "#888888")
        label = f"{e['step']} ({e['action']})" + (f" try {e['attempt']}" if e.get("attempt", 1) > 1 else "")
        s.text(x0 - 8, y + 15, label, size=12, anchor="end")
        a, b = x(e["started"] - t0), x(e["ended"] - t0)
        s.rect(a, y + 4, max(3.0, b - a), row - 10, col,
               title=f"{e['step']}: {e['status']}, {e['ended'] - e['started']:.1f} s")
        detail = short(e.get("result") or {}) or "; ".join(e.get("lines") or [])
        txt = f"{e['status']} · {e['ended'] - e['started']:.1f} s" + (f" · {detail}" if detail else "")
        # the note goes where it has most room: right of the bar, inside it, or left of it
        room = {"right": x1 + 20 - max(a + 3, b) - 6, "inside": b - a - 12, "left": a - x0 - 12}
        where = max(room, key=lambda k: room[k] + (40 if k == "right" else 0))
        chars = max(8, int(room[where] / 6.2))
        txt = txt if len(txt) <= chars else txt[:chars - 1] + "…"
        if where == "right":
            s.text(max(a + 3, b) + 6, y + 15, txt, size=11)
        elif where == "inside":
            s.text(a + 6, y + 15, txt, size=11, fill="white")
        else:
            s.text(a - 6, y + 15, txt, size=11, anchor="end")
    used = [st for st in STATUS_COLOURS if any(e["status"] == st for e in tl)]
    s.legend(10, bottom + 62, [(STATUS_COLOURS[st], st) for st in used], WIDTH - 20)
    return str(s)


# -- plan vs log ------------------------------------------------------------------------------

def plan_log_svg(doc: dict) -> str:
    """Planned vs logged pool sizes per rank of a ``dsv4ctl.plan-log/1`` document: one panel per
    pool (full, swa, c4, c128, c4_state, c128_state as present), a pair of bars per rank
    (planned outlined, logged filled; red when they differ) with the difference in % above."""
    ranks = [r for r in doc.get("ranks") or [] if r.get("pools")]
    pools: list[str] = []
    for r in ranks:
        for p in r["pools"]:
            if p not in pools:
                pools.append(p)
    cols = 3
    pw, ph, gap = (WIDTH - 40) / cols - 70, 150, 70
    nrows = max(1, (len(pools) + cols - 1) // cols)
    s = Svg(WIDTH, 60 + nrows * (ph + 80) + 40, f"Planned vs logged pool sizes: group {doc.get('group', '')}")
    s.text(10, 22, f"Planned vs logged pool sizes per rank — group {doc.get('group', '')} · "
                   f"{'match' if doc.get('ok') else 'MISMATCH'}", size=15, weight="bold",
           fill=S.TEXT if doc.get("ok") else S.WARN)
    s.text(10, 40, f"log: {doc.get('log', '')}", size=12, fill=S.AXIS)
    for k, p in enumerate(pools):
        x0 = 70 + (k % cols) * (pw + gap)
        y0 = 70 + (k // cols) * (ph + 80)
        vals = [v for r in ranks if p in r["pools"] for v in (r["pools"][p]["planned"], r["pools"][p]["logged"])]
        vmax = max(vals + [1]) * 1.15
        s.text(x0 + pw / 2, y0 - 6, p, size=13, anchor="middle", weight="bold")
        y = _y_axis(s, x0, y0, pw, ph, vmax, "", fmt=lambda t: f"{t / 1e6:.3g}M" if t >= 1e6 else
                    (f"{t / 1e3:.3g}k" if t >= 1e3 else fmt_tick(t)))
        slot = pw / max(1, len(ranks))
        bw = min(18, slot / 3)
        for j, r in enumerate(ranks):
            d = r["pools"].get(p)
            cx = x0 + slot * (j + 0.5)
            s.text(cx, y0 + ph + 14, r["rank"], size=10, anchor="middle", fill=S.AXIS)
            if d is None:
                continue
            col = S.WARN if d["diff"] else S.OK
            s.rect(cx - bw - 1, y(d["planned"]), bw, y(0) - y(d["planned"]), "#ffffff", stroke=S.SERIES[0],
                   title=f"{r['rank']} {p} planned {d['planned']:,}")
            s.rect(cx + 1, y(d["logged"]), bw, y(0) - y(d["logged"]), col,
                   title=f"{r['rank']} {p} logged {d['logged']:,} ({d['diff']:+,})")
            if d["diff"]:
                s.text(cx, min(y(d["planned"]), y(d["logged"])) - 4, f"{d['pct']:+.1f}%", size=10, anchor="middle",
                       fill=S.WARN)
    s.legend(10, 60 + nrows * (ph + 80) + 16, [("#ffffff", "planned"), (S.OK, "logged, equal"),
                                                 (S.WARN, "logged, differs")], WIDTH - 20)
    return str(s)


__all__ = ["plan_memory_svg", "load_rate_svg", "load_diff_svg", "load_classes_svg", "load_latency_svg",
           "smoke_svg", "incident_svg", "plan_log_svg", "esc"]
