"""The oracle matrix: SGLang 0.5.23's own pool sizes for a fixed set of DeepSeek-V4 configurations.

Re-run the live oracle and store its answers (from the repository root)::

    bash scripts/oracle-env.sh && .venv-oracle/bin/python -m tests.oracle.matrix --write tests/data/oracle_matrix.json

``--check PATH`` re-runs it and exits 1 when SGLang's answers differ from the stored ones.
``tests/test_capacity_oracle.py`` asserts dsv4ctl.plan.capacity reproduces every stored field.
Stdlib only: the SGLang code runs in ``.venv-oracle`` subprocesses (:mod:`tests.oracle.runner`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tests.oracle.runner import DEFAULT_SERVER_ARGS, run_cases

SCHEMA = "dsv4ctl.oracle-matrix/1"
GIB = 1 << 30
FLASH, PRO = "deepseek-v4-flash", "deepseek-v4-pro"
A_FLASH = 138_484_778_008       # B200 TP8 Flash worked example (reference §4)
A_PRO = 48_569_637_666          # B200 TP8 Pro (reference §4)

# nvidia-smi memory.total, MiB (reference §1.4)
B200, B300, GB200, GB300, H200, H100 = 183359, 275040, 189471, 284208, 143771, 81559


def _pool(cid: str, model: str, available, *, env=None, pp=1, dp=1, index_k="fp8", sm100=True,
          **server_args) -> dict:
    sa = dict(DEFAULT_SERVER_ARGS)
    sa.update(server_args)
    case = {"id": cid, "kind": "pool", "model": model, "available_bytes": available,
            "pp_size": pp, "attn_dp_size": dp, "index_k": index_k, "sm100": sm100,
            "server_args": sa, "env": dict(env or {})}
    return case


def _resolve(cid: str, model: str, gpu_mib: int, **server_args) -> dict:
    return {"id": cid, "kind": "resolve", "model": model, "gpu_memory_mib": gpu_mib,
            "server_args": server_args}


EAGLE = dict(speculative_algorithm="EAGLE")
CAP = dict(_swa_full_tokens_ratio_explicitly_set=False)
DECODE = dict(disaggregation_mode="decode")
STATE_BF16 = {"SGLANG_DSV4_COMPRESS_STATE_DTYPE": "bf16"}
ONLINE = {"SGLANG_OPT_USE_ONLINE_COMPRESS": "1"}
ONLINE_MTP = {"SGLANG_OPT_USE_ONLINE_COMPRESS": "1", "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP": "1"}
V41_LAYOUT = {"SGLANG_DSV4_KV_LAYOUT": "v41"}
V41_NEW = {"SGLANG_DSV4_KV_LAYOUT": "v41_new"}
# Some environment batches combine switches to keep the number of subprocesses (one SGLang
# import each, ~10 s of CPU) low; a PP layer partition only applies at pp > 1.
V41 = {**V41_LAYOUT, "SGLANG_PP_LAYER_PARTITION": "16,15,15,15"}
AUTO_STATE_BF16 = {"SGLANG_DSV4_KV_LAYOUT": "auto", **STATE_BF16}
PART_EVICT = {"SGLANG_PP_LAYER_PARTITION": "22,21", "SGLANG_SWA_EVICTION_INTERVAL": "64"}


def cases() -> list[dict]:
    """The matrix, in a stable order (ids are unique)."""
    P = _pool
    c = [
        # TP-only (every attention-TP rank holds a full replica), several budgets
        P("flash-tp8", FLASH, A_FLASH),
        P("pro-tp8", PRO, A_PRO),
        P("flash-20gib", FLASH, 20 * GIB),
        P("flash-64gib", FLASH, 64 * GIB),
        P("flash-150gib", FLASH, 150 * GIB + 12345),
        P("pro-30gib", PRO, 30 * GIB),
        P("pro-100gib", PRO, 100 * GIB + 777),
        P("flash-swa-0.075", FLASH, A_FLASH, swa_full_tokens_ratio=0.075),
        P("pro-swa-0.2", PRO, A_PRO, swa_full_tokens_ratio=0.2),
        P("flash-mrr-512", FLASH, A_FLASH, max_running_requests=512),
        P("pro-mrr-32", PRO, A_PRO, max_running_requests=32),
        P("flash-page-512", FLASH, A_FLASH, page_size=512),
        P("flash-fp4-indexer-flag", FLASH, A_FLASH, enable_deepseek_v4_fp4_indexer=True),
        P("flash-too-small", FLASH, 2_000_000_000),
        # DP attention 4 and 8 (mrr per worker, its own budget)
        P("flash-dp4", FLASH, 120 * GIB, dp=4),
        P("pro-dp4", PRO, 40 * GIB, dp=4),
        P("flash-dp8", FLASH, A_FLASH, dp=8),
        P("pro-dp8", PRO, 36 * GIB + 4096, dp=8),
        P("flash-dp8-mrr-1024", FLASH, 110 * GIB, dp=8, max_running_requests=1024),
        # PP 2 and 4: each stage, then the MIN across stages (config_from_budget)
        P("flash-pp2", FLASH, A_FLASH, pp=2),
        P("pro-pp2-uneven-budget", PRO, [90 * GIB, 84 * GIB], pp=2),
        P("flash-pp4", FLASH, [150 * GIB, 151 * GIB, 152 * GIB, 149 * GIB], pp=4),
        P("pro-pp4", PRO, 110 * GIB, pp=4),
        P("flash-pp2-dp4", FLASH, [100 * GIB, 101 * GIB], pp=2, dp=4),
        # --max-total-tokens (user cap), alone and with the PP MIN
        P("flash-max-total-tokens", FLASH, A_FLASH, max_total_tokens=1_000_000),
        P("flash-max-total-tokens-above", FLASH, A_FLASH, max_total_tokens=50_000_000),
        P("pro-pp2-max-total-tokens", PRO, 90 * GIB, pp=2, max_total_tokens=3_000_123),
        # EAGLE / MTP: larger rings and the (L+1)/L inflation
        P("flash-eagle-4", FLASH, A_FLASH, **EAGLE, speculative_num_draft_tokens=4),
        P("pro-eagle-2", PRO, A_PRO, **EAGLE, speculative_num_draft_tokens=2),
        P("flash-eagle-10", FLASH, A_FLASH, **EAGLE, speculative_num_draft_tokens=10),
        P("flash-eagle-11-rejected", FLASH, A_FLASH, **EAGLE, speculative_num_draft_tokens=11),
        P("pro-pp2-eagle-3", PRO, 90 * GIB, pp=2, **EAGLE, speculative_num_draft_tokens=3),
        P("flash-dp8-eagle-4", FLASH, A_FLASH, dp=8, **EAGLE, speculative_num_draft_tokens=4),
        # trtllm backend (uniform fp8, no padding)
        P("flash-trtllm", FLASH, A_FLASH, dsv4_attn_backend="trtllm"),
        P("pro-trtllm-dp4", PRO, 44 * GIB, dp=4, dsv4_attn_backend="trtllm"),
        P("flash-trtllm-eagle-3", FLASH, A_FLASH, dsv4_attn_backend="trtllm", **EAGLE,
          speculative_num_draft_tokens=3),
        # cap mode (ratio not explicitly set)
        P("flash-cap", FLASH, A_FLASH, **CAP),
        P("pro-cap", PRO, A_PRO, **CAP),
        P("flash-cap-dp4", FLASH, 120 * GIB, dp=4, **CAP),
        P("flash-cap-no-radix", FLASH, A_FLASH, **CAP, disable_radix_cache=True),
        P("pro-cap-tails-no-overlap", PRO, A_PRO, **CAP, swa_prefix_tails=100,
          disable_overlap_schedule=True),
        P("flash-cap-pd-decode", FLASH, A_FLASH, **CAP, **DECODE,
          disaggregation_decode_extra_slots=64, max_running_requests=64, dp=2),
        P("flash-cap-too-small", FLASH, 3 * GIB, **CAP),
        # PD decode with extra request slots
        P("flash-pd-decode-extra-64", FLASH, A_FLASH, **DECODE, dp=2, max_running_requests=64,
          disaggregation_decode_extra_slots=64),
        P("pro-pd-decode", PRO, A_PRO, **DECODE, disaggregation_decode_extra_slots=0),
        P("flash-pd-decode-dp8-extra-16", FLASH, 130 * GIB, **DECODE, dp=8,
          disaggregation_decode_extra_slots=16),
        # bf16 index-K (indexer bytes 2*index_head_dim), reference §4
        P("flash-bf16-index-k", FLASH, A_FLASH, index_k="bf16"),
        P("pro-bf16-index-k", PRO, A_PRO, index_k="bf16"),
        P("flash-bf16-index-k-dp8", FLASH, 125 * GIB, dp=8, index_k="bf16"),
        P("pro-bf16-index-k-pp2", PRO, 90 * GIB, pp=2, index_k="bf16"),
        P("flash-bf16-index-k-eagle-4", FLASH, A_FLASH, index_k="bf16", **EAGLE,
          speculative_num_draft_tokens=4),
        P("flash-bf16-index-k-cap", FLASH, A_FLASH, index_k="bf16", **CAP),
        # compress-state dtype bf16
        P("flash-state-bf16", FLASH, A_FLASH, env=STATE_BF16),
        P("pro-state-bf16", PRO, A_PRO, env=STATE_BF16),
        P("flash-state-bf16-eagle-4", FLASH, A_FLASH, env=STATE_BF16, **EAGLE,
          speculative_num_draft_tokens=4),
        P("flash-state-bf16-dp8", FLASH, A_FLASH, env=STATE_BF16, dp=8),
        P("pro-state-bf16-pp2", PRO, 90 * GIB, env=STATE_BF16, pp=2),
        P("flash-state-bf16-cap", FLASH, A_FLASH, env=STATE_BF16, **CAP),
        P("pro-state-bf16-bf16-index-k", PRO, A_PRO, env=STATE_BF16, index_k="bf16"),
        # online c128 (ring 1, different fixed-bytes formula)
        P("flash-online-c128", FLASH, A_FLASH, env=ONLINE),
        P("pro-online-c128", PRO, A_PRO, env=ONLINE),
        P("flash-online-c128-dp4", FLASH, 120 * GIB, env=ONLINE, dp=4),
        P("pro-online-c128-pp4", PRO, 110 * GIB, env=ONLINE, pp=4),
        P("flash-online-c128-eagle-rejected", FLASH, A_FLASH, env=ONLINE, **EAGLE,
          speculative_num_draft_tokens=2),
        P("flash-online-c128-mtp-eagle-3", FLASH, A_FLASH, env=ONLINE_MTP, **EAGLE,
          speculative_num_draft_tokens=3),
        P("pro-online-c128-mtp-eagle-2", PRO, A_PRO, env=ONLINE_MTP, **EAGLE,
          speculative_num_draft_tokens=2),
        # V4.1 layouts on SM100
        P("flash-v41", FLASH, A_FLASH, env=V41),
        P("pro-v41", PRO, A_PRO, env=V41),
        P("flash-v41-eagle-4", FLASH, A_FLASH, env=V41, **EAGLE, speculative_num_draft_tokens=4),
        P("flash-v41-bf16-index-k-dp8", FLASH, A_FLASH, env=V41, dp=8, index_k="bf16"),
        P("flash-v41-trtllm-rejected", FLASH, A_FLASH, env=V41, dsv4_attn_backend="trtllm"),
        P("flash-v41-not-sm100-rejected", FLASH, A_FLASH, env=V41, sm100=False),
        P("pro-v41-pp4-partition", PRO, 100 * GIB, pp=4, env=V41),
        P("flash-v41-new", FLASH, A_FLASH, env=V41_NEW),
        P("pro-v41-new-dp8", PRO, 36 * GIB, env=V41_NEW, dp=8),
        P("pro-v41-new-pp2", PRO, 90 * GIB, env=V41_NEW, pp=2),
        P("flash-layout-auto-sm100-state-bf16", FLASH, A_FLASH, env=AUTO_STATE_BF16),
        P("pro-layout-auto-sm100-state-bf16-dp4", PRO, 40 * GIB, dp=4, env=AUTO_STATE_BF16),
        P("flash-layout-auto-not-sm100-state-bf16", FLASH, A_FLASH, env=AUTO_STATE_BF16,
          sm100=False),
        P("flash-v41-compressed-fp4", FLASH, A_FLASH,
          env={**V41_LAYOUT, "SGLANG_DSV4_COMPRESSED_KV_LAYOUT": "fp4"}),
        # custom PP partition (ignored at pp 1), SWA eviction interval (cap mode)
        P("flash-pp2-partition-22-21", FLASH, A_FLASH, pp=2, env=PART_EVICT),
        P("flash-pp2-partition-22-21-cap-eviction-64", FLASH, A_FLASH, pp=2, **CAP,
          env=PART_EVICT),
        P("flash-cap-eviction-64", FLASH, A_FLASH, **CAP, env=PART_EVICT),
    ]
    # mem_fraction_static / chunked prefill / decode max_bs through the real ServerArgs pipeline
    R = _resolve
    c += [
        R("resolve-b200-tp8", FLASH, B200, tp_size=8),
        R("resolve-b200-tp4", FLASH, B200, tp_size=4),
        R("resolve-b200-tp8-dp8", FLASH, B200, tp_size=8, dp_size=8, enable_dp_attention=True),
        R("resolve-b200-tp8-dp4", FLASH, B200, tp_size=8, dp_size=4, enable_dp_attention=True),
        R("resolve-b200-tp4-dp4", FLASH, B200, tp_size=4, dp_size=4, enable_dp_attention=True),
        R("resolve-b200-tp8-deepep", FLASH, B200, tp_size=8, ep_size=8, moe_a2a_backend="deepep"),
        R("resolve-b200-tp8-dp8-deepep", FLASH, B200, tp_size=8, dp_size=8,
          enable_dp_attention=True, ep_size=8, moe_a2a_backend="deepep"),
        R("resolve-b200-pd-decode-tp8", FLASH, B200, tp_size=8, disaggregation_mode="decode"),
        R("resolve-b200-pd-decode-tp8-dp8", FLASH, B200, tp_size=8, dp_size=8,
          enable_dp_attention=True, disaggregation_mode="decode"),
        R("resolve-b200-pd-decode-dp2-mrr-64", FLASH, B200, tp_size=8, dp_size=2,
          enable_dp_attention=True, disaggregation_mode="decode", max_running_requests=64),
        R("resolve-b200-pd-prefill-tp4", FLASH, B200, tp_size=4, disaggregation_mode="prefill"),
        R("resolve-b200-tp4-pp2", FLASH, B200, tp_size=4, pp_size=2),
        R("resolve-b200-tp2-pp4", PRO, B200, tp_size=2, pp_size=4),
        R("resolve-b200-tp8-eagle", FLASH, B200, tp_size=8, speculative_algorithm="EAGLE",
          speculative_num_draft_tokens=4, speculative_num_steps=3, speculative_eagle_topk=1),
        R("resolve-b200-tp8-mrr-64", FLASH, B200, tp_size=8, max_running_requests=64),
        R("resolve-b200-tp8-chunked-8192", FLASH, B200, tp_size=8, chunked_prefill_size=8192),
        R("resolve-b200-pro-tp8", PRO, B200, tp_size=8),
        R("resolve-b300-tp8", FLASH, B300, tp_size=8),
        R("resolve-gb200-tp4", FLASH, GB200, tp_size=4),
        R("resolve-gb300-tp4", PRO, GB300, tp_size=4),
        R("resolve-h200-tp8", FLASH, H200, tp_size=8),
        R("resolve-h200-tp2", FLASH, H200, tp_size=2),
        R("resolve-h100-tp8", FLASH, H100, tp_size=8),
    ]
    ids = [x["id"] for x in c]
    assert len(ids) == len(set(ids)), "duplicate case ids"
    return c


def run(jobs=None) -> dict:
    """Run the matrix through the live oracle: (the JSON document ``--write`` stores,
    seconds elapsed, number of subprocesses)."""
    cs = cases()
    t0 = time.monotonic()
    out = run_cases(cs, jobs=jobs)
    elapsed = time.monotonic() - t0
    by_id = {r["id"]: r for r in out["results"]}
    doc = {
        "schema": SCHEMA,
        "sglang_version": out["sglang_version"],
        "torch_version": out["torch_version"],
        "generated_by": "python -m tests.oracle.matrix --write tests/data/oracle_matrix.json",
        "cases": [{"id": c["id"], "input": c,
                   "output": {k: v for k, v in by_id[c["id"]].items() if k != "id"}}
                  for c in cs],
    }
    return doc, elapsed, out["batches"]


def _summary(doc: dict) -> str:
    pool = [c for c in doc["cases"] if c["input"]["kind"] == "pool"]
    res = [c for c in doc["cases"] if c["input"]["kind"] == "resolve"]
    refused = sum(1 for c in doc["cases"] if "error" in c["output"])
    return (f"{len(doc['cases'])} cases ({len(pool)} pool, {len(res)} resolve, {refused} refused "
            f"by SGLang), sglang {doc['sglang_version']}")


def compare(stored: dict, live: dict) -> str:
    """'' when the stored matrix document equals the live one, else what differs (one line)."""
    if stored == live:
        return ""
    old = {c["id"]: c for c in stored.get("cases", [])}
    new = {c["id"]: c for c in live.get("cases", [])}
    changed = [i for i in new if old.get(i) != new[i]] + [i for i in old if i not in new]
    return (f"sglang {stored.get('sglang_version')} -> {live.get('sglang_version')}; "
            f"cases: {', '.join(changed) or 'metadata'}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.oracle.matrix", description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", metavar="PATH", help="store the oracle's answers in PATH")
    g.add_argument("--check", metavar="PATH", help="exit 1 when the live answers differ from PATH")
    ap.add_argument("--jobs", type=int, default=None, help="parallel oracle subprocesses")
    args = ap.parse_args(argv)
    doc, elapsed, batches = run(args.jobs)
    print(f"oracle: {_summary(doc)} in {elapsed:.1f}s ({batches} subprocesses)", file=sys.stderr)
    text = json.dumps(doc, indent=1, sort_keys=False) + "\n"
    if args.write:
        Path(args.write).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(args.write).with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(args.write)
        print(f"oracle: wrote {args.write}", file=sys.stderr)
    elif args.check:
        problem = compare(json.loads(Path(args.check).read_text()), json.loads(text))
        if problem:
            print(f"oracle: {args.check} differs from the live oracle ({problem})", file=sys.stderr)
            return 1
        print(f"oracle: {args.check} matches the live oracle", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
