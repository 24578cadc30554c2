"""Every supported SGLang release proven by its own code (issue 27 item 1): the release's
``DSV4PoolConfigurator`` and ``ServerArgs`` resolution run on CPU (its wheel's sources on the
oracle environment's path, scripts/oracle-env.sh) against dsv4ctl's capacity model with that
release's rules (dsv4ctl/plan/versions.py), on a matrix chosen where the releases differ."""

from __future__ import annotations

import json

import pytest

from dsv4ctl.plan.versions import VERSIONS
from tests.oracle import twin
from tests.oracle.fixtures import forked_oracle  # noqa: F401 - the oracle's fork servers
from tests.oracle.matrix import (A_FLASH, A_PRO, B200, FLASH, GB300, H200, ONLINE, PRO, STATE_BF16,
                                 V41_LAYOUT, _pool, _resolve)
from tests.oracle.matrix import cases as capacity_matrix
from tests.oracle.runner import ORACLE_PY, VERSIONS_DIR
from tests.oracle.versions_answers import STORED, live_answers

DECODE = dict(disaggregation_mode="decode")
PREFILL = dict(disaggregation_mode="prefill")
DPA = dict(enable_dp_attention=True)

CASES = [
    # where 0.5.21 and 0.5.22 differ: the decode graph batch capped at max-running-requests
    _resolve("col-mrr32", FLASH, B200, tp_size=8, max_running_requests=32),
    _resolve("pro-dp4-mrr16", PRO, B200, tp_size=8, dp_size=4, max_running_requests=16, **DPA),
    _resolve("pro-dp8-mrr64-h200", PRO, H200, tp_size=8, dp_size=8, max_running_requests=64, **DPA),
    _resolve("gb300-mrr8", PRO, GB300, tp_size=4, max_running_requests=8),
    # where 0.5.22 and 0.5.23 differ: fewer requests than attention-DP workers
    _pool("pool-mrr4-dp8", PRO, A_PRO, dp=8, max_running_requests=4),
    _pool("pool-mrr7-dp8-decode", PRO, A_PRO, dp=8, max_running_requests=7, **DECODE),
    # where 0.5.20 and 0.5.21 differ: the configurator (no SWA cap mode, no V4.1 layouts, 584-byte
    # slots whatever the page padding or backend, the C4 state ring per sliding window)
    _pool("pool-flash-cap", FLASH, A_FLASH, _swa_full_tokens_ratio_explicitly_set=False),
    _pool("pool-pro-cap-decode", PRO, A_PRO, dp=8, _swa_full_tokens_ratio_explicitly_set=False,
          disaggregation_decode_extra_slots=0, **DECODE),
    _pool("pool-flash-trtllm", FLASH, A_FLASH, dsv4_attn_backend="trtllm"),
    _pool("pool-flash-v41", FLASH, A_FLASH, env=V41_LAYOUT),
    _pool("pool-pro-state-bf16", PRO, A_PRO, env=STATE_BF16),
    _pool("pool-pro-pp2", PRO, [A_PRO, A_PRO + (1 << 30)], pp=2),
    _pool("pool-flash-online", FLASH, A_FLASH, env=ONLINE),
    # where 0.5.19 and 0.5.20 differ: 0.5.19 accepts a SWA pool that cannot admit one request
    # (256 slots <= window 128 + page 256); no --dsv4-attn-backend (trtllm is refused)
    _pool("pool-flash-swa-floor", FLASH, 3 * (1 << 30) + 777, swa_full_tokens_ratio=0.003),
    # where they agree: the common recipes
    _resolve("flash-b200-tp8", FLASH, B200, tp_size=8),
    _resolve("flash-b200-decode", FLASH, B200, tp_size=8, chunked_prefill_size=8192, **DECODE),
    _resolve("pro-prefill-chunk8k", PRO, B200, tp_size=8, chunked_prefill_size=8192, **PREFILL),
    _resolve("pro-h200-dp8", PRO, H200, tp_size=8, dp_size=8, **DPA, **DECODE),
    _pool("pool-flash-b200", FLASH, A_FLASH),
    _pool("pool-pro-dp8-mrr256", PRO, A_PRO, dp=8),
    _pool("pool-pro-eagle", PRO, A_PRO, speculative_algorithm="EAGLE", speculative_num_draft_tokens=4),
]

