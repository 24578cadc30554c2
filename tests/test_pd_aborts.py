"""PD abort classes (issue 45 item 3): one table (``dsv4ctl.check.classify.pd``) judges what a
client received (``check load``) and what the servers logged (``diagnose``). Message texts as
SGLang 0.5.18-0.5.23 write them (srt/disaggregation decode.py, prefill.py, common/conn.py)."""

from __future__ import annotations

import time

import pytest

from dsv4ctl.check import classify as C
from dsv4ctl.diagnose.rules import Evidence, diagnose
from tests.conftest import run_cli
from tests.standin.harness import free_port, popen_standin, wait_health, write_config

DEC = "Decode transfer failed for request rank=0 decode_req.req.rid='r{n}' decode_req.req.bootstrap_room={n}"
PRE = "Prefill {stage} failed for request rank=1 req.rid='r{n}' req.bootstrap_room={n}"
EXC = " with exception KVTransferError(bootstrap_room={n}): "

MESSAGES = [
    # (message, class): the reason decides when it says more than the stage
    (DEC + EXC + "Aborted by AbortReq.", C.PD_ABORTED),
    (PRE.replace("{stage}", "transfer") + EXC + "Aborted by AbortReq.", C.PD_ABORTED),
    (DEC + EXC + "Request {n} timed out after 300.0s in KVPoll.WaitingForInput", C.PD_TRANSFER),
    (DEC + EXC + "Request {n} timed out after 300.0s in KVPoll.WaitingForInput; no KV chunk was ever sent.",
     C.PD_TRANSFER),
    (DEC + EXC + "Failed to get kvcache from prefill instance, it might be dead", C.PD_TRANSFER),
    (DEC + EXC + "Prefill server with bootstrap_addr: 10.0.0.1:8998 is healthy before, but now it is down. "
     "Request (bootstrap_room: {n}) has been marked as failed.", C.PD_TRANSFER),
    (PRE.replace("{stage}", "bootstrap") + EXC + "Request {n} timed out after 600.0s in KVPoll.Bootstrapping",
     C.PD_BOOTSTRAP),
    ("Decode handshake failed for request rank=3 decode_req.req.rid='r{n}' decode_req.req.bootstrap_room={n}" + EXC
     + "Lost connection with prefill instance (bootstrap_addr: 10.0.0.1:8998)", C.PD_BOOTSTRAP),
    (DEC + EXC + "Could not fetch prefill parallel info from 10.0.0.1:8998 after 3 attempts", C.PD_BOOTSTRAP),
    (PRE.replace("{stage}", "bootstrap"), C.PD_BOOTSTRAP),           # no reason: the stage decides
    (PRE.replace("{stage}", "transfer"), C.PD_TRANSFER),
    ("Request r{n} exceeds the maximum number of tokens: 70000 > 65536", None),      # prefill.py 400: no PD abort
    ("Aborted by AbortReq.", None),                                                   # a reason without a stage
]


def _log_line(i: int, msg: str) -> str:
    return f"[2026-06-01 10:05:{i:02d} DP0 TP0] {msg}"


def test_one_table_classes_the_client_error_and_the_log_line_alike():
    """Every message: check load's class of the HTTP 500 equals the class diagnose counts for the
    logged line; an abort by AbortReq is its own class (was pd_transfer_failed: it is the peer's
    or the client's cancel, not a failed transfer), and diagnose counts every class (was: only
    lines with KVTransferError, as one transfer_error without classes)."""
    lines, want = [], {}
    for i, (text, cls) in enumerate(MESSAGES):
        msg = text.format(n=7000 + i)
        err = 'HTTP 500: {"object": "error", "message": "' + msg + '"}'
        v = C.classify(C.TurnResult(http_status=500, error=err), requires_tool=True, tools={})
        assert v.cls == (cls or C.HTTP_ERROR), msg
        assert C.pd_abort_class(_log_line(i, msg)) == cls, msg
        lines.append(_log_line(i, msg))
        if cls:
            want[cls] = want.get(cls, 0) + 1
    (f,) = [x for x in diagnose(Evidence("decode", "h1", role="decode", log="\n".join(lines), log_source="h1:d.log",
                                         health="ok", alive=True)) if x.rule == "pd_aborts"]
    assert f.detail["classes"] == want == {C.PD_ABORTED: 2, C.PD_TRANSFER: 5, C.PD_BOOTSTRAP: 4}
    assert f.severity == "stall" and f.runbook == "transfer-wedge"
    assert f.cause == "PD requests aborted: 5 KV transfer failed, 4 bootstrap or handshake failed, 2 aborted by AbortReq"


def test_aborts_by_abortreq_alone_are_degraded_without_a_runbook_and_not_unknown():
    log = "\n".join(_log_line(i, (DEC + EXC + "Aborted by AbortReq.").format(n=i)) for i in range(3))
    ev = Evidence("decode", "h1", role="decode", log=log, log_source="h1:d.log", health="GET /health: HTTP 503",
                  alive=True)
    (f,) = diagnose(ev)
    assert (f.rule, f.severity, f.runbook, f.detail["classes"]) == ("pd_aborts", "degraded", None, {C.PD_ABORTED: 3})


def test_standin_pd_aborts_counted_alike_by_check_load_and_diagnose(tmp_path):
    """The stand-in's pd_aborts fault answers every other chat with one of SGLang's PD abort
    messages and logs it: check load's per-class counts equal diagnose's over the same log, and
    the server's counters hold the same totals. A clean stand-in: no PD class, diagnose healthy."""
    cfg = write_config(tmp_path / "serve.yaml", enable_metrics=True, disaggregation_mode="decode")
    counts = {}
    for fault in ((), ("--fault", "pd_aborts")):
        port = free_port()
        proc = popen_standin(["--config", str(cfg), "--host", "127.0.0.1", "--port", str(port),
                              "--ttft-ms", "0", "--itl-ms", "0", *fault])
        try:
            wait_health(f"http://127.0.0.1:{port}")
            r = run_cli("check", "load", f"http://127.0.0.1:{port}", "-c", "2", "--turns", "2", "--min-requests", "20",
                        "--max-corruption", "0.9", "--no-progress", "--json", timeout=120)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            log = proc.stdout.read()
            proc.stdout.close()
        assert r.code == 0, r.err
        (lv,) = r.json()["levels"]
        client = {c: lv["classes"][c]["count"] for c in (C.PD_TRANSFER, C.PD_BOOTSTRAP, C.PD_ABORTED)
                  if lv["classes"][c]["count"]}
        top = diagnose(Evidence("decode", "h1", role="decode", log=log, log_source="h1:d.log", health="ok", alive=True))
        counts[bool(fault)] = (client, top, lv)
    client, top, _ = counts[False]
    assert client == {} and [f.rule for f in top] == ["healthy"]
    client, top, lv = counts[True]
    (f,) = [x for x in top if x.rule == "pd_aborts"]
    assert f.detail["classes"] == client and set(client) == {C.PD_TRANSFER, C.PD_BOOTSTRAP, C.PD_ABORTED}
    assert lv["classes"]["http_error"]["count"] == 0
    m = lv["metrics"]
    assert m["sglang:num_transfer_failed_reqs_total"] == client[C.PD_TRANSFER] + client[C.PD_ABORTED]
    assert m["sglang:num_bootstrap_failed_reqs_total"] == client[C.PD_BOOTSTRAP]
    assert lv["pd_failures_per_min"]["aborted"] == pytest.approx(60 * client[C.PD_ABORTED] / lv["duration_s"], rel=0.01)
