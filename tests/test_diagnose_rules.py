"""Diagnosis rules over the synthetic log fixtures in tests/data/diagnose/ (each written after the
public report named on its first line) and over collected numbers (nvidia-smi, /metrics)."""

from __future__ import annotations

import pytest

from dsv4ctl.diagnose.rules import Evidence, diagnose, rule_gpu_busy_no_progress, rule_transfer
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "diagnose"


def _log(name: str) -> str:
    """The fixture with its marker line blanked (it names the report, patterns included); line
    numbers stay those of the file."""
    return "\n" + (DATA / name).read_text().split("\n", 1)[1]


def _ev(name: str, **kw) -> Evidence:
    return Evidence(group=kw.pop("group", "prefill"), host="h1", log=_log(name),
                    log_source=f"h1:logs/{name}", **kw)


def _top(name: str, **kw):
    return diagnose(_ev(name, **kw))[0]


def test_every_fixture_is_marked_synthetic_and_names_its_source():
    for p in DATA.glob("*.log"):
        first = p.read_text().splitlines()[0]
        assert first.startswith("# SYNTHETIC fixture") and "Source:" in first, p.name


@pytest.mark.parametrize("name, where, tried", [
    ("oom_indexer.log", "indexer kernel", "1.42 GiB"),
    ("oom_pool_build.log", "pool build", "12.50 GiB"),
    ("oom_graph_capture.log", "graph capture", "2.00 GiB"),
])
def test_cuda_oom_and_where(name, where, tried):
    f = _top(name)
    assert (f.rule, f.detail["where"], f.detail["tried"], f.runbook) == ("cuda_oom", where, tried, "oom-at-startup")
    assert f.cause == f"CUDA out of memory in the {where} (tried to allocate {tried})"
    assert "OutOfMemoryError" in f.evidence[0] and f.evidence[0].startswith(f"h1:logs/{name}:")
    assert "C2" in f.source or "C1" in f.source


def test_oom_evidence_cites_the_line_number():
    f = _top("oom_indexer.log")
    assert f.evidence[0].startswith("h1:logs/oom_indexer.log:6: torch.OutOfMemoryError")


def test_illegal_memory_access_with_hicache_names_hicache_crash():
    f = _top("illegal_memory_access.log", hicache=True)
    assert (f.rule, f.runbook, f.severity) == ("illegal_memory_access", "hicache-crash", "crash")
    assert "sglang#35811" in f.source and "illegal memory access" in f.evidence[0]
    assert _top("illegal_memory_access.log", hicache=False).runbook == "bad-release"


def test_nan_sampling_names_every_rank():
    f = _top("nan_sampling.log", hicache=True)
    assert (f.rule, f.runbook, f.detail["ranks"]) == ("nan_sampling", "hicache-crash", ["0", "1", "2", "3"])
    assert "sglang#33656" in f.source


def test_hicache_load_back():
    f = _top("hicache_load_back.log", hicache=True)
    assert (f.rule, f.runbook) == ("hicache_load_back", "hicache-crash")
    assert any("commit_hicache_transfer" in e for e in f.evidence)
    assert any("NoneType' has no len()" in e for e in f.evidence)
    assert "sglang#32331" in f.source


def test_watchdog_eviction_deadlock_vs_full_pool():
    f = _top("watchdog_eviction_deadlock.log", group="decode")
    assert (f.rule, f.runbook) == ("watchdog_stall", "scheduler-stall")
    assert f.cause.startswith("eviction deadlock")
    assert f.detail["pool"] == {"available": 1024, "evictable": 1002311, "total": 1048576, "protected": 512}
    assert "watchdog timeout" in f.evidence[0] and "available_size=1024" in f.evidence[1]
    g = _top("watchdog_full_pool.log", group="decode")
    assert g.rule == "watchdog_stall" and g.cause.startswith("full KV pool")


def test_transfer_errors_by_phase():
    f = _top("transfer_waiting_for_input.log", group="decode", role="decode")
    assert (f.rule, f.runbook) == ("transfer_error", "transfer-wedge")
    assert f.detail["phases"] == {"WaitingForInput": 2, "Bootstrapping": 1} and f.detail["phase"] == "WaitingForInput"
    assert "KVPoll.WaitingForInput" in f.evidence[0]


def test_transfer_queue_frozen_in_the_log():
    f = _top("transfer_wedge.log", group="decode", role="decode")
    assert (f.rule, f.detail["transfer_queue"], f.runbook) == ("transfer_wedge", 58, "transfer-wedge")
    assert "P1" in f.source and "#transfer-req: 58" in f.evidence[0]


def test_transfer_queue_frozen_in_metrics():
    b = {"sglang:num_decode_transfer_queue_reqs": 7, "sglang:generation_tokens_total": 1000}
    a = dict(b)
    (f,) = rule_transfer(Evidence("decode", metrics_before=b, metrics_after=a, window_s=5))
    assert f.rule == "transfer_wedge" and f.detail["transfer_queue"] == 7
    assert f.evidence == ["/metrics: sglang:num_decode_transfer_queue_reqs 7 -> 7, generation_tokens_total +0 in 5 s"]
    a2 = dict(b, **{"sglang:generation_tokens_total": 1200})
    assert rule_transfer(Evidence("decode", metrics_before=b, metrics_after=a2, window_s=5)) == []


def test_kernel_argument_error_at_a_concurrency():
    f = _top("flashmla_invalid_argument.log")
    assert (f.rule, f.detail["concurrency"], f.detail["kernel"]) == ("kernel_argument", 16, "FlashMLA")
    assert f.cause == "FlashMLA invalid argument at concurrency 16" and "sglang#25620" in f.source


