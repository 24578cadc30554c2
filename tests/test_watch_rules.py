"""The Prometheus rules and the Grafana dashboard shipped with ``dsv4ctl watch``
(:mod:`dsv4ctl.watch.rules`, :mod:`dsv4ctl.watch.dashboard`, ``dsv4ctl/data/watch/``), checked
with the real ``promtool`` (Debian package ``prometheus``; scripts/test.sh installs it): the
rule files load, every alert fires and resolves in ``promtool test rules`` unit tests
(tests/data/watch/rules_test.yml), and every dashboard query is valid PromQL on known metrics.
Regenerating the shipped files: ``python scripts/gen_watch_rules.py``."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dsv4ctl.watch import metrics
from dsv4ctl.watch.dashboard import render_dashboard
from dsv4ctl.watch.rules import (ALERTS, RECORDS, RUNBOOKS, SLO_RECORD, count_record, corrupted_record, duration,
                                 ratio_record, render_rules, rules)
from tests.conftest import REPO

DATA = REPO / "dsv4ctl" / "data" / "watch"
TESTS = REPO / "tests" / "data" / "watch"
REGEN = "run python scripts/gen_watch_rules.py"


@pytest.fixture(scope="module")
def promtool() -> str:
    """The real promtool; a failure (not a skip) when it is missing."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found on PATH: install the Debian package prometheus "
                    "(apt-get install --no-install-recommends prometheus; scripts/test.sh does)")
    return path


def _run(promtool: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120)


def _check_rules(promtool: str, path: Path, n_rules: int) -> None:
    r = _run(promtool, "check", "rules", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {n_rules} rules found" in r.stdout, r.stdout


# --- names ---------------------------------------------------------------------------------------
def _metric_names() -> set[str]:
    """Every series name the watch serves: the metrics.py constants, histograms with their series."""
    names = {v for k, v in vars(metrics).items() if k.isupper() and isinstance(v, str) and v.startswith(metrics.PREFIX)}
    names.discard(metrics.PREFIX)
    for h in (metrics.TTFT, metrics.E2E):
        names |= {h + "_bucket", h + "_sum", h + "_count"}
    return names


_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}


def series_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (function names, label names, keywords,
    durations and numbers left out)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)          # strings
    e = re.sub(r"\{[^}]*\}", "", e)                         # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)                        # ranges
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)   # label lists
    out = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        after = e[m.end():].lstrip()
        if after.startswith("(") or m.group() in _KEYWORDS or re.fullmatch(r"\d*e\d*|inf|nan", m.group(), re.I):
            continue
        out.add(m.group())
    return out


def test_series_names_parser():
    assert series_names('sum by (target, le) (rate(a_bucket{target=~"x"}[5m])) / on (target) b > 0.5') == {"a_bucket", "b"}
    assert series_names("histogram_quantile(0.95, sum by (le) (rate(x_bucket[1m]))) and y{s!~\"a|b\"} == 1") == \
        {"x_bucket", "y"}
    assert series_names("vector(1e-3)") == set()


