"""dsv4ctl.plan.capacity against SGLang 0.5.23 itself.

(a) Stored oracle output (tests/data/oracle_matrix.json, written by
    ``.venv-oracle/bin/python -m tests.oracle.matrix --write tests/data/oracle_matrix.json``):
    every field of every case must be reproduced exactly, floats bit for bit. No oracle needed.
(b) The live oracle (``.venv-oracle``, marked ``oracle``) on seeded random configurations that are
    not in the matrix, plus the stored matrix cases that share the random draws' environments.
"""

from __future__ import annotations

import copy
import json
import os
import random

import pytest

from dsv4ctl.plan import capacity as cap
from tests.conftest import ORACLE_PY, REPO
from tests.oracle.fixtures import forked_oracle  # noqa: F401 - the oracle's fork servers
from tests.oracle import matrix, twin
from tests.oracle.runner import DEFAULT_SERVER_ARGS, batch_key, run_cases

MATRIX_PATH = REPO / "tests" / "data" / "oracle_matrix.json"
MATRIX = json.loads(MATRIX_PATH.read_text())
CASES = MATRIX["cases"]
GIB = 1 << 30


# ---------------------------------------------------------------------------------------------
# (a) the stored matrix
# ---------------------------------------------------------------------------------------------


def test_matrix_is_sglang_0_5_23_and_current():
    assert MATRIX["schema"] == "dsv4ctl.oracle-matrix/1"
    assert MATRIX["sglang_version"] == "0.5.23"
    # The stored inputs are exactly what tests/oracle/matrix.py runs: the data is not stale.
    assert [c["input"] for c in CASES] == matrix.cases()


def _pool_inputs():
    return [c["input"] for c in CASES if c["input"]["kind"] == "pool"]


def test_matrix_covers_the_required_configurations():
    pool = _pool_inputs()
    ok = [c["input"] for c in CASES if c["input"]["kind"] == "pool" and "error" not in c["output"]]
    assert len(ok) >= 40
    has = lambda pred: any(pred(c) for c in ok)  # noqa: E731
    sa = lambda c: c["server_args"]  # noqa: E731
    env = lambda c: c["env"]  # noqa: E731
    required = {
        "flash": lambda c: c["model"] == "deepseek-v4-flash",
        "pro": lambda c: c["model"] == "deepseek-v4-pro",
        "tp-only": lambda c: c["pp_size"] == 1 and c["attn_dp_size"] == 1 and not env(c),
        "dp4": lambda c: c["attn_dp_size"] == 4,
        "dp8": lambda c: c["attn_dp_size"] == 8,
        "pp2": lambda c: c["pp_size"] == 2,
        "pp4": lambda c: c["pp_size"] == 4,
        "state-bf16": lambda c: env(c).get("SGLANG_DSV4_COMPRESS_STATE_DTYPE") == "bf16",
        "state-fp32": lambda c: "SGLANG_DSV4_COMPRESS_STATE_DTYPE" not in env(c),
        "eagle": lambda c: sa(c).get("speculative_algorithm") == "EAGLE",
        "online-c128": lambda c: env(c).get("SGLANG_OPT_USE_ONLINE_COMPRESS") == "1",
        "v41": lambda c: env(c).get("SGLANG_DSV4_KV_LAYOUT") == "v41",
        "v41_new": lambda c: env(c).get("SGLANG_DSV4_KV_LAYOUT") == "v41_new",
        "trtllm": lambda c: sa(c).get("dsv4_attn_backend") == "trtllm",
        "cap-mode": lambda c: sa(c)["_swa_full_tokens_ratio_explicitly_set"] is False,
        "pd-decode-extra-slots": lambda c: sa(c).get("disaggregation_mode") == "decode"
        and sa(c).get("disaggregation_decode_extra_slots", 0) > 0,
        "bf16-index-k": lambda c: c["index_k"] == "bf16",
        "max-total-tokens": lambda c: sa(c).get("max_total_tokens") is not None,
    }
    missing = [name for name, pred in required.items() if not has(pred)]
    assert not missing
    assert len({c["available_bytes"] if isinstance(c["available_bytes"], int)
                else tuple(c["available_bytes"]) for c in pool}) >= 10
    # PP cases where the MIN across stages really lowers a stage's own answer.
    assert any(len({s["unconstrained_full_tokens"] for s in c["output"]["stages"]}) > 1
               for c in CASES if c["input"].get("pp_size", 1) > 1 and "stages" in c["output"])
    resolve = [c for c in CASES if c["input"]["kind"] == "resolve"]
    assert len(resolve) >= 10
    assert len({c["output"]["mem_fraction_static"] for c in resolve}) >= 8


