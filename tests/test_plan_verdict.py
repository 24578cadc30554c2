"""Plan verdicts (issue 16): the memory a rank holds before serving beyond the exact pool sizes
(2 MiB segments, SWATokenToKVPoolAllocator, EAGLE draft pool), the indexer logits transient, the
``fails`` / ``tight`` / ``fits`` table, fixes that are re-planned, and the inputs plan reads
(attn-dp-size, argparse abbreviations, cuda-graph-max-bs-*, draft weights, checkpoint formats).

In-process (``dsv4ctl.cli.main`` / ``build_plan``) to stay fast. Numbers: SGLang 0.5.23 source
(``srt/mem_cache/allocator/swa.py:107-116``, ``allocator/paged.py:395-399``,
``mem_cache/deepseek_v4_memory_pool.py:166-328``, ``layers/attention/mqa_logits_utils.py``) and
issue 16's measurements."""

from __future__ import annotations

import contextlib
import io
import json
import shutil

import pytest

from dsv4ctl.plan import capacity as cap
from dsv4ctl.plan import verdict as vd
from dsv4ctl.plan.argnames import AmbiguousOption, resolve_option
from dsv4ctl.plan.models import load_model
from tests.conftest import DEFAULT_PROFILE

GIB = 2**30
MIB = 2**20


def run(*argv: str) -> tuple[int, str, str]:
    from dsv4ctl.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def plan_doc(*argv: str, code: int = 0) -> dict:
    c, out, err = run("plan", "--json", *argv)
    assert c == code, (c, err)
    return json.loads(out)


@pytest.fixture(scope="module")
def flash():
    return load_model("flash")[0]


def flash_rank(flash, spec=None, avail=80 * GIB):
    i = cap.PoolInputs(speculative_algorithm=spec, speculative_num_draft_tokens=4 if spec else None)
    c = cap.Configurator(flash, i)
    return c, c.calculate_pool_sizes(avail)


# ----------------------------------------------------------------------------- memory terms
def test_segments_round_each_buffer_up_to_2_mib():
    assert [vd.segment(x) for x in (0, 1, 2 * MIB, 2 * MIB + 1, 149_760)] == [0, 2 * MIB, 2 * MIB, 4 * MIB, 2 * MIB]


def test_flash_rank_has_168_buffers_and_their_sum_is_the_exact_allocation(flash):
    c, s = flash_rank(flash)
    bufs = vd.pool_buffers(c, s, c.idx_real)
    # 43 SWA + 21 c4 + 20 c128 latents, 21 index-K, 21 + 21 c4 states, 20 c128 states; + req_to_token
    assert sum(n for _, _, n in bufs) + 1 == 168
    assert sum(b * n for _, b, n in bufs) == cap.allocated_bytes(c, s, c.idx_real).total == 85_915_545_280
    r2t = s.num_req_slots * 1_048_576 * 4
    m = vd.rank_memory(c, s, c.idx_real, resident=100 * GIB, req_to_token=r2t)
    # the rounding the issue measured: 80-210 MB with the allocator
    assert m.pools_rounding == 126_406_976 and m.allocator == 195_035_136
    assert 80e6 < m.pools_rounding < 210e6 and 178e6 <= m.allocator <= 245e6


def test_allocator_tensors_follow_swa_py(flash):
    c, s = flash_rank(flash)
    assert (s.full_max_total_num_tokens, s.swa_max_total_num_tokens) == (11_737_856, 1_173_760)
    bufs = dict((n, b) for n, b, _ in vd.allocator_buffers(11_737_856, 1_173_760, 256))
    assert bufs == {"full_free_pages": 45_851 * 8, "swa_free_pages": 4_585 * 8,
                    "full_to_swa_zeros": (11_737_856 + 256) * 8, "full_to_swa_index_mapping": (11_737_856 + 257) * 8,
                    "minus_one": 8}


def test_eagle_draft_pool_is_one_swa_layer(flash):
    # issue 16: 612,817,920 B for a Flash rank (4,092 pages of 149,760 B: 1,047,296 SWA slots)
    c, s = flash_rank(flash, spec="EAGLE")
    assert vd.draft_pool_bytes(c, cap.replace(s, swa_max_total_num_tokens=1_047_296)) == 612_817_920
    assert vd.draft_pool_bytes(c, s) == (1_013_504 + 256) // 256 * 149_760 == 593_049_600
    c0, s0 = flash_rank(flash)
    assert vd.draft_pool_bytes(c0, s0) == 0


