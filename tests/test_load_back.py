"""The HiCache load-back probe (issue 45 item 3): ``check smoke``'s ``load_back`` evicts the
known-answer prompt from the device tier with filler sized from the running pool, so that asking
again loads its prefix back from the host tier. The stand-in keeps both tiers
(tests/standin/tiers.py) and its fault ``load_back_indexer`` corrupts only answers built on a
prefix loaded back from the host: ``replay`` (whose flush resets the host tier too) passes it,
``load_back`` fails it."""

from __future__ import annotations

from dsv4ctl.check.smoke import LOAD_BACK_FILL, load_back_plan
from tests.conftest import run_cli
from tests.standin.harness import standin, write_config

FAST = ("--ttft-ms", "1", "--itl-ms", "0")
POOL = {"max_total_tokens": 16384, "context_length": 24576}     # a small context: the over_length probe stays cheap


def _lines(doc: dict) -> dict:
    return {c["check"]: c for c in doc["checks"]}


def test_load_back_catches_the_fault_smoke_without_it_passes_and_a_clean_host_tier_passes(tmp_path):
    cfg = write_config(tmp_path / "s.yaml", enable_hierarchical_cache=True, hicache_ratio=2.0, **POOL)
    with standin(cfg, *FAST, "--fault", "load_back_indexer") as url:
        r = run_cli("check", "smoke", url, "--json")
    assert r.code == 1, r.err
    lines = _lines(r.json())
    lb = lines["load_back"]
    assert lb["status"] == "fail" and lb["reason"].startswith("the answer loaded back from the host tier (")
    assert lb["detail"]["host_tokens"] > 0 and lb["detail"]["pool"] == 16384
    assert lb["detail"]["fill"] == int(LOAD_BACK_FILL * 16384) and lb["detail"]["requests"] == 2
    # every other line passes: smoke without the probe let this release through
    assert [c for c, x in lines.items() if x["status"] != "pass" and c != "load_back"] == []
    assert lines["replay"]["status"] == "pass"
    assert "dsv4ctl: gate failed: check smoke: 1 check(s) failed: load_back" in r.err

    with standin(cfg, *FAST) as url:
        r = run_cli("check", "smoke", url, "--json")
    assert r.code == 0, r.err
    lb = _lines(r.json())["load_back"]
    assert lb["status"] == "pass" and "with the prefix loaded back from the host tier (" in lb["reason"]
    assert lb["detail"]["host_tokens"] > 0 and lb["detail"]["device_tokens"] == 0


def test_without_hicache_there_is_no_load_back_line_and_the_plan_says_why_it_skips():
    assert load_back_plan([{"enable_hierarchical_cache": False, "max_total_num_tokens": 1000}], "u") == (None, None)
    hc = {"enable_hierarchical_cache": True, "max_total_num_tokens": 200_000, "max_req_input_len": 65_530,
          "hicache_ratio": 2.0}
    plan, skip = load_back_plan([hc], "u")
    assert skip is None and plan == {"pool": 200_000, "ratio": 2.0, "fill": 300_000, "per": 32768, "requests": 10}
    _, skip = load_back_plan([dict(hc, hicache_ratio=1.2)], "u")
    assert skip["status"] == "skip" and skip["reason"].startswith("hicache_ratio 1.2: the host tier cannot keep")
    _, skip = load_back_plan([dict(hc, max_total_num_tokens=None)], "u")
    assert skip["reason"].startswith("HiCache on but no server_info max_total_num_tokens")
    _, skip = load_back_plan([dict(hc, max_total_num_tokens=9_000_000)], "u")
    assert skip["reason"] == "a device pool of 9000000 tokens needs 412 filler prompts of 32768 tokens (over 256)"
