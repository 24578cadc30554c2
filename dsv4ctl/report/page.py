"""The report page: one self-contained HTML file (inline SVG and CSS, no script, no network)
with a header stating the inputs, versions and time, then one section per input: its charts
and, under each chart, a table of the same numbers. Pure: documents in, a string out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from . import charts as CH
from .memory import LABELS, SEGMENTS, plan_bars
from .svg import esc

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI','DejaVu Sans',Arial,sans-serif;margin:24px auto;max-width:1000px;padding:0 16px;color:#222}
h1{font-size:24px;margin:0 0 8px}h2{font-size:20px;margin:36px 0 8px;border-bottom:2px solid #ddd;padding-bottom:4px}
h3{font-size:16px;margin:20px 0 6px}
table{border-collapse:collapse;margin:8px 0 18px;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}
.meta td{border:none;padding:1px 12px 1px 0}.bad{color:#d62728;font-weight:bold}.good{color:#2ca02c;font-weight:bold}
svg.chart{display:block;margin:10px 0;max-width:100%;height:auto}
ul.notes li{margin:3px 0}
div.tw{overflow-x:auto;max-width:100%}
"""


#: What a document of the right schema but with missing or mistyped fields raises in a builder.
MALFORMED = (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError)


class BadDocument(ValueError):
    """An input whose schema is known but whose fields are not what that schema has (one line)."""


def _bad(name: str, doc: dict, e: Exception) -> BadDocument:
    what = f"field {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
    return BadDocument(f"{name}: not a well-formed {doc.get('schema')} document ({what})".splitlines()[0])


@dataclass
class Input:
    """One input of the report: its display ``name`` (the path given), the parsed ``doc``, its
    ``kind`` (see :data:`dsv4ctl.report.KINDS`), and for an incident the documents of the
    evidence files found next to it, [(file name, doc, kind)]."""

    name: str
    doc: dict
    kind: str
    evidence: list = field(default_factory=list)


def table(headers: Sequence[object], rows: Sequence[Sequence[object]], numeric: Sequence[int] = ()) -> str:
    """An HTML table; cells escaped; columns in ``numeric`` right-aligned."""
    num = set(numeric)
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="n">{esc(c)}</td>' if i in num else f"<td>{esc(c)}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f'<div class="tw"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _notes(items: Sequence[tuple[str, str]]) -> str:
    if not items:
        return ""
    return '<ul class="notes">' + "".join(
        f'<li><span class="{"bad" if k in ("error", "warning") else "good"}">{esc(k)}</span> {esc(m)}</li>'
        for k, m in items) + "</ul>"


# -- sections per kind ------------------------------------------------------------------------

def plan_section(doc: dict) -> str:
    """Chart and table of a ``dsv4ctl.plan/2`` document: GiB per segment and bar, headroom,
    reserve, requests at context; the plan's errors, fixes and warnings."""
    bars = plan_bars(doc)
    out = [CH.plan_memory_svg(doc)]
    if bars:
        rows = [[LABELS[k]] + [f"{b.value(k):.3f}" for b in bars] for k, *_ in SEGMENTS]
        rows.append(["sum of the segments"] + [f"{b.total_gib:.3f}" for b in bars])
        rows.append(["GPU memory"] + [f"{b.gpu_gib:.3f}" if b.gpu_gib else "-" for b in bars])
        rows.append(["headroom (after the real allocation)"] + [f"{b.headroom_gib:.3f}" for b in bars])
        rows.append(["SGLang's activation reserve"] + [f"{b.reserve_gib:.3f}" for b in bars])
        rows.append(["reserve the headroom lacks"] + [f"{b.reserve_short_gib:.3f}" for b in bars])
        rows.append(["requests @ context"] + [f"{b.requests:,} @ {b.context_length:,}" for b in bars])
        out.append(table(["GiB per rank"] + [b.title for b in bars], rows, numeric=range(1, len(bars) + 1)))
    notes = [(kind, f"{g['name']}: {m}") for g in doc["groups"]
             for kind, key in (("error", "errors"), ("fix", "fixes"), ("warning", "warnings")) for m in g[key]]
    out.append(_notes(notes))
    groups = [[g["name"], g["role"], f"tp{g['tp']} dp{g['dp']} pp{g['pp']}", g["mem_fraction_static"],
               g["mem_fraction_static_source"], g["ranks"][0]["index_k"]["dtype"] if g["ranks"] else "-",
               g["ranks"][0]["index_k"]["accounting"] if g["ranks"] else "-"] for g in doc["groups"]]
    out.append(table(["group", "role", "topology", "mem_fraction_static", "from", "index-K", "accounting"], groups))
    return "".join(out)


