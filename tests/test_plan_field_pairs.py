"""Field pairs (issue 44.3): a setting the field saw fail and its published fix, planned side by side.

* GB300 Pro DEP4 at ``mem-fraction-static`` 0.78 (issue 44; sgl-project/sglang#23817 set the cell to 0.9
  when it verified it): the weights the plan estimates for DEP4 with the EAGLE draft, the draft's own
  embedding and head included (held while the pools are sized, ``deepseek_v4_nextn.py``), leave no
  KV memory at 0.78: ``fails``; the published 0.9 does not fail.
* The EAGLE draft's own embedding and head: counted when the pools are built, given back after
  (``set_embed_and_head``), so a rank whose pools fit only once they are freed fails ``pools``.
* The decode forward's C4 indexer logits: DeepGEMM's rectangle at the full context, every EAGLE
  draft token a row (the ``indexer_logits`` need).
* B300 Pro DEP4 at 0.93 vs 0.90 (SemiAnalysisAI/InferenceX#2226: scheduler OOMs in
  ``deep_gemm.fp8_paged_mqa_logits``, "2.9-4.8 GiB free for 4.2-6.1 GiB allocations"): with the
  activation at the chunk a DP-attention rank runs, 0.93 is ``tight`` short of the indexer need,
  0.90 ``fits`` (docs/plan-calibration.md).
"""

from __future__ import annotations

import pytest

from dsv4ctl.plan import verdict as vd
from tests.test_recipes import CORPUS, plan as _plan

GIB = 1 << 30
RECIPES = {e["id"]: e for e in CORPUS["recipes"]}
FAILURES = {e["id"]: e for e in CORPUS["known_failures"]}


def plan(tmp, e: dict) -> dict:
    """:func:`tests.test_recipes.plan` in a folder of its own."""
    tmp.mkdir(parents=True, exist_ok=True)
    return _plan(tmp, e)


def test_gb300_pro_dep4_at_078_fails_and_its_published_fix_does_not(tmp_path):
    bad = plan(tmp_path / "bad", FAILURES["gb300-pro-dep4-mfs-0.78-sglang-23817"])
    fix = plan(tmp_path / "fix", RECIPES["gb300-pro-fp4-balanced-single"])
    assert bad["mem_fraction_static"] == 0.78 and fix["mem_fraction_static"] == 0.9
    for g in (bad, fix):
        m = g["memory_inputs"]
        # DEP4: the embedding replicated, wq_b/wo_a/wo_b whole per rank (attention TP 1), the shared
        # expert replicated with deepep; the draft: MTP layer 3.585 + its own embedding (replicated)
        # and head (over TP) 1.726 + 0.432 GiB
        assert (m["weights_gib_per_rank"], m["draft_weights_gib_per_rank"], m["draft_freed_gib_per_rank"]) == (
            219.428, 5.743, 2.158)
    assert (bad["verdict"]["level"], bad["verdict"]["deciding"]) == ("fails", "no_kv_memory")
    assert "Raise --mem-fraction-static above 0.818" in bad["verdict"]["message"]
    assert fix["verdict"]["level"] != "fails" and fix["errors"] == []


def test_the_drafts_own_embedding_and_head_count_for_the_pools_then_come_back():
    m = vd.RankMemory(resident=10 * GIB, pools=9 * GIB, pools_rounding=0, req_to_token=0, allocator=0,
                      draft_pool=2 * GIB, draft_freed=2 * GIB)
    assert (m.pools_headroom, m.headroom) == (-1 * GIB, 1 * GIB)
    # the pools are built while the draft still holds them: fails, whatever comes back afterwards
    v = vd.decide(m.headroom, 0, 0, 0, requests=1, pools_headroom=m.pools_headroom)
    assert (v.level, v.deciding, v.slack) == ("fails", "pools", -1 * GIB)
    ok = vd.RankMemory(resident=13 * GIB, pools=9 * GIB, pools_rounding=0, req_to_token=0, allocator=0,
                       draft_pool=2 * GIB, draft_freed=2 * GIB)
    assert (ok.pools_headroom, ok.headroom) == (2 * GIB, 4 * GIB)
    assert vd.decide(ok.headroom, 4 * GIB, 0, 0, requests=1, pools_headroom=ok.pools_headroom).level == "tight"


