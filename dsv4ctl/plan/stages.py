"""The pools of a resolved group, stage by stage (pure): :func:`plan_stages` sizes each PP stage
with :mod:`dsv4ctl.plan.capacity` and :func:`evaluate` gives the group's verdict
(:mod:`dsv4ctl.plan.verdict`) and its message."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from . import capacity as cap
from .capacity import GIB, CapacityError
from . import verdict as vd
from .inputs import GroupInputs


def to_gib(x: float) -> float:
    return round(x / GIB, 3)


def resident_gib(gi: GroupInputs) -> float:
    """F: GiB free on the tightest rank after target and draft weights and other memory (SGLang
    MIN-reduces free memory across the world before sizing, reference §3.2)."""
    if gi.rank_resident_gib:
        return min(gi.rank_resident_gib)
    return gi.free_gib_before_load - gi.weights_gib_per_rank - gi.draft_weights_gib_per_rank - gi.other_gib


@dataclass
class StagePlan:
    """One PP stage of a group (identical pools for all its TP/DP ranks)."""

    pp_rank: int
    conf: cap.Configurator
    sizes: cap.PoolSizes
    exact_conf: cap.Configurator
    exact_sizes: cap.PoolSizes
    alloc_budget: cap.Allocation
    alloc_real: cap.Allocation
    req_to_token_bytes: int
    headroom_bytes: int           # after everything built before serving (verdict.RankMemory), tightest rank
    headroom_budgeted_bytes: int  # had the index-K buffer held what was budgeted (no rounding terms)
    memory: vd.RankMemory = None
    logits_bytes: int = 0
    decode_logits_bytes: int = 0  # the decode rectangle of C4 indexer logits (verdict.decode_indexer_logits_bytes)
    concurrent: int = 0
    verdict: vd.Verdict = None


@lru_cache(maxsize=64)
def _configurator(model: cap.ModelGeometry, pool: cap.PoolInputs, layers: tuple[int, int]) -> cap.Configurator:
    return cap.Configurator(model, pool, layers)


def configurator(model: cap.ModelGeometry, pool: cap.PoolInputs, layers: tuple[int, int]) -> cap.Configurator:
    """``cap.Configurator(model, pool, layers)``, built once per distinct (frozen, equal) inputs: a
    Configurator is not changed after construction, and the fix searches re-plan the same pools at
    dozens of mem-fraction-static values (start-up, benchmarks/startup.py). Raises CapacityError as
    the constructor does (never cached); inputs that do not hash are built each time."""
    try:
        return _configurator(model, pool, layers)
    except TypeError:       # an unhashable field (a list where a tuple is expected): no memo
        return cap.Configurator(model, pool, layers)


def decode_logits(gi: GroupInputs, sizes: cap.PoolSizes) -> int:
    """Bytes of the decode forward's C4 indexer logits on a rank (:func:`verdict.decode_indexer_logits_bytes`):
    ``max_running_requests`` x tokens per request (the EAGLE draft tokens in target verify, else 1) rows at
    ``req_to_token``'s width, context_length + 4 (+ the draft tokens); 0 on a PD prefill server."""
    p = gi.pool
    if p.disaggregation_mode == "prefill":
        return 0
    draft = (p.speculative_num_draft_tokens or 1) if p.speculative_algorithm else 0
    return vd.decode_indexer_logits_bytes(sizes.max_running_requests * max(1, draft),
                                          gi.context_length + vd.REQ_TO_TOKEN_EXTRA + draft)


def _available(gi: GroupInputs, mfs: float) -> int:
    if gi.available_bytes_override is not None:
        return gi.available_bytes_override
    return cap.available_bytes_from_memory(gi.free_gib_before_load, resident_gib(gi), mfs)