def test_matrix_check_names_what_changed():
    live = copy.deepcopy(MATRIX)
    assert matrix.compare(MATRIX, live) == ""
    live["cases"][3]["output"]["stages"][0]["c4_state_pool_size"] += 8
    assert matrix.compare(MATRIX, live) == f"sglang 0.5.23 -> 0.5.23; cases: {CASES[3]['id']}"
    live = copy.deepcopy(MATRIX)
    live["sglang_version"] = "0.5.24"
    assert matrix.compare(MATRIX, live) == "sglang 0.5.23 -> 0.5.24; cases: metadata"


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_capacity_reproduces_sglang_exactly(case):
    """Every stored field: bytes per full/SWA token (float ==), fixed bytes, rings, the PP
    stage's own and final pool sizes, max_running_requests, layouts, refusals, and for resolve
    cases mem_fraction_static / chunked prefill / decode max_bs."""
    assert twin.diff(case["input"], case["output"]) == []


def test_float_comparison_is_bit_exact():
    case = next(c for c in CASES if c["id"] == "flash-eagle-4")
    bpft = case["output"]["stages"][0]["bytes_per_full_token"]
    assert bpft == 7939.186046511628
    nudged = copy.deepcopy(case["output"])
    nudged["stages"][0]["bytes_per_full_token"] = bpft + bpft * 2 ** -52
    assert nudged["stages"][0]["bytes_per_full_token"] != bpft
    assert any("bytes_per_full_token" in d for d in twin.diff(case["input"], nudged))


@pytest.mark.parametrize("field", ["full_max_total_num_tokens", "swa_max_total_num_tokens",
                                   "c4_max_total_num_tokens", "c128_max_total_num_tokens",
                                   "c4_state_pool_size", "c128_state_pool_size",
                                   "max_running_requests", "c128_state_fixed_bytes"])
def test_comparison_catches_any_pool_difference(field):
    case = next(c for c in CASES if c["id"] == "pro-pp2-uneven-budget")
    for stage in range(2):
        wrong = copy.deepcopy(case["output"])
        wrong["stages"][stage][field] += 1
        assert twin.diff(case["input"], wrong) == [
            f"pro-pp2-uneven-budget: stage {stage}: {field}: dsv4ctl "
            f"{case['output']['stages'][stage][field]!r} != sglang "
            f"{wrong['stages'][stage][field]!r}"]


def test_comparison_catches_refusal_disagreement():
    case = next(c for c in CASES if c["id"] == "flash-v41-trtllm-rejected")
    assert "trtllm uses uniform FP8 pools" in case["output"]["error"]
    assert twin.diff(case["input"], {"kv_layout": "v4", "compressed_kv_layouts": None,
                                     "stages": []}) != []