B300_DEP4 = dict(id="b300-pro-dep4-inferencex-2226", hw="b300", model="deepseek-v4-pro", nnodes=1, gpus=[0, 1, 2, 3],
                 serve={"model-path": "deepseek-ai/DeepSeek-V4-Pro", "tp": 4, "dp": 4, "enable-dp-attention": True,
                        "ep-size": 4, "moe-a2a-backend": "megamoe", "enable-prefill-delayer": True,
                        "swa-full-tokens-ratio": 0.075, "chunked-prefill-size": 32768,
                        "cuda-graph-max-bs-decode": 128, "context-length": 1000000})


@pytest.mark.parametrize("version,heads,short", [("0.5.20", (17.803, 25.942), 5.639), ("0.5.23", (18.141, 26.112), 1.428)])
def test_b300_pro_dep4_093_hangs_and_090_serves(tmp_path, version, heads, short):
    """InferenceX#2226 (launch flags from #2145): B300, V4-Pro FP4, DEP4, megamoe, chunk 32,768, decode
    graph 128, 1M context; 0.93 hung on OOMs in fp8_paged_mqa_logits with 2.9-4.8 GiB free, 0.90 served.
    A DP-attention rank prefills 32,768 / 4 = 8,192 tokens (parallel_hook.py): SGLang's own formula at
    that chunk, 14.75 GiB (its memory_hook.py sizes 50.75 GiB from the undivided chunk), is what the
    report's rank held at run time (18.14 - 4.8 .. 18.14 - 2.9 = 13.3-15.2 GiB). 0.5.20 scores the
    prefill logits whole (the July 2026 image did: 4.2-6.1 GiB allocations above 0.5.23's cap)."""
    sides = {}
    for mfs in (0.93, 0.90):
        e = dict(B300_DEP4, sglang={"version": version}, serve=dict(B300_DEP4["serve"], **{"mem-fraction-static": mfs}))
        sides[mfs] = plan(tmp_path / str(mfs), e)
    bad, fix = sides[0.93], sides[0.90]
    assert tuple(min(r["headroom_gib"] for r in g["ranks"]) for g in (bad, fix)) == heads
    for g in (bad, fix):
        assert (g["activation_estimate_gib"], g["activation_rank_gib"]) == (50.75, 14.75)
    v = bad["verdict"]
    assert (v["level"], v["deciding"], v["shortfall_gib"]) == ("tight", "indexer_logits", short)
    assert "14.75 GiB at the rank's prefill chunk of 8,192 tokens" in v["message"] and bad["fixes"]
    assert (fix["verdict"]["level"], fix["verdict"]["shortfall_gib"], fix["fixes"]) == ("fits", None, [])


def test_decode_indexer_logits_are_deepgemms_rectangle_at_the_full_context():
    """DeepGEMM fp8_paged_mqa_logits: fp32 [rows, align(max_context_len, 256)], max_context_len = pages x 64
    of a page table as wide as req_to_token (context_len + 4 + draft tokens; SGLang 0.5.23)."""
    # 256 rows at Flash's 1,048,576 + 4: 4,097 pages x 64 = 262,208 columns, aligned 262,400
    assert vd.decode_indexer_logits_bytes(256, 1_048_580) == 256 * 262_400 * 4 == 268_697_600
    assert vd.decode_indexer_logits_bytes(0, 1_048_580) == vd.decode_indexer_logits_bytes(8, 0) == 0
    # 1M-context pages: 1,000,004 tokens -> 3,907 pages x 64 = 250,048 -> 250,112 columns: ~1 MB a row
    assert vd.decode_indexer_logits_bytes(1, 1_000_004) == 250_112 * 4


def test_eagle_verify_rows_count_every_draft_token(tmp_path):
    e = RECIPES["b200-flash-fp4-low-latency-single"]          # EAGLE, 4 draft tokens, 1M context
    g = plan(tmp_path, e)
    r = min(g["ranks"], key=lambda r: r["headroom_gib"])
    rows = r["max_running_requests"] * 4
    want = vd.decode_indexer_logits_bytes(rows, 1_048_576 + 4 + 4)
    assert r["decode_logits_gib"] == round(want / GIB, 3) > 0.9
    assert "decode forward's indexer logits" in g["verdict"]["message"] + (g["verdict"]["short_of"] or "")