def plan_stages(model: cap.ModelGeometry, gi: GroupInputs, mfs: Optional[float] = None,
                pool: Optional[cap.PoolInputs] = None) -> list[StagePlan]:
    """Per-PP-stage pool decisions with the PP MIN of full tokens (config_from_budget), each with
    its memory before serving and its verdict (:mod:`dsv4ctl.plan.verdict`) on the tightest rank.

    Raises CapacityError when SGLang would refuse to start (no memory, SWA too small)."""
    mfs = gi.mem_fraction_static if mfs is None else mfs
    pool = pool or gi.pool
    avail = _available(gi, mfs)
    if avail <= 0:
        need = cap.min_viable_mem_fraction_static(gi.free_gib_before_load, resident_gib(gi))
        if need >= 1:
            w = gi.weights_gib_per_rank + gi.draft_weights_gib_per_rank
            raise CapacityError(
                f"the weights ({round(w, 3)} GiB per rank) and other memory do not fit in "
                f"{gi.free_gib_before_load} GiB free per GPU on {gi.tp * gi.pp} GPUs (tp{gi.tp} pp{gi.pp})")
        raise CapacityError(
            f"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static={mfs}. "
            f"Raise --mem-fraction-static above {need}")
    exact_pool = cap.replace(pool, index_k_accounting="exact")

    def stage_confs(p: cap.PoolInputs) -> list[cap.Configurator]:
        return [configurator(model, p, cap.pp_layer_range(model.num_hidden_layers, gi.pp, r, gi.pp_partition))
                for r in range(gi.pp)]

    def solve(confs: list[cap.Configurator]) -> list[cap.PoolSizes]:
        fulls = [c.solve_full_tokens(avail)[0] for c in confs]
        cap_tokens = min(fulls) if gi.pp > 1 else None
        return [c.calculate_pool_sizes(avail, max_tokens_cap=cap_tokens) for c in confs]

    confs, exact_confs = stage_confs(pool), stage_confs(exact_pool)
    sizes, exact_sizes = solve(confs), solve(exact_confs)
    resident = int(resident_gib(gi) * GIB)
    total = gi.gpu_memory_mib * (1 << 20) if gi.gpu_memory_mib else None
    # a release that does not split the logits under free memory needs them whole (versions.py)
    logits = vd.indexer_logits_bytes(gi.logits_rows, gi.context_length, total if gi.logits_chunked else None, mfs)
    out = []
    for r in range(gi.pp):
        c, s = confs[r], sizes[r]
        budget = cap.allocated_bytes(c, s, c.idx_budget)
        real = cap.allocated_bytes(c, s, c.idx_real)
        r2t = s.num_req_slots * gi.context_length * 4
        memory = vd.rank_memory(c, s, c.idx_real, resident, r2t, int(gi.draft_freed_gib_per_rank * GIB))
        conc = cap.max_concurrent_requests(c, s, gi.context_length)
        dec = decode_logits(gi, s)
        verdict = as_given(gi, vd.decide(memory.headroom, int(gi.need_estimate_gib * GIB),
                                          int(gi.need_reserve_gib * GIB), logits, conc, gi.min_requests,
                                          gi.min_requests_required, logits_chunked=gi.logits_chunked,
                                          pools_headroom=memory.pools_headroom, decode_logits=dec))
        out.append(StagePlan(pp_rank=r, conf=c, sizes=s, exact_conf=exact_confs[r],
                             exact_sizes=exact_sizes[r], alloc_budget=budget, alloc_real=real,
                             req_to_token_bytes=r2t,
                             headroom_bytes=memory.headroom,
                             headroom_budgeted_bytes=resident - budget.total - r2t,
                             memory=memory, logits_bytes=logits, decode_logits_bytes=dec, concurrent=conc,
                             verdict=verdict))
    return out


def rank_verdict(gi: GroupInputs, st: StagePlan, own_resident: Optional[int]) -> tuple[vd.RankMemory, vd.Verdict]:
    if own_resident is None:
        return st.memory, st.verdict
    mem = cap.replace(st.memory, resident=own_resident)
    return mem, vd.decide(mem.headroom, int(gi.need_estimate_gib * GIB), int(gi.need_reserve_gib * GIB),
                          st.logits_bytes, st.concurrent, gi.min_requests, gi.min_requests_required,
                          logits_chunked=gi.logits_chunked, pools_headroom=mem.pools_headroom,
                          decode_logits=st.decode_logits_bytes)


TIGHT_TEXT_GIB = vd.TIGHT_MARGIN_BYTES / GIB