@pytest.mark.parametrize("cid,mfs", [
    ("resolve-b200-tp8", 0.852), ("resolve-b200-tp4", 0.855), ("resolve-b200-tp8-dp8", 0.751),
    ("resolve-b200-tp4-dp4", 0.805), ("resolve-b200-pd-decode-tp8", 0.944),
    ("resolve-b200-pd-decode-tp8-dp8", 0.869), ("resolve-b300-tp8", 0.901),
    ("resolve-gb200-tp4", 0.859), ("resolve-h200-tp8", 0.897),
])
def test_stored_resolution_agrees_with_reference_table(cid, mfs):
    """The stored oracle output reproduces the capacity reference §3.1 table, and so does
    dsv4ctl.plan.capacity.default_mem_fraction_static."""
    case = next(c for c in CASES if c["id"] == cid)
    assert case["output"]["mem_fraction_static"] == mfs
    assert cap.default_mem_fraction_static(twin.memory_args(case["input"])) == mfs


def test_stored_pool_sizes_agree_with_reference_table():
    """Reference §5.5 rows printed by the real configurator (independent of this matrix run)."""
    by_id = {c["id"]: c["output"] for c in CASES}
    row = lambda cid, stage=0: tuple(by_id[cid]["stages"][stage][f] for f in (  # noqa: E731
        "bytes_per_full_token", "full_max_total_num_tokens", "swa_max_total_num_tokens",
        "c4_max_total_num_tokens", "c128_max_total_num_tokens", "c4_state_pool_size",
        "c128_state_pool_size", "max_running_requests"))
    assert row("flash-tp8") == (7086.75, 19158016, 1915648, 4789504, 149672, 59864, 32896, 256)
    assert row("pro-tp8") == (10115.25, 4385280, 438528, 1096320, 34260, 13704, 32896, 256)
    assert row("flash-dp8") == (7086.75, 19489536, 1948928, 4872384, 152262, 60904, 4224, 32)
    assert row("flash-cap") == (3899.25, 29727488, 622848, 7431872, 232246, 19464, 32896, 256)
    assert row("pro-bf16-index-k") == (11045.25, 4016128, 401408, 1004032, 31376, 12544, 32896, 256)
    assert row("flash-online-c128") == (7086.75, 19536640, 1953536, 4884160, 152630, 61048, 257, 256)
    assert row("flash-pp2", 1)[0] == 3685.0


# ---------------------------------------------------------------------------------------------
# (b) the live oracle on random configurations outside the matrix
# ---------------------------------------------------------------------------------------------

SEED = int(os.environ.get("DSV4CTL_ORACLE_SEED", "523"))
N_RANDOM = 40
ENV_PROFILES = [
    {},
    {"SGLANG_DSV4_COMPRESS_STATE_DTYPE": "bf16"},
    {"SGLANG_DSV4_KV_LAYOUT": "v41"},
    {"SGLANG_DSV4_KV_LAYOUT": "v41_new", "SGLANG_DSV4_COMPRESS_STATE_DTYPE": "bf16"},
    {"SGLANG_OPT_USE_ONLINE_COMPRESS": "1"},
]