def test_indexer_logits_transient_matches_field_report_c2():
    # C2: 4096 rows at ~372K context = 1.42 GiB (fits 0.5.23's budget on an 80 GiB GPU at mfs 0.9)
    assert vd.indexer_logits_bytes(4096, 372_000, 80 * GIB, 0.9) == 4096 * 93_184 * 4 == 1_526_726_656
    # 8192 rows at 1M: 8 GiB unchunked; 0.5.23 chunks rows under 0.2 * (1 - 0.9) * 80 GiB
    assert vd.indexer_logits_bytes(8192, 1_048_576, None, 0.9) == 8 * GIB
    assert vd.indexer_logits_bytes(8192, 1_048_576, 80 * GIB, 0.9) == 1638 * MIB
    assert vd.indexer_logits_bytes(0, 1_048_576, 80 * GIB, 0.9) == 0
    assert vd.indexer_logits_bytes(16, 4096, 80 * GIB, 0.9) == 16 * 1024 * 4      # below the 8e6 skip


@pytest.mark.parametrize("headroom,est,res,logits,req,level,deciding", [
    (-1, 4 * GIB, 10 * GIB, 0, 5, "fails", "pools"),
    (int(3.5 * GIB), 4 * GIB, 10 * GIB, 0, 5, "tight", "activation"),       # < 0.9 x 4 GiB: a heuristic, not proven
    (int(3.5 * GIB), 4 * GIB, 10 * GIB, 0, 0, "fails", "requests"),        # requests first
    (20 * GIB, 4 * GIB, 10 * GIB, 0, 0, "fails", "requests"),
    (int(3.7 * GIB), 4 * GIB, 10 * GIB, 0, 5, "tight", "activation_floor"),  # issue: 8.2 GiB vs a 10 GiB reserve
    (int(8.2 * GIB), 4 * GIB, 10 * GIB, 0, 5, "tight", "activation_floor"),
    (15 * GIB, 13 * GIB, 13 * GIB, 5 * GIB, 5, "tight", "indexer_logits"),
    (int(10.5 * GIB), 4 * GIB, 10 * GIB, 0, 5, "tight", "margin"),
    (12 * GIB, 4 * GIB, 10 * GIB, 0, 5, "fits", "activation_floor"),
])
def test_verdict_table(headroom, est, res, logits, req, level, deciding):
    v = vd.decide(headroom, est, res, logits, req)
    assert (v.level, v.deciding) == (level, deciding)


def test_worst_rank_decides():
    vs = [vd.Verdict("fits", "activation", 5), vd.Verdict("fails", "requests", -1), vd.Verdict("fails", "pools", -9)]
    assert vd.worst(vs).deciding == "pools"


# ------------------------------------------------------------------------------ the CLI
def test_default_profile_verdicts_and_json_terms():
    d = plan_doc()
    assert d["schema"] == "dsv4ctl.plan/2" and d["ok"] is True
    p, dec = d["groups"]
    assert (p["verdict"]["level"], p["verdict"]["deciding"]) == ("tight", "indexer_logits")
    assert (dec["verdict"]["level"], dec["verdict"]["deciding"]) == ("tight", "activation_floor")
    r = dec["ranks"][0]
    assert (r["verdict"], r["deciding"], r["headroom_gib"]) == ("tight", "activation_floor", 9.147)
    assert r["allocator_gib"] == 0.26 and r["rounding_gib"] == 0.169 and r["draft_pool_gib"] == 0.0
    assert dec["activation_estimate_gib"] == 4.25 and dec["activation_reserve_gib"] == 10.0
    assert p["ranks"][0]["indexer_logits_gib"] == 4.834      # 8192 rows, budget 0.2 * 0.135 * 179.06 GiB
    # the warning names the same headroom as the table row
    assert dec["warnings"][0].startswith("tight: headroom 9.147 GiB is under SGLang's 10.0 GiB activation reserve")