def _lat_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    headers = ["url", "conc"] + [f"{m} {p} ms" for m in ("TTFT", "ITL", "e2e") for p in ("p50", "p90", "p99")]
    rows = []
    for lv in doc["levels"]:
        cells = [lv["url"], str(lv["concurrency"])]
        for key in ("ttft_s", "itl_s", "e2e_s"):
            for p in ("p50", "p90", "p99"):
                v = (lv.get(key) or {}).get(p)
                cells.append("-" if v is None else f"{v * 1000:.1f}")
        rows.append(cells)
    return headers, rows


def load_section(doc: dict) -> str:
    """Charts and tables of a ``dsv4ctl.check.load/1`` document (one URL, a sweep or a
    ``--compare``): corruption rate with Wilson intervals and the gate, the A − B difference,
    classes, latency percentiles; the tables are check load's own."""
    from ..check import report as R
    out = [CH.load_rate_svg(doc), table(*R.level_rows(doc), numeric=(1, 2, 3, 7, 9))]
    diff = CH.load_diff_svg(doc)
    if diff:
        out += [diff, table(*R.compare_rows(doc))]
    out.append(CH.load_classes_svg(doc))
    h, rows = R.class_rows(doc)
    if rows:
        out.append(table(h, rows))
    out += [CH.load_latency_svg(doc), table(*_lat_rows(doc), numeric=range(2, 11))]
    notes = [("error", x) for x in R.crash_lines(doc)] + [("note", x) for x in R.gateway_lines(doc)]
    out.append(_notes(notes))
    return "".join(out)


def smoke_section(doc: dict) -> str:
    """Tiles and table of a ``dsv4ctl.check.smoke/1`` document."""
    rows = [[c["check"], c["target"], c["status"], c.get("reason", "")] for c in doc.get("checks") or []]
    return CH.smoke_svg(doc) + table(["check", "target", "status", "reason"], rows)


def plan_log_section(doc: dict) -> str:
    """Chart and table of a ``dsv4ctl.plan-log/1`` document (planned vs logged per rank and pool)."""
    rows = []
    for r in doc.get("ranks") or []:
        if "error" in r:
            rows.append([r["rank"], "-", "-", "-", "-", r["error"]])
        for p, d in (r.get("pools") or {}).items():
            rows.append([r["rank"], p, f"{d['planned']:,}", f"{d['logged']:,}", f"{d['diff']:+,}", f"{d['pct']:+.3f}"])
    return CH.plan_log_svg(doc) + table(["rank", "pool", "planned", "logged", "diff", "diff %"], rows,
                                        numeric=(2, 3, 4, 5))


def incident_section(inp: Input) -> str:
    """Timeline chart and table of a ``dsv4ctl.incident/1`` runbook run, then the charts of the
    checks and plans it ran (its evidence files, as found next to the incident.json)."""
    from ..runbook.report import _short, _ts
    doc = inp.doc
    rows = []
    for e in doc.get("timeline") or []:
        detail = _short(e["result"]) if e.get("result") else "; ".join(e.get("lines") or [])
        rows.append([_ts(e["started"]), e["step"], e["action"],
                     e["status"] + (f" (try {e['attempt']})" if e.get("attempt", 1) > 1 else ""),
                     f"{e['ended'] - e['started']:.1f}s", detail])
    out = [CH.incident_svg(doc, _short), table(["UTC", "step", "action", "status", "took", "result"], rows)]
    for name, edoc, kind in inp.evidence:
        out.append(f"<h3>evidence {esc(name)} ({esc(kind)})</h3>")
        try:
            out.append(SECTIONS[kind](edoc))
        except MALFORMED as e:      # one bad evidence file does not hide the run
            out.append(f'<p class="bad">{esc(_bad(name, edoc, e))}: not drawn</p>')
    return "".join(out)


