"""The same oracle cases computed by dsv4ctl's pure capacity model, in the oracle's result shape.

:func:`pool_result` maps a ``"pool"`` case (SGLang server-arg names and env switches, see
``docs/oracle.md``) to :class:`dsv4ctl.plan.capacity.PoolInputs` and reproduces the driver's
``_resolve_memory_pool_config`` sequence: per PP stage, the solve, ``--max-total-tokens``, the PP
MIN and the final max_running_requests / c128 state. :func:`resolve_result` gives dsv4ctl's
``mem_fraction_static``, chunked prefill and decode ``max_bs`` for a ``"resolve"`` case.
Imports only dsv4ctl (no torch, no sglang).
"""

from __future__ import annotations

from dsv4ctl.plan import capacity as cap
from dsv4ctl.plan.models import load_model
from dsv4ctl.plan.versions import DEFAULT_VERSION, rules_for

TRUE = ("1", "true", "yes", "on")

# Fields of a pool stage that must be equal to the oracle's, and of a resolve case.
STAGE_FIELDS = ("layers", "available_bytes", "bytes_per_full_token", "bytes_per_swa_token",
                "c128_state_fixed_bytes", "swa_fixed_bytes", "swa_cap_tokens", "ring_sizes",
                "unconstrained_full_tokens", "full_max_total_num_tokens",
                "swa_max_total_num_tokens", "c4_max_total_num_tokens", "c128_max_total_num_tokens",
                "c4_state_pool_size", "c128_state_pool_size", "max_total_num_tokens",
                "max_running_requests")
RESOLVE_FIELDS = ("mem_fraction_static", "chunked_prefill_size", "decode_max_bs",
                  "max_running_requests", "page_size", "swa_full_tokens_ratio",
                  "_swa_full_tokens_ratio_explicitly_set", "dsv4_attn_backend")

DEFAULTS = cap.PoolInputs()


def pool_inputs(case: dict) -> cap.PoolInputs:
    """``PoolInputs`` for a pool case: server args by SGLang name, env switches by env name."""
    sa = case.get("server_args") or {}
    env = case.get("env") or {}

    def arg(name, default):
        value = sa.get(name)
        return default if value is None else value

    idx = case.get("index_k", "fp8")
    if idx == "bf16" and sa.get("enable_deepseek_v4_fp4_indexer"):
        # The oracle's bf16 patch prices 2*d whenever the configurator asks for the non-fp4
        # formula, which on NVIDIA is always; dsv4ctl's exact accounting prices the fp4 buffer
        # the flag selects. Upstream 0.5.23 has no bf16 indexer, so neither is SGLang's answer.
        raise ValueError(f"{case.get('id')}: bf16 index-K with the fp4 indexer flag is outside "
                         "the oracle's domain")
    return cap.PoolInputs(
        page_size=arg("page_size", DEFAULTS.page_size),
        max_running_requests=arg("max_running_requests", DEFAULTS.max_running_requests),
        swa_full_tokens_ratio=arg("swa_full_tokens_ratio", DEFAULTS.swa_full_tokens_ratio),
        swa_ratio_explicit=arg("_swa_full_tokens_ratio_explicitly_set", True),
        chunked_prefill_size=arg("chunked_prefill_size", DEFAULTS.chunked_prefill_size),
        attn_dp_size=case.get("attn_dp_size", 1),
        speculative_algorithm=sa.get("speculative_algorithm"),
        speculative_num_draft_tokens=sa.get("speculative_num_draft_tokens"),
        attention_backend=arg("dsv4_attn_backend", DEFAULTS.attention_backend),
        kv_layout=env.get("SGLANG_DSV4_KV_LAYOUT", "v4").lower(),
        compressed_kv_layout=env.get("SGLANG_DSV4_COMPRESSED_KV_LAYOUT", "auto").lower(),
        compress_state_dtype=env.get("SGLANG_DSV4_COMPRESS_STATE_DTYPE", "float32"),
        online_compress=str(env.get("SGLANG_OPT_USE_ONLINE_COMPRESS", "0")).lower() in TRUE,
        online_c128_mtp=str(env.get("SGLANG_EXPERIMENTAL_ONLINE_C128_MTP", "0")).lower() in TRUE,
        swa_eviction_interval=int(env.get("SGLANG_SWA_EVICTION_INTERVAL", 128)),
        swa_prefix_tails=sa.get("swa_prefix_tails"),
        disable_radix_cache=arg("disable_radix_cache", False),
        disable_overlap_schedule=arg("disable_overlap_schedule", False),
        disaggregation_mode=sa.get("disaggregation_mode"),
        disaggregation_decode_extra_slots=arg("disaggregation_decode_extra_slots", 0),
        max_total_tokens=sa.get("max_total_tokens"),
        index_k_dtype=idx,
        index_k_accounting="exact" if idx == "bf16" else "fp8",
        fp4_indexer=arg("enable_deepseek_v4_fp4_indexer", False),
        sm100=case.get("sm100", True),
        **rules_for(case.get("sglang_version", DEFAULT_VERSION)).pool_flags(),
    )


