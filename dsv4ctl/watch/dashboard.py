"""The Grafana dashboard shipped with ``dsv4ctl watch`` (``dsv4ctl/data/watch/dashboard.json`` is
:func:`render_dashboard`; ``python scripts/gen_watch_rules.py`` rewrites it).

Pure, no I/O. Metric names come from :mod:`.metrics` and the recorded names from :mod:`.rules`
(the corruption panel reads the recorded ratios, so the rule file must be loaded in the
Prometheus the dashboard's ``datasource`` variable points at). Grafana 10/11 (``schemaVersion`` 39);
variables: ``datasource`` (any Prometheus data source) and ``target`` (multi-select, from the
targets the watch has probed).
"""

from __future__ import annotations

import json

from .metrics import (CORRUPTED, E2E, FAILED, PROBES, RELEASE, SCRAPE_UP, SGLANG_GENERATED, SGLANG_QUEUED,
                      SGLANG_RUNNING, SGLANG_TOKEN_USAGE, SGLANG_TRANSFER_FAILED, STUCK_NOW, TTFT)
from .rules import DEFAULT_SLO, KV_FULL, SLO_RECORD, ratio_record

UID = "dsv4ctl-watch"
SCHEMA_VERSION = 39
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = '{target=~"$target"}'
"""The label selector every panel query carries (the ``target`` variable; All is ``.*``)."""
RATE = "$__rate_interval"


def _q(expr: str, legend: str, ref: str, **extra) -> dict:
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "range": True, "refId": ref, **extra}


