"""Pure cores of dsv4ctl/check/gateway.py and smoke.workers_for, on data captured from the real
sglang-router 0.3.2 and smg 1.13.0 (tests/test_gateway.py runs them for real)."""

from __future__ import annotations

import pytest

from dsv4ctl.check.gateway import gateway_delta, identify_gateway, parse_gateway_metrics
from dsv4ctl.check.report import gateway_lines
from dsv4ctl.check.smoke import Worker, workers_for

WORKERS = {"workers": [
    {"id": "e3e7", "url": "http://127.0.0.1:18100", "model_id": "deepseek-v4-flash", "worker_type": "prefill",
     "is_healthy": True, "load": 0, "connection_mode": "HTTP", "bootstrap_port": 18998},
    {"id": "9a1c", "url": "http://127.0.0.1:18200/", "model_id": "deepseek-v4-flash", "worker_type": "decode",
     "is_healthy": False, "load": 0, "connection_mode": "HTTP", "bootstrap_port": None}]}
SGLANG_ROUTER_INFO = {"router_manager": True, "routers_count": 1, "workers_count": 2}
SMG_FORWARDED = {"version": "0.5.23", "tool_call_parser": "deepseekv4", "disaggregation_mode": "prefill"}

# one scrape of smg 1.13.0 after 2 requests, each retried once (the decode answered 503 first)
METRICS = """# HELP smg_worker_retries_total retries
# TYPE smg_worker_retries_total counter
smg_worker_retries_total{worker_type="prefill",endpoint="chat"} 2
smg_worker_retries_total{worker_type="decode",endpoint="chat"} 2
smg_worker_retries_total{worker_type="decode",endpoint="generate"} 0
smg_worker_retries_total{worker_type="regular",endpoint="chat"} 0
# TYPE smg_worker_retries_exhausted_total counter
smg_worker_retries_exhausted_total{worker_type="decode",endpoint="chat"} 0
# TYPE smg_worker_cb_outcomes_total counter
smg_worker_cb_outcomes_total{worker="http://127.0.0.1:18200",outcome="success"} 2
smg_worker_cb_outcomes_total{worker="http://127.0.0.1:18200",outcome="failure"} 2
smg_worker_cb_outcomes_total{worker="http://127.0.0.1:18100",outcome="failure"} 2
# TYPE smg_worker_cb_state gauge
smg_worker_cb_state{worker="http://127.0.0.1:18100"} 0
smg_worker_cb_state{worker="http://127.0.0.1:18200"} 1
# TYPE smg_http_connections_active gauge
smg_http_connections_active 0
"""


def test_sglang_router_is_recognised_by_router_manager():
    g = identify_gateway(404, SGLANG_ROUTER_INFO, WORKERS)
    assert g["kind"] == "sglang-router"
    assert g["workers"] == [
        {"url": "http://127.0.0.1:18100", "worker_type": "prefill", "is_healthy": True, "bootstrap_port": 18998},
        {"url": "http://127.0.0.1:18200", "worker_type": "decode", "is_healthy": False, "bootstrap_port": None}]
    assert g["summary"].startswith("sglang-router (/get_server_info: router_manager, routers_count 1, workers_count 2)")
    assert g["summary"].endswith("/workers: prefill http://127.0.0.1:18100, decode http://127.0.0.1:18200")
    # router_manager alone (no /workers) is still a gateway, with no workers listed
    assert identify_gateway(404, SGLANG_ROUTER_INFO, None)["workers"] == []


def test_smg_is_recognised_by_its_workers_list_not_its_forwarded_info():
    g = identify_gateway(404, SMG_FORWARDED, WORKERS)
    assert g["kind"] == "gateway" and "its /get_server_info is one worker's, not judged" in g["summary"]
    assert [w["worker_type"] for w in g["workers"]] == ["prefill", "decode"]


@pytest.mark.parametrize("status,gsi,workers", [
    (200, SMG_FORWARDED, WORKERS),      # /server_info answered: an SGLang server
    (404, SMG_FORWARDED, None),         # no /workers and no router_manager: an older server
    (404, None, {"detail": "Not Found"}),
    (404, None, "Not Found")])
def test_servers_are_not_gateways(status, gsi, workers):
    assert identify_gateway(status, gsi, workers) is None


def test_workers_for_given_then_listed_then_entry():
    g = identify_gateway(404, SGLANG_ROUTER_INFO, WORKERS)
    given = [Worker(name="d", url="http://127.0.0.1:18200")]
    assert workers_for("http://gw:8000", given, g) == given
    assert [(w.name, w.url) for w in workers_for("http://gw:8000", [], g)] == [
        ("prefill http://127.0.0.1:18100", "http://127.0.0.1:18100"),
        ("decode http://127.0.0.1:18200", "http://127.0.0.1:18200")]
    assert [(w.name, w.url) for w in workers_for("http://s:30000", [], None)] == [("http://s:30000", "http://s:30000")]