def test_dead_process_takes_the_runbook_of_the_crash_that_explains_it():
    fs = diagnose(_ev("nan_sampling.log", alive=False, exit_status=1, hicache=True, health="cannot connect"))
    assert [f.rule for f in fs] == ["nan_sampling", "dead_rank"]
    assert fs[1].runbook == "hicache-crash" and fs[1].detail["explained_by"] == "nan_sampling"
    assert fs[1].evidence[0] == "process state: not running, exit status 1"


def test_dead_process_alone():
    fs = diagnose(Evidence("prefill", alive=False, exit_status=137, health="cannot connect", log="=== dsv4ctl: prefill exited with status 137\n"))
    assert [(f.rule, f.runbook) for f in fs] == [("dead_rank", "scheduler-stall")]


_GPUS_BUSY = [{"index": i, "util_pct": 100.0, "power_w": 690.0} for i in range(4)]
_GPUS_IDLE = [{"index": i, "util_pct": 0.0, "power_w": 120.0} for i in range(4)]
_STUCK = ({"sglang:generation_tokens_total": 5000, "sglang:num_running_reqs": 8},
          {"sglang:generation_tokens_total": 5000, "sglang:num_running_reqs": 8})


def test_gpu_busy_without_progress():
    (f,) = rule_gpu_busy_no_progress(Evidence("prefill", gpus=_GPUS_BUSY, metrics_before=_STUCK[0],
                                              metrics_after=_STUCK[1], window_s=5))
    assert (f.rule, f.runbook, f.detail["util"]) == ("gpu_busy_no_progress", "scheduler-stall", [100.0] * 4)
    assert "GPUs 0,1,2,3 at 100,100,100,100 %" in f.evidence[0] and "+0 in 5 s" in f.evidence[0]


def test_accepted_never_scheduled_d1():
    (f,) = rule_gpu_busy_no_progress(Evidence("prefill", gpus=_GPUS_IDLE, metrics_before=_STUCK[0],
                                              metrics_after=_STUCK[1], window_s=5))
    assert (f.rule, f.runbook) == ("never_scheduled", "bad-release") and "D1" in f.source


def test_progress_or_idle_server_is_not_a_stall():
    moving = {"sglang:generation_tokens_total": 5400, "sglang:num_running_reqs": 8}
    assert rule_gpu_busy_no_progress(Evidence("p", gpus=_GPUS_BUSY, metrics_before=_STUCK[0], metrics_after=moving)) == []
    idle = {"sglang:generation_tokens_total": 5000, "sglang:num_running_reqs": 0}
    assert rule_gpu_busy_no_progress(Evidence("p", gpus=_GPUS_IDLE, metrics_before=idle, metrics_after=idle)) == []


def test_healthy_and_unknown():
    (f,) = diagnose(_ev("healthy.log", alive=True, health="ok"))
    assert (f.rule, f.runbook, f.severity) == ("healthy", None, "ok")
    (u,) = diagnose(_ev("healthy.log", alive=True, health="GET /health: no answer within 5 s"))
    assert u.rule == "unknown" and "no answer" in u.cause
    assert u.evidence == ["/health: GET /health: no answer within 5 s; process alive: yes"]
    # a host that could not be read: not "process alive: None"
    (n,) = diagnose(_ev("healthy.log", alive=None, health="cannot connect"))
    assert n.evidence == ["/health: cannot connect; process alive: unknown (host not read)"]


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.log")
                                         if p.name != "healthy.log" and not p.name.startswith("mn_")))
def test_no_fixture_reads_as_healthy(name):
    """(The ``mn_*`` fixtures are one node's log of a multi-node server: judged with every node's
    evidence in tests/test_diagnose_multinode.py.)"""
    assert diagnose(_ev(name, alive=True, health="ok"))[0].rule not in ("healthy", "unknown")


def test_kv_canary_violations():
    f = _top("kv_canary.log", hicache=True)
    assert (f.rule, f.detail["count"], f.runbook) == ("kv_canary", 2, "hicache-crash")
    assert "kv canary violation" in f.evidence[0]


HEALTHY = dict(group="decode", alive=True, health="ok")


@pytest.mark.parametrize("line", [
    "[2026-12-01 10:00:00] Receive: obj=GenerateReqInput(text='my job died with CUDA out of memory, why?', "
    "sampling_params={'max_new_tokens': 64})",
    "[2026-12-01 10:00:00] Finish: obj=GenerateReqInput(text='RuntimeError: invalid argument in flash_mla kernel')",
    '[2026-12-01 10:00:00] Receive: {"messages": [{"role": "user", "content": "an illegal memory access was encountered"}]}',
    "[2026-12-01 10:00:00] Receive: obj=ChatCompletionRequest(messages=[...'watchdog timeout, the scheduler kills it'])",
    "[2026-12-01 10:00:00] Prefill batch. financial maintenance banana sampling_params temperature=0.6",
])
def test_request_echoes_and_lookalikes_are_not_findings(line):
    ev = Evidence(log=line + "\n", **HEALTHY)
    assert [f.rule for f in diagnose(ev) if f.severity in ("crash", "stall")] == []


def test_long_lines_are_cut_and_ansi_removed():
    ev = Evidence(log="watchdog " * 200_000 + "\n", **HEALTHY)
    assert [len(x) for x in ev.lines()] == [2000]
    ev = Evidence(log="\x1b[31mtorch.OutOfMemoryError: CUDA\x1b[0m out of memory. Tried to allocate 2.00 GiB\n",
                  group="decode", alive=False, health="cannot connect")
    assert "cuda_oom" in [f.rule for f in diagnose(ev)]