def pool_result(case: dict) -> dict:
    """dsv4ctl's answer to a pool case: ``{"stages": [...]}`` or ``{"error": msg}``."""
    model, _ = load_model(case["model"])
    pp = case.get("pp_size", 1)
    avail = case["available_bytes"]
    avails = list(avail) if isinstance(avail, list) else [avail] * pp
    part = (case.get("env") or {}).get("SGLANG_PP_LAYER_PARTITION")
    at_pp1 = rules_for(case.get("sglang_version", DEFAULT_VERSION)).pp_partition_at_pp1   # 0.5.18
    partition = tuple(int(x) for x in part.split(",")) if part and (pp > 1 or at_pp1) else None
    try:
        inputs = pool_inputs(case)
        if not inputs.swa_cap_mode and inputs.swa_prefix_tails is not None:
            # 0.5.20 has no --swa-prefix-tails (its argument table refuses the option too)
            raise cap.CapacityError("unknown ServerArgs field: swa_prefix_tails")
        rules = rules_for(case.get("sglang_version", DEFAULT_VERSION))
        if rules.resolved_attn_backend is None and inputs.attention_backend != "flashmla":
            # 0.5.19 has no --dsv4-attn-backend: FlashMLA pools only
            raise cap.CapacityError("unknown ServerArgs field: dsv4_attn_backend")
        confs = [cap.Configurator(model, inputs,
                                  cap.pp_layer_range(model.num_hidden_layers, pp, r, partition))
                 for r in range(pp)]
        unconstrained = [c.solve_full_tokens(a)[0] for c, a in zip(confs, avails)]
        pp_min = min(unconstrained) if pp > 1 else None
        stages = []
        for r, (c, a) in enumerate(zip(confs, avails)):
            s = c.calculate_pool_sizes(a, max_tokens_cap=pp_min)
            stages.append(dict(
                pp_rank=r, layers=list(c.layers), available_bytes=a,
                bytes_per_full_token=c.bytes_per_full_token,
                bytes_per_swa_token=c.bytes_per_swa_token,
                c128_state_fixed_bytes=s.c128_state_fixed_bytes,
                swa_fixed_bytes=c.swa_fixed_bytes(),
                swa_cap_tokens=c.swa_cap_tokens,
                ring_sizes={str(k): v for k, v in sorted(c.rings.items())},
                unconstrained_full_tokens=unconstrained[r],
                full_max_total_num_tokens=s.full_max_total_num_tokens,
                swa_max_total_num_tokens=s.swa_max_total_num_tokens,
                c4_max_total_num_tokens=s.c4_max_total_num_tokens,
                c128_max_total_num_tokens=s.c128_max_total_num_tokens,
                c4_state_pool_size=s.c4_state_pool_size,
                c128_state_pool_size=s.c128_state_pool_size,
                max_total_num_tokens=s.full_max_total_num_tokens,
                max_running_requests=s.max_running_requests))
        c = confs[0]
        if not inputs.swa_cap_mode:
            # 0.5.20 (driver._swa_terms): no SWA coefficient of its own, no cap mode, no layouts
            for st in stages:
                st.update(bytes_per_swa_token=None, swa_fixed_bytes=0, swa_cap_tokens=None)
        compressed = None if c.trtllm or not inputs.v41_layouts else {
            str(r): c.layout_for(r) for r in (4, 128)}
        return {"kv_layout": c.main_layout, "compressed_kv_layouts": compressed, "stages": stages}
    except cap.CapacityError as e:
        return {"error": str(e)}


