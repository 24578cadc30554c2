"""DeepSeek-V4 KV-pool capacity model: a pure re-implementation of SGLang 0.5.23's
``DSV4PoolConfigurator`` (no I/O, no torch, no sglang import).

Every formula names its source in the sglang 0.5.23 wheel:

* ``srt/model_executor/pool_configurator.py`` (``DSV4PoolConfigurator``, l.1067-1712):
  bytes per full / SWA token, fixed bytes, the solve for ``full_token``, cap mode, finalize.
* ``srt/mem_cache/deepseek_v4_memory_pool.py``: indexer bytes per token (l.53), compress-state
  ring sizes (l.60), owner layers per ratio (l.94), layout selection (l.174-234), and the pool
  construction that :func:`allocated_bytes` mirrors (l.943-1820).
* ``kernels/ops/attention/dsv4/kv_layout.py``: ``KVLayout`` page geometry.
* ``srt/distributed/utils.py``: ``get_pp_indices`` (PP layer split).

Units: bytes (int) unless a name ends in ``_gib`` (GiB = 2**30 bytes); token counts are ints.
Floats are evaluated in the same order as SGLang so that ``bytes_per_full_token`` and every pool
size are bit-identical to the real configurator (proved by ``tests/test_capacity_oracle.py``
against stored and live oracle output).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional

GIB = 1 << 30

# Index-K dtypes: what one C4 indexer slot of index_head_dim d really occupies.
INDEX_K_DTYPES = ("fp8", "bf16", "fp4")
# Index-K accounting of the deployed tree: "fp8" = stock 0.5.23 (always budgets the fp8 formula on
# NVIDIA), "exact" = a sizing fix budgets what the buffer really holds.
INDEX_K_ACCOUNTINGS = ("fp8", "exact")
KV_LAYOUTS = ("v4", "v41", "v41_new", "auto")
ATTENTION_BACKENDS = ("auto", "flashmla", "flashmla_mega", "trtllm")
STATE_DTYPES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2}


class CapacityError(ValueError):
    """An input SGLang 0.5.23 would reject, or a configuration this model does not cover.

    The message is one line, phrased like SGLang's own error where one exists."""


