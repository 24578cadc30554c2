"""Patch (a) proved with the CPU oracle: SGLang 0.5.23's own DSV4PoolConfigurator, run from a
pristine tree with the shipped series applied and SGLANG_DSV4_INDEX_K_DTYPE=bf16, returns exactly
what dsv4ctl.plan.capacity predicts for bf16 index-K with exact accounting — and without the switch,
exactly the stock fp8 numbers. Patch (b)'s DSV4_POOL_PLAN line carries the same final sizes."""

from __future__ import annotations

import pytest

from dsv4ctl.plan import capacity as cap
from dsv4ctl.plan.models import load_model
from dsv4ctl.plan.poollog import parse_log
from tests.patchoracle.fixtures import (BYTES_CASES, FLASH_BYTES, drive, model_config,  # noqa: F401
                                        oracle_runs, patched_tree)
from tests.oracle.fixtures import forked_oracle  # noqa: F401 - the oracle's fork servers
from tests.patchoracle.trees import ORACLE_PY, REPO

pytestmark = [pytest.mark.oracle,
              pytest.mark.skipif(not ORACLE_PY.exists(), reason="needs .venv-oracle (bash scripts/oracle-env.sh)")]
CASES = BYTES_CASES


def predicted(model: str, avail: int, **inputs) -> cap.PoolSizes:
    geom, _ = load_model(model)
    return cap.Configurator(geom, cap.PoolInputs(**inputs)).calculate_pool_sizes(avail)


def as_pools(s: cap.PoolSizes) -> dict:
    return dict(full=s.full_max_total_num_tokens, swa=s.swa_max_total_num_tokens,
                c4=s.c4_max_total_num_tokens, c128=s.c128_max_total_num_tokens,
                c4_state=s.c4_state_pool_size, c128_state=s.c128_state_pool_size,
                max_running_requests=s.max_running_requests)


@pytest.fixture
def patched_results(patched_tree, oracle_runs):
    """(tree, results) in the order: per case bf16 then off, then the int8 case."""
    res = []
    for model, avail in CASES:
        res += [oracle_runs[(model, avail, "bf16")], oracle_runs[(model, avail, "off")]]
    res.append(oracle_runs[("deepseek-v4-flash", FLASH_BYTES, "int8")])
    return patched_tree, res


def test_patched_configurator_runs_from_the_patched_tree(patched_results):
    tree, res = patched_results
    assert all(r.get("sglang_file") == f"{tree}/python/sglang/__init__.py" for r in res[:-1]), res


@pytest.mark.parametrize("i", range(len(CASES)))
def test_bf16_switch_equals_dsv4ctl_bf16_exact(patched_results, i):
    _, res = patched_results
    model, avail = CASES[i]
    got = res[2 * i]
    want = predicted(model, avail, index_k_dtype="bf16", index_k_accounting="exact")
    assert got["indexer_bytes_per_token"] == 256 == want.index_k_budget_bytes
    assert got["bytes_per_full_token"] == want.bytes_per_full_token
    assert {k: got[k] for k in as_pools(want)} == as_pools(want)


@pytest.mark.parametrize("i", range(len(CASES)))
def test_switch_off_is_stock_fp8(patched_results, i):
    _, res = patched_results
    model, avail = CASES[i]
    got = res[2 * i + 1]
    want = predicted(model, avail)          # fp8 index-K, stock accounting
    assert got["indexer_bytes_per_token"] == 132
    assert got["bytes_per_full_token"] == want.bytes_per_full_token
    assert {k: got[k] for k in as_pools(want)} == as_pools(want)


def test_reference_numbers_for_the_worked_example(patched_results):
    """Capacity reference §4 / §5.5: Flash 17,546,240 (bf16) vs 19,158,016 (fp8) full tokens."""
    _, res = patched_results
    assert (res[0]["full"], res[0]["bytes_per_full_token"]) == (17_546_240, 7737.75)
    assert (res[1]["full"], res[1]["bytes_per_full_token"]) == (19_158_016, 7086.75)
    assert (res[2]["full"], res[2]["bytes_per_full_token"]) == (4_016_128, 11045.25)


def test_bad_switch_value_is_refused_by_sglang(patched_results):
    _, res = patched_results
    assert res[-1] == {"error": "ValueError: Unsupported SGLANG_DSV4_INDEX_K_DTYPE='int8'. "
                                "Expected one of: fp8, bf16."}


def test_pool_plan_line_carries_the_final_sizes(patched_results):
    _, res = patched_results
    for got in res[:-1]:
        lines = [ln for ln in got["log"] if ln.startswith("DSV4_POOL_PLAN ")]
        assert len(lines) == 1
        (rank,) = parse_log("[2026-11-29 12:00:00 TP0] " + lines[0])
        assert rank.source == "DSV4_POOL_PLAN" and rank.rank == {"TP": 0}
        assert rank.pools == {k: got[k] for k in ("full", "swa", "c4", "c128", "c4_state", "c128_state")}
        assert rank.max_running_requests == got["max_running_requests"]
        assert rank.bytes_per_full_token == got["bytes_per_full_token"]
        # the stock line is logged before finalize: its c128_state is 0
        stock = [ln for ln in got["log"] if ln.startswith("DSV4 pool sizes:")]
        assert stock and stock[-1].endswith("c128_state=0")


@pytest.mark.usefixtures("forked_oracle")
def test_pristine_sglang_ignores_the_switch():
    """Without the series the switch does not exist: the installed (pristine) 0.5.23 budgets fp8."""
    (got,) = drive(str(REPO), [dict(config=model_config("deepseek-v4-flash"), available_bytes=FLASH_BYTES,
                                    env={"SGLANG_DSV4_INDEX_K_DTYPE": "bf16"})])
    assert "site-packages/sglang" in got["sglang_file"]
    want = predicted("deepseek-v4-flash", FLASH_BYTES, index_k_dtype="bf16", index_k_accounting="fp8")
    assert got["indexer_bytes_per_token"] == 132 and got["full"] == want.full_max_total_num_tokens == 19_158_016
    assert not [ln for ln in got["log"] if ln.startswith("DSV4_POOL_PLAN")]


def test_indexer_pool_allocates_what_the_configurator_budgets(oracle_runs):
    """Budget == allocation, both from SGLang's own code: the real DeepSeekV4IndexerPool built on
    CPU at the configurator's size holds 256 B per slot with the switch (132 B without), exactly
    the bytes dsv4ctl.plan.capacity.allocated_bytes reports for that dtype."""
    from tests.patchoracle.fixtures import SMALL_BYTES
    geom, _ = load_model("deepseek-v4-flash")
    for switch, dtype, acc, idx in (("bf16", "bf16", "exact", 256), ("off", "fp8", "fp8", 132)):
        got = oracle_runs[("deepseek-v4-flash", SMALL_BYTES, switch)]
        conf = cap.Configurator(geom, cap.PoolInputs(index_k_dtype=dtype, index_k_accounting=acc))
        sizes = conf.calculate_pool_sizes(SMALL_BYTES)
        assert {k: got[k] for k in as_pools(sizes)} == as_pools(sizes)
        pool = got["indexer_pool"]
        assert pool["bytes_per_token"] == got["indexer_bytes_per_token"] == idx
        assert (pool["layers"], pool["page_bytes"]) == (21, 64 * idx)
        assert pool["pages"] == -(-(sizes.c128_max_total_num_tokens * 32 + 256) // 64)
        assert pool["bytes"] == cap.allocated_bytes(conf, sizes, idx).c4_index_k
