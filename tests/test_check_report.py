"""dsv4ctl.check.report and dsv4ctl.check.workload: pure cores."""

from __future__ import annotations

import pytest

from dsv4ctl.check import classify as C
from dsv4ctl.check import report as R
from dsv4ctl.check.workload import ANSWER_INSTRUCTION, SYSTEM_PROMPT, TOOL_NAMES, Session, sessions


def rec(cls: str = "ok", stream: bool = True, ttft: float | None = 0.1, e2e: float = 0.5, tokens: int = 10) -> dict:
    return {"class": cls, "stream": stream, "ttft_s": ttft, "e2e_s": e2e, "completion_tokens": tokens}


@pytest.mark.parametrize("m,n", [(0.01, 381), (0.05, 73), (0.1, 35), (0.5, 4)])
def test_min_requests_for_gate(m, n):
    assert R.min_requests_for_gate(m) == n
    from dsv4ctl.check.stats import wilson
    assert wilson(0, n)[1] <= m < wilson(0, n - 1)[1]
    with pytest.raises(ValueError):
        R.min_requests_for_gate(0)


def test_summarize_level_counts_failures_in_the_denominator():
    records = [rec()] * 90 + [rec("dsml_in_content")] * 6 + [rec("stuck", ttft=None)] * 2 + [rec("http_error")] * 2
    s = R.summarize_level(records, url="u", concurrency=60, duration_s=10.0, itl_gaps=[0.01, 0.02, 0.03],
                          max_corruption=0.2)
    assert (s["turns"], s["corrupted"], s["rate"], s["stuck"]) == (100, 10, 0.1, 2)
    assert s["classes"]["dsml_in_content"] == {"count": 6, "rate": 0.06, "wilson95": [0.027786, 0.124768]}
    assert s["wilson95"] == [0.055229, 0.174366] and s["pass"] is True
    assert s["requests_per_s"] == 10.0 and s["output_tokens_per_s"] == 100.0
    assert s["itl_s"] == {"p50": 0.02, "p90": 0.028, "p99": 0.0298}
    assert s["ttft_s"]["p50"] == 0.1 and s["streaming_turns"] == 100
    assert R.summarize_level(records, url="u", concurrency=60, duration_s=10.0, itl_gaps=[],
                             max_corruption=0.17)["pass"] is False
    empty = R.summarize_level([], url="u", concurrency=1, duration_s=0.0, itl_gaps=[], max_corruption=0.01)
    assert (empty["rate"], empty["wilson95"], empty["pass"], empty["requests_per_s"]) == (None, [0.0, 1.0], False, None)


def test_compare_levels_and_doc():
    a = {"url": "A", "concurrency": 60, "turns": 480, "corrupted": 72, "rate": 0.15, "pass": False}
    b = {"url": "B", "concurrency": 60, "turns": 480, "corrupted": 0, "rate": 0.0, "pass": True}
    c = R.compare_levels(a, b)
    assert c["difference"] == 0.15 and c["significant"] and c["fisher_p"] < 1e-20
    assert c["difference_ci95"][0] < 0.15 < c["difference_ci95"][1]
    same = R.compare_levels(b, {**b, "url": "C"})
    assert same["fisher_p"] == 1.0 and not same["significant"]
    doc = R.build_doc([a, b], max_corruption=0.01, settings={}, comparisons=[c])
    assert doc["schema"] == "dsv4ctl.check.load/1" and doc["pass"] is False
    assert R.compare_rows(doc)[1] == [["60", "15.00 %", "0.00 %", "15.00 %",
                                       f"{R.fmt_pct(c['difference_ci95'][0])} – {R.fmt_pct(c['difference_ci95'][1])}",
                                       f"{c['fisher_p']:.3g}", "yes"]]