needs = pytest.mark.skipif(not ORACLE_PY.exists(), reason=f"{ORACLE_PY} missing: run bash scripts/oracle-env.sh")
OLDER_GENERATION = ("0.5.18", "0.5.19", "0.5.20")   # another configurator: the whole matrix runs too


@pytest.fixture(scope="module")
def answers():
    """Each release's own answers to :data:`CASES`, as stored by ``python -m
    tests.oracle.versions_answers`` (every release's live run must equal them: the test below)."""
    return {v: json.loads(STORED.read_text())[v] for v in VERSIONS}


@pytest.mark.oracle
@needs
@pytest.mark.timeout(900)
@pytest.mark.parametrize("version", list(VERSIONS))
@pytest.mark.usefixtures("forked_oracle")
def test_dsv4ctl_reproduces_each_release(version):
    """The release's own code, run now, answers :data:`CASES` as stored (so the comparisons
    between releases below hold for the code, not for a file), and dsv4ctl's model with that
    release's rules equals every answer. 0.5.18-0.5.20, another configurator generation, also
    answer all of tests/oracle/matrix.py (106 cases: budgets, SWA ratios and cap mode, PP, DP
    attention, EAGLE, online c128, bf16 state, V4.1 layout switches, refusals) in the same run
    (one import of the release): its answers to the switches it does not have
    (SGLANG_DSV4_KV_LAYOUT) are its own V4 pools, and an argument it does not have
    (``swa_prefix_tails``; 0.5.18/0.5.19: ``dsv4_attn_backend=trtllm``) is a refusal on both
    sides, as is (0.5.18) a layer partition that does not match ``pp_size`` 1. 0.5.18/0.5.19
    price the C4 indexer inline (no function to re-price for the bf16 index-K cases, 8 of 106):
    their bf16 budget is proven on their patched trees instead (tests/test_patch_versions.py)."""
    matrix = []
    if version in OLDER_GENERATION:
        matrix = [{**c, "sglang_version": version} for c in capacity_matrix()
                  if not (version in ("0.5.18", "0.5.19") and c.get("index_k") == "bf16")]
        assert len(matrix) == (106 if version == "0.5.20" else 98)
    cases = [{**c, "sglang_version": version} for c in CASES]
    live = live_answers(version, cases + matrix)
    assert {c["id"]: live[c["id"]] for c in CASES} == json.loads(STORED.read_text())[version]
    bad = []
    for c in cases + matrix:
        bad += twin.diff(c, live[c["id"]])
    assert bad == []
    if version == "0.5.18":     # the partition is checked with one stage too (get_pp_indices)
        assert live["flash-cap-eviction-64"]["error"] == "ValueError: len(partitions)=2 does not match pp_size=1."


