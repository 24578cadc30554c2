"""``dsv4ctl check load`` end to end: the real CLI (subprocess) against the stand-in SGLang
server (subprocess) over real HTTP on 127.0.0.1. Reproduces the issue-6 incident: 0 % at one
session, about 15 % at 60 with HiCache on, 0 % with HiCache off, stuck transfers."""

from __future__ import annotations

import json
import urllib.request

import pytest

from dsv4ctl.check.stats import wilson
from tests.conftest import run_cli
from tests.standin.harness import free_port, standin, write_config

FAST = ("--ttft-ms", "2", "--itl-ms", "0.1")
COMMON = ("--turns", "8", "--answer-words", "40")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    d = tmp_path_factory.mktemp("load")
    on = write_config(d / "hicache-on.yaml", enable_hierarchical_cache=True, hicache_ratio=2.0)
    off = write_config(d / "hicache-off.yaml")
    with standin(on, *FAST) as url_on, standin(off, *FAST) as url_off:
        yield {"on": url_on, "off": url_off}


def test_incident_reproduced_and_compared(servers, tmp_path):
    rec = tmp_path / "turns.jsonl"
    r = run_cli("check", "load", "--compare", servers["on"], servers["off"], "-c", "1,60", *COMMON,
                "--records", str(rec), "--json", timeout=300)
    assert r.code == 1, r.err
    assert "dsv4ctl: gate failed: check load: " + servers["on"] + " c=60: corruption" in r.err
    doc = r.json()
    lv = {(x["url"], x["concurrency"]): x for x in doc["levels"]}
    on1, on60, off1, off60 = (lv[(servers["on"], 1)], lv[(servers["on"], 60)],
                              lv[(servers["off"], 1)], lv[(servers["off"], 60)])
    # 0 % at one session (381 turns: the smallest count for which 0 failures pass a 1 % gate)
    assert (on1["turns"], on1["corrupted"], on1["pass"]) == (381, 0, True)
    assert on1["wilson95"][1] <= 0.01
    # about 15 % at 60 sessions with HiCache on: the interval contains 15 %, the rate is 10-20 %
    assert on60["turns"] == 480 and not on60["pass"]
    assert on60["wilson95"][0] <= 0.15 <= on60["wilson95"][1]
    assert 0.10 <= on60["rate"] <= 0.20
    assert on60["wilson95"] == [round(x, 6) for x in wilson(on60["corrupted"], 480)]
    assert on60["classes"]["dsml_in_content"]["count"] == max(c["count"] for c in on60["classes"].values())
    assert sum(c["count"] for c in on60["classes"].values()) == on60["corrupted"]
    # 0 % with HiCache off, at both levels; the gate passes there
    assert (off1["corrupted"], off60["corrupted"], off60["pass"]) == (0, 0, True)
    # the comparison: significant at 60, not at 1
    cmp = {c["concurrency"]: c for c in doc["comparisons"]}
    assert cmp[1]["fisher_p"] == 1.0 and not cmp[1]["significant"]
    assert cmp[60]["significant"] and cmp[60]["fisher_p"] < 1e-10
    assert cmp[60]["difference"] == pytest.approx(on60["rate"])
    assert cmp[60]["difference_ci95"][0] > 0.08
    # /metrics deltas seen by the server match the turns the client sent
    assert on60["metrics"]["sglang:num_requests_total"] == 480
    assert on60["metrics"]["cache_hit_rate_during_run"] > 0.5      # growing sessions reuse prefixes
    # per-turn records: one per turn, unique request ids echoed by the server, classes agree
    recs = [json.loads(x) for x in rec.read_text().splitlines()]
    assert len(recs) == 381 * 2 + 480 * 2
    assert len({x["rid"] for x in recs}) == len(recs)
    assert all(x["response_id"] == x["rid"] for x in recs)
    bad60 = [x for x in recs if x["url"] == servers["on"] and x["concurrency"] == 60 and x["class"] != "ok"]
    assert len(bad60) == on60["corrupted"]
    # markup split across SSE chunks (the stand-in writes it as 3-character text tokens) is caught
    assert any(x["stream"] and x["class"] == "dsml_in_content" and x["chunks"] > 10 for x in bad60)
    assert any(not x["stream"] and x["class"] == "dsml_in_content" for x in bad60)
    # the excerpt shows the markup, in any of the incident's bar spellings (｜ U+FF5C, and the
    # other_bars / ascii_bars kinds: ‖ U+2016, |): which kinds a run draws depends on scheduling
    marks = ("\uff5cDSML\uff5c", "\u2016DSML\u2016", "|DSML|")
    assert all(any(m in x["content_excerpt"] for m in marks) for x in bad60 if x["class"] == "dsml_in_content")
    seen = {x["class"] for x in bad60}         # the incident's kinds reach the client as their classes
    assert {"dsml_in_content", "think_in_content", "args_not_json"} <= seen, seen
    # stderr is not a terminal here: no progress bar, only the one error line
    total = 381 * 2 + 480 * 2
    assert f"{total}/{total}" not in r.err and r.err.count("\n") == 1


