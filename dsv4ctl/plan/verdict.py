"""The plan's verdict for one rank: ``fails`` / ``tight`` / ``fits``, and the term that decided.

Pure arithmetic (no I/O) on top of :mod:`dsv4ctl.plan.capacity`. Units: bytes (int) unless a name
ends in ``_gib`` (GiB = 2**30 bytes).

What a rank holds before it serves its first request, beyond the pool sizes the configurator
computes (which are exact, see ``tests/test_capacity_oracle.py``):

* **2 MiB segment rounding.** PyTorch's CUDA caching allocator serves every buffer above 1 MiB
  from a segment rounded up to 2 MiB (``c10/cuda/CUDACachingAllocator.cpp``, ``kRoundLarge``), and
  SGLang 0.5.23 allocates one buffer per layer and pool: ``DeepSeekV4SingleKVPool.kv_buffer``
  (``srt/mem_cache/deepseek_v4_memory_pool.py:286-293``), ``DeepSeekV4IndexerPool.
  index_k_with_scale_buffer`` (l.626-634), one compress-state pool per c4/c128 layer and one per
  c4 indexer layer (``_init_paged_compress_states``, l.1786-1818), plus ``ReqToTokenPool.
  req_to_token`` (``srt/mem_cache/memory_pool.py:406-408``). About 168 buffers on a Flash rank.
* **SWATokenToKVPoolAllocator.** Built right after the pools (``srt/mem_cache/
  kv_cache_configurator.py:2875-2884``) with ``size = full_max_total_num_tokens`` and
  ``size_swa = swa_max_total_num_tokens``: two ``PagedTokenToKVPoolAllocator`` whose ``clear()``
  allocates ``free_pages = arange(1, size // page_size + 1)`` int64 (``srt/mem_cache/allocator/
  paged.py:395-399``), and ``full_to_swa_index_mapping = cat([zeros(size + page_size), [-1]])``
  int64 (``srt/mem_cache/allocator/swa.py:107-116``): the zeros tensor and the concatenation are
  both live while ``cat`` runs, and the freed zeros segment stays reserved in PyTorch's cache.
* **EAGLE draft pool.** The draft worker builds its own pool through the same
  ``_build_dsv4_kv_pool`` (``kv_cache_configurator.py:2054-2131``) with the target's sizes
  (``memory_pool_config`` is shared, l.470-474) and ``compression_ratios =
  [COMPRESS_RATIO_NEXTN_LAYER] * 1`` (= 0, ``srt/models/deepseek_v4_nextn.py:53``): one SWA-only
  layer of ``swa_max_total_num_tokens`` slots. The budget covers it through the (L+1)/L inflation,
  but the plan's allocation has to add it.
* **Activation estimate.** SGLang's own activation/CUDA-graph estimate ``reserved_mb``
  (``srt/arg_groups/memory_hook.py:47-355``) without the 10 GiB floor is what the rank needs
  free to run a prefill chunk and capture its graphs; the floored value is SGLang's safety margin.
  SGLang computes it from the chunk before DP attention divides it; a DP-attention rank is judged
  at the chunk it runs (:func:`dsv4ctl.plan.inputs.rank_activation`, issue 44.3).
* **Indexer logits transient.** The C4 indexer scores ``[query rows, compressed columns]`` fp32
  logits per layer (``srt/layers/attention/mqa_logits_utils.py:20-101``): row stride padded to 256
  columns, and above 8,000,000 elements chunked by rows under ``min(0.3 * total, 0.2 * (1 - mfs)
  * total)`` (and 0.2 of the free memory at run time). A prefill chunk of ``chunked_prefill_size``
  rows at ``context_length // 4`` columns therefore takes ``min(rows * row_bytes, budget)``.
* **Decode indexer logits.** A decode (or EAGLE target-verify) forward scores every running
  request's rows against the whole page table: ``make_forward_metadata_from_raw_decode`` builds it
  at ``MAX_SEQ_LEN_FOR_CAPTURE = req_to_token.shape[1]`` = context_len + 4 (+ draft tokens)
  (``srt/layers/attention/deepseek_v4_backend.py:1296, 2344-2359``; ``kv_cache_configurator.py:
  883-886``), the indexer passes ``max_compressed_seq_len = pages x 64`` (``dsv4/metadata.py:
  319-324``) and never chunks decode (``dsv4/indexer.py:1059-1065``), and DeepGEMM's
  ``fp8_paged_mqa_logits`` allocates ``[rows, align(max_context_len, 256)]`` fp32 (its
  ``paged_mqa_logits`` host code): :func:`decode_indexer_logits_bytes`. The decode graphs hold
  the rectangle of their largest captured batch in their pool; batches above it run eagerly at the
  same width, so the plan counts ``max_running_requests`` x tokens per request rows.

Verdict (first match wins; README "plan verdicts"):

==============  ======  ======================================================================
deciding        level   condition (per rank)
==============  ======  ======================================================================
pools           fails   headroom < 0: pools (2 MiB rounded), req_to_token, allocator, draft pool
                        do not fit in the memory left after weights and other memory
requests        fails   fewer than ``min_requests`` requests fit at context_length, the profile asking
                        for them (``plan.min_requests`` or ``--set``)
activation      tight   headroom < 0.9 x SGLang's activation estimate (``reserved_mb`` unfloored)
requests        tight   not one request fits at context_length, no ``min_requests`` asked: SGLang
                        starts and refuses only longer requests (``tp_worker.py:556-571``)
activation_floor tight  headroom < SGLang's reserve (the estimate, floored at 10 GiB above 60 GiB GPUs)
indexer_logits  tight   headroom < activation estimate + indexer logits transient (one prefill chunk's +
                        the decode rectangle)
indexer_logits  fails   headroom < the whole logits transient, on a release that does not chunk it (0.5.18-0.5.20)
margin          tight   headroom < the largest of the above + ``TIGHT_MARGIN_BYTES``
headroom        fits    otherwise
==============  ======  ======================================================================

``fails`` is only what is proven to fail at start or on first use: pools that do not fit (every
start-up OOM measured on a real H200 is one), and a configuration that cannot hold the requests
the profile asks for. The corpus in ``tests/data/recipes/corpus.json`` (``tests/test_recipes.py``)
holds this to evidence: the 50 verified NVIDIA cells of the SGLang cookbook do not fail, the
known failures do. SGLang's activation estimate is a heuristic: ``memory_hook.py`` uses it only to choose
``mem_fraction_static`` when none is given, and published recipes and field-proven settings run
below it (the SGLang cookbook's B200 Pro high-throughput recipe; NVIDIA's srt-slurm B200, B300,
GB300 PD recipes; V4-Pro at ``mem-fraction-static`` 0.90). A rank under 90 % of it is ``tight``
(deciding ``activation``: CUDA-graph capture or a large prefill chunk may run out of memory, so
measure it under load), between 90 % and the reserve ``tight`` as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from . import capacity as cap

SEGMENT_BYTES = 2 << 20               # PyTorch CUDA caching allocator: large blocks round to 2 MiB
TIGHT_MARGIN_BYTES = 1 << 30          # 1 GiB above the binding need: "tight", not "fits"
ACTIVATION_FAIL_FRACTION = 0.9        # "tight: activation" below 90 % of SGLang's activation estimate
MQA_LOGITS_STATIC_SKIP_ELEMS = 8_000_000   # mqa_logits_utils.py:21
MQA_LOGITS_TOTAL_MEM_FRACTION = 0.3         # mqa_logits_utils.py:22
MQA_LOGITS_FREE_MEM_FRACTION = 0.2          # SGLANG_DSA_MQA_LOGITS_FREE_MEM_FRACTION, environ.py:1985
MQA_LOGITS_ROW_ALIGN = 256                  # mqa_logits_utils.py:26
LEVELS = ("fits", "tight", "fails")
BALANCE_FRACTION = 0.9                      # srt/distributed/bootstrap.py:444 (_check_tp_memory_balance)
BALANCE_STEP_GIB = 0.1                      # a fix frees memory in steps of 0.1 GiB


def segment(nbytes: int) -> int:
    """Bytes a buffer of ``nbytes`` reserves: rounded up to a 2 MiB segment (0 stays 0)."""
    return -(-nbytes // SEGMENT_BYTES) * SEGMENT_BYTES if nbytes > 0 else 0


def pool_buffers(conf: cap.Configurator, sizes: cap.PoolSizes, index_k_bytes: int) -> list[tuple[str, int, int]]:
    """The DSV4 pool buffers of one rank as ``(name, bytes each, count)``: one buffer per layer and
    pool, the per-layer share of :func:`capacity.allocated_bytes` (whose totals equal SGLang's
    allocation to the byte). ``sum(b * n)`` equals ``allocated_bytes(...).total``."""
    a = cap.allocated_bytes(conf, sizes, index_k_bytes)
    n_all, n4, n128 = conf.num_layers_total, conf.n4, conf.n128
    out = [("swa_latent", a.swa_latent // n_all, n_all)]
    for name, total, n in (("c4_latent", a.c4_latent, n4), ("c128_latent", a.c128_latent, n128),
                           ("c4_index_k", a.c4_index_k, n4), ("c4_attn_state", a.c4_attn_state, n4),
                           ("c4_index_state", a.c4_index_state, n4), ("c128_state", a.c128_state, n128)):
        if n:
            out.append((name, total // n, n))
    return out


def allocator_buffers(full_tokens: int, swa_tokens: int, page_size: int) -> list[tuple[str, int, int]]:
    """``SWATokenToKVPoolAllocator`` tensors (int64), see the module docstring for source lines."""
    return [("full_free_pages", full_tokens // page_size * 8, 1),
            ("swa_free_pages", swa_tokens // page_size * 8, 1),
            ("full_to_swa_zeros", (full_tokens + page_size) * 8, 1),
            ("full_to_swa_index_mapping", (full_tokens + page_size + 1) * 8, 1),
            ("minus_one", 8, 1)]


def draft_pool_bytes(conf: cap.Configurator, sizes: cap.PoolSizes) -> int:
    """Bytes of the EAGLE/MTP draft worker's pool: one SWA-only layer of
    ``swa_max_total_num_tokens`` slots at the main cache's page geometry
    (``_num_dsv4_physical_kv_pages``, deepseek_v4_memory_pool.py:166-171; ``create_buffer``
    l.306-328). 0 without speculative decoding. Flash, v4 layout, 1,047,296 SWA slots:
    4,092 pages x 149,760 B = 612,817,920 B."""
    if not conf.spec:
        return 0
    P = conf.inputs.page_size
    per_page = conf.kv_bytes * P if conf.trtllm else cap.page_bytes(conf.layout_for(0), P)
    return -(-(sizes.swa_max_total_num_tokens + P) // P) * per_page


DECODE_PAGE_SIZE = 256                      # the DSV4 attention page (dsv4/metadata.py: asserted)
DECODE_INDEX_PAGE = 64                      # C4 indexer rows per page (page_size // 4)
DEEPGEMM_LOGITS_ALIGN = 256                 # DeepGEMM paged_mqa_logits: align(max_context_len, split_kv=256)
REQ_TO_TOKEN_EXTRA = 4                      # kv_cache_configurator.py:884 extra_max_context_len


def decode_indexer_logits_bytes(rows: int, context_width: int) -> int:
    """fp32 C4 indexer logits of one decode / target-verify forward, per layer (SGLang 0.5.23 and
    DeepGEMM's ``fp8_paged_mqa_logits``, module docstring): ``rows x align256(ceil(context_width /
    256) x 64) x 4`` bytes, ``rows`` = running requests x tokens per request (1, or the EAGLE draft
    tokens in target verify), ``context_width`` = ``req_to_token``'s width (context_len + 4 + draft
    tokens). About ``rows x context_width`` bytes: 256 rows at 1,048,580 tokens = 256 x 1,048,576 B =
    0.25 GiB. 0 when ``rows`` or ``context_width`` <= 0."""
    if rows <= 0 or context_width <= 0:
        return 0
    cols = -(-context_width // DECODE_PAGE_SIZE) * DECODE_INDEX_PAGE
    return rows * (-(-cols // DEEPGEMM_LOGITS_ALIGN) * DEEPGEMM_LOGITS_ALIGN) * 4


def indexer_logits_bytes(rows: int, context_length: int, total_gpu_bytes: Optional[int],
                         mem_fraction_static: float) -> int:
    """Peak fp32 indexer logits of one prefill chunk: ``rows`` query rows against
    ``context_length // 4`` compressed columns (row stride padded to 256 columns), capped by
    SGLang 0.5.23's row chunking budget ``min(0.3 * total, 0.2 * total * (1 - mfs))``
    (``mqa_logits_utils.py:37-101``; field report C2). 0 when rows <= 0 or below the 8e6-element
    skip. ``total_gpu_bytes`` None: no cap."""
    cols = context_length // 4
    if rows <= 0 or cols <= 0:
        return 0
    row_bytes = -(-cols // MQA_LOGITS_ROW_ALIGN) * MQA_LOGITS_ROW_ALIGN * 4
    full = rows * row_bytes
    if rows * cols < MQA_LOGITS_STATIC_SKIP_ELEMS or total_gpu_bytes is None:
        return full
    budget = max(1, min(int(total_gpu_bytes * MQA_LOGITS_TOTAL_MEM_FRACTION),
                        int(int(total_gpu_bytes * max(0.0, 1.0 - mem_fraction_static)) * MQA_LOGITS_FREE_MEM_FRACTION)))
    if full <= budget:
        return full
    return max(budget // row_bytes, 1) * row_bytes


@dataclass(frozen=True)
class RankMemory:
    """Everything one rank holds before serving, in bytes."""

    resident: int            # free after weights and other memory (F)
    pools: int               # pool bytes as allocated (exact)
    pools_rounding: int      # extra from 2 MiB segments over the pool buffers and req_to_token
    req_to_token: int
    allocator: int           # SWATokenToKVPoolAllocator tensors, 2 MiB rounded
    draft_pool: int          # EAGLE draft pool, 2 MiB rounded
    draft_freed: int = 0     # the draft's own embed/head, held while the pools are built, then freed

    @property
    def used(self) -> int:
        return self.pools + self.pools_rounding + self.req_to_token + self.allocator + self.draft_pool

    @property
    def pools_headroom(self) -> int:
        """Bytes left once the pools are built, the draft's own embed/head still held: < 0 fails."""
        return self.resident - self.used

    @property
    def headroom(self) -> int:
        """Bytes left before serving: :attr:`pools_headroom` + the draft's embed/head that EAGLE frees
        after its pool (``set_embed_and_head``: ``del`` + ``empty_cache``, srt/models/deepseek_v4.py
        l.5650-5656)."""
        return self.pools_headroom + self.draft_freed


