"""Issue 44.5: ``plan --csv`` names each rank's node and host; a ``fails`` prints a fix or says why
none exists; checkpoint header reading has a total memory cap (exit 2 naming it); on 0.5.18-0.5.20
the ``indexer_logits`` fix is searched by a scan, because a configuration that must hold
``min_requests`` passes only in a window of mem-fraction-static that can be narrower than 0.01."""

from __future__ import annotations

import csv
import io
import re
import struct

from tests.conftest import run_cli
from tests.test_plan_weights import W, make_checkpoint
from tests.test_recipes import PRINTED, plan


def test_plan_csv_has_node_and_host_columns():
    """The shipped Pro profile's prefill is TP16 over two hosts: ranks 0-7 on node 0 (h200-0),
    8-15 on node 1 (h200-1), GPUs 0-7 on each."""
    r = run_cli("plan", "dsv4-pro-4xh200-pd", "--csv", "-g", "prefill")
    assert r.code in (0, 1), r.err
    rows = list(csv.DictReader(io.StringIO(r.out)))
    assert list(rows[0])[:6] == ["group", "role", "rank", "node", "host", "gpu"]
    assert [(x["rank"], x["node"], x["host"], x["gpu"]) for x in rows] == \
        [(str(i), str(i // 8), f"h200-{i // 8}", str(i % 8)) for i in range(16)]


def _errors(*sets: str) -> dict:
    r = run_cli("plan", "--json", *[x for s in sets for x in ("--set", s)])
    assert r.code == 1, r.err
    return {g["name"]: g for g in r.json()["groups"]}


def test_min_requests_above_max_running_requests_gets_a_fix_that_re_plans():
    """1,000 requests asked of a prefill server capped at 256 running: before, no fix (every single
    change stays under the cap); now max-running-requests and the largest context-length that holds
    them, applied, re-plan to what the fix prints."""
    g = _errors("min_requests=1000")["prefill"]
    (fix,) = g["fixes"]
    m = re.match(r"set max-running-requests: 1000 \(from 256\) and context-length: (\d+) \(from 1048576\)", fix)
    assert m, fix
    again = run_cli("plan", "--json", "-g", "prefill", "--set", "min_requests=1000", "--set", "max_running_requests=1000",
                    "--set", f"context_length={m[1]}")
    v = again.json()["groups"][0]
    assert again.code == 0 and v["verdict"]["level"] == PRINTED.search(fix)[1]
    assert min(r["headroom_gib"] for r in v["ranks"]) == float(PRINTED.search(fix)[2])
    longer = run_cli("plan", "--json", "-g", "prefill", "--set", "min_requests=1000", "--set", "max_running_requests=1000",
                     "--set", f"context_length={int(m[1]) + 1024}")
    assert longer.code == 1                  # the largest, to 1,024 tokens


def test_a_fails_without_a_fix_says_why():
    """Requests no pool can hold, and weights on GPUs too small even at 8 x the tp-size: the error
    says what the most generous candidate still plans (before: only the list of changes tried)."""
    g = _errors("min_requests=100000")["decode"]
    assert g["fixes"] == []
    assert g["errors"][0].endswith("; why: at mem-fraction-static 0.99 the full pool holds 19,740,672 tokens, and 100,000 "
                                   "requests of even 4,096 tokens need 409,600,000 (with max-running-requests >= 100,000, "
                                   "now 128)"), g["errors"][0]
    g = _errors("free_gib_before_load=12")["prefill"]
    # Flash's 8 output groups take at most TP 8: the largest GPU count SGLang takes (16, 32 leave a rank none)
    assert g["fixes"] == [] and "; why: at 8 GPUs (tp-size 8, weights ~21.836 GiB per rank) it is still fails (weights): " \
        "the weights (21.836 GiB per rank) and other memory do not fit in 12.0 GiB free per GPU" in g["errors"][0], g["errors"][0]
    g = _errors("model=deepseek-v4-pro", "min_requests=30")["decode"]      # a model change
    assert g["fixes"] == [] and "; why: at 16 GPUs (tp-size 16, weights ~55.227 GiB per rank) it is still fails (requests): 10 request(s) fit" in g["errors"][0], g["errors"][0]


def test_checkpoint_headers_over_the_total_cap_are_exit_2_naming_it(tmp_path, monkeypatch, capsys):
    from dsv4ctl.cli import main
    folder = make_checkpoint(tmp_path / "ck")
    monkeypatch.setenv("DSV4CTL_CACHE", str(tmp_path / "cache"))
    sizes = [struct.unpack("<Q", p.read_bytes()[:8])[0] for p in sorted(folder.glob("*.safetensors"))]
    monkeypatch.setattr(W, "MAX_TOTAL_HEADER_BYTES", sizes[0] + sizes[1] - 1)
    W._read_files.cache_clear()
    try:
        assert main(["plan", "--set", f"model={folder}"]) == 2
    finally:
        W._read_files.cache_clear()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"the checkpoint's safetensors headers take more than {sizes[0] + sizes[1] - 1:,} bytes together" in err


def test_indexer_logits_fix_on_0_5_20_is_found_in_a_window_narrower_than_0_01(tmp_path):
    """Flash on 4 H200 with SGLang 0.5.20 (logits of an 8,192-row chunk in one fp32 tensor), 11
    requests of 1,028,096 tokens asked, mem-fraction-static 0.95: fails on the logits. Only 0.893-0.895
    plan (below, 11 requests do not fit; above, the headroom lands under 90 % of SGLang's estimate):
    0.89 and 0.90, the 0.01 steps around it, both fail or stay under the estimate, so a search by
    0.01 steps found no mem-fraction-static; the scan finds 0.895, which re-plans as printed."""
    e = {"id": "w", "hw": "h200", "model": "deepseek-v4-flash", "nnodes": 1,
         "serve": {"tp-size": 4, "chunked-prefill-size": 8192}, "sglang": {"version": "0.5.20"},
         "set": ["min_requests=11", "context_length=1028096"]}
    g = plan(tmp_path, e, "mem_fraction_static=0.95")
    assert (g["verdict"]["level"], g["verdict"]["deciding"]) == ("fails", "indexer_logits")
    assert g["fixes"][0].startswith("set mem-fraction-static: 0.895 (from 0.95) in the serve config"), g["fixes"]
    at = plan(tmp_path, e, "mem_fraction_static=0.895")
    assert at["verdict"]["level"] == PRINTED.search(g["fixes"][0])[1] != "fails"
    for m, want in (("0.89", ("fails", "requests")), ("0.9", ("tight", "activation")), ("0.892", ("fails", "requests"))):
        v = plan(tmp_path, e, f"mem_fraction_static={m}")["verdict"]
        assert (v["level"], v["deciding"]) == want, (m, v)