# --- the shipped files ---------------------------------------------------------------------------
def test_shipped_files_are_generated():
    assert (DATA / "rules.yml").read_text() == render_rules(), f"dsv4ctl/data/watch/rules.yml is stale: {REGEN}"
    assert (DATA / "dashboard.json").read_text() == render_dashboard(), f"dashboard.json is stale: {REGEN}"
    spec = importlib.util.spec_from_file_location("gen_watch_rules", REPO / "scripts" / "gen_watch_rules.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.main(["--check"]) == 0
    assert gen.generate() == {"rules.yml": render_rules(), "dashboard.json": render_dashboard()}


def test_shipped_files_go_into_the_wheel():
    # pyproject: package-data dsv4ctl = ["data/**/*"] (tests/test_install.py builds the real wheel)
    import tomllib
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["dsv4ctl"]
    assert "data/**/*" in data
    assert sorted(p.name for p in DATA.iterdir()) == ["dashboard.json", "rules.yml"]


@pytest.mark.parametrize("kw,n", [({}, 27), ({"scale": 1 / 60}, 27), ({"slo": 0.05}, 27), ({"slo": 0.007, "scale": 1 / 7}, 27),
                                  ({"scale": 3}, 27), ({"job": "prom/dsv4ctl:watch", "runbook_url": "http://wiki.example/r"}, 27)])
def test_promtool_checks_the_rule_files(promtool, tmp_path, kw, n):
    _check_rules(promtool, DATA / "rules.yml", 27)
    f = tmp_path / "rules.yml"
    f.write_text(render_rules(**kw))
    _check_rules(promtool, f, n)


# --- contents ------------------------------------------------------------------------------------
def _alerts(doc: dict) -> dict[str, dict]:
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


def _records(doc: dict) -> dict[str, str]:
    return {r["record"]: r["expr"] for g in doc["groups"] for r in g["rules"] if "record" in r}


def test_rule_file_contents():
    text = render_rules()
    doc = yaml.safe_load(text)
    assert text.startswith("# Prometheus rules of dsv4ctl watch: dsv4ctl.watch.rules.render_rules(slo=0.01, scale=1).\n")
    assert doc == rules()
    assert [g["name"] for g in doc["groups"]] == ["dsv4ctl-watch-corruption", "dsv4ctl-watch-alerts"]
    assert [r.get("alert") for r in doc["groups"][0]["rules"]][-3:] == [None, *ALERTS[:2]]
    assert list(_alerts(doc)) == list(ALERTS)
    assert tuple(_records(doc)) == RECORDS
    assert _records(doc)[SLO_RECORD] == "vector(0.01)"
    assert _records(doc)[count_record("6h")] == (
        "sum by (target, release) (increase(dsv4ctl_watch_probes_total[6h]))\n- (\n"
        "  sum by (target, release) (increase(dsv4ctl_watch_probes_failed_total[6h]))\n"
        "  or 0 * sum by (target, release) (increase(dsv4ctl_watch_probes_total[6h]))\n)\n")
    assert _records(doc)[corrupted_record("30m")] == (
        "sum by (target, release) (increase(dsv4ctl_watch_probes_corrupted_total[30m]))\n"
        "or 0 * sum by (target, release) (increase(dsv4ctl_watch_probes_total[30m]))\n")
    assert _records(doc)[ratio_record("5m")] == "dsv4ctl:probe_corrupted:increase5m / dsv4ctl:probe_count:increase5m"
    assert len(RECORDS) == 13 and RECORDS[:2] == (SLO_RECORD, "dsv4ctl:probe_count:increase5m")
    a = _alerts(doc)
    assert {n: r["labels"]["severity"] for n, r in a.items()} == {
        "DSV4ToolCallCorruptionFastBurn": "page", "DSV4ToolCallCorruptionSlowBurn": "ticket", "DSV4ProbeStuck": "page",
        "DSV4ProbesFailing": "page", "DSV4SchedulerStall": "page", "DSV4KVPoolNearFull": "ticket",
        "DSV4PDTransferFailures": "ticket", "DSV4GatewayRetrying": "ticket", "DSV4GatewayCircuitOpen": "ticket",
        "DSV4ReleaseNotPromoted": "ticket", "DSV4ActiveReleaseFailed": "page",
        "DSV4WatchScrapeDown": "ticket", "DSV4WatchDown": "page", "DSV4WatchAbsent": "ticket"}
    assert {n: r.get("for") for n, r in a.items()} == {
        "DSV4ToolCallCorruptionFastBurn": "2m", "DSV4ToolCallCorruptionSlowBurn": "15m", "DSV4ProbeStuck": "2m",
        "DSV4ProbesFailing": "5m", "DSV4SchedulerStall": "2m", "DSV4KVPoolNearFull": "10m",
        "DSV4PDTransferFailures": None, "DSV4GatewayRetrying": None, "DSV4GatewayCircuitOpen": "2m",
        "DSV4ReleaseNotPromoted": "30m", "DSV4ActiveReleaseFailed": "1m",
        "DSV4WatchScrapeDown": "10m", "DSV4WatchDown": "2m", "DSV4WatchAbsent": "10m"}
    assert a["DSV4ToolCallCorruptionFastBurn"]["expr"] == (
        "(\n  dsv4ctl:probe_corruption:ratio_rate1h > 0.1\n  and dsv4ctl:probe_corruption:ratio_rate5m > 0.1\n)\n"
        "and dsv4ctl:probe_count:increase1h >= 10\n")
    assert a["DSV4WatchDown"]["expr"] == 'up{job="dsv4ctl-watch"} == 0'
    assert a["DSV4WatchAbsent"]["expr"] == 'absent(up{job="dsv4ctl-watch"})'
    alerts_md = (REPO / "docs" / "alerts.md").read_text()
    for name, r in a.items():
        ann = r["annotations"]
        assert list(ann) == ["summary", "description"] + (["runbook"] if name in RUNBOOKS else []) + ["runbook_url"], name
        # watch's own alerts are about Prometheus' scrape of it (up{job, instance}), not a target
        label = "{{ $labels.instance }}" if name == "DSV4WatchDown" else "{{ $labels.target }}"
        if name != "DSV4WatchAbsent":
            assert label in ann["summary"] and label in ann["description"], name
        if name in RUNBOOKS:
            assert ann["runbook"] == f"dsv4ctl runbook run {RUNBOOKS[name]} PROFILE"
        # every alert links its own section of docs/alerts.md (GitHub's anchor of its heading)
        assert ann["runbook_url"] == f"https://github.com/dsv4ctl/dsv4ctl/blob/main/docs/alerts.md#{name.lower()}"
        assert f"\n## {name}\n" in alerts_md, name
        if name in RUNBOOKS:
            section = alerts_md.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
            assert f"dsv4ctl runbook run {RUNBOOKS[name]}" in section, name
    # every runbook named (annotation or description) is a shipped playbook
    named = set(re.findall(r"dsv4ctl runbook run ([a-z-]+)", text))
    assert named == {"toolcall-corruption", "scheduler-stall", "transfer-wedge", "bad-release"}
    assert all((REPO / "playbooks" / f"{n}.yaml").is_file() for n in named)
    # every series named is served by the watch or recorded here
    used = set().union(*(series_names(r.get("expr", "")) for g in doc["groups"] for r in g["rules"]))
    assert used <= _metric_names() | set(RECORDS) | {"up"}, used - _metric_names() - set(RECORDS)
    # the counters watch re-exports from SGLang and the gateway are counters, read with increase()
    for counter in (metrics.SGLANG_GENERATED, metrics.SGLANG_TRANSFER_FAILED, metrics.GATEWAY_RETRIES):
        assert counter.endswith("_total")
        uses = re.findall(r"(\w+)\(" + re.escape(counter), text)
        assert uses and set(uses) == {"increase"}, (counter, uses)
    assert {metrics.PROBES, metrics.CORRUPTED, metrics.FAILED, metrics.STUCK_NOW, metrics.RELEASE, metrics.SCRAPE_UP,
            metrics.SGLANG_RUNNING, metrics.SGLANG_GENERATED, metrics.SGLANG_TOKEN_USAGE,
            metrics.SGLANG_TRANSFER_FAILED, metrics.GATEWAY_RETRIES, metrics.GATEWAY_CIRCUIT_OPEN} <= used


def test_slo_and_scale():
    a = _alerts(rules(slo=0.05))
    assert "ratio_rate1h > 0.5\n" in a["DSV4ToolCallCorruptionFastBurn"]["expr"]
    assert "ratio_rate30m > 0.15\n" in a["DSV4ToolCallCorruptionSlowBurn"]["expr"]
    assert a["DSV4ToolCallCorruptionSlowBurn"]["annotations"]["description"].endswith(
        "more than 15% over the last 30m: 3x the SLO of 5% corrupted tool calls.")
    # 3 x 0.007 written as 0.021, not 0.021000000000000001
    assert "ratio_rate30m > 0.021\n" in _alerts(rules(slo=0.007))["DSV4ToolCallCorruptionSlowBurn"]["expr"]
    assert _records(rules(slo=0.05))[SLO_RECORD] == "vector(0.05)"
    doc = rules(scale=1 / 60)
    assert {n: r.get("for") for n, r in _alerts(doc).items()} == {
        "DSV4ToolCallCorruptionFastBurn": "2s", "DSV4ToolCallCorruptionSlowBurn": "15s", "DSV4ProbeStuck": "2s",
        "DSV4ProbesFailing": "5s", "DSV4SchedulerStall": "2s", "DSV4KVPoolNearFull": "10s",
        "DSV4PDTransferFailures": None, "DSV4GatewayRetrying": None, "DSV4GatewayCircuitOpen": "2s",
        "DSV4ReleaseNotPromoted": "30s", "DSV4ActiveReleaseFailed": "1s",
        "DSV4WatchScrapeDown": "10s", "DSV4WatchDown": "2s", "DSV4WatchAbsent": "10s"}
    windows = {n: re.findall(r"\[([^\]]+)\]", e) for n, e in _records(doc).items()}
    assert windows[count_record("1h")] == ["1m", "1m", "1m"] and windows[corrupted_record("6h")] == ["6m", "6m"]
    assert "[2s]" in _alerts(doc)["DSV4SchedulerStall"]["expr"]
    assert "[10s]" in _alerts(doc)["DSV4PDTransferFailures"]["expr"]
    assert list(_records(doc)) == list(RECORDS)        # recorded names keep their nominal windows
    assert _alerts(rules(scale=1 / 7))["DSV4ReleaseNotPromoted"]["for"] == "4m17s143ms"
    assert _alerts(rules(scale=0.001))["DSV4ActiveReleaseFailed"]["for"] == "60ms"


def test_scrape_job_and_runbook_page():
    doc = rules(job="prom/dsv4ctl:watch", runbook_url="http://wiki.example/sre/dsv4")
    a = _alerts(doc)
    assert a["DSV4WatchDown"]["expr"] == 'up{job="prom/dsv4ctl:watch"} == 0'
    assert a["DSV4WatchAbsent"]["expr"] == 'absent(up{job="prom/dsv4ctl:watch"})'
    assert a["DSV4WatchAbsent"]["annotations"]["summary"] == "No dsv4ctl watch is scraped (job prom/dsv4ctl:watch)"
    assert {n: r["annotations"]["runbook_url"] for n, r in a.items()} == {
        n: f"http://wiki.example/sre/dsv4#{n.lower()}" for n in ALERTS}
    # a profile named in the annotations never rewrites the operator's URL
    text = render_rules(profile="PROFILE-x", runbook_url="https://w.example/PROFILE/alerts")
    assert "https://w.example/PROFILE/alerts#dsv4watchdown" in text


def test_duration():
    assert [duration(s) for s in (3600, 21600, 300, 90, 5, 0.5, 3723.004, 0.0004999 + 0.0006, 360000)] == \
        ["1h", "6h", "5m", "1m30s", "5s", "500ms", "1h2m3s4ms", "1ms", "100h"]
    for bad in (0, 0.0004, -1, math.inf, math.nan):
        with pytest.raises(ValueError):
            duration(bad)


@pytest.mark.parametrize("kw,msg", [
    ({"slo": 0}, "slo must be a ratio strictly between 0 and 1"), ({"slo": 1}, "slo must be"),
    ({"slo": -0.01}, "slo must be"), ({"slo": 1.5}, "slo must be"), ({"slo": math.nan}, "slo must be"),
    ({"slo": True}, "slo must be"), ({"slo": "0.01"}, "slo must be"),
    ({"scale": 0}, "scale must be a finite number > 0"), ({"scale": -1}, "scale must be"),
    ({"scale": math.inf}, "scale must be"), ({"scale": math.nan}, "scale must be"),
    ({"scale": 1e-7}, "under 1 ms"),      # 2m x 1e-7 = 12 us: Prometheus has no unit for it
    ({"runbook_url": "wiki.example/alerts"}, "runbook URL 'wiki.example/alerts': expected an http:// or https:// URL"),
    ({"runbook_url": "https://wiki.example/alerts#top"}, "without '#'"),
    ({"runbook_url": "https://wiki.example/{{ $labels.x }}"}, "runbook URL"),
    ({"runbook_url": "https://wiki.example/a b"}, "runbook URL"),
    ({"job": 'w"} or vector(1) #'}, "scrape job 'w\"} or vector(1) #': expected 1-200 letters"),
    ({"job": ""}, "scrape job"),
])
def test_render_rules_rejects(kw, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        render_rules(**kw)


# --- promtool unit tests -------------------------------------------------------------------------
def _unit_doc(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_unit_tests_cover_every_alert():
    doc = _unit_doc(TESTS / "rules_test.yml")
    assert [(TESTS / f).resolve() for f in doc["rule_files"]] == [DATA / "rules.yml"]
    fires: dict[str, int] = {}
    quiet: dict[str, int] = {}
    for t in doc["tests"]:
        for case in t.get("alert_rule_test", []):
            name = case["alertname"]
            assert name in ALERTS, name
            if case.get("exp_alerts"):
                fires[name] = fires.get(name, 0) + 1
                for exp in case["exp_alerts"]:       # labels and every annotation checked
                    sev = _alerts(rules())[name]["labels"]["severity"]
                    where = "job" if name in ("DSV4WatchDown", "DSV4WatchAbsent") else "target"
                    assert exp["exp_labels"]["severity"] == sev and where in exp["exp_labels"], (name, exp)
                    assert set(exp["exp_annotations"]) == set(_alerts(rules())[name]["annotations"]), name
            else:
                quiet[name] = quiet.get(name, 0) + 1
    assert sorted(fires) == sorted(ALERTS), set(ALERTS) - set(fires)
    assert sorted(quiet) == sorted(ALERTS), set(ALERTS) - set(quiet)


def test_promtool_unit_tests_pass(promtool):
    r = _run(promtool, "test", "rules", str(TESTS / "rules_test.yml"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout and "FAILED" not in r.stdout


@pytest.mark.parametrize("old,new,failing", [
    # without the minimum-sample guard the one-probe-every-10-minutes target pages
    ("and dsv4ctl:probe_count:increase1h >= 10", "and dsv4ctl:probe_count:increase1h >= 0",
     "DSV4ToolCallCorruptionFastBurn"),
    # delta() of the transfer-failure count goes negative at a restart and misses the failure after it
    ("increase(dsv4ctl_watch_sglang_transfer_failed_requests_total[10m])", "delta(dsv4ctl_watch_sglang_transfer_failed_requests_total[10m])",
     "DSV4PDTransferFailures"),
    ('state!~"good|failed|none"', 'state!="good"', "DSV4ReleaseNotPromoted"),
    ("dsv4ctl_watch_sglang_token_usage > 0.95", "dsv4ctl_watch_sglang_token_usage >= 0.95", "DSV4KVPoolNearFull"),
    # watch's own alerts: a down watch that never pages, a "not up" that misses a job without target
    ('up{job="dsv4ctl-watch"} == 0', 'up{job="dsv4ctl-watch"} < 0', "DSV4WatchDown"),
    ('absent(up{job="dsv4ctl-watch"})', 'up{job="dsv4ctl-watch"} != 1', "DSV4WatchAbsent"),
])
def test_promtool_unit_tests_catch_a_broken_rule(promtool, tmp_path, old, new, failing):
    text = render_rules()
    assert text.count(old) == 1
    (tmp_path / "rules.yml").write_text(text.replace(old, new))
    unit = _unit_doc(TESTS / "rules_test.yml")
    unit["rule_files"] = ["rules.yml"]
    (tmp_path / "rules_test.yml").write_text(yaml.safe_dump(unit, sort_keys=False))
    r = _run(promtool, "test", "rules", str(tmp_path / "rules_test.yml"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert re.findall(r"alertname: (\w+),", r.stdout + r.stderr) and \
        set(re.findall(r"alertname: (\w+),", r.stdout + r.stderr)) == {failing}, r.stdout


def test_promtool_unit_test_of_scaled_rules(promtool, tmp_path):
    shutil.copy(TESTS / "rules_test_scaled.yml", tmp_path / "rules_test_scaled.yml")
    (tmp_path / "rules_scaled.yml").write_text(render_rules(scale=1 / 60))
    r = _run(promtool, "test", "rules", str(tmp_path / "rules_test_scaled.yml"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


# --- the dashboard -------------------------------------------------------------------------------
def _dashboard() -> dict:
    return json.loads((DATA / "dashboard.json").read_text())


def test_dashboard_model():
    d = _dashboard()
    assert d["uid"] == "dsv4ctl-watch" and d["schemaVersion"] == 39 and d["title"] == "dsv4ctl watch"
    var = {v["name"]: v for v in d["templating"]["list"]}
    assert list(var) == ["datasource", "target"]
    assert var["datasource"]["type"] == "datasource" and var["datasource"]["query"] == "prometheus"
    assert var["target"]["query"]["query"] == var["target"]["definition"] == "label_values(dsv4ctl_watch_probes_total, target)"
    assert var["target"]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert var["target"]["multi"] and var["target"]["includeAll"] and var["target"]["allValue"] == ".*"
    panels = d["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    assert [p["title"] for p in panels] == [
        "Tool-call corruption ratio", "Corrupted probes by class", "Probes judged and failed", "Stuck probes",
        "Probe time to first token", "Probe duration", "Active release per target",
        "SGLang running and queued requests", "KV pool usage", "Generation throughput", "PD transfer failures",
        "Metrics scrape up"]
    cells = set()
    for p in panels:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert all(t["datasource"] == p["datasource"] for t in p["targets"]), p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"]), p["title"]
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
    by_title = {p["title"]: p for p in panels}
    corr = by_title["Tool-call corruption ratio"]
    assert [t["expr"] for t in corr["targets"]] == [
        'dsv4ctl:probe_corruption:ratio_rate5m{target=~"$target"}', 'dsv4ctl:probe_corruption:ratio_rate1h{target=~"$target"}',
        "dsv4ctl:probe_corruption:slo"]
    steps = corr["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1] == {"color": "red", "value": 0.01} and corr["fieldConfig"]["defaults"]["unit"] == "percentunit"
    assert by_title["Probe time to first token"]["targets"][1]["expr"] == (
        'histogram_quantile(0.95, sum by (target, le) (rate(dsv4ctl_watch_probe_ttft_seconds_bucket{target=~"$target"}'
        '[$__rate_interval])))')
    rel = by_title["Active release per target"]
    assert rel["type"] == "table" and rel["targets"][0]["instant"] and rel["targets"][0]["format"] == "table"
    assert rel["targets"][0]["expr"] == 'dsv4ctl_watch_release{target=~"$target"} == 1'


def _panel_exprs(d: dict) -> list[str]:
    return [t["expr"] for p in d["panels"] for t in p["targets"]]


def test_dashboard_queries_are_valid_promql_on_known_metrics(promtool, tmp_path):
    exprs = _panel_exprs(_dashboard())
    assert len(exprs) == 18
    concrete = [e.replace("$__rate_interval", "1m").replace("$target", "g1|g2") for e in exprs]
    assert not [e for e in concrete if "$" in e]
    assert all('{target=~"g1|g2"}' in e for e in concrete if e != SLO_RECORD)    # every panel follows the variable
    recs = [{"record": f"dashboard:query_{i}:check", "expr": e} for i, e in enumerate(concrete)]
    (tmp_path / "dashboard_rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recs}]}))
    _check_rules(promtool, tmp_path / "dashboard_rules.yml", len(recs))
    used = set().union(*(series_names(e) for e in concrete))
    sglang = {n for n in used if n.startswith("sglang:")}
    assert used - sglang <= _metric_names() | set(RECORDS), used - _metric_names() - set(RECORDS)
    assert {ratio_record("5m"), ratio_record("1h"), SLO_RECORD, metrics.CORRUPTED, metrics.STUCK_NOW, metrics.RELEASE,
            metrics.TTFT + "_bucket", metrics.E2E + "_bucket", metrics.SGLANG_RUNNING, metrics.SGLANG_QUEUED,
            metrics.SGLANG_TOKEN_USAGE, metrics.SGLANG_GENERATED, metrics.SGLANG_TRANSFER_FAILED, metrics.SCRAPE_UP} <= used


def test_promtool_rejects_a_broken_query(promtool, tmp_path):
    # the validation above has teeth: a query with a typo does not load
    (tmp_path / "bad.yml").write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": [
        {"record": "dashboard:bad", "expr": 'sum by (target (rate(dsv4ctl_watch_probes_total[1m]))'}]}]}))
    r = _run(promtool, "check", "rules", str(tmp_path / "bad.yml"))
    assert r.returncode == 1 and "parse error" in r.stdout + r.stderr


def test_record_names():
    assert [ratio_record(w) for w in ("5m", "30m", "1h", "6h")] == [
        "dsv4ctl:probe_corruption:ratio_rate5m", "dsv4ctl:probe_corruption:ratio_rate30m",
        "dsv4ctl:probe_corruption:ratio_rate1h", "dsv4ctl:probe_corruption:ratio_rate6h"]
    assert count_record("1h") == "dsv4ctl:probe_count:increase1h"
    assert corrupted_record("6h") == "dsv4ctl:probe_corrupted:increase6h"
    with pytest.raises(KeyError, match="the recorded windows are 5m, 30m, 1h, 6h"):
        ratio_record("2h")