def _message(gi: GroupInputs, st: StagePlan, v: vd.Verdict) -> str:
    """One line naming the deciding term first, with the same headroom as the table row."""
    m = st.memory
    h = to_gib(m.headroom)
    if v.level == "fits":
        return (f"headroom {h} GiB, {to_gib(v.slack)} GiB above the largest need ({v.deciding}: SGLang's "
                f"activation estimate {gi.need_estimate_gib} GiB, reserve {gi.need_reserve_gib} GiB{_rank_text(gi)}, "
                f"indexer logits {to_gib(st.logits_bytes)} GiB" + _decode_text(st) + ")")
    if v.deciding == "pools":
        return (f"the pools ({to_gib(m.pools)} GiB as allocated + {to_gib(m.pools_rounding)} GiB 2 MiB rounding), "
                f"req_to_token ({to_gib(m.req_to_token)} GiB), SGLang's allocator ({to_gib(m.allocator)} GiB)"
                + (f" and the draft pool ({to_gib(m.draft_pool)} GiB)" if m.draft_pool else "")
                + f" exceed the {to_gib(m.resident)} GiB left after weights: headroom {to_gib(m.pools_headroom)} GiB"
                + (f" while the draft holds its own embedding and head ({to_gib(m.draft_freed)} GiB, freed after "
                   "its pool)" if m.draft_freed else ""))
    if v.deciding == "activation":
        return (f"headroom {h} GiB is below 90 % of SGLang's activation/CUDA-graph estimate "
                f"({gi.need_estimate_gib} GiB{_rank_text(gi)}, memory_hook.py, a heuristic SGLang uses only to choose "
                "mem_fraction_static when none is set): CUDA-graph capture or a large prefill chunk may run out "
                "of memory; published recipes run below it, so measure under load (dsv4ctl check load)")
    if v.deciding == "requests":
        s = st.sizes
        return (f"{st.concurrent} request(s) fit at context_length {gi.context_length:,} (full pool "
                f"{s.full_max_total_num_tokens:,} tokens, SWA {s.swa_max_total_num_tokens:,}, max running "
                f"{s.max_running_requests}); " + (f"at least {gi.min_requests} needed" if v.level == "fails" else
                "SGLang starts and refuses the requests longer than its pool (tp_worker.py: 'Not an error'), so "
                f"measure the lengths served; plan: {{min_requests: {gi.min_requests}}} in the profile requires them"))
    if v.deciding == "activation_floor":
        return (f"headroom {h} GiB is under SGLang's {gi.need_reserve_gib} GiB activation reserve "
                f"(its estimate without the floor: {gi.need_estimate_gib} GiB{_rank_text(gi)})")
    if v.deciding == "indexer_logits" and v.level == "fails":
        return (f"headroom {h} GiB is under the indexer logits of one prefill chunk ({to_gib(st.logits_bytes)} GiB, "
                f"fp32, {gi.logits_rows:,} rows x {gi.context_length:,} context / 4): this SGLang release scores a "
                "chunk's rows in one tensor (no free-memory chunking before 0.5.21), so the first long prefill runs "
                "out of memory (field report C2)")
    if v.deciding == "indexer_logits":
        return (f"headroom {h} GiB is under SGLang's activation estimate ({gi.need_estimate_gib} GiB{_rank_text(gi)}) plus the "
                f"indexer logits of one prefill chunk ({to_gib(st.logits_bytes)} GiB at {gi.logits_rows:,} rows x "
                f"{gi.context_length:,} context)" + _decode_text(st) + ": "
                + ("SGLang chunks the logits under free memory, long prefills slow down" if gi.logits_chunked else
                   "this release scores them in one tensor beside the activations (no chunking before 0.5.21): a "
                   "long prefill may run out of memory"))
    if v.deciding == "margin":
        need = h - to_gib(v.slack)
        return f"headroom {h} GiB is within {TIGHT_TEXT_GIB:g} GiB of what the rank needs ({round(need, 3)} GiB)"
    return f"headroom {h} GiB"


def _rank_text(gi: GroupInputs) -> str:
    """`` at the rank's chunk of N tokens (SGLang sizes X GiB from the undivided M)`` for a DP-attention
    rank (:func:`dsv4ctl.plan.inputs.rank_activation`), else empty."""
    if gi.rank_estimate_gib is None:
        return ""
    return (f" at the rank's prefill chunk of {gi.pool.chunked_prefill_size:,} tokens; SGLang's memory_hook.py "
            f"sizes {gi.activation_estimate_gib} GiB from the chunk before the DP-attention division")


def _decode_text(st: StagePlan) -> str:
    """`` and the decode rectangle (X GiB: R rows)`` when the rank has one, else empty."""
    if not st.decode_logits_bytes:
        return ""
    return (f" and the decode forward's indexer logits ({to_gib(st.decode_logits_bytes)} GiB: "
            f"{st.sizes.max_running_requests:,} running requests' rows at the full context)")