def test_metrics_delta():
    before = {"sglang:prompt_tokens_total": 100.0, "sglang:cached_tokens_total": 10.0,
              "sglang:num_aborted_requests_total": 1.0, "sglang:num_running_reqs": 3.0}
    after = {"sglang:prompt_tokens_total": 1100.0, "sglang:cached_tokens_total": 810.0,
             "sglang:num_aborted_requests_total": 3.0, "sglang:num_running_reqs": 0.0, "other": 5.0}
    d = R.metrics_delta(before, after)
    assert d == {"sglang:num_aborted_requests_total": 2.0, "sglang:prompt_tokens_total": 1000.0,
                 "sglang:cached_tokens_total": 800.0, "sglang:num_running_reqs": 0.0,
                 "cache_hit_rate_during_run": 0.8}
    assert R.metrics_delta(None, after) is None


def test_tables_render_every_level():
    recs = [rec()] * 9 + [rec("args_schema")]
    lv = R.summarize_level(recs, url="u", concurrency=4, duration_s=1.0, itl_gaps=[0.01], max_corruption=0.01)
    doc = R.build_doc([lv], max_corruption=0.01, settings={})
    h, rows = R.level_rows(doc)
    assert rows == [["u", "4", "10", "1", "10.00 %", "1.79 % – 40.41 %", "FAIL", "0", "args_schema (1)", "10.0",
                     "100.0 / 100.0", "10.0 / 10.0", "500.0 / 500.0"]]
    assert R.class_rows(doc)[1] == [[f"args_schema ({C.DESCRIPTIONS['args_schema']})", "1 (10.00 %)"]]


# --- workload -------------------------------------------------------------------------------
def test_session_turns_grow_and_reuse_the_prefix():
    s = Session(sid=1, turns=3, stream=True, known_share=0.0, probe_share=0.0)     # free-form turns only
    assert [s.spec(t).tool for t in range(3)] == [TOOL_NAMES[1], TOOL_NAMES[2], None]
    b0 = s.request("m", "r0")
    assert b0["messages"][0] == {"role": "system", "content": SYSTEM_PROMPT} and b0["stream"] and b0["rid"] == "r0"
    assert b0["messages"][-1]["content"].endswith(f"call the {TOOL_NAMES[1]} tool.")
    first = list(b0["messages"])
    s.advance(C.TurnResult(tool_calls=[C.ToolCall(0, "call_x", TOOL_NAMES[1], '{"command": "ls", "timeout_s": 1}')]), True)
    b1 = s.request("m", "r1")
    assert b1["messages"][:len(first)] == first                     # the previous request is a prefix
    assert b1["messages"][len(first)]["tool_calls"][0]["id"] == "call_x"
    assert b1["messages"][-1]["role"] == "tool" and b1["messages"][-1]["content"].endswith(f"call the {TOOL_NAMES[2]} tool.")
    s.advance(C.TurnResult(tool_calls=[C.ToolCall(0, None, TOOL_NAMES[2], "{}")]), True)
    b2 = s.request("m", "r2")
    assert b2["max_tokens"] == 1024 and b2["messages"][-1]["content"].endswith(ANSWER_INSTRUCTION.format(words=150)[-40:])
    s.advance(C.TurnResult(content="done"), True)
    assert s.done


def test_failed_turn_restarts_the_conversation():
    s = Session(sid=0, turns=4, stream=False, known_share=0.0, probe_share=0.0)
    s.advance(None, False)
    assert s.restarts == 1 and len(s.messages) == 2 and "(retry 1)" in s.messages[-1]["content"]
    assert s.messages[-1]["content"].endswith(f"call the {TOOL_NAMES[1]} tool.")


def test_sessions_stream_modes():
    assert [x.stream for x in sessions(4, 2, "mixed")] == [True, False, True, False]
    assert all(x.stream for x in sessions(3, 2, "on")) and not any(x.stream for x in sessions(3, 2, "off"))
    with pytest.raises(ValueError):
        sessions(1, 1, "maybe")
    with pytest.raises(ValueError):
        Session(sid=0, turns=0, stream=True)
    assert Session(sid=0, turns=1, stream=True).spec().requires_tool     # a one-turn session is a tool turn