def test_eagle_counts_draft_weights_and_pool():
    base = plan_doc("-g", "decode", "--set", "index_k_dtype=fp8")["groups"][0]
    d = plan_doc("-g", "decode", "--set", "index_k_dtype=fp8", "--set", "speculative_algorithm=EAGLE",
                 "--set", "speculative_num_draft_tokens=3")["groups"][0]
    # the published Flash MTP layer at TP4 (dsv4ctl/plan/weights.py, issue 27): its routed experts,
    # 256 x 3 x (2048x2048 I8 + 2048x128 e8m0) B / 4 = 0.797 GiB, plus attention and replicated parts
    routed = 256 * 3 * (2048 * 2048 + 2048 * 128) / 4 / GIB
    # + the draft's own embedding and head (DeepseekV4ForCausalLMNextN.__init__, deepseek_v4_nextn.py:67-72,
    # 275-281), bf16 129,280 x 4,096 each over TP4, held while the pools are built, then freed (issue 44.3)
    own = 2 * 129_280 * 4096 * 2 / 4 / GIB
    assert round(own, 3) == 0.493 and d["memory_inputs"]["draft_freed_gib_per_rank"] == 0.493
    assert d["memory_inputs"]["draft_weights_gib_per_rank"] == 1.362   # 0.868 (MTP layer, unrounded) + 0.493
    assert 0.868 > round(routed, 3) == 0.797
    r = d["ranks"][0]
    assert r["draft_pool_gib"] == round(vd.segment(-(-(r["swa_max_total_num_tokens"] + 256) // 256) * 149_760) / GIB, 3)
    assert r["draft_pool_gib"] > 0.5 and base["ranks"][0]["draft_pool_gib"] == 0
    assert any("draft_weights_gib_per_rank=1.362" in w and "+ 0.493 GiB of the draft's own embedding and head" in w
               for w in d["warnings"])
    # measured draft weights win
    m = plan_doc("-g", "decode", "--set", "speculative_algorithm=EAGLE", "--set", "draft_weights_gib_per_rank=1.5")
    assert m["groups"][0]["memory_inputs"]["draft_weights_gib_per_rank"] == 1.5
    assert m["groups"][0]["memory_inputs"]["draft_freed_gib_per_rank"] == 0.0


def test_checkpoint_format_fp8_weights_estimate():
    d = plan_doc("-g", "decode", "--set", "model=pro", "--set", "checkpoint_format=fp8", code=1)["groups"][0]
    # FP8 routed experts: 61 layers x 384 experts x 3 x (3072x7168 e4m3 + 24x56 e8m0) B / 4 ranks
    routed = 61 * 384 * 3 * (3072 * 7168 + 24 * 56) / 4 / GIB
    assert round(routed, 3) == 360.303
    assert d["memory_inputs"]["weights_gib_per_rank"] == 372.07      # + 9.167 GiB of the rest + 2.6 overhead
    assert d["memory_inputs"]["checkpoint_format"] == "fp8" and d["verdict"]["deciding"] == "weights"
    # FP8 Pro does not fit on 8 B200s either: the fix offered is the one that works (16 GPUs)
    assert d["fixes"][0].startswith("use 16 GPUs per group (tp-size: 16")


def test_requests_at_context_fail_with_working_fixes():
    d = plan_doc("-g", "decode", "--set", "min_requests=20", code=1)["groups"][0]
    assert d["verdict"]["deciding"] == "requests"
    assert d["errors"][0].startswith("16 request(s) fit at context_length 1,048,576")
    assert d["fixes"] and all("(re-planned: " in f for f in d["fixes"])
    for f in d["fixes"]:
        if "context-length:" in f:
            ctx = f.split("context-length: ")[1].split(" ")[0]
            assert plan_doc("-g", "decode", "--set", "min_requests=20", "--set", f"context_length={ctx}")["ok"]


def test_set_topology_beyond_the_groups_gpus_is_a_what_if_on_hypothetical_gpus():
    """Issue 25: "what if TP8?" on a 4-GPU group is planned, on GPUs the group does not have, and
    the plan says so (it was refused, exit 2)."""
    c, out, err = run("plan", "--json", "--set", "tp_size=8", "-g", "decode")
    assert c in (0, 1), err
    g = json.loads(out)["groups"][0]
    assert (g["tp"], len(g["ranks"])) == (8, 8)
    assert [r["gpu"] for r in g["ranks"]] == [None] * 8
    assert ("what-if: --set tp_size plans 8 rank(s) on hypothetical GPUs like host b200-0's (NVIDIA B200, "
            "183,359 MiB), not the group's 4 GPU(s) 4,5,6,7") in g["memory_inputs"]["estimated"]
    # the same topology as the group's GPUs stays on them
    g = json.loads(run("plan", "--json", "--set", "tp_size=4", "-g", "decode")[1])["groups"][0]
    assert [r["gpu"] for r in g["ranks"]] == [4, 5, 6, 7]
    assert not [e for e in g["memory_inputs"]["estimated"] if e.startswith("what-if")]


# ------------------------------------------------------------------- serve-config inputs
@pytest.fixture
def prof(tmp_path):
    shutil.copytree(DEFAULT_PROFILE.parent / DEFAULT_PROFILE.stem, tmp_path / DEFAULT_PROFILE.stem)
    p = tmp_path / DEFAULT_PROFILE.name
    text = DEFAULT_PROFILE.read_text().replace("series: ../patches/sglang-0.5.23", "series: null")
    p.write_text(text)
    return p


def set_decode(prof, **kv) -> None:
    f = prof.parent / DEFAULT_PROFILE.stem / "decode.yaml"
    f.write_text(f.read_text() + "".join(f"{k}: {v}\n" for k, v in kv.items()))


def test_abbreviations_resolve_as_argparse_does():
    assert resolve_option("tp") == "tp-size" and resolve_option("dp") == "dp-size"
    assert resolve_option("speculative-algo") == "speculative-algorithm"
    assert resolve_option("tensor-parallel-size") == "tp-size"
    assert resolve_option("no-such-option") is None
    with pytest.raises(AmbiguousOption, match="--cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
                                              "--cuda-graph-max-bs-prefill"):
        resolve_option("cuda-graph-max-bs")
    with pytest.raises(AmbiguousOption):
        resolve_option("pp")          # pp-async-batch-depth, pp-max-micro-batch-size, pp-size


def test_speculative_algo_abbreviation_plans_the_draft(prof):
    # SGLang's DSV4 hook takes EAGLE with top-k 1 and explicit steps only (dsv4ctl.plan.startup)
    set_decode(prof, **{"speculative-algo": "EAGLE", "speculative-num-draft-tokens": 3, "speculative-eagle-topk": 1,
                        "speculative-num-steps": 2})
    g = plan_doc(str(prof), "-g", "decode")["groups"][0]
    assert g["server_args"]["speculative_algorithm"] == "EAGLE" and g["ranks"][0]["draft_pool_gib"] > 0.5
    # the oracle's Flash EAGLE bytes per full token (reference §5.5): 12 % above 7086.75 without the draft
    assert g["ranks"][0]["bytes_per_full_token"] == 7939.186046511628


def test_ambiguous_key_is_a_one_line_input_error(prof):
    set_decode(prof, **{"cuda-graph-max-bs": 64})
    code, out, err = run("plan", str(prof), "-g", "decode")
    assert code == 2 and len(err.splitlines()) == 1
    assert "decode.yaml:" in err and "cuda-graph-max-bs: SGLang rejects it: ambiguous option" in err


def test_attn_dp_size_and_cuda_graph_max_bs_decode(prof):
    set_decode(prof, **{"cuda-graph-max-bs-decode": 64})
    g = plan_doc(str(prof), "-g", "decode")["groups"][0]
    # decode reserve: 512 + 1.5*2048 + 512 + 2*64 MB unfloored (memory_hook.py)
    assert g["activation_estimate_gib"] == round((512 + 3072 + 512 + 128) / 1024, 3)
    set_decode(prof, **{"attn-dp-size": 4})
    # the profile leaves dp to the serve config (issue 25): attention DP 4 on the 4 GPUs is what runs
    g = plan_doc(str(prof), "-g", "decode")["groups"][0]
    assert (g["dp"], g["dp_attention"], g["server_args"]["attn_dp_size"]) == (4, True, 4)
    assert g["ranks"][0]["max_running_requests"] == 128 // 4
    # a profile that says dp 1 disagrees with it (exit 2, one line)
    text = prof.read_text()
    prof.write_text(text.replace("    gpus: [4, 5, 6, 7]\n    tp: 4\n", "    gpus: [4, 5, 6, 7]\n    tp: 4\n    dp: 1\n"))
    code, out, err = run("plan", str(prof), "-g", "decode")
    assert code == 2 and "dp-size: 4 disagrees with the profile's group 'decode' (dp: 1)" in err and len(err.splitlines()) == 1
    g = plan_doc(str(prof), "-g", "decode", "--set", "attn_dp_size=4")["groups"][0]
    assert (g["dp"], g["dp_attention"], g["server_args"]["attn_dp_size"]) == (4, True, 4)


# ------------------------------------------------------------------------------ --from-log
def test_from_log_gates_bytes_per_full_token_under_a_token_cap():
    """A --max-total-tokens cap makes the pools equal while bytes per full token differs (a stock
    7086.75 server against a bf16/exact plan of 7737.75): the comparison must not say "matches"."""
    from dsv4ctl.commands.planlog import log_report
    doc = plan_doc("-g", "decode", "--set", "index_k_accounting=exact", "--set", "max_total_tokens=1048576")
    r = doc["groups"][0]["ranks"][0]
    assert r["full_max_total_num_tokens"] == 1_048_576 and r["bytes_per_full_token"] == 7737.75
    line = lambda tp, bpft: (f"[2026-01-01 00:00:00 TP{tp}] DSV4 memory calculation: unified=False, "
                             f"bytes_per_full_token={bpft}, available_bytes=112.99 GB, full_token=1048576\n"
                             f"[2026-01-01 00:00:00 TP{tp}] DSV4 pool sizes: full={r['full_max_total_num_tokens']}, "
                             f"swa={r['swa_max_total_num_tokens']}, c4={r['c4_max_total_num_tokens']}, "
                             f"c128={r['c128_max_total_num_tokens']}, c4_state={r['c4_state_pool_size']}, c128_state=0\n")
    rep = log_report(doc, "".join(line(t, 7086.75) for t in range(4)), "server.log", None)
    assert rep["ok"] is False
    assert all(all(d["diff"] == 0 for d in x["pools"].values()) for x in rep["ranks"])
    assert rep["ranks"][0]["bytes_per_full_token"] == dict(logged=7086.75, planned=7737.75, match=False)
    rep = log_report(doc, "".join(line(t, 7737.75) for t in range(4)), "server.log", None)
    assert rep["ok"] is True


def test_from_log_uses_the_generic_max_total_num_tokens_line():
    from dsv4ctl.commands.planlog import log_report
    doc = plan_doc("-g", "decode")
    full = doc["groups"][0]["ranks"][0]["full_max_total_num_tokens"]
    generic = ("[2026-01-01 00:00:00 TP0] max_total_num_tokens={n}, chunked_prefill_size=8192, "
               "max_prefill_tokens=16384, max_running_requests=128, context_len=1048576, available_gpu_mem=9.15 GB\n")
    rep = log_report(doc, generic.format(n=full), "server.log", None)
    assert rep["ok"] is True and rep["ranks"][0]["source"] == "max_total_num_tokens"
    assert rep["ranks"][0]["pools"] == {"full": dict(planned=full, logged=full, diff=0, pct=0.0)}
    rep = log_report(doc, generic.format(n=full - 256), "server.log", None)
    assert rep["ok"] is False and rep["ranks"][0]["pools"]["full"]["diff"] == -256


def test_deep_json_and_long_model_path_are_one_line_errors(tmp_path):
    deep = tmp_path / "config.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    code, out, err = run("plan", "--set", f"model={deep}")
    assert code == 2 and len(err.splitlines()) == 1 and "not a readable config.json (RecursionError" in err
    code, out, err = run("plan", "--set", "model=/tmp/" + "a" * 5000)
    assert code == 2 and len(err.splitlines()) == 1 and "(5005 characters)" in err and len(err) < 600
    log = tmp_path / "deep.log"
    log.write_text("DSV4_POOL_PLAN " + "[" * 100_000 + "]" * 100_000 + "\n")
    code, out, err = run("plan", "-g", "decode", "--from-log", str(log))
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err


def test_serve_keys_are_real_0523_options():
    from dsv4ctl.plan.argnames import option_names
    from dsv4ctl.plan.plan import SERVE_KEYS
    assert [k for k in SERVE_KEYS if k not in option_names()] == []


def test_hicache_on_refuses_page_size_1_on_both_pd_sides(prof):
    for g in ("prefill", "decode"):
        f = prof.parent / DEFAULT_PROFILE.stem / f"{g}.yaml"
        f.write_text(f.read_text().replace("enable-hierarchical-cache: true", "enable-hierarchical-cache: false")
                     + "page-size: 1\n")
    code, out, err = run("hicache", "on", str(prof), "--group", "prefill", "--dry-run")
    assert code == 2 and "DSV118 dsv4-page-size" in err and "page-size 1" in err and len(err.splitlines()) == 1


def test_unchunked_logits_fail_only_below_the_whole_transient():
    """decide(logits_chunked=False): SGLang 0.5.18-0.5.20 need the whole logits transient free;
    below it the first long prefill fails (indexer_logits), at or above it the usual tiers apply."""
    G = 2 ** 30
    v = vd.decide(10 * G, 4 * G, 4 * G, 11 * G, requests=5, logits_chunked=False)
    assert (v.level, v.deciding, v.slack) == ("fails", "indexer_logits", -1 * G)
    v = vd.decide(11 * G, 4 * G, 4 * G, 11 * G, requests=5, logits_chunked=False)
    assert (v.level, v.deciding) == ("tight", "indexer_logits")
    v = vd.decide(10 * G, 4 * G, 4 * G, 11 * G, requests=5)             # 0.5.21+: chunked, tight
    assert (v.level, v.deciding) == ("tight", "indexer_logits")
