"""The capacity model against SGLang 0.5.23's own numbers (reference §3.1, §4, §5.5)."""

import json

import pytest

from dsv4ctl.plan import capacity as cap
from dsv4ctl.plan.models import load_model

FLASH, _ = load_model("deepseek-v4-flash")
PRO, _ = load_model("deepseek-v4-pro")
A_FLASH = 138_484_778_008
A_PRO = 48_569_637_666

# (model, available, layers, inputs) -> bpft, full, swa, c4, c128, c4_state, c128_state, mrr
# printed by the real 0.5.23 configurator (capacity reference §5.5).
CASES = [
    ("flash", A_FLASH, None, {}, (7086.75, 19158016, 1915648, 4789504, 149672, 59864, 32896, 256)),
    ("pro", A_PRO, None, {}, (10115.25, 4385280, 438528, 1096320, 34260, 13704, 32896, 256)),
    ("flash", A_FLASH, None, dict(attn_dp_size=8, max_running_requests=256),
     (7086.75, 19489536, 1948928, 4872384, 152262, 60904, 4224, 32)),
    ("flash", A_FLASH, None, dict(speculative_algorithm="EAGLE", speculative_num_draft_tokens=4),
     (7939.186046511628, 16760320, 1676032, 4190080, 130940, 104752, 65792, 256)),
    ("flash", A_FLASH, None, dict(swa_ratio_explicit=False),
     (3899.25, 29727488, 622848, 7431872, 232246, 19464, 32896, 256)),
    ("pro", A_PRO, None, dict(swa_full_tokens_ratio=0.075),
     (8983.125, 4937984, 370176, 1234496, 38578, 11568, 32896, 256)),
    ("flash", A_FLASH, None, dict(index_k_dtype="bf16", index_k_accounting="exact"),
     (7737.75, 17546240, 1754624, 4386560, 137080, 54832, 32896, 256)),
    ("pro", A_PRO, None, dict(index_k_dtype="bf16", index_k_accounting="exact"),
     (11045.25, 4016128, 401408, 1004032, 31376, 12544, 32896, 256)),
    ("flash", A_FLASH, None, dict(compress_state_dtype="bf16"),
     (6750.75, 20312832, 2031104, 5078208, 158694, 63472, 32896, 256)),
    ("flash", A_FLASH, None, dict(online_compress=True),
     (7086.75, 19536640, 1953536, 4884160, 152630, 61048, 257, 256)),
    ("flash", A_FLASH, (21, 43), {},
     (3685.0, 37175296, 3717376, 9293824, 290432, 116168, 32896, 256)),
]


@pytest.mark.parametrize("name,avail,layers,kw,expected", CASES)
def test_reference_oracle_table(name, avail, layers, kw, expected):
    model = FLASH if name == "flash" else PRO
    conf = cap.Configurator(model, cap.PoolInputs(**kw), layers)
    s = conf.calculate_pool_sizes(avail)
    got = (conf.bytes_per_full_token, s.full_max_total_num_tokens, s.swa_max_total_num_tokens,
           s.c4_max_total_num_tokens, s.c128_max_total_num_tokens, s.c4_state_pool_size,
           s.c128_state_pool_size, s.max_running_requests)
    assert got == expected


def test_bf16_with_stock_accounting_keeps_fp8_sizes_but_allocates_more():
    stock = cap.Configurator(FLASH, cap.PoolInputs(index_k_dtype="bf16"))
    s = stock.calculate_pool_sizes(A_FLASH)
    assert s.full_max_total_num_tokens == 19158016          # budgeted as fp8
    real = cap.allocated_bytes(stock, s, stock.idx_real)
    budget = cap.allocated_bytes(stock, s, stock.idx_budget)
    # reference §4: 140.60 GiB needed against a 128.97 GiB budget, 11.62 GiB over
    assert round(real.total / cap.GIB, 2) == 140.60
    assert round(budget.total / cap.GIB, 2) == 128.98
    assert round((real.c4_index_k - budget.c4_index_k) / cap.GIB, 2) == 11.62
    assert round(budget.c4_index_k / cap.GIB, 3) == 12.365
    assert round(budget.swa_latent / cap.GIB, 3) == 44.885


def test_worked_example_bf16_allocation_matches_reference():
    conf = cap.Configurator(FLASH, cap.PoolInputs(index_k_dtype="bf16", index_k_accounting="exact"))
    s = conf.calculate_pool_sizes(A_FLASH)
    a = cap.allocated_bytes(conf, s, conf.idx_real)
    got = [round(x / cap.GIB, 3) for x in (a.swa_latent, a.c4_latent, a.c128_latent, a.c4_index_k,
                                           a.c4_attn_state, a.c4_index_state, a.c128_state)]
    assert got == [41.112, 50.191, 2.210, 21.964, 8.787, 2.197, 2.529]