# --------------------------------------------------------------------------------------------
# Model geometry
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelGeometry:
    """What the configurator reads from a DeepSeek-V4 ``config.json``.

    ``compress_ratios`` may be longer than ``num_hidden_layers`` (the trailing MTP placeholder);
    only the first ``num_hidden_layers`` entries are used, as in SGLang."""

    name: str
    model_type: str
    num_hidden_layers: int
    compress_ratios: tuple[int, ...]
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    index_head_dim: int
    sliding_window: int
    context_len: int
    kv_source_layer_ids: tuple[int, ...] = ()
    #: attention projection shapes the attention-TP split must divide (0: not in the config)
    num_attention_heads: int = 0
    o_groups: int = 0
    o_lora_rank: int = 0

    @property
    def attn_head_dim(self) -> int:
        """H = qk_nope + qk_rope (512 for V4)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @classmethod
    def from_config(cls, cfg: dict, name: str = "custom") -> "ModelGeometry":
        """Build from a parsed ``config.json`` dict.

        SGLang derives ``qk_nope_head_dim = head_dim - qk_rope_head_dim``
        (sglang 0.5.23: ``srt/configs/model_config.py``). Raises :class:`CapacityError` naming
        the first missing or invalid field."""
        required = ("num_hidden_layers", "compress_ratios", "head_dim", "qk_rope_head_dim",
                    "index_head_dim", "sliding_window", "max_position_embeddings")
        for key in required:
            if key not in cfg:
                raise CapacityError(f"model config {name}: missing field {key!r}")
        mt = cfg.get("model_type", "deepseek_v4")
        if not str(mt).startswith("deepseek_v4"):
            raise CapacityError(f"model config {name}: model_type {mt!r} is not a DeepSeek-V4 model")

        def bad(key: str, msg: str) -> CapacityError:
            return CapacityError(f"model config {name}: {key}: {msg}")

        def whole(key: str, v, minimum: int = 1, maximum: int = 1 << 40) -> int:
            # JSON ints only: bool, 4.7, NaN, Infinity, "128" and null are rejected (SGLang
            # reads these fields as Python ints; a float would fail inside torch).
            if isinstance(v, bool) or not isinstance(v, int):
                raise bad(key, f"expected an integer, got {v!r}")
            if not minimum <= v <= maximum:
                raise bad(key, f"must be within {minimum}..{maximum}, got {v}")
            return v

        n = whole("num_hidden_layers", cfg["num_hidden_layers"], 1, 100_000)
        raw = cfg["compress_ratios"]
        if not isinstance(raw, list):
            raise bad("compress_ratios", f"expected a list of integers, got {raw!r}")
        ratios = tuple(whole(f"compress_ratios[{i}]", r, 0, 1 << 20) for i, r in enumerate(raw))
        if len(ratios) < n:
            raise CapacityError(
                f"model config {name}: compress_ratios has {len(ratios)} entries, "
                f"num_hidden_layers is {n}")
        for r in ratios[:n]:
            if r not in (0, 1, 2, 4, 128):
                raise CapacityError(f"model config {name}: Unsupported compression ratio: {r}")
        head_dim = whole("head_dim", cfg["head_dim"], 1, 1 << 20)
        rope = whole("qk_rope_head_dim", cfg["qk_rope_head_dim"], 0, 1 << 20)
        if head_dim <= rope:
            raise bad("head_dim", f"{head_dim} must exceed qk_rope_head_dim {rope} "
                                  "(qk_nope_head_dim = head_dim - qk_rope_head_dim)")
        kv_src = cfg.get("kv_source_layer_ids")
        if kv_src is None:
            kv_src = []
        if not isinstance(kv_src, list):
            raise bad("kv_source_layer_ids", f"expected a list of layer ids, got {kv_src!r}")
        kv_ids = tuple(whole(f"kv_source_layer_ids[{i}]", x, 0, n - 1) for i, x in enumerate(kv_src))
        return cls(
            name=name, model_type=str(mt), num_hidden_layers=n, compress_ratios=ratios,
            qk_nope_head_dim=head_dim - rope,
            qk_rope_head_dim=rope,
            index_head_dim=whole("index_head_dim", cfg["index_head_dim"], 1, 1 << 20),
            sliding_window=whole("sliding_window", cfg["sliding_window"], 1, 1 << 30),
            context_len=_derived_context_len(cfg, whole("max_position_embeddings", cfg["max_position_embeddings"],
                                                        1, 1 << 40), name),
            kv_source_layer_ids=kv_ids,
            **{k: whole(k, cfg[k], 1, 1 << 20) for k in ("num_attention_heads", "o_groups", "o_lora_rank")
               if cfg.get(k) is not None},
        )

    def attn_tp_refusal(self, attn_tp: int) -> Optional[str]:
        """SGLang's refusal of an attention-TP size that does not divide the attention
        projections, or None. ``wq_b`` (``n_heads * head_dim`` outputs) and ``wo_a``
        (``o_groups * o_lora_rank`` outputs) are ``ColumnParallelLinear`` over the attention-TP group
        (sglang 0.5.18-0.5.23 ``srt/models/deepseek_v4.py``); ``divide`` asserts
        ``"{n} is not divisible by {tp}"`` (``srt/distributed/utils.py ensure_divisibility``) when
        the model is built, after the arguments resolved. Fields missing from a custom config: no check."""
        for what, n in (("num_attention_heads x head_dim (wq_b)", self.num_attention_heads * self.attn_head_dim),
                        ("o_groups x o_lora_rank (wo_a)", self.o_groups * self.o_lora_rank)):
            if n and n % attn_tp:
                return f"{n} is not divisible by {attn_tp}: {what} split over attention TP {attn_tp}"
        # the model builds, but each rank holds n // attn_tp heads / output groups (the same file,
        # DeepseekV4Attention.__init__): none left fails the first forward (wo_a's per-rank outputs are
        # n_local_groups x o_lora_rank)
        for what, n in (("num_attention_heads", self.num_attention_heads), ("o_groups", self.o_groups)):
            if n and n < attn_tp:
                return (f"{what} {n} // attention TP {attn_tp} = 0 per rank: the model builds and its first "
                        "forward fails (dsv4ctl refuses it)")
        return None


def _derived_context_len(cfg: dict, max_positions: int, name: str) -> int:
    """SGLang's derived context length (sglang 0.5.23 ``srt/utils/hf_transformers/common.py``
    ``get_context_length``): ``max_position_embeddings`` times the rope-scaling ``factor``, except
    when ``rope_scaling`` names ``original_max_position_embeddings`` (DeepSeek-V4's YaRN) or is
    llama3. Its default ``context_length``, and the most it accepts without
    ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN``. CapacityError for a ``rope_scaling`` SGLang
    cannot read (not a mapping; a factor that is not a positive number up to 2**20)."""
    rs = cfg.get("rope_scaling")
    if rs is None:
        return max_positions
    if not isinstance(rs, dict):
        raise CapacityError(f"model config {name}: rope_scaling: expected a mapping or null, got {str(rs)[:60]!r} (SGLang reads "
                            "rope_scaling.get(...))")
    if "original_max_position_embeddings" in rs or rs.get("rope_type") == "llama3":
        return max_positions
    factor = rs.get("factor", 1)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1 << 20:
        raise CapacityError(f"model config {name}: rope_scaling.factor: expected a number in (0, {1 << 20}], got {str(factor)[:60]!r}")
    return int(factor * max_positions)


def pp_layer_range(num_hidden_layers: int, pp_size: int, pp_rank: int,
                   partition: Optional[tuple[int, ...]] = None) -> tuple[int, int]:
    """Layers ``[start, end)`` of PP stage ``pp_rank``.

    Even split with the remainder on the *last* stages, or ``SGLANG_PP_LAYER_PARTITION``
    (sglang 0.5.23: ``srt/distributed/utils.py`` ``get_pp_indices``). Raises CapacityError when
    the partition does not have ``pp_size`` entries summing to ``num_hidden_layers``."""
    if pp_size < 1 or not 0 <= pp_rank < pp_size:
        raise CapacityError(f"pp_rank {pp_rank} outside pp_size {pp_size}")
    if partition:
        if len(partition) != pp_size or sum(partition) != num_hidden_layers:
            raise CapacityError(
                f"SGLANG_PP_LAYER_PARTITION {','.join(map(str, partition))} must have {pp_size} "
                f"entries summing to num_hidden_layers {num_hidden_layers}")
        start = sum(partition[:pp_rank])
        return start, start + partition[pp_rank]
    base, rem = divmod(num_hidden_layers, pp_size)
    if base == 0:
        raise CapacityError(f"pp_size {pp_size} exceeds num_hidden_layers {num_hidden_layers}")
    sizes = [base + (1 if i >= pp_size - rem else 0) for i in range(pp_size)]
    start = sum(sizes[:pp_rank])
    return start, start + sizes[pp_rank]


# --------------------------------------------------------------------------------------------
# Server arguments and env switches the configurator reads
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ReleaseFlags:
    """What the SGLang release changes in the configurator's arithmetic: declared once, for
    :class:`dsv4ctl.plan.versions.VersionRules` (one per release) and :class:`PoolInputs` (one
    rank's inputs, ``VersionRules.pool_flags()`` copied in). Defaults: 0.5.21+ (0.5.23 for
    ``mrr_floor`` and ``v41_new_layout``). Keyword-only: a subclass's own fields keep their
    positions."""

    # requests per attention-DP worker floored at 1 (0.5.23: ``max(1, max_running_requests //
    # attn_dp_size)``); 0.5.20-0.5.22 divide without the floor (dsv4ctl.plan.versions)
    mrr_floor: bool = True
    # The configurator generation (dsv4ctl.plan.versions; defaults: 0.5.21+). 0.5.20's
    # DSV4PoolConfigurator (pool_configurator.py l.926-1346) has no SWA cap mode
    # (``swa_cap_mode``), no V4.1 page layouts (``v41_layouts``: SGLANG_DSV4_KV_LAYOUT does not
    # exist, every pool is V4), prices a latent slot at 584 bytes instead of the padded page's
    # bytes per slot (``paged_kv_budget``) and addresses the C4 compress-state ring per sliding
    # window instead of per page (``c4_state_per_window``).
    swa_cap_mode: bool = True
    v41_layouts: bool = True
    paged_kv_budget: bool = True
    c4_state_per_window: bool = False
    # 0.5.20+ refuse a ratio-sized SWA pool that cannot admit one request
    # (``validate_swa_pool_size``); 0.5.19 has no such check
    swa_floor_check: bool = True
    # SGLANG_DSV4_KV_LAYOUT=v41_new exists from 0.5.23 (select_dsv4_kv_layout); 0.5.21 and 0.5.22
    # assert ``mode in ("v41", "auto")`` after "v4"
    v41_new_layout: bool = True


@dataclass(frozen=True)
class PoolArgs:
    """The server arguments and env switches of :class:`PoolInputs` (its fields before the
    release's :class:`ReleaseFlags`, in this order: ``plan --json``'s ``server_args`` keys)."""

    page_size: int = 256
    max_running_requests: int = 256          # --max-running-requests (whole server, all DP ranks)
    swa_full_tokens_ratio: float = 0.1
    swa_ratio_explicit: bool = True          # SGLang's _swa_full_tokens_ratio_explicitly_set
    chunked_prefill_size: int = 16384        # as resolved (after the DP division)
    attn_dp_size: int = 1
    speculative_algorithm: Optional[str] = None   # None | "EAGLE" | "DSPARK"
    speculative_num_draft_tokens: Optional[int] = None
    attention_backend: str = "flashmla"      # --dsv4-attn-backend after resolution
    kv_layout: str = "v4"                    # SGLANG_DSV4_KV_LAYOUT
    compressed_kv_layout: str = "auto"       # SGLANG_DSV4_COMPRESSED_KV_LAYOUT
    compress_state_dtype: str = "float32"    # SGLANG_DSV4_COMPRESS_STATE_DTYPE
    online_compress: bool = False            # SGLANG_OPT_USE_ONLINE_COMPRESS
    online_c128_mtp: bool = False            # SGLANG_EXPERIMENTAL_ONLINE_C128_MTP
    swa_eviction_interval: int = 128         # SGLANG_SWA_EVICTION_INTERVAL (cap mode)
    swa_prefix_tails: Optional[int] = None   # --swa-prefix-tails (cap mode)
    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False
    disaggregation_mode: Optional[str] = None   # None | "prefill" | "decode"
    disaggregation_decode_extra_slots: int = 0
    hisparse_shrink: int = 1                 # HiSparse host_to_device_ratio (1 = off)
    max_total_tokens: Optional[int] = None   # --max-total-tokens
    index_k_dtype: str = "fp8"               # what the deployed tree stores
    index_k_accounting: str = "fp8"          # what the deployed tree budgets
    fp4_indexer: bool = False                # --enable-deepseek-v4-fp4-indexer
    sm100: bool = True                       # Blackwell (SM100/SM103): v41 layouts allowed


@dataclass(frozen=True)
class PoolInputs(ReleaseFlags, PoolArgs):
    """Resolved SGLang 0.5.23 server arguments and env switches for one worker (a rank):
    :class:`PoolArgs` then the release's :class:`ReleaseFlags` (fields in that order).

    Defaults are 0.5.23's resolved defaults for DeepSeek-V4 on CUDA (reference §1.2):
    page_size 256, max_running_requests 256, SWA ratio 0.1 in ratio mode, flashmla, layout v4,
    fp32 compress state, fp8 index-K with stock accounting."""

    def per_worker_requests(self) -> int:
        """``max_running_requests // attn_dp_size``, at least 1 with :attr:`mrr_floor`
        (pool_configurator.py: the SWA cap's ``num_reqs`` and the request pool's budget)."""
        n = self.max_running_requests // self.attn_dp_size
        return max(1, n) if self.mrr_floor else n

    def validate(self) -> None:
        """Raise CapacityError for values SGLang 0.5.23 rejects or this model does not cover."""
        if self.page_size <= 0 or self.page_size % 128:
            raise CapacityError(
                f"page_size {self.page_size}: page_size must be multiple of 128 for compressed attention")
        if self.max_running_requests is not None and self.max_running_requests < 1:
            raise CapacityError(f"max_running_requests must be >= 1, got {self.max_running_requests}")
        if not 0 < self.swa_full_tokens_ratio <= 1:
            raise CapacityError(f"swa_full_tokens_ratio must be in (0, 1], got {self.swa_full_tokens_ratio}")
        if self.attn_dp_size < 1:
            raise CapacityError(f"dp_size must be >= 1, got {self.attn_dp_size}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise CapacityError(f"dsv4_attn_backend {self.attention_backend!r} not in {ATTENTION_BACKENDS}")
        if self.kv_layout not in KV_LAYOUTS or (self.kv_layout == "v41_new" and self.v41_layouts
                                                and not self.v41_new_layout):
            raise CapacityError(f"unknown SGLANG_DSV4_KV_LAYOUT={self.kv_layout!r}")
        if self.compressed_kv_layout not in ("auto", "fp8", "fp4"):
            raise CapacityError(f"unknown compressed KV layout {self.compressed_kv_layout!r}")
        if self.compress_state_dtype.strip().lower() not in STATE_DTYPES:
            raise CapacityError(
                f"Unsupported SGLANG_DSV4_COMPRESS_STATE_DTYPE={self.compress_state_dtype!r}. "
                "Expected one of: float32, fp32, bfloat16, bf16.")
        if self.index_k_dtype not in INDEX_K_DTYPES:
            raise CapacityError(f"index_k_dtype {self.index_k_dtype!r} not in {INDEX_K_DTYPES}")
        if self.index_k_accounting not in INDEX_K_ACCOUNTINGS:
            raise CapacityError(
                f"index_k_accounting {self.index_k_accounting!r} not in {INDEX_K_ACCOUNTINGS}")
        if self.speculative_algorithm not in (None, "EAGLE", "DSPARK"):
            raise CapacityError(
                f"speculative_algorithm {self.speculative_algorithm!r}: DeepSeek-V4 allows EAGLE or DSPARK")
        if self.speculative_algorithm and (self.speculative_num_draft_tokens or 0) < 1:
            raise CapacityError("speculative_num_draft_tokens must be >= 1 with a speculative algorithm")
        if self.disaggregation_mode not in (None, "prefill", "decode"):
            raise CapacityError(f"disaggregation_mode {self.disaggregation_mode!r}")
        if self.hisparse_shrink < 1:
            raise CapacityError("HiSparse host_to_device_ratio must be >= 1")
        if self.max_total_tokens is not None and self.max_total_tokens <= 0:
            raise CapacityError(f"max_total_tokens must be > 0, got {self.max_total_tokens}")


# Layout geometry: (data bytes, scale bytes, page_align) per token
# (sglang 0.5.23: kernels/ops/attention/dsv4/kv_layout.py, KVLayout).
_LAYOUTS = {
    "v4": (576, 8, 576),
    "v41": (512, 16, 512),
    "v41_new": (512, 16, 528),
    "v41_fp4": (256, 32, 256),
    "v41_fp4_new": (256, 32, 288),
    "uniform_fp8": (512, 0, 512),
}


def page_bytes(layout: str, page: int) -> int:
    """Bytes of one page of ``page`` slots: ``ceil(page * b / A) * A`` (``KVLayout.page_bytes``)."""
    data, scale, align = _LAYOUTS[layout]
    raw = page * (data + scale)
    return -(-raw // align) * align


def indexer_bytes_per_slot(index_head_dim: int, dtype: str) -> int:
    """Bytes one C4 index-K slot occupies.

    fp8: ``d + d//128*4`` (payload + one fp32 scale per 128), fp4: ``d//2 + d//32``
    (``get_dsv4_indexer_bytes_per_token``, sglang 0.5.23 ``deepseek_v4_memory_pool.py:53``);
    bf16: ``2*d``, no scales (the bf16 index-K patch; not in upstream 0.5.23)."""
    d = index_head_dim
    if dtype == "fp8":
        return d + d // 128 * 4
    if dtype == "fp4":
        return d // 2 + d // 32
    if dtype == "bf16":
        return 2 * d
    raise CapacityError(f"index_k_dtype {dtype!r} not in {INDEX_K_DTYPES}")


def index_k_dtype_of(inputs: PoolInputs) -> str:
    """The dtype the indexer buffer really uses: fp4 when the FP4 indexer flag is on."""
    return "fp4" if inputs.fp4_indexer else inputs.index_k_dtype


def budgeted_index_k_dtype(inputs: PoolInputs) -> str:
    """The dtype SGLang's configurator budgets for the C4 indexer.

    Stock 0.5.23 on NVIDIA budgets fp8 whatever the buffer holds (the fp4 term is HIP-only);
    a tree with exact accounting budgets the real dtype."""
    if inputs.index_k_accounting == "exact":
        return index_k_dtype_of(inputs)
    return "fp8"


# --------------------------------------------------------------------------------------------
# The configurator
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolSizes:
    """One rank's pool decision. Field names are SGLang's ``MemoryPoolConfig`` names.

    Token counts are in tokens (slots); ``*_state_pool_size`` in state rows; bytes in bytes."""

    available_bytes: int
    bytes_per_full_token: float
    bytes_per_swa_token: float
    fixed_bytes: int
    c128_state_fixed_bytes: int
    swa_fixed_bytes: int
    full_max_total_num_tokens: int
    swa_max_total_num_tokens: int
    c4_max_total_num_tokens: int
    c128_max_total_num_tokens: int
    c4_state_pool_size: int
    c128_state_pool_size: int
    max_running_requests: int
    num_req_slots: int
    swa_mode: str                       # "ratio" | "cap"
    layers: tuple[int, int]
    n_layers: int
    n_c4: int
    n_c128: int
    ring_c4: int
    ring_c128: int
    index_k_budget_bytes: int           # per C4 slot, what the configurator priced
    index_k_real_bytes: int             # per C4 slot, what the buffer holds


def _layer_owners(model: ModelGeometry, start: int, end: int) -> dict[int, list[int]]:
    """compress ratio -> the layer ids of ``[start, end)`` that own a pool of that ratio (C4 and
    C128 layers; ratio 1/2 ``kv_source`` layers of V4.1, which raise CapacityError: not modelled)."""
    owners: dict[int, list[int]] = {}
    for ratio in (4, 128, 1, 2):
        if ratio in (1, 2):
            ls = [l for l in model.kv_source_layer_ids
                  if start <= l < end and model.compress_ratios[l] == ratio]
        else:
            ls = [l for l in range(start, end) if model.compress_ratios[l] == ratio]
        if ls:
            owners[ratio] = ls
    if 1 in owners or 2 in owners:
        raise CapacityError("V4.1 ratio-1/2 kv_source layers are not modelled by dsv4ctl 0.1")
    return owners


def _kv_layouts(i: PoolInputs) -> tuple[str, Optional[str]]:
    """(main KV layout ``v4``/``v41``/``v41_new``, compressed-KV option or None) as SGLang selects
    them (select_dsv4_kv_layout / resolve_compressed_kv_layout; 0.5.20: V4 only); CapacityError for
    a combination SGLang refuses (trtllm with packed V4.1 layouts, V4.1 without SM100/SM103, the V4
    main cache with a V4.1 compressed option)."""
    mode = i.kv_layout if i.v41_layouts else "v4"
    if i.attention_backend == "flashmla_mega" and mode != "v41_new" and i.v41_layouts:
        mode = "v41"
    option = None if i.compressed_kv_layout == "auto" or not i.v41_layouts else i.compressed_kv_layout
    if i.attention_backend == "trtllm":
        if mode not in ("auto", "v4") or option not in (None, "fp8"):
            raise CapacityError("trtllm uses uniform FP8 pools, not the packed V4.1 KV layouts")
        main, option = "v4", None
    elif mode == "v4":
        main = "v4"
    elif mode == "auto":
        main = "v41" if i.sm100 else "v4"
        option = option if i.sm100 else None
    else:
        if not i.sm100:
            raise CapacityError("the V4.1 KV cache layouts need an SM100 / SM103 GPU")
        main = mode
    if main == "v4" and option not in (None, "fp8"):
        raise CapacityError("the V4 main cache only pairs with V4 caches")
    return main, option


class Configurator:
    """Pure twin of ``DSV4PoolConfigurator`` for one rank (one PP stage, one DP rank).

    Construct with the model, the PP slice ``layers=(start, end)`` and resolved inputs; then
    :meth:`calculate_pool_sizes`. Raises CapacityError where SGLang raises or asserts."""

    def __init__(self, model: ModelGeometry, inputs: PoolInputs,
                 layers: Optional[tuple[int, int]] = None):
        inputs.validate()
        self.model = model
        self.inputs = inputs
        start, end = layers or (0, model.num_hidden_layers)
        if not 0 <= start < end <= model.num_hidden_layers:
            raise CapacityError(f"layer slice [{start},{end}) outside 0..{model.num_hidden_layers}")
        self.layers = (start, end)
        self.stage_ratios = model.compress_ratios[start:end]
        self.num_layers_total = len(self.stage_ratios)
        self.owners = owners = _layer_owners(model, start, end)
        self.n4 = len(owners.get(4, ()))
        self.n128 = len(owners.get(128, ()))

        i = inputs
        self.spec = i.speculative_algorithm is not None
        self.num_draft = (i.speculative_num_draft_tokens or 0) if self.spec else 0
        self.online = i.online_compress
        if self.online and self.spec and not (i.online_c128_mtp and i.speculative_algorithm == "EAGLE"):
            raise CapacityError(
                "SGLANG_OPT_USE_ONLINE_COMPRESS does not support speculative decode (MTP) yet, except "
                "the experimental EAGLE topk=1 path gated by SGLANG_EXPERIMENTAL_ONLINE_C128_MTP=1")
        # online_c128_mtp_max_draft_tokens = max_speculative_num_draft_tokens() or 0
        self.online_mtp_drafts = self.num_draft
        self.state_size = STATE_DTYPES[i.compress_state_dtype.strip().lower()]
        self.rings = {r: self._ring(r) for r in owners}
        if self.spec:
            self._check_draft_rings()
        self.trtllm = i.attention_backend == "trtllm"
        self.main_layout, self.compressed_option = _kv_layouts(i)
        self.kv_bytes = model.attn_head_dim if self.trtllm else (
            model.qk_nope_head_dim + model.qk_rope_head_dim * 2 + 8)

        self.idx_budget = indexer_bytes_per_slot(model.index_head_dim, budgeted_index_k_dtype(i))
        self.idx_real = indexer_bytes_per_slot(model.index_head_dim, index_k_dtype_of(i))
        self.shrink = i.hisparse_shrink
        # 0.5.20 reads the resolved --swa-full-tokens-ratio (0.1 unless given) in every case
        self.swa_ratio = (i.swa_full_tokens_ratio if i.swa_ratio_explicit or not i.swa_cap_mode
                          else 0.1)
        # the C4 ring is addressed per SWA page (0.5.21+) or per sliding window (0.5.20:
        # ``swa_page_size = cfg.window_size``)
        self.c4_state_unit = model.sliding_window if i.c4_state_per_window else i.page_size
        self.mrr_req = i.per_worker_requests()
        self.swa_prefix_tails = self._resolve_swa_prefix_tails()
        self.swa_cap_tokens = self._resolve_swa_cap_tokens()
        self.bytes_per_swa_token = self._bytes_per_swa_token()
        self.bytes_per_full_token = self._bytes_per_full_token()
        if self.spec:
            infl = (self.num_layers_total + 1) / self.num_layers_total
            self.bytes_per_full_token *= infl
            self.bytes_per_swa_token *= infl

    # -- pieces ---------------------------------------------------------------------------

    def _check_draft_rings(self) -> None:
        """CapacityError when the speculative draft tokens exceed what a C4 (window 8) or C128
        (window 128, not online) compress-state ring keeps resident: ``ring - window + 2``."""
        for r, window in ((4, 8), (128, 128)):
            if r not in self.owners or (r == 128 and self.online):
                continue
            ring = self.rings[r]
            pad = ring - window + 2 if ring > window else 0
            if self.num_draft > pad:
                raise CapacityError(
                    f"speculative_num_draft_tokens={self.num_draft} exceeds what the c{r} compress "
                    f"state ring can keep resident (ring_size={ring} serves at most {pad} draft tokens)")

    def _ring(self, ratio: int) -> int:
        """``get_compress_state_ring_size`` (deepseek_v4_memory_pool.py:60)."""
        if ratio == 128 and self.online:
            return 1
        if self.num_draft > 0:
            return 16 if ratio == 4 else 256
        return 8 if ratio == 4 else 128

    def layout_for(self, ratio: int) -> str:
        """Layout of ratio's pages (``resolve_compressed_kv_layout``); 0 = the SWA/main cache."""
        if self.trtllm:
            return "uniform_fp8"
        main = self.main_layout
        if not ratio or main == "v4":
            return main
        use_fp4 = self.compressed_option == "fp4" or (
            self.compressed_option is None and ratio in (1, 2))
        enc = "v41_fp4" if use_fp4 else "v41"
        return enc + ("_new" if main == "v41_new" else "")

    def kv_bytes_per_token(self, ratio: int = 0) -> float:
        """``_get_paged_kv_bytes_per_token``: padded page bytes / slots per page (float);
        0.5.20 prices the unpadded 584-byte slot (``nope + 2*rope + 8``) for every backend."""
        if not self.inputs.paged_kv_budget:
            return self.model.qk_nope_head_dim + self.model.qk_rope_head_dim * 2 + 8
        if self.trtllm:
            return self.kv_bytes
        p = self.inputs.page_size // ratio if ratio else self.inputs.page_size
        return page_bytes(self.layout_for(ratio), p) / p

    def _bytes_per_swa_token(self) -> float:
        H, d, s = self.model.attn_head_dim, self.model.index_head_dim, self.state_size
        c4_state_ratio = self.rings.get(4, 0) / self.c4_state_unit
        return self.kv_bytes_per_token() * self.num_layers_total + (
            c4_state_ratio * (2 * 2 * H * s + 2 * 2 * d * s) * self.n4)

    def _compressed_bytes_per_full_token(self, ratio: int, idx: int) -> float:
        if ratio == 4:
            c4_frac = 1 / (4 * self.shrink)
            return c4_frac * self.kv_bytes_per_token(4) + 1 / 4 * idx
        return 1 / 128 * self.kv_bytes_per_token(128)

    def _bytes_per_full_token(self, idx: Optional[int] = None) -> float:
        idx = self.idx_budget if idx is None else idx
        if not self.inputs.swa_cap_mode:      # the 0.5.19/0.5.20 configurator: one sum
            return self._bytes_per_full_token_0520(idx)
        swa_ratio = 0 if self.swa_cap_tokens is not None else self.swa_ratio
        return swa_ratio * self.bytes_per_swa_token + sum(
            self._compressed_bytes_per_full_token(r, idx) * len(ls) for r, ls in self.owners.items())

    def _bytes_per_full_token_0520(self, idx: int) -> float:
        """0.5.20's ``_get_bytes_per_full_token`` (pool_configurator.py l.1106-1164): one sum,
        term by term in its order (so the float is bit-identical), SWA and C4 state per token."""
        H, d, s, r = self.model.attn_head_dim, self.model.index_head_dim, self.state_size, self.swa_ratio
        kv = self.kv_bytes_per_token()
        c4_state_ratio = self.rings.get(4, 8) / self.c4_state_unit
        c4_frac = 1 / (4 * self.shrink)
        return (r * kv * self.num_layers_total
                + c4_frac * kv * self.n4
                + 1 / 128 * kv * self.n128
                + 1 / 4 * idx * self.n4
                + r * c4_state_ratio * (2 * 2 * H * s) * self.n4
                + 0 * (2 * H * s) * self.n128
                + r * c4_state_ratio * (2 * 2 * d * s) * self.n4)

    def _resolve_swa_prefix_tails(self) -> int:
        if self.inputs.swa_prefix_tails is not None:
            return self.inputs.swa_prefix_tails
        if self.inputs.disable_radix_cache:
            return 0
        return 4 * self.mrr_req

    def _resolve_swa_cap_tokens(self) -> Optional[int]:
        """Cap mode (``_resolve_swa_cap_tokens`` + ``compute_swa_request_cap``, l.924/1328)."""
        i = self.inputs
        if i.swa_ratio_explicit or not i.swa_cap_mode:
            return None
        if i.disaggregation_mode != "decode" and i.chunked_prefill_size <= 0:
            return None
        if self.spec:
            raise CapacityError("cap-mode SWA sizing with speculative decoding is not modelled by dsv4ctl 0.1")
        P, W = i.page_size, self.model.sliding_window
        per_request = W + max(1, i.swa_eviction_interval) * 1 + P + P
        num_reqs = i.per_worker_requests()
        if i.disaggregation_mode == "decode":
            cap = per_request * num_reqs + (W + P) * i.disaggregation_decode_extra_slots
        else:
            chunks = 1 if i.disable_overlap_schedule else 2
            cap = per_request * num_reqs + chunks * i.chunked_prefill_size + P
        headroom = self.swa_prefix_tails * (W + P)
        return -(-(cap + headroom) // P) * P

    def num_req_slots(self, mrr: int) -> int:
        """Request slots: mrr + 1 (+ decode extra slots in PD decode)."""
        if self.inputs.disaggregation_mode == "decode":
            return mrr + self.inputs.disaggregation_decode_extra_slots + 1
        return mrr + 1

    def c128_state_fixed_bytes(self, mrr: int) -> int:
        """``_get_c128_state_fixed_bytes`` (l.1509)."""
        if not self.n128:
            return 0
        H, s = self.model.attn_head_dim, self.state_size
        slots = self.num_req_slots(mrr)
        ring = self.rings[128]
        if self.online:
            rows = (slots + ring + 1) * (1 + self.online_mtp_drafts)
            return rows * 3 * H * s * self.n128
        rows = -(-(slots * ring + ring + 1) // 128) * 128
        return rows * 2 * H * s * self.n128

    def swa_fixed_bytes(self) -> float:
        """Cap-mode SWA pool bytes (``_get_swa_fixed_bytes``); 0 in ratio mode."""
        return 0 if self.swa_cap_tokens is None else self.swa_cap_tokens * self.bytes_per_swa_token

    def compute_sizes(self, full_token: int) -> dict:
        """``_compute_dsv4_sizes``: derived pool sizes for a full-token count (page floored)."""
        P = self.inputs.page_size
        full = full_token // P * P
        if self.swa_cap_tokens is None:
            swa = int(full * self.swa_ratio) // P * P
            W = self.model.sliding_window
            if W + P >= swa and self.inputs.swa_floor_check:
                raise CapacityError(
                    f"SWA pool ({swa} tokens) cannot hold even one request: the prefill admission "
                    f"floor is sliding_window_size ({W}) + page_size ({P}). Increase "
                    "--swa-full-tokens-ratio or the total KV budget.")
        else:
            swa = self.swa_cap_tokens
        return dict(full_max_total_num_tokens=full, swa_max_total_num_tokens=swa,
                    c4_max_total_num_tokens=full // (4 * self.shrink),
                    c128_max_total_num_tokens=full // 128,
                    c4_state_pool_size=swa // self.c4_state_unit * self.rings.get(4, 0))

    def solve_full_tokens(self, available_bytes: int) -> tuple[int, int]:
        """(full_token, fixed_bytes) from ``calculate_pool_sizes`` (l.1638), before constraints."""
        P = self.inputs.page_size
        fixed = self.c128_state_fixed_bytes(self.mrr_req) + self.swa_fixed_bytes()
        avail_tok = max(available_bytes - fixed, 0)
        full = int(avail_tok / self.bytes_per_full_token) // P * P
        if full <= 0 and self.swa_cap_tokens is not None:
            raise CapacityError(
                f"The DSV4 SWA pool cap ({self.swa_cap_tokens} tokens) leaves no room for the full "
                "KV pool. Reduce --max-running-requests or increase --mem-fraction-static.")
        # Ratio mode with full == 0 fails in _compute_dsv4_sizes (SWA floor), as in SGLang.
        return max(full, 0), fixed

    def finalize(self, sizes: dict, available_bytes: int, fixed: int) -> PoolSizes:
        """Final mrr (``resolve_max_num_reqs``) and c128 state (``finalize_with_max_running_requests``)."""
        full = sizes["full_max_total_num_tokens"]
        if full <= 0:
            raise CapacityError("Not enough memory. Please try to increase --mem-fraction-static.")
        mrr = min(self.mrr_req, full // 2)
        slots = self.num_req_slots(mrr)
        c128_state = slots if self.online else slots * self.rings.get(128, 0)
        return PoolSizes(
            available_bytes=available_bytes,
            bytes_per_full_token=self.bytes_per_full_token,
            bytes_per_swa_token=self.bytes_per_swa_token,
            fixed_bytes=int(fixed),
            c128_state_fixed_bytes=self.c128_state_fixed_bytes(self.mrr_req),
            swa_fixed_bytes=int(self.swa_fixed_bytes()),
            c128_state_pool_size=c128_state,
            max_running_requests=mrr,
            num_req_slots=slots,
            swa_mode="ratio" if self.swa_cap_tokens is None else "cap",
            layers=self.layers, n_layers=self.num_layers_total, n_c4=self.n4, n_c128=self.n128,
            ring_c4=self.rings.get(4, 0), ring_c128=self.rings.get(128, 0),
            index_k_budget_bytes=self.idx_budget, index_k_real_bytes=self.idx_real,
            **sizes)

    def calculate_pool_sizes(self, available_bytes: int,
                             max_tokens_cap: Optional[int] = None) -> PoolSizes:
        """Pool sizes for ``available_bytes`` (bytes this rank may give the KV pools).

        ``max_tokens_cap`` is the external constraint of ``config_from_budget``
        (kv_cache_configurator.py:3192): ``--max-total-tokens`` and/or the PP MIN across stages;
        when it lowers ``full`` the sizes are re-derived without re-subtracting fixed bytes."""
        if available_bytes < 0:
            raise CapacityError(f"available_bytes must be >= 0, got {available_bytes}")
        full, fixed = self.solve_full_tokens(available_bytes)
        cap = min(x for x in (max_tokens_cap, self.inputs.max_total_tokens, full) if x is not None)
        sizes = self.compute_sizes(cap)
        return self.finalize(sizes, available_bytes, fixed)


# --------------------------------------------------------------------------------------------
# Allocation (what the pools really take) and derived reports
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Allocation:
    """Bytes the ``DeepSeekV4TokenToKVPool`` allocates for given sizes (reference §2.9).

    Each paged buffer reserves one extra global page of ``page_size`` tokens."""

    swa_latent: int
    c4_latent: int
    c128_latent: int
    c4_index_k: int
    c4_attn_state: int
    c4_index_state: int
    c128_state: int

    @property
    def total(self) -> int:
        return (self.swa_latent + self.c4_latent + self.c128_latent + self.c4_index_k
                + self.c4_attn_state + self.c4_index_state + self.c128_state)


def allocated_bytes(conf: Configurator, sizes: PoolSizes, index_k_bytes: int) -> Allocation:
    """Bytes each DSV4 buffer of one rank allocates at ``sizes``, with ``index_k_bytes`` per
    C4 index-K slot (sglang 0.5.23: ``deepseek_v4_memory_pool.py:943-1300, 1541-1820``;
    bf16 page geometry assumed equal to fp8, reference §4)."""
    P = conf.inputs.page_size
    H, d, s = conf.model.attn_head_dim, conf.model.index_head_dim, conf.state_size

    def pages(size: int, p: int) -> int:
        return -(-(size + P) // p)

    def latent(ratio: int, n: int, slots: int) -> int:
        if not n:
            return 0
        p = P // ratio if ratio else P
        per_page = conf.kv_bytes * p if conf.trtllm else page_bytes(conf.layout_for(ratio), p)
        return n * pages(slots, p) * per_page

    swa = latent(0, conf.num_layers_total, sizes.swa_max_total_num_tokens)
    c4 = latent(4, conf.n4, sizes.c4_max_total_num_tokens)
    c128 = latent(128, conf.n128, sizes.c128_max_total_num_tokens)
    c4_logical = sizes.c128_max_total_num_tokens * 32
    idx = conf.n4 * pages(c4_logical, P // 4) * (P // 4) * index_k_bytes if conf.n4 else 0
    r4, r128 = conf.rings.get(4, 0), conf.rings.get(128, 0)
    rows4 = -(-(sizes.c4_state_pool_size + r4 + 1) // 4) * 4 if conf.n4 else 0
    if conf.online:
        rows128 = (sizes.c128_state_pool_size + r128 + 1) * (1 + conf.online_mtp_drafts)
        c128_state = rows128 * 3 * H * s * conf.n128
    else:
        rows128 = -(-(sizes.c128_state_pool_size + r128 + 1) // 128) * 128
        c128_state = rows128 * 2 * H * s * conf.n128
    return Allocation(swa_latent=swa, c4_latent=c4, c128_latent=c128, c4_index_k=idx,
                      c4_attn_state=conf.n4 * rows4 * 2 * 2 * H * s,
                      c4_index_state=conf.n4 * rows4 * 2 * 2 * d * s,
                      c128_state=c128_state)


def max_concurrent_requests(conf: Configurator, sizes: PoolSizes, context_length: int) -> int:
    """Requests that fit at once when each holds ``context_length`` tokens (tokens, >= 0).

    Bounded by the final max_running_requests, by the full pool (each request holds
    ``ceil(context_length / page_size)`` pages) and by the SWA pool (each request holds at most
    sliding_window + eviction interval + 2 pages of SWA slots, SGLang's per-request SWA cap in
    ``compute_swa_request_cap``)."""
    if context_length <= 0:
        raise CapacityError(f"context_length must be > 0, got {context_length}")
    P = conf.inputs.page_size
    per_req_full = -(-context_length // P) * P
    per_req_swa = min(per_req_full,
                      conf.model.sliding_window + conf.inputs.swa_eviction_interval + 2 * P)
    return max(0, min(sizes.max_running_requests,
                      sizes.full_max_total_num_tokens // per_req_full,
                      sizes.swa_max_total_num_tokens // per_req_swa))


# --------------------------------------------------------------------------------------------
# mem_fraction_static default and available bytes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryArgs:
    """Inputs of SGLang's ``handle_gpu_memory_settings`` (srt/arg_groups/memory_hook.py)."""

    gpu_memory_mib: Optional[int]            # nvidia-smi memory.total, MiB
    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1
    enable_dp_attention: bool = False
    disaggregation_mode: Optional[str] = None
    max_running_requests: Optional[int] = None   # as the *user* set it (None for the DSV4 default)
    speculative_num_draft_tokens: Optional[int] = None
    chunked_prefill_size: Optional[int] = None   # user value; None → by GPU memory
    cuda_graph_max_bs: Optional[int] = None      # user value; None → by GPU memory
    disable_cuda_graph: bool = False
    moe_a2a_backend: Optional[str] = None
    # the default decode CUDA-graph max_bs capped at max_running_requests (0.5.22+); 0.5.21 keeps
    # the GPU-size default (dsv4ctl.plan.versions)
    graph_bs_capped_by_mrr: bool = True


def default_chunked_prefill_size(gpu_memory_mib: Optional[int]) -> int:
    """Chunked prefill by GPU memory (memory_hook.py ``handle_gpu_memory_settings``)."""
    if gpu_memory_mib is None:
        return 4096
    g = gpu_memory_mib / 1024
    if g < 20:
        return 2048
    if g < 60:
        return 4096
    if g < 160:
        return 8192
    return 16384


def default_decode_max_bs(gpu_memory_mib: Optional[int], tp_size: int) -> int:
    """Decode CUDA-graph ``max_bs`` by GPU memory and TP (memory_hook.py)."""
    if gpu_memory_mib is None:
        return 160
    g = gpu_memory_mib / 1024
    if g < 20:
        return 8
    if g < 35:
        return 48 if tp_size < 4 else 160
    if g < 60:
        return 32 if tp_size < 4 else 160
    if g < 160:
        return 256 if tp_size < 4 else 512
    return 512


def decode_graph_max_bs(m: MemoryArgs) -> int:
    """The decode CUDA graph's largest batch size SGLang resolves (memory_hook.py): the given one,
    else by GPU memory and TP (:func:`default_decode_max_bs`), capped at a given
    ``max_running_requests`` on releases that do (0.5.22+)."""
    max_bs = m.cuda_graph_max_bs or default_decode_max_bs(m.gpu_memory_mib, m.tp_size)
    if m.max_running_requests is not None and m.cuda_graph_max_bs is None and m.graph_bs_capped_by_mrr:
        max_bs = min(max_bs, m.max_running_requests)
    return max_bs


def reserved_mb(m: MemoryArgs, floor: bool = True) -> float:
    """MB SGLang 0.5.23 keeps outside ``mem_fraction_static`` for activations and CUDA graphs.

    reserved_MB = 512 + 1.5*act_tokens + tp*pp/8*1024 + reserve_for_graph, floored at 10240 MB
    above 60 GiB of GPU memory (``floor``), plus 2048 MB for DeepEP with decode graphs
    (sglang 0.5.23: ``srt/arg_groups/memory_hook.py:47-355``, ``reserve_for_graph_mb``;
    reference §3.1). The prefill-graph term is 0: DSV4 disables the prefill CUDA graph."""
    gpu = m.gpu_memory_mib
    chunked = m.chunked_prefill_size or default_chunked_prefill_size(gpu)
    max_bs = decode_graph_max_bs(m)
    if m.disaggregation_mode == "decode":
        act = max((m.max_running_requests or max_bs) * (m.speculative_num_draft_tokens or 1), 2048)
    else:
        act = max(chunked, 2048)
    attn_dp = m.dp_size if m.enable_dp_attention else 1
    graph_on = not m.disable_cuda_graph
    not_prefill = m.disaggregation_mode != "prefill"
    reserve_graph = 0.0
    if not_prefill and graph_on:
        reserve_graph += 2 * max_bs
    if m.enable_dp_attention and not_prefill:
        reserve_graph += 3 * max_bs * attn_dp
        if max_bs > 300:
            reserve_graph += 1.5 * max_bs * attn_dp
    reserved = 512 + 1.5 * act + m.tp_size * m.pp_size / 8 * 1024 + reserve_graph
    if floor and gpu is not None and gpu > 60 * 1024:
        reserved = max(reserved, 10240)
    if m.moe_a2a_backend == "deepep" and graph_on and not_prefill:
        reserved += 2048
    return reserved


def default_mem_fraction_static(m: MemoryArgs) -> float:
    """SGLang 0.5.23's default ``mem_fraction_static`` for DeepSeek-V4 (fraction, 3 decimals):
    ``round((gpu_MiB - reserved_mb) / gpu_MiB, 3)``, 0.95 when the GPU memory is unknown
    (sglang 0.5.23: ``srt/arg_groups/memory_hook.py``; reference §3.1)."""
    if m.gpu_memory_mib is None:
        return 0.95
    return round((m.gpu_memory_mib - reserved_mb(m)) / m.gpu_memory_mib, 3)


def available_bytes_from_memory(free_before_load_gib: float, free_before_kv_gib: float,
                                mem_fraction_static: float) -> int:
    """``_profile_available_bytes`` (kv_cache_configurator.py:2990-3061), text-only V4:
    ``int((F - P*(1 - mfs)) * 2**30)`` with P = free GiB before weight load and F = free GiB
    right before KV sizing. May be negative: SGLang then refuses to start."""
    rest = free_before_kv_gib - free_before_load_gib * (1 - mem_fraction_static)
    return int(rest * GIB)


def min_viable_mem_fraction_static(free_before_load_gib: float, free_before_kv_gib: float) -> float:
    """Smallest mfs leaving any KV memory: ``1 - F/P`` rounded up to 3 decimals."""
    return math.ceil((1 - free_before_kv_gib / free_before_load_gib) * 1000) / 1000


__all__ = [
    "GIB", "CapacityError", "ModelGeometry", "PoolInputs", "PoolSizes", "Configurator",
    "Allocation", "allocated_bytes", "max_concurrent_requests", "MemoryArgs",
    "default_mem_fraction_static", "reserved_mb", "decode_graph_max_bs", "default_chunked_prefill_size", "default_decode_max_bs",
    "available_bytes_from_memory", "min_viable_mem_fraction_static", "pp_layer_range",
    "page_bytes", "indexer_bytes_per_slot", "replace", "field",
]