def test_the_matrix_tells_the_releases_apart(answers):
    """The cases chosen where the releases differ do differ, in the direction the code says
    (the stored answers: each release's live run equals them, above)."""
    a = {v: answers[v] for v in VERSIONS}
    mfs = lambda v, cid: a[v][cid]["mem_fraction_static"]  # noqa: E731
    assert mfs("0.5.21", "col-mrr32") < mfs("0.5.22", "col-mrr32") == mfs("0.5.23", "col-mrr32")
    assert mfs("0.5.21", "pro-dp4-mrr16") < mfs("0.5.22", "pro-dp4-mrr16")
    assert a["0.5.22"]["pool-mrr4-dp8"] != a["0.5.23"]["pool-mrr4-dp8"]
    assert a["0.5.21"]["pool-mrr4-dp8"] == a["0.5.22"]["pool-mrr4-dp8"]
    same = lambda v, cid: {k: x for k, x in a[v][cid].items() if k != "dsv4_attn_backend"}  # noqa: E731
    for cid in ("flash-b200-tp8", "pool-flash-b200", "pool-pro-eagle"):
        assert same("0.5.21", cid) == same("0.5.22", cid) == same("0.5.23", cid), cid
    assert a["0.5.22"]["flash-b200-tp8"]["dsv4_attn_backend"] == "auto"
    assert a["0.5.23"]["flash-b200-tp8"]["dsv4_attn_backend"] == "flashmla"
    # 0.5.20 → 0.5.21: the same argument resolution and default mem_fraction_static ...
    for c in CASES:
        if c["kind"] == "resolve":
            old, new = a["0.5.20"][c["id"]], a["0.5.21"][c["id"]]
            assert {k: v for k, v in old.items() if k != "_swa_full_tokens_ratio_explicitly_set"} == \
                   {k: v for k, v in new.items() if k != "_swa_full_tokens_ratio_explicitly_set"}, c["id"]
            assert old["_swa_full_tokens_ratio_explicitly_set"] is None   # no such field in 0.5.20
    # ... but another configurator: 584-byte slots, C4 state per 128-token window
    st = lambda v, cid: a[v][cid]["stages"][0]  # noqa: E731
    assert (st("0.5.20", "pool-flash-b200")["bytes_per_full_token"],
            st("0.5.21", "pool-flash-b200")["bytes_per_full_token"]) == (7705.450000000001, 7086.75)
    assert [(st(v, "pool-flash-b200")["full_max_total_num_tokens"], st(v, "pool-flash-b200")["c4_state_pool_size"])
            for v in ("0.5.20", "0.5.21")] == [(17619712, 110112), (19158016, 59864)]
    # no SWA cap mode: the default ratio sizes the SWA pool where 0.5.21 caps it
    assert st("0.5.20", "pool-flash-cap")["swa_cap_tokens"] is None
    assert st("0.5.21", "pool-flash-cap")["swa_cap_tokens"] is not None
    # the trtllm pool is priced at 584 bytes a slot (0.5.21: 512), the V4.1 layout does not exist
    assert st("0.5.20", "pool-flash-trtllm")["bytes_per_full_token"] > st("0.5.21", "pool-flash-trtllm")["bytes_per_full_token"]
    assert a["0.5.20"]["pool-flash-v41"]["kv_layout"] == "v4" != a["0.5.21"]["pool-flash-v41"]["kv_layout"]
    # 0.5.19 → 0.5.20: the SWA floor check, --dsv4-attn-backend; the same sizes otherwise
    assert "error" not in a["0.5.19"]["pool-flash-swa-floor"]
    assert st("0.5.19", "pool-flash-swa-floor")["swa_max_total_num_tokens"] == 256
    assert a["0.5.20"]["pool-flash-swa-floor"]["error"].startswith("ValueError: SWA pool (256 tokens) cannot hold")
    assert "error" in a["0.5.19"]["pool-flash-trtllm"] and "error" not in a["0.5.20"]["pool-flash-trtllm"]
    assert a["0.5.19"]["flash-b200-tp8"]["dsv4_attn_backend"] is None
    for c in CASES:
        if c["id"] not in ("pool-flash-swa-floor", "pool-flash-trtllm"):
            old, new = a["0.5.19"][c["id"]], a["0.5.20"][c["id"]]
            assert {k: v for k, v in old.items() if k != "dsv4_attn_backend"} == \
                   {k: v for k, v in new.items() if k != "dsv4_attn_backend"}, c["id"]
    # 0.5.18 → 0.5.19: another argument pipeline (ServerArgs.__post_init__), the same answers
    for c in CASES:
        assert a["0.5.18"][c["id"]] == a["0.5.19"][c["id"]], c["id"]
    # and the versions' rules are not all the same
    assert len({(r.mrr_floor, r.graph_bs_capped_by_mrr, r.pp_partition_at_pp1, *r.pool_flags().values())
                for r in VERSIONS.values()}) == len(VERSIONS)


def test_versions_dir_is_where_oracle_env_puts_them():
    assert VERSIONS_DIR.name == "versions" and VERSIONS_DIR.parent.name == ".venv-oracle"