def test_fp4_indexer_on_nvidia_is_budgeted_as_fp8_unless_exact():
    stock = cap.Configurator(FLASH, cap.PoolInputs(fp4_indexer=True))
    assert (stock.idx_budget, stock.idx_real) == (132, 68)
    exact = cap.Configurator(FLASH, cap.PoolInputs(fp4_indexer=True, index_k_accounting="exact"))
    assert exact.bytes_per_full_token == 6750.75
    assert exact.calculate_pool_sizes(A_FLASH).full_max_total_num_tokens == 20111616


@pytest.mark.parametrize("gpu,kw,mfs", [
    (183359, dict(tp_size=8), 0.852),
    (183359, dict(tp_size=4), 0.855),
    (183359, dict(tp_size=8, dp_size=8, enable_dp_attention=True), 0.751),
    (183359, dict(tp_size=8, dp_size=8, enable_dp_attention=True, moe_a2a_backend="deepep"), 0.740),
    (183359, dict(tp_size=4, dp_size=4, enable_dp_attention=True), 0.805),
    (183359, dict(tp_size=8, disaggregation_mode="decode"), 0.944),
    (183359, dict(tp_size=8, dp_size=8, enable_dp_attention=True, disaggregation_mode="decode"), 0.869),
    (275040, dict(tp_size=8), 0.901),
    (189471, dict(tp_size=4), 0.859),
    (143771, dict(tp_size=8), 0.897),
    (None, dict(tp_size=8), 0.95),
])
def test_default_mem_fraction_static(gpu, kw, mfs):
    assert cap.default_mem_fraction_static(cap.MemoryArgs(gpu_memory_mib=gpu, **kw)) == mfs


def test_available_bytes_worked_example():
    # reference §4: P 177.0, W 21.83, mfs 0.852 -> 138,484,778,008
    assert cap.available_bytes_from_memory(177.0, 177.0 - 21.83, 0.852) == 138_484_778_008


def test_pp_split_puts_the_remainder_on_the_last_stage():
    assert cap.pp_layer_range(43, 2, 0) == (0, 21)
    assert cap.pp_layer_range(43, 2, 1) == (21, 43)
    assert [cap.pp_layer_range(43, 4, r) for r in range(4)] == [(0, 10), (10, 21), (21, 32), (32, 43)]
    assert cap.pp_layer_range(43, 2, 1, (22, 21)) == (22, 43)
    with pytest.raises(cap.CapacityError):
        cap.pp_layer_range(43, 2, 0, (20, 20))


def test_layouts_and_trtllm_bytes_per_token():
    v41 = cap.Configurator(FLASH, cap.PoolInputs(kv_layout="v41"))
    assert (v41.kv_bytes_per_token(), v41.kv_bytes_per_token(4), v41.kv_bytes_per_token(128)) == (528, 528, 768)
    new = cap.Configurator(FLASH, cap.PoolInputs(kv_layout="v41_new"))
    assert new.kv_bytes_per_token(128) == 528
    trt = cap.Configurator(FLASH, cap.PoolInputs(attention_backend="trtllm"))
    assert trt.kv_bytes_per_token(128) == 512


@pytest.mark.parametrize("kw,msg", [
    (dict(page_size=200), "multiple of 128"),
    (dict(speculative_algorithm="EAGLE", speculative_num_draft_tokens=11), "exceeds what the c4"),
    (dict(online_compress=True, speculative_algorithm="EAGLE", speculative_num_draft_tokens=2), "does not support speculative"),
    (dict(kv_layout="v41", sm100=False), "SM100"),
    (dict(compress_state_dtype="fp16"), "COMPRESS_STATE_DTYPE"),
    (dict(attention_backend="trtllm", kv_layout="v41"), "trtllm"),
])
def test_rejections_match_sglang(kw, msg):
    with pytest.raises(cap.CapacityError, match=msg):
        cap.Configurator(FLASH, cap.PoolInputs(**kw)).calculate_pool_sizes(A_FLASH)


def test_tiny_budget_fails_like_sglang():
    conf = cap.Configurator(FLASH, cap.PoolInputs())
    # full == 0 and a tiny pool both trip SGLang's SWA floor first (validate_swa_pool_size)
    with pytest.raises(cap.CapacityError, match=r"SWA pool \(0 tokens\) cannot hold even one request"):
        conf.calculate_pool_sizes(2_000_000_000)
    with pytest.raises(cap.CapacityError, match=r"SWA pool \(256 tokens\)"):
        conf.calculate_pool_sizes(2_715_811_840 + 4096 * 7087)
    assert conf.calculate_pool_sizes(2_715_811_840 + 5120 * 7087).swa_max_total_num_tokens == 512


def test_max_concurrent_requests_bounds():
    conf = cap.Configurator(FLASH, cap.PoolInputs())
    s = conf.calculate_pool_sizes(A_FLASH)
    assert cap.max_concurrent_requests(conf, s, 1_048_576) == 19158016 // 1048576
    assert cap.max_concurrent_requests(conf, s, 4096) == 256