SECTIONS = {"plan": plan_section, "load": load_section, "smoke": smoke_section, "plan-log": plan_log_section}
TITLES = {"plan": "Capacity plan", "load": "Load check", "smoke": "Smoke check", "incident": "Runbook run",
          "plan-log": "Plan vs server log"}


def plan_words(doc: dict) -> str:
    """The plan's verdict in the plan's own words (pure): the worst group's level, ``fits``,
    ``tight`` or ``FAILS``, with each group's (``tight: prefill indexer_logits, decode
    activation_floor``), never ``fits`` for a plan whose groups are tight."""
    groups = [g for g in doc.get("groups") or [] if isinstance(g, dict)]
    levels = [(g.get("name"), (g.get("verdict") or {}).get("level"), (g.get("verdict") or {}).get("deciding"))
              for g in groups]
    worst = next((lv for lv in ("fails", "tight") if any(x[1] == lv for x in levels)),
                 "fits" if doc.get("ok") else "fails")
    named = [f"{n} {d}" for n, lv, d in levels if lv == worst and n]
    return ("FAILS" if worst == "fails" else worst) + (f": {', '.join(named)}" if named and worst != "fits" else "")


def _facts(inp: Input) -> str:
    d = inp.doc
    if inp.kind == "plan":
        return f"profile {d.get('profile')}, model {d.get('model')}, SGLang {d.get('sglang_version')}, {plan_words(d)}"
    if inp.kind == "load":
        st = d.get("settings") or {}
        return (f"{', '.join(st.get('urls') or [])}; concurrency {st.get('concurrency')}; run {st.get('run_id', '-')}; "
                f"gate {'pass' if d.get('pass') else 'FAIL'}")
    if inp.kind == "smoke":
        return f"{d.get('entry')}: {'pass' if d.get('pass') else 'FAIL'}"
    if inp.kind == "incident":
        return f"runbook {d.get('playbook')}, run {d.get('run_id')}, {len(inp.evidence)} evidence file(s)"
    return f"group {d.get('group')}, log {d.get('log')}: {'match' if d.get('ok') else 'MISMATCH'}"


def _sglang_versions(inputs: Sequence[Input]) -> list[str]:
    out: list[str] = []
    docs = [i.doc for i in inputs] + [e[1] for i in inputs for e in i.evidence]
    for d in docs:
        v = d.get("sglang_version")
        for c in d.get("checks") or []:
            v = v or ((c.get("detail") or {}).get("version") if c.get("check") == "server_info" else None)
        if v and v not in out:
            out.append(str(v))
    return out


def build_html(inputs: Sequence[Input], *, generated: str, version: str, title: Optional[str] = None) -> str:
    """The whole report page for ``inputs`` (in the order given). ``generated`` is the UTC time
    written in the header (``2026-12-01T21:00:00Z``), ``version`` dsv4ctl's version.
    :class:`BadDocument` for an input with missing or mistyped fields."""
    title = title or "dsv4ctl report"
    sg = _sglang_versions(inputs)
    meta = [("generated", f"{generated} (UTC)"), ("dsv4ctl", version),
            ("SGLang", ", ".join(sg) if sg else "not stated by the inputs")]
    head = "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in meta)
    inputs_rows = [[i.name, i.kind, i.doc.get("schema", ""), _facts(i)] for i in inputs]
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{esc(title)}</title>"
             f"<style>{CSS}</style></head><body><h1>{esc(title)}</h1>",
             f'<table class="meta">{head}</table>', "<h3>inputs</h3>",
             table(["file", "kind", "schema", "what"], inputs_rows)]
    for n, inp in enumerate(inputs, 1):
        parts.append(f'<section id="input-{n}"><h2>{esc(TITLES[inp.kind])}: {esc(inp.name)}</h2>')
        try:
            parts.append(incident_section(inp) if inp.kind == "incident" else SECTIONS[inp.kind](inp.doc))
        except MALFORMED as e:
            raise _bad(inp.name, inp.doc, e) from None
        parts.append("</section>")
    parts.append("</body></html>\n")
    return "".join(parts)