def test_metrics_parse_and_delta():
    m = parse_gateway_metrics(METRICS)
    assert m == {"retries": {"prefill": 2.0, "decode": 2.0, "regular": 0.0}, "retries_exhausted": {"decode": 0.0},
                 "cb_failures": 4.0, "cb_open": ["http://127.0.0.1:18200"]}
    zero = {"retries": {}, "retries_exhausted": {}, "cb_failures": 0.0, "cb_open": []}
    d = gateway_delta(zero, m)
    assert d == {"retries": 2, "retries_by_worker_type": {"prefill": 2, "decode": 2}, "retries_exhausted": 0,
                 "circuit_breaker_failures": 4, "circuit_breakers_open": ["http://127.0.0.1:18200"]}
    assert gateway_delta(m, m)["retries"] == 0 and gateway_delta(None, m) is None and gateway_delta(m, None) is None
    # a counter that went down (the gateway restarted mid-level) counts from 0
    assert gateway_delta({**m, "retries": {"decode": 9.0}}, m)["retries_by_worker_type"]["decode"] == 2
    # prefill-only counts (no decode series) are the client retries
    assert gateway_delta(zero, {**zero, "retries": {"prefill": 3.0}})["retries"] == 3
    with pytest.raises(ValueError):
        parse_gateway_metrics("smg_worker_retries_total{worker_type=\"decode\" 1\n")


def test_gateway_lines():
    doc = {"levels": [{"url": "http://gw:8000", "concurrency": 8, "gateway": {
        "retries": 3, "retries_by_worker_type": {"decode": 3, "prefill": 3}, "retries_exhausted": 1,
        "circuit_breaker_failures": 7, "circuit_breakers_open": ["http://d:1"]}},
        {"url": "http://gw:8000", "concurrency": 16, "gateway": None}]}
    assert gateway_lines(doc) == [
        "gateway at http://gw:8000 c=8: 3 request(s) retried by the gateway (decode 3, prefill 3) - failures the "
        "corruption rate does not count; 1 retries exhausted; 7 circuit-breaker failure(s); open: http://d:1"]


def test_bad_options_are_one_line_errors():
    from tests.conftest import DEFAULT_PROFILE, run_cli
    r = run_cli("check", "smoke", "--profile", str(DEFAULT_PROFILE), "--worker", "http://x:1")
    assert r.code == 2 and r.err.strip() == ("dsv4ctl: error: check smoke: --worker goes with a URL (with --profile "
                                             "the workers are its server groups)")
    r = run_cli("check", "smoke", "http://127.0.0.1:9", "--worker", "x:1")
    assert r.code == 2 and r.err.strip() == "dsv4ctl: error: x:1: a URL must start with http:// or https://"
    r = run_cli("check", "load", "http://127.0.0.1:9", "--gateway-metrics", "gw:29000")
    assert r.code == 2 and r.err.strip() == "dsv4ctl: error: gw:29000: a URL must start with http:// or https://"


def test_metrics_that_are_no_counts_and_labels_of_no_worker_type_are_left_out():
    """A gateway page with +Inf, NaN and negative values, a worker_type that is no gateway's (it
    could be anything, a secret included: labels stay bounded) and a NaN breaker state: only the
    real counts are read (was: OverflowError traceback in watch --once, breaker's finding)."""
    text = "\n".join([
        'smg_worker_retries_total{worker_type="decode",endpoint="chat"} +Inf',
        'smg_worker_retries_total{worker_type="decode",endpoint="chat"} 2',
        'smg_worker_retries_total{worker_type="prefill",endpoint="chat"} -7',
        'smg_worker_retries_total{worker_type="sk-SECRETVALUE-0123456789"} 3',
        'smg_worker_retries_exhausted_total 1',
        'smg_worker_cb_outcomes_total{worker="http://a",outcome="failure"} NaN',
        'smg_worker_cb_state{worker="http://a"} NaN',
        'smg_worker_cb_state{worker="http://b"} 1',
        'smg_worker_cb_state 1', ""])
    m = parse_gateway_metrics(text)
    assert m == {"retries": {"decode": 2.0}, "retries_exhausted": {"regular": 1.0}, "cb_failures": 0.0,
                 "cb_open": ["http://b"]}
    d = gateway_delta(parse_gateway_metrics(""), m)
    assert (d["retries"], d["retries_exhausted"], d["circuit_breakers_open"]) == (2, 1, ["http://b"])