def rank_memory(conf: cap.Configurator, sizes: cap.PoolSizes, index_k_bytes: int, resident: int,
                req_to_token: int, draft_freed: int = 0) -> RankMemory:
    """A rank's memory before serving (see module docstring for every term); ``draft_freed``: bytes
    of the draft's own embed/head in ``resident``'s weights, freed after the pools (plan.weights)."""
    bufs = pool_buffers(conf, sizes, index_k_bytes)
    exact = sum(b * n for _, b, n in bufs)
    rounded = sum(segment(b) * n for _, b, n in bufs) + segment(req_to_token)
    alloc = sum(segment(b) * n for _, b, n in allocator_buffers(
        sizes.full_max_total_num_tokens, sizes.swa_max_total_num_tokens, conf.inputs.page_size))
    return RankMemory(resident=resident, pools=exact, pools_rounding=rounded - exact - req_to_token,
                      req_to_token=req_to_token, allocator=alloc,
                      draft_pool=segment(draft_pool_bytes(conf, sizes)), draft_freed=draft_freed)


@dataclass(frozen=True)
class Verdict:
    """One rank's verdict: ``level`` in LEVELS, ``deciding`` the term (module table), ``slack``
    bytes above the deciding need (negative when it fails)."""

    level: str
    deciding: str
    slack: int