def random_cases(seed: int = SEED, n: int = N_RANDOM) -> list[dict]:
    """``n`` pool cases drawn from ``seed``: model, available bytes 20-200 GiB (per PP stage),
    max_running_requests, attention DP, PP, env (state dtype, layout, online c128), EAGLE draft
    1-10, trtllm, SWA ratio or cap mode, PD decode extra slots, bf16 index-K, page size,
    chunked prefill and --max-total-tokens."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        env = dict(rng.choice(ENV_PROFILES))
        model = rng.choice(["deepseek-v4-flash", "deepseek-v4-pro"])
        pp = rng.choice([1, 1, 1, 2, 4])
        dp = rng.choice([1, 1, 2, 4, 8])
        sa = dict(DEFAULT_SERVER_ARGS)
        sa["max_running_requests"] = rng.choice([8, 32, 64, 128, 256, 256, 512, 1024])
        sa["chunked_prefill_size"] = rng.choice([2048, 4096, 8192, 16384])
        if rng.random() < 0.1:
            sa["page_size"] = 512
        online = "SGLANG_OPT_USE_ONLINE_COMPRESS" in env
        spec = not online and rng.random() < 0.4
        if spec:
            sa.update(speculative_algorithm="EAGLE",
                      speculative_num_draft_tokens=rng.randint(1, 10))
        if not spec and rng.random() < 0.3:
            sa["_swa_full_tokens_ratio_explicitly_set"] = False
            if rng.random() < 0.3:
                sa["swa_prefix_tails"] = rng.randint(0, 2000)
        else:
            sa["swa_full_tokens_ratio"] = rng.choice([0.05, 0.075, 0.1, 0.125, 0.2, 0.3])
        if "SGLANG_DSV4_KV_LAYOUT" not in env and rng.random() < 0.2:
            sa["dsv4_attn_backend"] = "trtllm"
        if rng.random() < 0.2:
            sa.update(disaggregation_mode="decode",
                      disaggregation_decode_extra_slots=rng.choice([0, 2, 16, 64]))
        if rng.random() < 0.15:
            sa["max_total_tokens"] = rng.randint(500_000, 40_000_000)
        avail = [rng.randint(20 * GIB, 200 * GIB) for _ in range(pp)]
        out.append({"id": f"random-{seed}-{i}", "kind": "pool", "model": model,
                    "available_bytes": avail if pp > 1 and rng.random() < 0.5 else avail[0],
                    "pp_size": pp, "attn_dp_size": dp,
                    "index_k": "bf16" if rng.random() < 0.3 else "fp8", "sm100": True,
                    "server_args": sa, "env": env})
    return out


RANDOM = random_cases()


def test_random_cases_are_outside_the_matrix_and_varied():
    stored = [c["input"] for c in CASES]
    strip = lambda c: {k: v for k, v in c.items() if k != "id"}  # noqa: E731
    assert not any(strip(r) == strip(s) for r in RANDOM for s in stored)
    assert len({batch_key(c) for c in RANDOM}) == len(ENV_PROFILES)   # few subprocesses
    assert {c["model"] for c in RANDOM} == {"deepseek-v4-flash", "deepseek-v4-pro"}
    assert {c["pp_size"] for c in RANDOM} == {1, 2, 4}
    assert {c["attn_dp_size"] for c in RANDOM} == {1, 2, 4, 8}
    assert sum(1 for c in RANDOM if c["server_args"].get("speculative_algorithm")) >= 5
    assert random_cases(SEED) == RANDOM and random_cases(SEED + 1) != RANDOM


needs_oracle = pytest.mark.skipif(
    not ORACLE_PY.exists(),
    reason=f"SGLang 0.5.23 CPU oracle not installed ({ORACLE_PY} missing): "
           "run `bash scripts/oracle-env.sh` (scripts/test.sh does)")


@pytest.fixture(scope="module")
def live(forked_oracle):
    """One oracle run: the random cases plus the stored matrix cases in the same environments
    (one subprocess per environment, in parallel)."""
    envs = {batch_key(c) for c in RANDOM}
    again = [c["input"] for c in CASES if batch_key(c["input"]) in envs]
    out = run_cases(RANDOM + again, timeout=300)
    return out, {r["id"]: r for r in out["results"]}


@pytest.mark.oracle
@needs_oracle
@pytest.mark.timeout(400)
def test_live_oracle_matches_stored_matrix(live):
    out, by_id = live
    assert out["sglang_version"] == MATRIX["sglang_version"]
    rerun = [c for c in CASES if c["id"] in by_id]
    assert len(rerun) >= 40
    stale = [c["id"] for c in rerun
             if {k: v for k, v in by_id[c["id"]].items() if k != "id"} != c["output"]]
    assert stale == [], "stored matrix differs from the live oracle: re-run tests.oracle.matrix --write"


@pytest.mark.oracle
@needs_oracle
@pytest.mark.timeout(400)
@pytest.mark.parametrize("case", RANDOM, ids=[c["id"] for c in RANDOM])
def test_live_oracle_random_configuration(live, case):
    _, by_id = live
    oracle = by_id[case["id"]]
    assert twin.diff(case, oracle) == [], f"seed {SEED}: {json.dumps(case)}"
