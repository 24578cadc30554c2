"""dsv4ctl behind the REAL PD gateways (PyPI sglang-router 0.3.2, smg 1.13.0) in front of the
stand-in prefill and decode servers: what each gateway does at registration and per request,
check smoke / check load through it, X-Request-Id, the gateway's own retry metrics."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.conftest import run_cli
from tests.gateway import pd_gateway

pytestmark = pytest.mark.gateway
KINDS = ["sglang-router", "smg"]


@pytest.fixture(params=KINDS)
def gw(request, tmp_path):
    with pd_gateway(request.param, tmp_path) as pd:
        yield pd


def chat(url: str, rid: str, xid: str) -> tuple[dict, dict]:
    body = {"model": "deepseek-v4-flash", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "rid": rid}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "X-Request-Id": xid})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read()), dict(r.headers)


def test_registration_and_pd_fields(gw):
    """Registration probes; every request reaches prefill and decode with the same bootstrap_room,
    the prefill's bootstrap host and port; X-Request-Id goes through and is echoed; rid is dropped
    by sglang-router, kept by smg."""
    doc, headers = chat(gw.url, "rid-body-1", "xid-1")
    assert doc["choices"][0]["finish_reason"] in ("stop", "length")
    assert headers.get("x-request-id") == "xid-1"
    p, d = gw.seen(gw.prefill), gw.seen(gw.decode)
    for s in (p, d):
        paths = [r["path"] for r in s["requests"]]
        for need in ("/health", "/server_info", "/model_info"):
            assert need in paths, (gw.kind, paths)
        if gw.kind == "smg":
            assert "/v1/models" in paths and "/get_server_info" not in paths[:paths.index("/model_info")]
    pc = [r for r in p["requests"] if r["path"] == "/v1/chat/completions"]
    dc = [r for r in d["requests"] if r["path"] == "/v1/chat/completions"]
    assert len(pc) == len(dc) == 1
    pr, dr = pc[0], dc[0]
    assert isinstance(pr["bootstrap_room"], int) and pr["bootstrap_room"] == dr["bootstrap_room"]
    assert pr["bootstrap_port"] == dr["bootstrap_port"] == gw.bootstrap_port
    assert pr["bootstrap_host"] == dr["bootstrap_host"] == "127.0.0.1"
    assert pr["x_request_id"] == dr["x_request_id"] == "xid-1"
    assert pr["rid"] == dr["rid"] == (None if gw.kind == "sglang-router" else "rid-body-1")
    assert not pr["override_headers"] and not dr["override_headers"]
    # smg also probes the prefill's bootstrap port at registration; sglang-router does not
    assert (p["bootstrap_connections"] >= 1) == (gw.kind == "smg")
    assert d["bootstrap_connections"] == 0


def test_check_smoke_through_the_gateway(gw):
    """A bare router URL: the gateway is a "router" line, the workers it lists are checked."""
    r = run_cli("check", "smoke", gw.url, "--json", timeout=120)
    assert r.code == 0, r.out + r.err
    doc = r.json()
    lines = {(x["check"], x["target"]): x for x in doc["checks"]}
    router = lines[("router", gw.url)]
    assert router["status"] == "pass"
    assert router["detail"]["kind"] == ("sglang-router" if gw.kind == "sglang-router" else "gateway")
    assert {(w["worker_type"], w["url"]) for w in router["detail"]["workers"]} == {("prefill", gw.prefill),
                                                                                   ("decode", gw.decode)}
    infos = {k[1]: v for k, v in lines.items() if k[0] == "server_info"}
    assert set(infos) == {f"prefill {gw.prefill}", f"decode {gw.decode}"}
    assert all(v["status"] == "pass" for v in infos.values())
    assert infos[f"decode {gw.decode}"]["detail"]["disaggregation_mode"] == "decode"
    assert {x["check"] for x in doc["checks"] if x["target"] == gw.url and x["status"] == "pass"} >= {
        "router", "models", "chat", "tool_call", "tool_call_stream", "tool_choice_none", "tool_choice_required",
        "tool_choice_named", "over_length", "prompt_tokens"}
    # --worker names the workers; one that is not behind the gateway fails the router line
    r = run_cli("check", "smoke", gw.url, "--worker", gw.decode, "--json", timeout=120)
    assert r.code == 0, r.err
    assert [x["target"] for x in r.json()["checks"] if x["check"] == "server_info"] == [gw.decode]
    r = run_cli("check", "smoke", gw.url, "--worker", gw.decode, "--worker", "http://127.0.0.1:9", "--json", timeout=120)
    assert r.code == 1
    bad = [x for x in r.json()["checks"] if x["status"] == "fail"]
    assert [(x["check"]) for x in bad][0] == "router" and "not behind it: http://127.0.0.1:9" in bad[0]["reason"]


def test_check_load_through_the_gateway_records_echoed_ids(gw, tmp_path):
    rec = tmp_path / "turns.jsonl"
    r = run_cli("check", "load", gw.url, "--concurrency", "8", "--turns", "2", "--min-requests", "40",
                "--max-corruption", "0.1", "--gateway-metrics", gw.metrics_url, "--records", str(rec), "--json", "--no-progress", timeout=300)
    assert r.code == 0, r.err
    doc = r.json()
    lv = doc["levels"][0]
    assert lv["turns"] >= 40 and lv["corrupted"] == 0 and doc["pass"] is True
    assert lv["gateway"] == {"retries": 0, "retries_by_worker_type": {}, "retries_exhausted": 0,
                             "circuit_breaker_failures": 0, "circuit_breakers_open": []}
    recs = [json.loads(x) for x in rec.read_text().splitlines()]
    assert len(recs) == lv["turns"] and all(x["echoed_request_id"] == x["rid"] for x in recs)
    seen = {x["x_request_id"] for x in gw.seen(gw.decode)["requests"] if x["path"] == "/v1/chat/completions"}
    assert {x["rid"] for x in recs} <= seen


def test_gateway_retries_are_counted_not_hidden(tmp_path):
    """A decode that answers every other request 503: both gateways retry (their default), the
    client sees no failure, and check load reports how many requests the gateway retried."""
    for kind in KINDS:
        with pd_gateway(kind, tmp_path, decode_flags=("--fault", "http_503")) as gw:
            r = run_cli("check", "load", gw.url, "--concurrency", "1", "--turns", "2", "--min-requests", "10",
                        "--max-corruption", "0.3", "--gateway-metrics", gw.metrics_url, "--json", "--no-progress", timeout=300)
            assert r.code == 0, (kind, r.err)
            lv = r.json()["levels"][0]
            assert lv["corrupted"] == 0 and lv["turns"] == 10
            g = lv["gateway"]
            assert g["retries"] == 10 and g["retries_by_worker_type"] == {"prefill": 10, "decode": 10}, (kind, g)
            # each failed attempt is a breaker failure on prefill and decode (sglang-router: 20;
            # smg 1.13.0 counted 18 here: its breaker records outcomes asynchronously)
            assert g["retries_exhausted"] == 0 and 10 <= g["circuit_breaker_failures"] <= 20, (kind, g)
            assert g["circuit_breakers_open"] == [], (kind, g)
            r = run_cli("check", "load", gw.url, "--concurrency", "1", "--turns", "2", "--min-requests", "4",
                        "--max-corruption", "0.6", "--gateway-metrics", gw.metrics_url, "--no-progress", timeout=300)
            assert r.code == 0, r.err
            assert f"gateway at {gw.url} c=1: 4 request(s) retried by the gateway (decode 4, prefill 4) - failures " \
                   "the corruption rate does not count" in r.out.replace("\n", " ")