def decide(headroom: int, activation_estimate: int, activation_reserve: int, indexer_logits: int,
           requests: int, min_requests: int = 1, required: bool = True, logits_chunked: bool = True,
           pools_headroom: Optional[int] = None, decode_logits: int = 0) -> Verdict:
    """The verdict for a rank's ``headroom`` (bytes) against SGLang's activation estimate and
    floored reserve, the indexer logits transient and the requests that fit at context.

    ``required``: the operator asked for ``min_requests`` (profile ``plan.min_requests`` or
    ``--set``); a shortfall then fails. Otherwise (the default of one request at the model's
    context) it is ``tight``: SGLang 0.5.23 starts with a pool smaller than one full-context request
    ("Not an error: a deployment that never sends max-length requests may want a small pool",
    ``srt/managers/tp_worker.py:556-571``; 0.5.21 and 0.5.22 clamp the same way without the warning,
    ``max_req_len = min(context_len - 1, pool - 1)``, tp_worker.py:411-415 and 414-418) and refuses,
    or with ``--allow-auto-truncate`` truncates, only the requests longer than ``min(context_len,
    pool) - 6`` tokens (``srt/managers/utils.py`` ``validate_input_length``): the cookbook's H200
    Pro recipes serve so.

    ``logits_chunked`` False (SGLang 0.5.18-0.5.20, :class:`dsv4ctl.plan.versions.VersionRules`):
    the release scores a prefill chunk's indexer logits in one fp32 tensor, so headroom below
    ``indexer_logits`` alone fails the first long prefill (field report C2, an OOM in
    ``fp8_paged_mqa_logits``).

    ``pools_headroom``: the bytes left once the pools are built while the EAGLE draft still holds
    its own embed/head (:attr:`RankMemory.pools_headroom`; default ``headroom``): below 0 fails.
    ``decode_logits``: the decode rectangle (:func:`decode_indexer_logits_bytes`), part of the
    ``indexer_logits`` need beside one prefill chunk's."""
    if (headroom if pools_headroom is None else pools_headroom) < 0:
        return Verdict("fails", "pools", headroom if pools_headroom is None else pools_headroom)
    if not logits_chunked and headroom < indexer_logits:
        return Verdict("fails", "indexer_logits", headroom - indexer_logits)
    if requests < min_requests and required:
        return Verdict("fails", "requests", requests - min_requests)
    short_line = int(activation_estimate * ACTIVATION_FAIL_FRACTION)
    if headroom < short_line:
        return Verdict("tight", "activation", headroom - activation_estimate)
    if requests < min_requests:
        return Verdict("tight", "requests", requests - min_requests)
    name, need = largest_need(activation_estimate, activation_reserve, indexer_logits, decode_logits)
    if headroom < need:
        return Verdict("tight", name, headroom - need)
    if headroom < need + TIGHT_MARGIN_BYTES:
        return Verdict("tight", "margin", headroom - need)
    return Verdict("fits", name, headroom - need)


