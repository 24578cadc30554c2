"""Every corruption class, driven through the stand-in's real served path (SGLang 0.5.23's
DeepSeekRecipeOutputParser on the V4 tokenizer): the stand-in's model *writes* the corrupted text
(``--fault KIND``), the real ``dsv4ctl check load`` / ``check smoke`` CLI reads it over HTTP on
127.0.0.1, and the gate fails with that class (with an example record for it). No response is
built by hand here."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.standin.harness import standin, write_config

FAST = ("--ttft-ms", "0", "--itl-ms", "0")
LOAD = ("--turns", "4", "--answer-words", "80", "-c", "2", "--min-requests", "24", "--no-progress", "--json")

CASES = [
    # (fault, expected class, extra check-load flags, serve-config changes)
    ("markup_as_text", "dsml_in_content", (), {}),
    ("other_bars", "dsml_in_content", (), {}),
    ("ascii_bars", "dsml_in_content", (), {}),
    ("think_leak", "think_in_content", (), {}),
    ("special_token", "special_token_leak", (), {}),
    ("bad_json_value", "args_not_json", (), {}),
    ("json_body_invoke", "empty_args", (), {}),
    ("truncated", "length_mid_call", (), {}),
    ("no_call", "no_tool_call", (), {}),
    ("markup_in_args", "markup_in_args", (), {}),
    ("quoted_cut", "markup_cut", (), {}),
    ("closer_in_args", "args_cut", (), {}),
    ("wrong_args", "wrong_args", (), {}),
    ("dropped_block", "missing_call", (), {}),
    ("extra_call", "extra_call", (), {}),
    ("wrong_tool", "wrong_tool", (), {}),
    ("loop", "ngram_loop", (), {}),
    ("language_switch", "language_switch", (), {}),
    ("language_mix", "language_mix", (), {}),
    ("dsml_in_reasoning", "dsml_in_reasoning", ("--thinking",), {}),
    ("empty_length", "empty_length", ("--thinking",), {}),
    (None, "reasoning_in_content", ("--thinking",), {"reasoning_parser": None}),
]


@pytest.mark.parametrize("fault,cls,flags,config", CASES, ids=[f"{c[0]}->{c[1]}" for c in CASES])
def test_each_class_fails_the_gate_through_the_served_path(tmp_path, fault, cls, flags, config):
    cfg = write_config(tmp_path / "serve.yaml", **config)
    with standin(cfg, *FAST, *(("--fault", fault) if fault else ())) as url:
        rec = tmp_path / "turns.jsonl"
        r = run_cli("check", "load", url, *LOAD, *flags, "--records", str(rec), timeout=120)
    assert r.code == 1, r.err
    lv = r.json()["levels"][0]
    assert lv["classes"][cls]["count"] > 0, {k: v["count"] for k, v in lv["classes"].items() if v["count"]}
    ex = lv["examples"][cls]
    recs = {x["rid"]: x for x in map(json.loads, rec.read_text().splitlines())}
    assert recs[ex["rid"]]["class"] == cls and ex["reason"] == recs[ex["rid"]]["reason"]


def test_quoted_markup_is_a_note_not_corruption(tmp_path):
    cfg = write_config(tmp_path / "serve.yaml")
    with standin(cfg, *FAST, "--fault", "quoted_markup") as url:
        rec = tmp_path / "turns.jsonl"
        r = run_cli("check", "load", url, *LOAD, "--max-corruption", "0.2", "--records", str(rec), timeout=120)
    assert r.code == 0, r.err
    recs = [json.loads(x) for x in rec.read_text().splitlines()]
    answers = [x for x in recs if not x["requires_tool"]]
    assert answers and all(x["class"] == "ok" for x in recs)
    assert all(any("quoted DSML" in n for n in x["notes"]) for x in answers)


@pytest.mark.parametrize("fault,line,words", [
    ("call_when_none", "tool_choice_none", "sglang #35736"),
    ("overlength_200", "over_length", "HTTP 200"),
    ("overlength_200", "over_pool", "HTTP 200"),
    ("language_drift", "chat", "language_drift: content is 100% CJK letters; the prompt asked for Latin"),
    ("replay_differs", "replay", "the cached replay"),
])
def test_smoke_probes_catch_server_faults(tmp_path, fault, line, words):
    cfg = write_config(tmp_path / "serve.yaml", context_length=4096, max_total_tokens=2048)
    with standin(cfg, *FAST, "--fault", fault) as url:
        r = run_cli("check", "smoke", url, "--json", timeout=120)
    assert r.code == 1, r.err
    lines = {x["check"]: x for x in r.json()["checks"]}
    assert lines[line]["status"] == "fail" and words in lines[line]["reason"], lines[line]


def test_clean_stand_in_has_no_flagged_turn_in_5000_at_64_sessions(tmp_path):
    """No false positives: corruption off, 64 sessions, >= 5,000 turns of the default workload
    (known-answer, free-form, probe and long-answer turns; JSON and SSE) -> 0 flagged."""
    cfg = write_config(tmp_path / "serve.yaml")
    with standin(cfg, *FAST) as url:
        r = run_cli("check", "load", url, "-c", "64", "--min-requests", "5000", "--no-progress", "--json",
                    "--records", str(tmp_path / "turns.jsonl"), timeout=900)
    assert r.code == 0, r.err
    lv = r.json()["levels"][0]
    assert lv["turns"] >= 5000 and lv["corrupted"] == 0, {k: v["count"] for k, v in lv["classes"].items() if v["count"]}
    recs = [json.loads(x) for x in (tmp_path / "turns.jsonl").read_text().splitlines()]
    assert {x["class"] for x in recs} == {"ok"}
    kinds = {("known" if x["expected_calls"] else "probe" if x["tool_choice"] not in (None, "auto") else
              "tool" if x["requires_tool"] else "answer") for x in recs}
    assert kinds == {"known", "probe", "tool", "answer"} and {x["stream"] for x in recs} == {True, False}


def test_pd_transfer_aborts_are_their_own_class_with_a_rate_per_minute(tmp_path):
    """The stand-in answers every fourth chat with SGLang 0.5.23's HTTP 500 for a failed PD KV
    transfer and counts it in sglang:num_transfer_failed_reqs: check load names the class and
    gives the client's and the server's rates per minute."""
    cfg = write_config(tmp_path / "serve.yaml", enable_metrics=True)
    with standin(cfg, *FAST, "--fault", "transfer_500") as url:
        r = run_cli("check", "load", url, "-c", "2", "--turns", "2", "--min-requests", "16", "--max-corruption", "0.9",
                    "--no-progress", "--json", timeout=120)
    assert r.code == 0, r.err
    (lv,) = r.json()["levels"]
    k = lv["classes"]["pd_transfer_failed"]["count"]
    assert k >= 3 and lv["classes"]["http_error"]["count"] == 0
    pd = lv["pd_failures_per_min"]
    assert pd["transfer_failed"] == pytest.approx(60 * k / lv["duration_s"], rel=0.01)
    assert pd["server_transfer_failed"] == pytest.approx(60 * lv["metrics"]["sglang:num_transfer_failed_reqs_total"]
                                                         / lv["duration_s"], rel=0.01)
    assert lv["metrics"]["sglang:num_transfer_failed_reqs_total"] == k
    assert pd["bootstrap_failed"] == 0
    assert "Decode transfer failed for request" in lv["examples"]["pd_transfer_failed"]["reason"]