def test_gate_passes_with_hicache_off_and_renders(servers):
    r = run_cli("check", "load", servers["off"], "-c", "60", *COMMON, "--markdown", "--no-progress")
    assert r.code == 0, r.err
    assert "## dsv4ctl check load" in r.out and "**gate (95 % Wilson upper bound <= 1.00 %): pass**" in r.out
    assert f"| {servers['off']} | 60 | 480 | 0 | 0.00 % |" in r.out
    r = run_cli("check", "load", servers["off"], "-c", "20", "--turns", "2", "--min-requests", "40", "--no-progress")
    assert r.code == 1 and "upper bound 8.76 % > 1.00 %, 0/40" in r.err       # 0/40 cannot prove 1 %
    assert "corruption per level" in r.out


@pytest.mark.parametrize("limit,code", [("0.165", 1), ("0.2", 0)])
def test_gate_is_on_the_wilson_upper_bound(servers, limit, code):
    # about 72/480 = 15 % is under 16.5 %, but its upper bound (about 18.5 %) is not
    r = run_cli("check", "load", servers["on"], "-c", "60", *COMMON, "--max-corruption", limit, "--json",
                "--no-progress")
    assert r.code == code, (r.err, r.out[-3000:])
    lv = r.json()["levels"][0]
    assert lv["rate"] < 0.165 < lv["wilson95"][1] < 0.2


def test_stuck_transfers_are_detected(tmp_path):
    cfg = write_config(tmp_path / "serve.yaml")
    with standin(cfg, *FAST, "--stuck-rate", "0.05") as url:
        rec = tmp_path / "r.jsonl"
        r = run_cli("check", "load", url, "-c", "10", "--turns", "4", "--min-requests", "40", "--stall-timeout", "1",
                    "--answer-words", "20", "--max-corruption", "0.5", "--json", "--records", str(rec), "--no-progress")
        assert r.code == 0, r.err                      # 2/40 stuck is within a 50 % gate
        lv = r.json()["levels"][0]
        assert (lv["turns"], lv["stuck"], lv["corrupted"], lv["classes"]["stuck"]["count"]) == (40, 2, 2, 2)
        stuck = [json.loads(x) for x in rec.read_text().splitlines() if '"stuck"' in x]
        assert len(stuck) == 2 and all(x["http_status"] is None and "no progress for 1 s" in x["reason"] for x in stuck)
        assert all(0.9 < x["e2e_s"] < 5 for x in stuck)
        with urllib.request.urlopen(url + "/metrics") as m:
            text = m.read().decode()
        assert 'sglang:num_aborted_requests_total{' in text
        aborted = [ln for ln in text.splitlines() if ln.startswith("sglang:num_aborted_requests_total{")][0]
        assert aborted.endswith(" 2.0")
        r = run_cli("check", "load", url, "-c", "10", "--turns", "4", "--min-requests", "40", "--stall-timeout", "1",
                    "--answer-words", "20", "--no-progress")
        assert r.code == 1 and "dsv4ctl: gate failed: check load: " in r.err