def _panel(pid: int, title: str, kind: str, grid: tuple[int, int, int, int], targets: list[dict],
           unit: str = "short", description: str = "", **extra) -> dict:
    x, y, w, h = grid
    p = {"id": pid, "type": kind, "title": title, "description": description, "datasource": DS,
         "gridPos": {"x": x, "y": y, "w": w, "h": h},
         "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}, "options": {}, "targets": targets}
    p.update(extra)
    return p


def _threshold_line(value: float, unit: str, **custom) -> dict:
    """fieldConfig of a time series drawn with a red threshold line at ``value``."""
    return {"defaults": {"unit": unit, "min": 0, "custom": {"thresholdsStyle": {"mode": "line"}, **custom},
                         "thresholds": {"mode": "absolute",
                                        "steps": [{"color": "green", "value": None}, {"color": "red", "value": value}]}},
            "overrides": []}


def dashboard() -> dict:
    """The dashboard as a dict (Grafana JSON model)."""
    def quantiles(hist: str) -> list[dict]:
        return [_q(f"histogram_quantile({q}, sum by (target, le) (rate({hist}_bucket{SEL}[{RATE}])))",
                   f"{{{{target}}}} p{int(q * 100)}", ref)
                for q, ref in ((0.5, "A"), (0.95, "B"))]

    panels = [
        _panel(1, "Tool-call corruption ratio", "timeseries", (0, 0, 12, 8), [
            _q(f"{ratio_record('5m')}{SEL}", "{{target}} {{release}} 5m", "A"),
            _q(f"{ratio_record('1h')}{SEL}", "{{target}} {{release}} 1h", "B"),
            _q(SLO_RECORD, "SLO", "C"),
        ], description="Fraction of known-answer probes judged corrupted (recorded by the dsv4ctl watch "
                       "rules), per target and release; the red line is the default SLO (check.max_corruption).",
            fieldConfig=_threshold_line(DEFAULT_SLO, "percentunit")),
        _panel(2, "Corrupted probes by class", "timeseries", (12, 0, 12, 8), [
            _q(f"sum by (target, class) (increase({CORRUPTED}{SEL}[{RATE}]))", "{{target}} {{class}}", "A"),
        ], description="Probes judged corrupted per classifier class (dsv4ctl check's classes).",
            fieldConfig={"defaults": {"unit": "short", "min": 0, "custom": {"drawStyle": "bars", "stacking": {"mode": "normal"}}},
                         "overrides": []}),
        _panel(3, "Probes judged and failed", "timeseries", (0, 8, 12, 8), [
            _q(f"sum by (target) (rate({PROBES}{SEL}[{RATE}]))", "{{target}} judged", "A"),
            _q(f"sum by (target, class) (rate({FAILED}{SEL}[{RATE}]))", "{{target}} {{class}}", "B"),
        ], unit="reqps", description="Probe rate per target and the probes without a judged answer (http_error, pd_transfer_failed, pd_bootstrap_failed, pd_aborted, stuck, auth_refused, client_error)."),
        _panel(4, "Stuck probes", "timeseries", (12, 8, 12, 8), [
            _q(f"{STUCK_NOW}{SEL}", "{{target}}", "A"),
        ], description="Probes in flight for longer than the stall timeout right now.",
            fieldConfig=_threshold_line(1, "short")),
        _panel(5, "Probe time to first token", "timeseries", (0, 16, 12, 8), quantiles(TTFT), unit="s",
               description="p50 and p95 of the time to the first streamed token of streaming probes."),
        _panel(6, "Probe duration", "timeseries", (12, 16, 12, 8), quantiles(E2E), unit="s",
               description="p50 and p95 of probe request to complete answer."),
        _panel(7, "Active release per target", "table", (0, 24, 24, 6), [
            _q(f"{RELEASE}{SEL} == 1", "", "A", format="table", instant=True, range=False),
        ], description="The release active on each target's node-0 host and its state (good = promoted).",
            transformations=[{"id": "organize", "options": {
                "excludeByName": {"Time": True, "Value": True, "__name__": True, "instance": True, "job": True},
                "indexByName": {"target": 0, "host": 1, "release": 2, "state": 3}, "renameByName": {}}}]),
        _panel(8, "SGLang running and queued requests", "timeseries", (0, 30, 12, 8), [
            _q(f"{SGLANG_RUNNING}{SEL}", "{{target}} running", "A"),
            _q(f"{SGLANG_QUEUED}{SEL}", "{{target}} queued", "B"),
        ], description="sglang:num_running_reqs and sglang:num_queue_reqs summed over each target's ranks."),
        _panel(9, "KV pool usage", "timeseries", (12, 30, 12, 8), [
            _q(f"{SGLANG_TOKEN_USAGE}{SEL}", "{{target}}", "A"),
        ], description="sglang:token_usage, the fullest rank of each target; the red line is the alert threshold.",
            fieldConfig=_threshold_line(KV_FULL, "percentunit")),
        _panel(10, "Generation throughput", "timeseries", (0, 38, 12, 8), [
            _q(f"rate({SGLANG_GENERATED}{SEL}[{RATE}])", "{{target}}", "A"),
        ], unit="suffix: tok/s",
            description="Generated tokens per second (rate of sglang:generation_tokens_total summed over ranks)."),
        _panel(11, "PD transfer failures", "timeseries", (12, 38, 12, 8), [
            _q(f"increase({SGLANG_TRANSFER_FAILED}{SEL}[{RATE}])", "{{target}}", "A"),
        ], description="Failed PD KV transfers and bootstraps (sglang:num_transfer_failed_reqs_total + "
                       "sglang:num_bootstrap_failed_reqs_total)."),
        _panel(12, "Metrics scrape up", "state-timeline", (0, 46, 24, 6), [
            _q(f"{SCRAPE_UP}{SEL}", "{{target}} {{source}}", "A"),
        ], description="1 when dsv4ctl watch's last /metrics scrape of the target worked.",
            fieldConfig={"defaults": {"unit": "short", "mappings": [
                {"type": "value", "options": {"0": {"text": "down", "color": "red"},
                                              "1": {"text": "up", "color": "green"}}}]}, "overrides": []}),
    ]
    return {
        "uid": UID, "title": "dsv4ctl watch", "description": "Known-answer tool-call probes of DeepSeek-V4 on SGLang (dsv4ctl watch).",
        "tags": ["dsv4ctl", "sglang", "deepseek-v4"], "schemaVersion": SCHEMA_VERSION, "version": 1,
        "editable": True, "graphTooltip": 1, "refresh": "30s", "timezone": "browser",
        "time": {"from": "now-6h", "to": "now"},
        "annotations": {"list": []},
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []},
            {"name": "target", "label": "Target", "type": "query", "datasource": DS,
             "definition": f"label_values({PROBES}, target)",
             "query": {"query": f"label_values({PROBES}, target)", "refId": "targets", "qryType": 1},
             "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "hide": 0, "refresh": 2,
             "regex": "", "sort": 1, "options": []},
        ]},
        "panels": panels,
    }


def render_dashboard() -> str:
    """The dashboard as JSON text (2-space indent, stable key order, ends in a newline)."""
    return json.dumps(dashboard(), indent=2) + "\n"