def largest_need(activation_estimate: int, activation_reserve: int, indexer_logits: int,
                 decode_logits: int = 0) -> tuple[str, int]:
    """``(deciding term, bytes)`` of the largest need a rank's headroom is judged against (module
    table): SGLang's floored reserve, its activation estimate plus one prefill chunk's indexer
    logits and the decode rectangle, or the estimate alone. A rank ``fits`` at this +
    :data:`TIGHT_MARGIN_BYTES`."""
    needs = [("activation_floor", activation_reserve),
             ("indexer_logits", activation_estimate + indexer_logits + decode_logits),
             ("activation", activation_estimate)]
    return max(needs, key=lambda x: x[1])


def shortfall_bytes(headroom: int, activation_estimate: int, activation_reserve: int, indexer_logits: int,
                    decode_logits: int = 0) -> int:
    """Bytes of headroom a rank lacks to plan ``fits`` (issue 44.4): the largest need (:func:`largest_need`)
    + :data:`TIGHT_MARGIN_BYTES` - ``headroom``; 0 when it has them."""
    return max(0, largest_need(activation_estimate, activation_reserve, indexer_logits, decode_logits)[1]
               + TIGHT_MARGIN_BYTES - headroom)


def unbalanced(frees_gib: list[float]) -> Optional[str]:
    """Why SGLang 0.5.23 refuses to start a TP group with these per-GPU free memories (GiB, one per
    GPU, before weight load), or None when it starts.

    ``srt/distributed/bootstrap.py:213-218`` (``tp_size > 1``, target worker) calls
    ``_check_tp_memory_balance`` (l.441-452) with ``pre_model_load_memory`` = the MIN across the
    world of ``get_available_gpu_memory`` and ``local_gpu_memory`` = this rank's own; it raises
    ``RuntimeError("The memory capacity is unbalanced. ...")`` when ``pre_model_load_memory <
    local_gpu_memory * 0.9`` (``SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK``, default true, environ.py:500;
    false makes it a warning). Some rank raises exactly when ``min < 0.9 x max``."""
    if not frees_gib:
        return None
    lo, hi = min(frees_gib), max(frees_gib)
    if lo < hi * BALANCE_FRACTION:
        return (f"free before load {lo} GiB on one GPU < {BALANCE_FRACTION:g} x {hi} GiB on another: "
                "SGLang refuses to start ('The memory capacity is unbalanced')")
    return None


