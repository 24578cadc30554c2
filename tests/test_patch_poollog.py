"""dsv4ctl.plan.poollog on SGLang 0.5.23's real log line formats (pool_configurator.py, scheduler.py
logger prefix), as emitted by the real configurator in tests/test_patch_oracle.py."""

from __future__ import annotations

from dsv4ctl.plan.poollog import compare, match_rank, parse_log

CALC = ("DSV4 memory calculation: unified=False, unified_fp8=False, dspark_draft_bf16=False, "
        "bytes_per_full_token=7737.75, available_bytes=128.97 GB, c128_state_fixed=2.53 GB, "
        "c2_state_fixed=0.00 GB, swa_fixed=0.00 GB, swa_ring_fixed=0.00 GB, c4_state_fixed=0.00 GB, "
        "full_token=17546240")
SIZES = "DSV4 pool sizes: full=17546240, swa=1754624, c4=4386560, c128=137080, c4_state=54832, c128_state=0"
PLAN = ('DSV4_POOL_PLAN {"schema":1,"full":17546240,"swa":1754624,"c4":4386560,"c128":137080,'
        '"c4_state":54832,"c128_state":32896,"max_running_requests":256,"bytes_per_full_token":7737.75,'
        '"bytes_per_swa_token":31875.0,"index_k_bytes_per_token":256,"num_layers":43,'
        '"available_bytes":138484778008,"fixed_bytes":2715811840}')


def test_stock_lines_per_tp_rank():
    log = "\n".join([
        "[2026-11-29 12:00:00] server_args=ServerArgs(model_path='deepseek-ai/DeepSeek-V4-Flash', tp_size=2)",
        f"[2026-11-29 12:00:01 TP0] {CALC}",
        f"[2026-11-29 12:00:01 TP1] {CALC}",
        f"[2026-11-29 12:00:01 TP0] {SIZES}",
        f"[2026-11-29 12:00:01 TP1] {SIZES.replace('full=17546240', 'full=17545984')}",
        "[2026-11-29 12:00:02 TP0] KV Cache is allocated. #tokens: 17546240",
    ])
    r0, r1 = parse_log(log)
    assert r0.rank == {"TP": 0} and r1.rank == {"TP": 1}
    assert r0.source == "DSV4 pool sizes" and r0.line == 4
    assert r0.pools == dict(full=17546240, swa=1754624, c4=4386560, c128=137080, c4_state=54832)
    assert "c128_state" not in r0.pools            # logged before finalize: always 0 in 0.5.23
    assert (r0.bytes_per_full_token, r0.available_gib, r0.full_token) == (7737.75, 128.97, 17546240)
    assert r1.pools["full"] == 17545984


def test_plan_line_wins_and_is_final():
    log = "\n".join([f"[2026-11-29 12:00:01.123 DP0 TP0 EP0] {CALC}",
                     f"[2026-11-29 12:00:01.124 DP0 TP0 EP0] {SIZES}",
                     f"[2026-11-29 12:00:01.200 DP0 TP0 EP0] {PLAN}"])
    (r,) = parse_log(log)
    assert r.rank == {"DP": 0, "TP": 0, "EP": 0} and r.source == "DSV4_POOL_PLAN" and r.line == 3
    assert r.pools["c128_state"] == 32896 and r.available_bytes == 138484778008
    assert r.max_running_requests == 256


def test_last_record_per_rank_wins_and_pp_prefix():
    # --max-total-tokens re-derives the sizes: the configurator logs a second pool line.
    log = "\n".join([f"[t PP1 TP0] {SIZES}",
                     f"[t PP1 TP0] {SIZES.replace('full=17546240', 'full=1048576')}",
                     f"[t PP0 TP0] {SIZES}"])
    a, b = parse_log(log)
    assert a.rank == {"PP": 1, "TP": 0} and a.pools["full"] == 1048576 and a.line == 2
    assert b.rank == {"PP": 0, "TP": 0} and b.pools["full"] == 17546240


def test_no_prefix_and_junk():
    log = "\n".join([SIZES, "DSV4_POOL_PLAN {not json", 'DSV4_POOL_PLAN {"full": 1}', "random"])
    (r,) = parse_log(log)
    assert r.rank == {} and r.label() == "(no rank prefix)" and r.pools["full"] == 17546240
    assert parse_log("nothing here\n") == []


def test_compare_and_match_rank():
    (r,) = parse_log(f"[t DP1 TP5] {PLAN}")
    ranks = [dict(tp_rank=t, pp_rank=0, dp_rank=t // 4, full_max_total_num_tokens=17546240,
                  swa_max_total_num_tokens=1754624, c4_max_total_num_tokens=4386560,
                  c128_max_total_num_tokens=137080, c4_state_pool_size=54832,
                  c128_state_pool_size=32896 + 128) for t in range(8)]
    m = match_rank(ranks, r)
    assert m is ranks[5]
    diffs = {d.pool: (d.planned, d.logged, d.diff) for d in compare(m, r)}
    assert diffs["full"] == (17546240, 17546240, 0)
    assert diffs["c128_state"] == (33024, 32896, -128)
    assert [d.pct for d in compare(m, r) if d.diff] == [-0.388]
    (r,) = parse_log(f"[t DP3 TP5] {PLAN}")
    assert match_rank(ranks, r) is None