def memory_args(case: dict) -> cap.MemoryArgs:
    """``MemoryArgs`` for a resolve case (user-given server args only, as SGLang sees them)."""
    sa = case.get("server_args") or {}
    return cap.MemoryArgs(
        gpu_memory_mib=case["gpu_memory_mib"], tp_size=sa.get("tp_size", 1),
        pp_size=sa.get("pp_size", 1), dp_size=sa.get("dp_size", 1),
        enable_dp_attention=sa.get("enable_dp_attention", False),
        disaggregation_mode=sa.get("disaggregation_mode"),
        max_running_requests=sa.get("max_running_requests"),
        speculative_num_draft_tokens=sa.get("speculative_num_draft_tokens"),
        chunked_prefill_size=sa.get("chunked_prefill_size"),
        cuda_graph_max_bs=sa.get("cuda_graph_max_bs"),
        disable_cuda_graph=sa.get("disable_cuda_graph", False),
        moe_a2a_backend=sa.get("moe_a2a_backend"),
        graph_bs_capped_by_mrr=rules_for(case.get("sglang_version", DEFAULT_VERSION)).graph_bs_capped_by_mrr)


def resolve_result(case: dict) -> dict:
    """dsv4ctl's resolved defaults for a resolve case, keyed like the oracle's result."""
    m = memory_args(case)
    sa = case.get("server_args") or {}
    rules = rules_for(case.get("sglang_version", DEFAULT_VERSION))
    chunked = m.chunked_prefill_size or cap.default_chunked_prefill_size(m.gpu_memory_mib)
    if m.enable_dp_attention and m.dp_size > 1 and chunked > 0:
        chunked //= m.dp_size
    max_bs = m.cuda_graph_max_bs or cap.default_decode_max_bs(m.gpu_memory_mib, m.tp_size)
    if m.max_running_requests is not None and m.cuda_graph_max_bs is None and m.graph_bs_capped_by_mrr:
        max_bs = min(max_bs, m.max_running_requests)
    return {
        "mem_fraction_static": cap.default_mem_fraction_static(m),
        "chunked_prefill_size": chunked,
        "decode_max_bs": max_bs,
        "max_running_requests": m.max_running_requests or DEFAULTS.max_running_requests,
        "page_size": DEFAULTS.page_size,
        "swa_full_tokens_ratio": sa.get("swa_full_tokens_ratio", DEFAULTS.swa_full_tokens_ratio),
        # 0.5.20 has no such field (no SWA cap mode)
        "_swa_full_tokens_ratio_explicitly_set": DEFAULTS.swa_ratio_explicit if rules.swa_cap_mode else None,
        "dsv4_attn_backend": rules.resolved_attn_backend,
    }


def diff(case: dict, oracle: dict) -> list[str]:
    """Every field where dsv4ctl differs from the oracle's result for ``case`` (empty = exact).

    Floats are compared with ``==`` (bit-exact). A refusal must be a refusal on both sides."""
    cid = case.get("id")
    if case.get("kind", "pool") == "resolve":
        mine = resolve_result(case)
        return [f"{cid}: {f}: dsv4ctl {mine[f]!r} != sglang {oracle.get(f)!r}"
                for f in RESOLVE_FIELDS if mine[f] != oracle.get(f)]
    mine = pool_result(case)
    if "error" in oracle or "error" in mine:
        if ("error" in oracle) != ("error" in mine):
            return [f"{cid}: sglang {oracle.get('error', 'accepts')!r}, "
                    f"dsv4ctl {mine.get('error', 'accepts')!r}"]
        return []
    out = [f"{cid}: {f}: dsv4ctl {mine[f]!r} != sglang {oracle[f]!r}"
           for f in ("kv_layout", "compressed_kv_layouts") if mine[f] != oracle[f]]
    if len(mine["stages"]) != len(oracle["stages"]):
        return [f"{cid}: {len(mine['stages'])} stages != {len(oracle['stages'])}"]
    for a, b in zip(mine["stages"], oracle["stages"]):
        for f in STAGE_FIELDS:
            x, y = a[f], b[f]
            same = x == y and type(x) is type(y) if isinstance(y, float) else x == y
            if not same:
                out.append(f"{cid}: stage {b['pp_rank']}: {f}: dsv4ctl {x!r} != sglang {y!r}")
    return out