def to_balance(frees_gib: list[float]) -> list[tuple[int, float]]:
    """The GiB to free on each GPU below ``0.9 x max`` so that :func:`unbalanced` passes: a list of
    ``(position in frees_gib, GiB)``, each rounded up to :data:`BALANCE_STEP_GIB` (so the GPU ends at
    or above the threshold); empty when balanced. Pure; GiB = 2**30 bytes."""
    if unbalanced(frees_gib) is None:
        return []
    line = max(frees_gib) * BALANCE_FRACTION
    out = []
    for i, f in enumerate(frees_gib):
        if f >= line:
            continue
        steps = -(-round((line - f) * 1000) // round(BALANCE_STEP_GIB * 1000))    # ceil in 1/1000 GiB
        while round(f + steps * BALANCE_STEP_GIB, 3) < line:
            steps += 1
        out.append((i, round(steps * BALANCE_STEP_GIB, 3)))
    return out


DECIDING_ORDER = ("unbalanced", "weights", "no_kv_memory", "pools", "activation", "requests", "activation_floor",
                  "indexer_logits", "margin", "available_bytes")


def worst(verdicts: list[Verdict]) -> Verdict:
    """The worst of several ranks' verdicts: highest level, then the deciding term's order, then
    least slack."""
    return min(verdicts, key=lambda v: (-LEVELS.index(v.level), DECIDING_ORDER.index(v.deciding)
                                        if v.deciding in DECIDING_ORDER else 99, v.slack))