def test_usage_and_connection_errors_exit_2(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    cases = [
        (("check", "load", dead, "-c", "2"), "check load: cannot connect to " + dead.removeprefix("http://") + " (connection refused)"),
        (("check", "load", "127.0.0.1:8000"), "must start with http://"),
        (("check", "load", dead, "-c", "0"), "--concurrency '0'"),
        (("check", "load", dead, "-c", "4,x"), "positive integers"),
        (("check", "load"), "give exactly one of"),
        (("check", "load", dead, "--profile", "dsv4-flash-8xb200-pd"), "give exactly one of"),
        (("check", "load", "--compare", dead, dead), "two different URLs"),
        (("check", "load", dead, "--stream", "sometimes"), "--stream 'sometimes'"),
        (("check", "load", dead, "--max-corruption", "1.5"), "--max-corruption"),
        (("check", "load", dead, "--records", str(tmp_path / "no" / "r.jsonl")), "--records"),
    ]
    for args, needle in cases:
        r = run_cli(*args)
        assert r.code == 2, (args, r.out, r.err)
        assert r.err.startswith("dsv4ctl: error: ") and needle in r.err, (args, r.err)
        assert "Traceback" not in r.err


def test_interrupt_exits_130_and_keeps_records(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO
    cfg = write_config(tmp_path / "serve.yaml")
    with standin(cfg, *FAST, "--stuck-rate", "0.5") as url:
        rec = tmp_path / "r.jsonl"
        p = subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", "check", "load", url, "-c", "4", "--turns", "2",
                              "--stall-timeout", "60", "--records", str(rec), "--no-progress"],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, NO_COLOR="1"),
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as in a terminal
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not rec.exists() or not rec.read_text()):
            time.sleep(0.1)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        assert p.returncode == 130, err
        assert err.strip().endswith(f"dsv4ctl: error: interrupted (records so far in {rec})") and "Traceback" not in err
        assert all(json.loads(x)["class"] == "ok" for x in rec.read_text().splitlines())


def test_max_duration_caps_a_level(servers, tmp_path):
    """Issue 31: 381 turns at concurrency 1 take many minutes on real hardware. --max-duration
    stops issuing turns after that many seconds per level; the level says it was capped and is
    judged on what it has (too few turns to pass a 1 % gate: fails, exit 1)."""
    import time
    t0 = time.monotonic()
    r = run_cli("check", "load", servers["off"], "-c", "1,2", "--turns", "4", "--min-requests", "100000",
                "--max-duration", "1.5", "--answer-words", "20", "--json", "--no-progress", timeout=120)
    took = time.monotonic() - t0
    assert r.code == 1, r.err
    doc = r.json()
    assert doc["settings"]["max_duration_s"] == 1.5
    assert [lv["capped_by_max_duration"] for lv in doc["levels"]] == [True, True]
    assert all(0 < lv["turns"] < 100000 and lv["duration_s"] < 1.5 + 10 for lv in doc["levels"])
    assert took < 60
    r = run_cli("check", "load", servers["off"], "--max-duration", "0", "--no-progress")
    assert r.code == 2 and "--max-duration" in r.err


def test_verbose_lines_per_bad_turn_and_quiet_verdict_only(servers, tmp_path):
    """Issue 31: -v/-q on every command that prints progress. -v: a stderr line per turn not ok
    (masked like --records, which still get every turn); -q: no progress, the verdict line alone."""
    rec = tmp_path / "turns.jsonl"
    r = run_cli("check", "load", servers["on"], "-c", "60", *COMMON, "-v", "--records", str(rec), "--json", "--no-progress")
    assert r.json()["levels"][0]["turns"] == 480
    bad = [x for x in map(json.loads, rec.read_text().splitlines()) if x["class"] != "ok"]
    lines = [ln for ln in r.err.splitlines() if ln.startswith("check load: ") and " rid " in ln]
    assert len(rec.read_text().splitlines()) == 480 and len(bad) > 0
    assert len(lines) == len(bad) and f"turn {bad[0]['turn']}: {bad[0]['class']} (" in "\n".join(lines)
    r = run_cli("check", "load", servers["off"], "-c", "60", *COMMON, "-q")
    assert r.code == 0 and r.out == "gate (95 % Wilson upper bound <= 1.00 %): pass\n", (r.out, r.err)
    r = run_cli("check", "load", servers["off"], "-v", "-q")
    assert r.code == 2 and r.err == "dsv4ctl: error: -v/--verbose and -q/--quiet cannot be used together (pick one)\n"
