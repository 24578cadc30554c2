"""``dsv4ctl plan`` through the real CLI: the default profile's numbers, the JSON schema of the
README ("plan JSON"), Markdown and table output, the failing-headroom verdict with its fixes,
PP / DP / DP-attention what-ifs, model what-ifs, and bad ``--set`` / ``--group`` input.

Expected numbers come from the formulas of the capacity reference (§2.6-§2.8, §3.2; SGLang
0.5.23 ``pool_configurator.py`` / ``kv_cache_configurator.py``) or from its oracle fixtures
(§4 worked example, §5.5: printed by the real SGLang 0.5.23 configurator)."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from tests.conftest import DEFAULT_PROFILE, run_cli

GIB = 2**30
PAGE = 256
FLASH_BPFT_FP8 = 7086.75      # reference §4 / §5.5 (oracle)
FLASH_N128 = 20
FLASH_LAYERS = 43

TOP_KEYS = ["schema", "sglang_version", "sglang_version_source", "profile", "profile_path", "model", "ok", "groups"]
GROUP_KEYS = ["name", "role", "host", "tp", "dp", "pp", "ep", "dp_attention", "mem_fraction_static",
              "mem_fraction_static_source", "context_length", "gpu_memory_mib", "activation_reserve_gib",
              "memory_inputs", "server_args", "ranks", "warnings", "errors", "fixes"]
RANK_KEYS = ["rank", "gpu", "tp_rank", "pp_rank", "dp_rank", "layers", "available_bytes", "bytes_per_full_token",
             "bytes_per_swa_token", "fixed_bytes", "full_max_total_num_tokens", "swa_max_total_num_tokens",
             "c4_max_total_num_tokens", "c128_max_total_num_tokens", "c4_state_pool_size", "c128_state_pool_size",
             "max_running_requests", "swa_mode", "pools_gib", "allocated_gib", "index_k_gib", "index_k",
             "req_to_token_gib", "headroom_gib", "max_concurrent_requests"]
INDEX_K_KEYS = ["dtype", "accounting", "budget_bytes_per_slot", "real_bytes_per_slot", "budget_gib", "real_gib",
                "overcommit_gib", "exact"]
POOL_FIELDS = ["full_max_total_num_tokens", "swa_max_total_num_tokens", "c4_max_total_num_tokens",
               "c128_max_total_num_tokens", "c4_state_pool_size", "c128_state_pool_size"]


def plan_json(*args: str, code: int | None = 0) -> dict:
    """``plan --json ARGS``: its document, asserting the exit code (``None``: 0 or 1)."""
    r = run_cli("plan", "--json", *args)
    assert r.code == code if code is not None else r.code in (0, 1), (r.code, r.err)
    return r.json()


def group(doc: dict, name: str) -> dict:
    return next(g for g in doc["groups"] if g["name"] == name)


def pools(rank: dict) -> list[int]:
    return [rank[k] for k in POOL_FIELDS]


@pytest.fixture(scope="module")
def default_doc() -> dict:
    return plan_json()


# ---------------------------------------------------------------------------- default profile
def test_default_profile_json_has_the_documented_schema(default_doc):
    d = default_doc
    for keys, obj in ((TOP_KEYS, d), (GROUP_KEYS, d["groups"][0]), (RANK_KEYS, d["groups"][0]["ranks"][0]),
                      (INDEX_K_KEYS, d["groups"][0]["ranks"][0]["index_k"])):
        missing = [k for k in keys if k not in obj]
        assert missing == []
    assert list(d)[:len(TOP_KEYS)] == TOP_KEYS
    assert d["schema"] == "dsv4ctl.plan/2" and d["sglang_version"] == "0.5.23"
    assert d["profile"] == "dsv4-flash-8xb200-pd" and d["profile_path"] == str(DEFAULT_PROFILE)
    assert d["model"] == "deepseek-v4-flash" and d["ok"] is True
    assert [g["name"] for g in d["groups"]] == ["prefill", "decode"]          # the router has no pools
    for g, gpus in zip(d["groups"], ([0, 1, 2, 3], [4, 5, 6, 7])):
        assert (g["tp"], g["dp"], g["pp"], g["dp_attention"]) == (4, 1, 1, False)
        assert [r["gpu"] for r in g["ranks"]] == gpus
        assert [(r["rank"], r["tp_rank"], r["pp_rank"], r["dp_rank"]) for r in g["ranks"]] == [
            (i, i, 0, 0) for i in range(4)]
        assert all(r["layers"] == [0, FLASH_LAYERS] for r in g["ranks"])
        assert g["errors"] == [] and (g["fixes"] == []) == (g["verdict"]["level"] == "fits")   # tight: fixes (44.4)


def test_default_decode_numbers_follow_sglang_formulas(default_doc):
    """Decode: mfs 0.885 from its serve config, P 177 GiB, W 43.66 GiB, mrr 128, bf16 index-K on
    fp8 accounting (SGLang budgets the fp8 132 B/slot)."""
    g = group(default_doc, "decode")
    assert g["mem_fraction_static"] == 0.885 and g["mem_fraction_static_source"] == "serve config"
    r = g["ranks"][0]
    # §3.2: available = (P - W - other) - P * (1 - mfs)
    assert r["available_bytes"] == int((177.0 - 43.66 - 0.0 - 177.0 * (1 - 0.885)) * GIB) == 121_316_719_984
    # §2.6/§2.7: slots = mrr + 1 = 129; c128 rows = ceil((129*128 + 128 + 1) / 128) * 128; 2H*fp32*n128
    slots = 128 + 1
    rows = math.ceil((slots * 128 + 128 + 1) / 128) * 128
    assert r["fixed_bytes"] == rows * 1024 * 4 * FLASH_N128 == 1_373_634_560
    assert r["bytes_per_full_token"] == FLASH_BPFT_FP8
    # §2.8: full = int((avail - fixed) / bpft), page floor; swa/c4/c128/states from full
    full = int((r["available_bytes"] - r["fixed_bytes"]) / FLASH_BPFT_FP8) // PAGE * PAGE
    swa = int(full * 0.1) // PAGE * PAGE
    assert pools(r) == [full, swa, full // 4, full // 128, swa // PAGE * 8, slots * 128]
    assert r["full_max_total_num_tokens"] == 16_924_928
    assert r["max_running_requests"] == 128 and r["swa_mode"] == "ratio"
    ik = r["index_k"]
    assert (ik["dtype"], ik["accounting"], ik["budget_bytes_per_slot"], ik["real_bytes_per_slot"]) == ("bf16", "fp8", 132, 256)
    assert ik["real_gib"] > ik["budget_gib"] and ik["overcommit_gib"] == pytest.approx(ik["real_gib"] - ik["budget_gib"], abs=0.002)
    # §4: exact accounting prices the bf16 slot: bpft + n4 * 124 / 4
    assert ik["exact"]["bytes_per_full_token"] == FLASH_BPFT_FP8 + 21 * 124 / 4 == 7737.75
    assert ik["exact"]["full_max_total_num_tokens"] == int((r["available_bytes"] - r["fixed_bytes"]) / 7737.75) // PAGE * PAGE
    assert 0 < r["headroom_gib"] < g["activation_reserve_gib"]
    # every TP rank holds the same replica (§3.3)
    assert all(pools(x) == pools(r) for x in g["ranks"])


def test_default_prefill_numbers(default_doc):
    g = group(default_doc, "prefill")
    r = g["ranks"][0]
    assert g["mem_fraction_static"] == 0.865
    assert r["available_bytes"] == int((177.0 - 43.66 - 177.0 * (1 - 0.865)) * GIB)
    assert r["fixed_bytes"] == 2_715_811_840                     # mrr 256: the §2.7 TP8 figure (oracle)
    assert r["full_max_total_num_tokens"] == int((r["available_bytes"] - 2_715_811_840) / FLASH_BPFT_FP8) // PAGE * PAGE
    assert r["full_max_total_num_tokens"] == 16_199_168
    assert g["server_args"]["chunked_prefill_size"] == 8192 and g["server_args"]["disaggregation_mode"] == "prefill"
    assert any("9.822 GiB per rank over budget" in w for w in g["warnings"])


def test_default_table_and_markdown_show_the_same_numbers():
    r = run_cli("plan")
    assert r.code == 0, r.err
    assert "prefill ranks 0-3" in r.out and "decode ranks 0-3" in r.out
    assert "16,924,928" in r.out and "16,199,168" in r.out
    assert "mem_fraction_static 0.885 (serve config)" in r.out

    m = run_cli("plan", "--markdown")
    assert m.code == 0, m.err
    lines = m.out.splitlines()
    assert lines[0] == "## dsv4ctl plan: dsv4-flash-8xb200-pd (deepseek-v4-flash, SGLang 0.5.23)"
    assert "| per rank | prefill ranks 0-3 | decode ranks 0-3 |" in lines
    assert "| full tokens | 16,199,168 | 16,924,928 |" in lines
    assert "| GPUs | 0,1,2,3 | 4,5,6,7 |" in lines
    assert any(ln.startswith("- **warning** `decode`: index-K is bf16 (256 B/slot)") for ln in lines)

    g = run_cli("plan", "--markdown", "-g", "decode")
    assert "| per rank | decode ranks 0-3 |" in g.out and "prefill" not in g.out


# ------------------------------------------------------------------------ verdict and fixes
def test_overcommit_beyond_headroom_exits_1_and_prints_working_fixes():
    r = run_cli("plan", "--set", "mem_fraction_static=0.95", "-g", "decode")
    assert r.code == 1
    err = r.err.splitlines()
    # the deciding term first, with the table row's headroom
    assert len(err) == 1 and err[0].startswith("dsv4ctl: plan fails: decode: the pools (135.823 GiB as allocated")
    assert err[0].endswith("exceed the 133.34 GiB left after weights: headroom -3.349 GiB") and "Traceback" not in r.err

    d = plan_json("--set", "mem_fraction_static=0.95", "-g", "decode", code=1)
    g = group(d, "decode")
    assert d["ok"] is False and len(g["errors"]) == 1
    assert g["verdict"]["level"] == "fails" and g["verdict"]["deciding"] == "pools"
    rank = g["ranks"][0]
    assert rank["headroom_gib"] == -3.349 and rank["verdict"] == "fails" and rank["deciding"] == "pools"
    fixes = g["fixes"]
    # smallest change first: a serve-config value, then the tree changes
    assert fixes[0].startswith("set mem-fraction-static: 0.912 (from 0.95) in the serve config (re-planned: tight")
    assert fixes[1].startswith(f"or apply the index-K sizing patch (index_k_accounting: exact): full tokens "
                               f"{rank['full_max_total_num_tokens']:,} -> {rank['index_k']['exact']['full_max_total_num_tokens']:,}")
    assert fixes[2].startswith("or store index-K in fp8 (index_k_dtype: fp8)")
    # each fix really makes the plan pass; the mem-fraction-static fix is the largest value that
    # keeps 90 % of SGLang's activation estimate: above it the plan is tight (a heuristic shortfall,
    # exit 0, never a contradiction of the fix), and only pools that do not fit fail
    for fix in (["--set", "mem_fraction_static=0.912"],
                ["--set", "mem_fraction_static=0.95", "--set", "index_k_accounting=exact"],
                ["--set", "mem_fraction_static=0.95", "--set", "index_k_dtype=fp8"]):
        ok = plan_json(*fix, "-g", "decode")
        assert ok["ok"] is True, fix
        assert group(ok, "decode")["verdict"]["deciding"] != "activation", fix
    above = group(plan_json("--set", "mem_fraction_static=0.913", "-g", "decode"), "decode")["verdict"]
    assert (above["level"], above["deciding"]) == ("tight", "activation")
    assert "a heuristic SGLang uses only to choose mem_fraction_static" in above["message"]
    levels = {m: group(plan_json("--set", f"mem_fraction_static={m}", "-g", "decode", code=None), "decode")["verdict"]["level"]
              for m in (0.92, 0.93, 0.94, 0.95)}
    assert [lv for lv in levels.values()] == sorted(levels.values(), key=["tight", "fails"].index)
    assert levels[0.95] == "fails" and "tight" in levels.values()


# ------------------------------------------------------------------------------- what-ifs
def test_dp_attention_what_if_has_one_rank_per_dp_rank():
    d = plan_json("--set", "enable_dp_attention=true", "--set", "dp_size=4", "-g", "decode")
    g = group(d, "decode")
    assert (g["tp"], g["dp"], g["dp_attention"]) == (4, 4, True)
    assert [(r["gpu"], r["tp_rank"], r["pp_rank"], r["dp_rank"]) for r in g["ranks"]] == [
        (4, 0, 0, 0), (5, 1, 0, 1), (6, 2, 0, 2), (7, 3, 0, 3)]
    r = g["ranks"][0]
    assert r["max_running_requests"] == 128 // 4                     # §2.6: mrr // attn_dp
    # decode with mrr_req <= 32: 2 * 32 extra slots (pd_disaggregation_hook.py)
    slots = 32 + 1 + 64
    assert r["c128_state_pool_size"] == slots * 128
    assert g["server_args"]["attn_dp_size"] == 4


def test_dp_without_attention_replicates_tp_groups():
    d = plan_json("--set", "tp_size=2", "--set", "dp_size=2", "-g", "decode")
    g = group(d, "decode")
    assert [(r["gpu"], r["tp_rank"], r["pp_rank"], r["dp_rank"]) for r in g["ranks"]] == [
        (4, 0, 0, 0), (5, 1, 0, 0), (6, 0, 0, 1), (7, 1, 0, 1)]
    assert len({tuple(pools(r)) for r in g["ranks"]}) == 1


@pytest.mark.parametrize("pp,tp,layers", [
    (2, 2, [[0, 21], [21, 43]]),                               # §2.1: the last rem stages get one more layer
    (4, 1, [[0, 10], [10, 21], [21, 32], [32, 43]]),
])
def test_pp_what_if_slices_layers_and_takes_the_min(pp, tp, layers):
    d = plan_json("--set", f"pp_size={pp}", "--set", f"tp_size={tp}", "-g", "decode")
    g = group(d, "decode")
    assert len(g["ranks"]) == pp * tp
    assert [r["pp_rank"] for r in g["ranks"]] == [s for s in range(pp) for _ in range(tp)]
    assert [r["tp_rank"] for r in g["ranks"]] == list(range(tp)) * pp
    assert all(r["dp_rank"] == 0 for r in g["ranks"])
    assert [g["ranks"][s * tp]["layers"] for s in range(pp)] == layers
    assert len({r["full_max_total_num_tokens"] for r in g["ranks"]}) == 1     # PP MIN (§2.8)


def test_pp2_stage1_matches_the_oracle_fixture():
    """§5.5: Flash PP=2 stage 1 (layers 21..42) on 138,484,778,008 B: bpft 3685.0, full 37,175,296
    on its own; under the PP MIN the plan can only be lower or equal."""
    d = plan_json("--set", "pp_size=2", "--set", "tp_size=2", "--set", "available_bytes=138484778008",
                  "--set", "index_k_dtype=fp8", "--set", "max_running_requests=256", "-g", "prefill")
    st1 = [r for r in group(d, "prefill")["ranks"] if r["pp_rank"] == 1][0]
    assert st1["layers"] == [21, 43] and st1["bytes_per_full_token"] == 3685.0
    assert st1["full_max_total_num_tokens"] <= 37_175_296


@pytest.mark.parametrize("args,bpft,expected", [
    # §5.5 oracle rows (TP8 defaults: mrr 256, page 256, swa ratio 0.1)
    (["--set", "available_bytes=138484778008", "--set", "index_k_dtype=fp8"], 7086.75,
     [19_158_016, 1_915_648, 4_789_504, 149_672, 59_864, 32_896]),
    (["--set", "available_bytes=138484778008", "--set", "index_k_accounting=exact"], 7737.75,
     [17_546_240, 1_754_624, 4_386_560, 137_080, 54_832, 32_896]),
    (["--set", "model=deepseek-v4-pro", "--set", "available_bytes=48569637666", "--set", "weights_gib_per_rank=105.57", "--set", "index_k_dtype=fp8"], 10115.25,
     [4_385_280, 438_528, 1_096_320, 34_260, 13_704, 32_896]),
    (["--set", "model=deepseek-v4-pro", "--set", "available_bytes=48569637666", "--set", "weights_gib_per_rank=105.57", "--set", "index_k_accounting=exact"], 11045.25,
     [4_016_128, 401_408, 1_004_032, 31_376, 12_544, 32_896]),
    (["--set", "available_bytes=138484778008", "--set", "index_k_dtype=fp8",
      "--set", "SGLANG_DSV4_COMPRESS_STATE_DTYPE=bf16"], 6750.75,
     [20_312_832, 2_031_104, 5_078_208, 158_694, 63_472, 32_896]),
    (["--set", "available_bytes=138484778008", "--set", "index_k_dtype=fp8",
      "--set", "SGLANG_OPT_USE_ONLINE_COMPRESS=1"], 7086.75,
     [19_536_640, 1_953_536, 4_884_160, 152_630, 61_048, 257]),
    (["--set", "model=pro", "--set", "available_bytes=48569637666", "--set", "weights_gib_per_rank=105.57", "--set", "index_k_dtype=fp8",
      "--set", "swa_full_tokens_ratio=0.075"], 8983.125,
     [4_937_984, 370_176, 1_234_496, 38_578, 11_568, 32_896]),
], ids=["flash-fp8", "flash-bf16-exact", "pro-fp8", "pro-bf16-exact", "flash-bf16-state", "flash-online-c128",
        "pro-swa-0.075"])
def test_model_and_switch_what_ifs_match_sglang_oracle(args, bpft, expected):
    d = plan_json(*args, "-g", "prefill")
    r = group(d, "prefill")["ranks"][0]
    assert r["bytes_per_full_token"] == bpft
    assert pools(r) == expected
    assert r["max_running_requests"] == 256


def test_available_bytes_from_memory_matches_the_worked_example():
    """§4 worked example: TP8, mfs 0.852, P 177 GiB, W 21.83 GiB -> 138,484,778,008 B and, with
    fp8 index-K, the oracle's 19,158,016 full tokens; 8 ranks (4 beyond the group's GPUs)."""
    # the TP8 figures on the 4-GPU prefill group: the pools of a rank do not depend on tp (§3.3)
    d = plan_json("--set", "mem_fraction_static=0.852", "--set", "free_gib_before_load=177.0",
                  "--set", "weights_gib_per_rank=21.83", "--set", "index_k_dtype=fp8", "-g", "prefill")
    g = group(d, "prefill")
    assert len(g["ranks"]) == 4
    r = g["ranks"][0]
    assert r["available_bytes"] == 138_484_778_008
    assert r["full_max_total_num_tokens"] == 19_158_016


def test_model_what_if_by_name_alias_and_config_path(tmp_path):
    pro = plan_json("--set", "model=deepseek-v4-pro", "--set", "weights_gib_per_rank=43.66", "-g", "decode")
    assert pro["model"] == "deepseek-v4-pro"
    assert group(pro, "decode")["ranks"][0]["layers"] == [0, 61]
    assert group(pro, "decode")["ranks"][0]["bytes_per_full_token"] == 10115.25
    alias = plan_json("--set", "model=deepseek-ai/DeepSeek-V4-Pro", "--set", "weights_gib_per_rank=43.66", "-g", "decode")
    assert pools(group(alias, "decode")["ranks"][0]) == pools(group(pro, "decode")["ranks"][0])
    # any local config.json: the shipped Flash config copied elsewhere plans like Flash
    from dsv4ctl.resources import MODELS_DIR
    cfg = tmp_path / "flash" / "config.json"
    cfg.parent.mkdir()
    shutil.copy(MODELS_DIR / "deepseek-v4-flash.json", cfg)
    by_path = plan_json("--set", f"model={cfg}", "-g", "decode")
    by_dir = plan_json("--set", f"model={cfg.parent}", "-g", "decode")
    flash = plan_json("-g", "decode")
    assert by_path["model"] == str(cfg)
    for doc in (by_path, by_dir):
        assert pools(group(doc, "decode")["ranks"][0]) == pools(group(flash, "decode")["ranks"][0])


def test_profile_given_by_shipped_name_and_path_agree(default_doc):
    by_name = plan_json("dsv4-flash-8xb200-pd")
    by_path = plan_json(str(DEFAULT_PROFILE))
    assert by_name["groups"] == by_path["groups"] == default_doc["groups"]


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("args,expected", [
    (["--set", "index-k-dtype=bf16"], "--set index-k-dtype: unknown key (did you mean index_k_dtype?); known: "),
    (["--set", "nokey"], "--set 'nokey': expected KEY=VALUE"),
    (["--set", "tp_size=four"], "--set tp_size: expected an integer, got 'four'"),
    (["--set", "page_size=-256"], "--set page_size: must be >= 0, got -256"),
    (["--set", "mem_fraction_static=lots"], "--set mem_fraction_static: expected a number, got 'lots'"),
    (["--set", "enable_dp_attention=maybe"], "--set enable_dp_attention: expected a boolean, got 'maybe'"),
    (["--set", "mem_fraction_static=1.5"], "group prefill: mem_fraction_static must be in (0, 1), got 1.5"),
    (["--set", "index_k_dtype=fp16"], "group prefill: index_k_dtype 'fp16' not in ('fp8', 'bf16', 'fp4')"),
    (["--set", "model=deepseek-v4-mega"], "--set model: unknown model 'deepseek-v4-mega': not a shipped model "
                                          "(deepseek-v4-flash, deepseek-v4-pro) and no config.json at "),
    (["--set", "weights_gib_per_rank=inf"], "--set weights_gib_per_rank: must be a finite number >= 0.0, got 'inf'"),
    (["--set", "free_gib_before_load=0"], "--set free_gib_before_load: must be > 0 GiB, got 0.0"),
    (["-g", "nosuch"], f"{DEFAULT_PROFILE}: no group 'nosuch' (groups: prefill, decode, router)"),
    (["--bogus"], "dsv4ctl plan: No such option: --bogus (see 'dsv4ctl plan --help')"),
    (["a.yaml", "b.yaml"], "dsv4ctl plan: Got unexpected extra argument(s) (b.yaml) (see 'dsv4ctl plan --help')"),
    (["-g", "router"], "group 'router' is the router: it has no KV pools"),
], ids=["dashed-key", "no-equals", "bad-int", "negative", "bad-float", "bad-bool", "mfs-range", "bad-dtype",
        "unknown-model", "infinite", "zero-free-memory", "unknown-group", "unknown-option", "extra-argument",
        "router-group"])
def test_bad_set_or_group_is_one_line_exit_2(args, expected):
    r = run_cli("plan", *args)
    assert r.code == 2 and r.out == "" and "Traceback" not in r.err
    lines = r.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dsv4ctl: error: " + expected), lines


def test_a_server_argument_set_as_sglangs_option_is_the_same_what_if(default_doc):
    # SGLang's own spelling (as in the serve config and on the command line) plans as the underscore key;
    # dsv4ctl's own inputs (index-k-dtype above) keep one spelling
    want = plan_json("--set", "mem_fraction_static=0.8")
    assert want["groups"] != default_doc["groups"]
    assert plan_json("--set", "mem-fraction-static=0.8") == want
    assert plan_json("--set", "--mem-fraction-static=0.8") == want


def test_unknown_command_is_a_one_line_usage_error():
    r = run_cli("plna")
    assert r.code == 2 and r.out == "" and "Traceback" not in r.err
    assert r.err.splitlines() == [
        "dsv4ctl: error: dsv4ctl: No such command 'plna'. Did you mean 'plan'? (see 'dsv4ctl --help')"]


def test_pro_what_if_names_the_weights_first_and_offers_only_gpus():
    """Issue 18: Pro on the 4-GPU group fails on the weights (the published checkpoint sharded at TP4,
    issue 27: 200.566 + 2.6 GiB load overhead per rank),
    named first; no mem-fraction or index-K fix is offered (they cannot work), only more GPUs,
    re-planned."""
    r = run_cli("plan", "-g", "decode", "--json", "--set", "model=deepseek-v4-pro",
                "--set", "available_bytes=48569637666", "--set", "index_k_dtype=fp8")
    assert r.code == 1
    (g,) = json.loads(r.out)["groups"]
    assert g["errors"] == ["the weights (203.166 GiB per rank) and other memory do not fit in 177.0 GiB free per GPU "
                           "on 4 GPUs (tp4 pp1)"]
    assert g["verdict"]["deciding"] == "weights"
    assert g["fixes"] == ["use 8 GPUs per group (tp-size: 8, weights ~104.54 GiB per rank) (re-planned: fits, headroom 26.3 GiB)"]
    # the given available_bytes with weights that fit but a GPU it cannot fit: a warning, not a verdict
    r = run_cli("plan", "-g", "decode", "--json", "--set", "available_bytes=150000000000", "--set", "index_k_dtype=fp8")
    g = json.loads(r.out)["groups"][0]
    assert r.code == 0 and g["verdict"]["deciding"] == "available_bytes"
    assert {(x["verdict"], x["deciding"]) for x in g["ranks"]} == {("tight", "available_bytes")}   # ranks agree
    assert [w for w in g["warnings"] if "the given available_bytes (150,000,000,000 B)" in w]
    r = run_cli("plan", "-g", "decode", "--json", "--set", "available_bytes=100000000000", "--set", "index_k_dtype=fp8")
    assert not [w for w in json.loads(r.out)["groups"][0]["warnings"] if "the given available_bytes" in w]


def test_available_bytes_above_the_gpu_is_bad_input():
    r = run_cli("plan", "-g", "decode", "--set", "available_bytes=1000000000000")
    assert r.code == 2 and r.err == ("dsv4ctl: error: available_bytes 1,000,000,000,000 B is more than the GPU's memory "
                                     "(183,359 MiB = 192,265,846,784 B): it cannot be SGLang's number for this group\n")


@pytest.mark.parametrize("sets, said", [
    (("free_gib_before_load=5000",), "free_gib_before_load 5000.0 GiB is more than the GPU's memory (183,359 MiB"),
    (("gpu_memory_mib=1",), "free_gib_before_load 177.0 GiB is more than the GPU's memory (1 MiB"),
])
def test_free_memory_above_the_gpu_is_bad_input(sets, said):
    r = run_cli("plan", "-g", "decode", *[x for s in sets for x in ("--set", s)])
    assert r.code == 2 and said in r.err and r.err.count("\n") == 1


LONGER = ("--set", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")   # past the model's 1M: SGLang's env switch


def test_a_context_or_token_cap_failure_offers_a_fix_that_passes():
    """--set context_length=10^9: req_to_token alone is 480 GiB; the fix is the largest context
    length (to 1,024 tokens) that re-plans without failing. --set max_total_tokens=1: no KV
    memory; the fix removes the cap."""
    r = run_cli("plan", "-g", "decode", "--json", "--set", "context_length=1000000000", *LONGER)
    assert r.code == 1
    (fix,) = json.loads(r.out)["groups"][0]["fixes"]
    assert fix.startswith("set context-length: 12119040 (from 1000000000) in the serve config (re-planned: ")
    ok = json.loads(run_cli("plan", "-g", "decode", "--json", "--set", "context_length=12119040", *LONGER).out)["groups"][0]
    assert ok["verdict"]["level"] != "fails" and ok["verdict"]["deciding"] != "activation"
    over = run_cli("plan", "-g", "decode", "--json", "--set", "context_length=12120064", *LONGER)
    v = json.loads(over.out)["groups"][0]["verdict"]
    assert (over.code, v["level"], v["deciding"]) == (0, "tight", "activation")     # past the fix: a warning
    r = run_cli("plan", "-g", "decode", "--json", "--set", "max_total_tokens=1")
    g = json.loads(r.out)["groups"][0]
    assert r.code == 1 and g["verdict"]["deciding"] == "no_kv_memory"
    assert g["fixes"][0].startswith("remove max-total-tokens (1) from the serve config (re-planned: tight")


@pytest.mark.parametrize("mfs", ["0.80", "0.85", "0.88", "0.90", "0.93"])
def test_field_proven_v4_pro_settings_do_not_fail(mfs):
    """Issue 27: V4-Pro on H200 serves at mem-fraction-static 0.90 in the field, and every value
    from 0.80 to 0.93 used to fail on the activation heuristic. None fails now; the plan says
    tight, naming SGLang's estimate as a heuristic."""
    d = plan_json("dsv4-pro-4xh200-pd", "--set", f"mem_fraction_static={mfs}")
    assert d["ok"] is True
    for g in d["groups"]:
        assert g["verdict"]["level"] in ("fits", "tight"), g["verdict"]
        if g["verdict"]["deciding"] == "activation":
            assert "a heuristic SGLang uses only to choose mem_fraction_static" in g["verdict"]["message"]