_NEED_TEXT = {"activation_floor": "SGLang's activation reserve ({reserve} GiB, memory_hook.py)",
              "indexer_logits": "SGLang's activation estimate + one prefill chunk's indexer logits ({est} + {logits} GiB)",
              "indexer_logits_decode": "SGLang's activation estimate + one prefill chunk's + the decode forward's "
                                       "indexer logits ({est} + {logits} + {dlogits} GiB)",
              "activation": "SGLang's activation/CUDA-graph estimate ({est} GiB, memory_hook.py)"}


def shortfall(gi: GroupInputs, stages: Optional[list[StagePlan]], v: vd.Verdict) -> dict:
    """What a verdict that is not ``fits`` is short of and by how much (issue 44.4), JSON-ready:
    ``short_of`` (text), ``shortfall_gib`` (GiB of headroom the tightest rank lacks to plan
    ``fits``: the largest need + the 1 GiB margin - headroom, :func:`verdict.shortfall_bytes`) or
    ``shortfall_requests`` (requests at ``context_length`` missing); all None for ``fits`` and for
    verdicts without a memory need (``unbalanced``, ``weights``, ``no_kv_memory``, ``available_bytes``)."""
    out = dict(short_of=None, shortfall_gib=None, shortfall_requests=None)
    if not stages or v.level == "fits":
        return out
    st = next((s for s in stages if s.verdict == v), min(stages, key=lambda s: s.headroom_bytes))
    if v.deciding == "requests":
        return dict(out, short_of=f"requests at context_length {gi.context_length:,}",
                    shortfall_requests=max(1, gi.min_requests) - st.concurrent)
    if v.deciding not in ("pools", "activation", "activation_floor", "indexer_logits", "margin"):
        return out
    est, res = int(gi.need_estimate_gib * GIB), int(gi.need_reserve_gib * GIB)
    dec = st.decode_logits_bytes
    name, need = vd.largest_need(est, res, st.logits_bytes, dec)
    what = _NEED_TEXT[name + ("_decode" if name == "indexer_logits" and dec else "")].format(
        reserve=gi.need_reserve_gib, est=gi.need_estimate_gib, logits=to_gib(st.logits_bytes),
        dlogits=to_gib(dec))
    return dict(out, short_of=f"{what} + {TIGHT_TEXT_GIB:g} GiB margin = {to_gib(need + vd.TIGHT_MARGIN_BYTES)} GiB "
                              "of headroom", shortfall_gib=to_gib(vd.shortfall_bytes(st.memory.headroom, est, res,
                                                                                      st.logits_bytes, dec)))


def evaluate(model, gi: GroupInputs) -> tuple[Optional[list[StagePlan]], vd.Verdict, str]:
    """Plan ``gi`` and judge it: (stages or None, worst verdict, one-line message)."""
    try:
        stages = plan_stages(model, gi)
    except CapacityError as e:
        deciding = "weights" if "do not fit in" in str(e) else "no_kv_memory"
        return None, vd.Verdict("fails", deciding, -1), str(e)
    why = vd.unbalanced(gi.free_gib_per_gpu or []) if gi.tp > 1 and gi.balance_check else None
    if why:
        return stages, vd.Verdict("fails", "unbalanced", -1), why
    if gi.available_bytes_override is not None and resident_gib(gi) < 0:
        w = gi.weights_gib_per_rank + gi.draft_weights_gib_per_rank
        return stages, vd.Verdict("fails", "weights", -1), (
            f"the weights ({round(w, 3)} GiB per rank) and other memory do not fit in "
            f"{gi.free_gib_before_load} GiB free per GPU on {gi.tp * gi.pp} GPUs (tp{gi.tp} pp{gi.pp})")
    v = vd.worst([s.verdict for s in stages])
    st = next(s for s in stages if s.verdict == v)
    return stages, v, _message(gi, st, v)


def as_given(gi, v: vd.Verdict) -> vd.Verdict:
    """``--set available_bytes`` is taken as given (SGLang's own number, e.g. from a log): when,
    with the group's weights and what SGLang builds before serving, it does not fit the GPU, the
    inputs disagree: ``tight`` with the deciding term ``available_bytes`` (for the rank and the
    group alike), not a verdict on the pools."""
    if gi.available_bytes_override is not None and v.deciding in ("pools", "activation"):
        return vd.Verdict("tight", "available_bytes", v.slack)
    return v
