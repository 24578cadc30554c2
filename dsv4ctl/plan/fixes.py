"""The fixes a plan prints (pure): for a verdict that is not ``fits``, the changes that re-plan to
a better one (mem-fraction-static, chunked-prefill-size, more GPUs, balanced memory), each
re-planned before it is offered, so no hint contradicts the verdict it accompanies."""

from __future__ import annotations

from typing import Optional

from . import capacity as cap
from ..errors import InputError
from .models import REPLICATED_WEIGHTS_GIB
from . import verdict as vd
from .inputs import MAX_PARALLEL, GroupInputs
from .stages import StagePlan, evaluate, resident_gib, to_gib


def _replanned(model, gi: GroupInputs) -> Optional[tuple[vd.Verdict, Optional[float]]]:
    """(verdict, tightest headroom GiB) of a candidate fix, or None when it still fails or lands
    under 90 % of SGLang's activation estimate (``tight: activation``: not a fix worth printing)."""
    stages, v, _ = evaluate(model, gi)
    if v.level == "fails" or stages is None or (v.level == "tight" and v.deciding == "activation"):
        return None
    return v, min(to_gib(s.headroom_bytes) for s in stages)


def _with_pool(gi: GroupInputs, **changes) -> GroupInputs:
    return cap.replace(gi, pool=cap.replace(gi.pool, **changes))


def _fits(model, gi: GroupInputs) -> Optional[tuple[vd.Verdict, Optional[float]]]:
    """(verdict, tightest headroom GiB) of a candidate that plans ``fits`` (what clears a ``tight``),
    else None."""
    stages, v, _ = evaluate(model, gi)
    if v.level != "fits" or stages is None:
        return None
    return v, min(to_gib(s.headroom_bytes) for s in stages)


def _search_mfs(model, gi: GroupInputs, down: bool, accept=None) -> Optional[tuple[float, tuple]]:
    """The closest 3-decimal mem_fraction_static below (``down``) or above the current one, within
    0.3..0.99, whose re-plan ``accept`` takes (default :func:`_replanned`: does not fail).

    A scan 0.001 at a time, not steps and bisection: the verdict is not monotonic in
    mem-fraction-static. Lower values free headroom but shrink the pools, so a configuration that
    must hold ``min_requests`` passes only in a window between too few requests and too little
    headroom, and on 0.5.18-0.5.20 (indexer logits in one tensor, field report C2) that window can
    be narrower than 0.01 (issue 44.5); a coarse step would jump over it."""
    accept = accept or _replanned
    step = -1 if down else 1
    m = round(gi.mem_fraction_static * 1000) + step
    while 300 <= m <= 990:
        r = accept(model, cap.replace(gi, mem_fraction_static=m / 1000))
        if r is not None:
            return m / 1000, r
        m += step
    return None


def chunk_fix(model, gi: GroupInputs, resolve, accept=None) -> list[str]:
    """A smaller ``chunked-prefill-size``: with SGLang's default ``mem_fraction_static`` it shrinks
    the activation estimate SGLang reserves (memory_hook.py: 1.5 MB per chunk token) and so raises
    its default; on any setting it shrinks the indexer logits of one prefill chunk (rows x
    context/4 x 4 B). The largest halving (down to 2,048) whose re-plan ``accept`` takes (default
    :func:`_replanned`; ``resolve(overrides)`` re-resolves the group, defaults included), as a
    one-item list, else []."""
    accept = accept or _replanned
    cur = gi.pool.chunked_prefill_size * (gi.dp if gi.dp_attention else 1)
    c = cur // 2
    while c >= 2048:
        g2 = resolve({"chunked_prefill_size": c})
        r = accept(model, g2)
        if r is not None:
            why = (f"SGLang's default mem-fraction-static becomes {g2.mem_fraction_static}"
                   if gi.mfs_source.startswith("default") else
                   f"a prefill chunk's indexer logits are {g2.logits_rows:,} rows")
            return [f"set chunked-prefill-size: {c} (from {cur}) in the serve config: {why} "
                    f"(re-planned: {r[0].level}, headroom {r[1]} GiB)"]
        c //= 2
    return []


def first_passing_mfs(model, gi: GroupInputs) -> str:
    """What SGLang's "Raise --mem-fraction-static above X" leaves out: X is its minimum for any KV
    memory (``1 - F/P``), and just above it the pools may still hold no request (SGLang's
    configurator refuses that too). The smallest 3-decimal value up to 0.99 at which the plan no
    longer fails (tight allowed), as a clause for the message, so the hint never contradicts it."""
    def passes(m: float):
        stages, v, _ = evaluate(model, cap.replace(gi, mem_fraction_static=m))
        return (v, stages) if stages and v.level != "fails" else None
    need = cap.min_viable_mem_fraction_static(gi.free_gib_before_load, resident_gib(gi))
    lo, m = need, round(-(-round(need * 1000) // 10) / 100, 3)      # need rounded up to 0.01
    while m <= 0.99 and not passes(m):
        lo, m = m, round(m + 0.01, 3)
    if m > 0.99:
        return " (SGLang's minimum for any KV memory; no value up to 0.99 plans without failing: see the fixes)"
    fine = round(lo + 0.001, 3)
    while fine < m and not passes(fine):
        fine = round(fine + 0.001, 3)
    v, stages = passes(fine)
    return (f" (SGLang's minimum for any KV memory; the plan first passes at {fine}: {v.level}, {v.deciding}, "
            f"headroom {min(to_gib(st.headroom_bytes) for st in stages)} GiB)")


def fixes_for(model, gi: GroupInputs, v: vd.Verdict, stages: Optional[list[StagePlan]],
              resolve=None) -> list[str]:
    """Fixes that work: every candidate is re-planned and kept only when it no longer fails;
    smallest change first (serve-config values by relative change, then tree changes, then GPUs).
    ``resolve(overrides)`` re-resolves the group as ``--set`` would (SGLang's activation estimate
    and defaults follow the new tp-size); without it a GPU candidate only rescales the weights."""
    out: list[tuple[tuple, str]] = []

    def add(cost: tuple, text: str, r: tuple) -> None:
        out.append((cost, f"{text} (re-planned: {r[0].level}, headroom {r[1]} GiB)"))

    cur = gi.mem_fraction_static
    if v.deciding in ("pools", "activation", "indexer_logits") and gi.available_bytes_override is None:
        f = _search_mfs(model, gi, down=True)
        if f:
            add((0, (cur - f[0]) / cur), f"set mem-fraction-static: {f[0]} (from {cur}) in the serve config", f[1])
    if v.deciding in ("requests", "no_kv_memory") and gi.available_bytes_override is None:
        f = _search_mfs(model, gi, down=False)
        if f:
            add((0, (f[0] - cur) / cur), f"set mem-fraction-static: {f[0]} (from {cur}) in the serve config", f[1])
    if v.deciding in ("pools", "activation", "requests") and stages:
        mrr = gi.pool.max_running_requests
        for frac in (0.75, 0.5, 0.25, 0.125):
            new = max(1, int(mrr * frac))
            if new >= mrr or new < gi.min_requests:
                continue
            r = _replanned(model, _with_pool(gi, max_running_requests=new))
            if r is not None:
                add((0, 1 - new / mrr), f"set max-running-requests: {new} (from {mrr}) in the serve config", r)
                break
        ctx = gi.context_length
        new, fails = int(ctx * 0.75) // 1024 * 1024, ctx     # 3/4, then halving down to 4,096 tokens
        while new >= 4096:
            r = _replanned(model, cap.replace(gi, context_length=new))
            if r is not None:
                while fails - new > 1024:       # the largest passing length, to 1,024 tokens
                    mid = (new + fails) // 2 // 1024 * 1024
                    rm = _replanned(model, cap.replace(gi, context_length=mid)) if mid > new else None
                    if rm is None:
                        fails = mid if mid > new else new + 1024
                    else:
                        new, r = mid, rm
                add((0, 1 - new / ctx), f"set context-length: {new} (from {ctx}) in the serve config", r)
                break
            new, fails = new // 2 // 1024 * 1024, new
    if v.deciding == "requests" and stages and gi.pool.max_running_requests < gi.min_requests:
        f = _mrr_fix(model, gi)
        if f:
            add(*f)
    if v.deciding in ("requests", "no_kv_memory") and gi.pool.max_total_tokens is not None:
        r = _replanned(model, _with_pool(gi, max_total_tokens=None))
        if r is not None:
            add((0, 0.5), f"remove max-total-tokens ({gi.pool.max_total_tokens:,}) from the serve config", r)
    if stages and v.deciding in ("pools", "activation", "requests"):
        st = stages[0]
        if st.sizes.index_k_real_bytes > st.sizes.index_k_budget_bytes and gi.pool.index_k_accounting != "exact":
            r = _replanned(model, _with_pool(gi, index_k_accounting="exact"))
            if r is not None:
                add((1, 0.0), f"apply the index-K sizing patch (index_k_accounting: exact): full tokens "
                              f"{st.sizes.full_max_total_num_tokens:,} -> {st.exact_sizes.full_max_total_num_tokens:,}", r)
        if gi.pool.index_k_dtype == "bf16":
            r = _replanned(model, _with_pool(gi, index_k_dtype="fp8"))
            if r is not None:
                add((1, 0.1), "store index-K in fp8 (index_k_dtype: fp8)", r)
    if v.deciding == "unbalanced" and gi.free_gib_per_gpu:
        r = _balance_fix(model, gi)
        if r is not None:
            add((0, 0.0), r[0], r[1])
    if v.deciding in ("weights", "pools", "activation", "no_kv_memory"):
        g = _gpu_fix(model, gi, resolve, _replanned, with_mfs=not out)
        if g:
            add(*g)
    out.sort(key=lambda x: x[0])
    return [text if i == 0 else "or " + text for i, (_, text) in enumerate(out)]


def _gpu_fix(model, gi: GroupInputs, resolve, accept, with_mfs: bool) -> Optional[tuple[tuple, str, tuple]]:
    """``(cost, text, re-plan)`` of the fewest more GPUs (2, 4, 8 x tp-size) whose re-plan ``accept``
    takes; ``with_mfs``: when more GPUs alone do not, the same GPUs with the closest
    mem-fraction-static that does. ``resolve(overrides)`` re-resolves the group as ``--set tp_size=N``
    would (estimated weights estimated again, attention-DP sharding included; given or measured
    ones rescaled); without it only the weights are rescaled. None when no candidate passes."""
    for mult in (2, 4, 8):
        tp = gi.tp * mult
        if tp > MAX_PARALLEL:
            break
        fixed = REPLICATED_WEIGHTS_GIB if gi.weights_fixed_gib is None else gi.weights_fixed_gib
        w = round((gi.weights_gib_per_rank - fixed) / mult + fixed, 3)
        if resolve is None:
            g2 = cap.replace(gi, tp=tp, weights_gib_per_rank=w,
                             draft_weights_gib_per_rank=round(gi.draft_weights_gib_per_rank / mult, 3),
                             draft_freed_gib_per_rank=round(gi.draft_freed_gib_per_rank / mult, 3),
                             rank_resident_gib=None, free_gib_per_gpu=None, other_gib_per_gpu=None)
        else:
            o = {"tp_size": tp} if gi.weights_fixed_gib is not None else {"tp_size": tp, "weights_gib_per_rank": w}
            try:
                g2 = resolve(o)
            except InputError:          # a tp-size the model or topology refuses
                continue
            w = round(g2.weights_gib_per_rank, 3)
        r = accept(model, g2)
        also = ""
        if r is None and with_mfs and gi.available_bytes_override is None:
            # more GPUs alone still fail or land under SGLang's activation estimate at this
            # mem-fraction-static: the same GPUs with the closest value that plans
            f = _search_mfs(model, g2, down=True, accept=accept) or _search_mfs(model, g2, down=False, accept=accept)
            if f:
                also, r = f" and set mem-fraction-static: {f[0]} (from {g2.mem_fraction_static})", f[1]
        if r is not None:
            return ((2, mult), f"use {gi.tp * gi.pp * mult} GPUs per group (tp-size: {tp}, weights ~{w} GiB per rank)"
                               f"{also}", r)
    return None


def _balance_fix(model, gi: GroupInputs) -> Optional[tuple[str, tuple]]:
    """Free memory on the GPUs below SGLang's balance line (:func:`verdict.to_balance`): the fix
    text and the re-plan with those GPUs' free memory (P, and F with it) raised by the amount freed.
    The smallest change first: up to the 0.9 line; when that re-plan still fails (the pools are
    sized from the least free GPU), up to the most free GPU's memory. None when nothing is below
    the line or neither re-plan passes."""
    frees0 = list(gi.free_gib_per_gpu or [])
    if not vd.to_balance(frees0):
        return None
    top = max(frees0)
    line_need = vd.to_balance(frees0)
    full_need = [(i, round(top - f, 3)) for i, f in enumerate(frees0) if f < top]
    for need, line in ((line_need, True), (full_need, False)):
        frees = list(frees0)
        resident = list(gi.rank_resident_gib or [])
        for i, gib in need:
            frees[i] = round(frees[i] + gib, 3)
            if i < len(resident):
                resident[i] = round(resident[i] + gib, 3)
        r = _replanned(model, cap.replace(gi, free_gib_per_gpu=frees, rank_resident_gib=resident or None,
                                          free_gib_before_load=min(frees)))
        if r is None:
            continue
        others = gi.other_gib_per_gpu or []
        parts = []
        for i, gib in need:
            held = f" (other_gib {others[i]} GiB)" if i < len(others) and others[i] else ""
            parts.append(f"{gib} GiB on {gi.gpu_name(i)}{held}")
        why = (f"SGLang needs every GPU's free memory >= {vd.BALANCE_FRACTION:g} x {top} GiB" if line else
               f"SGLang needs every GPU's free memory >= {vd.BALANCE_FRACTION:g} x {top} GiB, and the pools, "
               f"sized from the least free GPU, fit only with every GPU at {top} GiB")
        return f"free {' and '.join(parts)} (other processes hold it; dsv4ctl facts shows which): {why}", r
    return None


TIGHT_MEMORY = ("activation", "activation_floor", "indexer_logits", "margin")


def tight_fixes(model, gi: GroupInputs, v: vd.Verdict, resolve, version: Optional[str] = None) -> list[str]:
    """Fixes that clear a ``tight`` (issue 44.4): each re-plans to ``fits`` as printed, smallest change
    first. Short of headroom (``TIGHT_MEMORY``): the closest lower mem-fraction-static (more memory
    outside the pools), a smaller decode CUDA graph (``cuda-graph-max-bs-decode``: SGLang's estimate
    counts 2 MB per batch, more with DP attention, memory_hook.py ``reserve_for_graph_mb``), a
    smaller chunked-prefill-size. Short of requests at context: the closest higher
    mem-fraction-static, the largest context-length that holds one, max-total-tokens removed.
    ``resolve(overrides)`` re-resolves the group as ``--set`` does; ``version``: the SGLang release
    (the graph fix only where its ``--config`` takes ``cuda-graph-max-bs-decode``: 0.5.20+). []
    when nothing plans ``fits``."""
    out: list[tuple[tuple, str]] = []

    def add(cost: tuple, text: str, r: tuple) -> None:
        out.append((cost, f"{text} (re-planned: {r[0].level}, headroom {r[1]} GiB)"))

    cur, frm = gi.mem_fraction_static, ("from SGLang's default " if gi.mfs_source.startswith("default") else "from ")
    mem = v.deciding in TIGHT_MEMORY
    if gi.available_bytes_override is None and (mem or v.deciding == "requests"):
        f = _search_mfs(model, gi, down=mem, accept=_fits)
        if f:
            add((0, abs(cur - f[0]) / cur), f"set mem-fraction-static: {f[0]} ({frm}{cur}) in the serve config", f[1])
    if mem and gi.graph_max_bs > 1 and _config_takes("cuda-graph-max-bs-decode", version):
        new = gi.graph_max_bs // 2
        while new >= 1:
            r = _fits(model, resolve({"cuda_graph_max_bs": new}))
            if r is not None:
                add((0, 1 - new / gi.graph_max_bs), f"set cuda-graph-max-bs-decode: {new} (from {gi.graph_max_bs}) "
                                                     "in the serve config", r)
                break
            new //= 2
    if mem:
        for text in chunk_fix(model, gi, resolve, accept=_fits):      # already says how it re-plans
            new = int(text.split(": ", 1)[1].split(" ", 1)[0])
            out.append(((0, 1 - new / (gi.pool.chunked_prefill_size * (gi.dp if gi.dp_attention else 1))), text))
    if v.deciding == "requests":
        r = _context_fix(model, gi)
        if r:
            add((0, 1 - r[0] / gi.context_length), f"set context-length: {r[0]} (from {gi.context_length}) in the serve "
                                                   "config", r[1])
        if gi.pool.max_total_tokens is not None and (r := _fits(model, _with_pool(gi, max_total_tokens=None))):
            add((0, 0.5), f"remove max-total-tokens ({gi.pool.max_total_tokens:,}) from the serve config", r)
    if not out:         # nothing on these GPUs clears it: more of them
        g = _gpu_fix(model, gi, resolve, _fits, with_mfs=True)
        if g:
            add(*g)
    out.sort(key=lambda x: x[0])
    return [text if i == 0 else "or " + text for i, (_, text) in enumerate(out)]


def _config_takes(option: str, version: Optional[str]) -> bool:
    """True when SGLang ``version``'s ``--config`` reads ``option`` as a value (0.5.18/0.5.19 refuse
    ``cuda-graph-max-bs-decode`` there: two options share its dest)."""
    from .argtable import load_table
    arg = load_table(version=version).get(option)
    return arg is not None and arg.config == "value"


def _context_fix(model, gi: GroupInputs, accept=None) -> Optional[tuple[int, tuple]]:
    """``(context-length, re-plan)``: the largest context-length (a multiple of 1,024, down to
    4,096) below the current one whose re-plan ``accept`` takes (default :func:`_fits`): 3/4, then
    halvings until one does, then a scan down from the last that did not, 1,024 at a time (the
    verdict is not assumed monotonic). None when even 4,096 tokens do not."""
    accept = accept or _fits
    hi, new = gi.context_length, int(gi.context_length * 0.75) // 1024 * 1024
    while new >= 4096 and (r := accept(model, cap.replace(gi, context_length=new))) is None:
        hi, new = new, new // 2 // 1024 * 1024
    if new < 4096:
        return None
    c = (hi - 1) // 1024 * 1024
    while c > new:
        rc = accept(model, cap.replace(gi, context_length=c))
        if rc is not None:
            return c, rc
        c -= 1024
    return new, r


def _mrr_fix(model, gi: GroupInputs) -> Optional[tuple[tuple, str, tuple]]:
    """``min_requests`` above ``max-running-requests``: no pool size holds them (SGLang admits at
    most that many, :func:`capacity.max_concurrent_requests`). The fix raises it to ``min_requests``
    and, when the pools then hold fewer at ``context_length``, takes the largest context-length
    that plans (:func:`_context_fix`). None when even 4,096 tokens do not."""
    g = _with_pool(gi, max_running_requests=gi.min_requests)
    text = f"set max-running-requests: {gi.min_requests} (from {gi.pool.max_running_requests})"
    r = _replanned(model, g)
    if r is not None:
        return (0, 1.0), f"{text} in the serve config", r
    found = _context_fix(model, g, _replanned)
    if found is None:
        return None
    new, r = found
    return (0, 1.0 + 1 - new / gi.context_length), f"{text} and context-length: {new} (from {gi.context_length}) in the " \
        "serve config", r


def why_no_fix(model, gi: GroupInputs, v: vd.Verdict, resolve=None) -> str:
    """Why no candidate change plans (issue 44.5), as a clause for a ``fails`` without fixes: for
    ``requests``, the full pool at mem-fraction-static 0.99 against ``min_requests`` x 4,096 tokens
    (the shortest context-length tried); otherwise what the largest GPU count tried (8, 4 or 2 x
    tp-size: the largest the model's attention split takes) still plans, in its own words; when
    none is taken, why the largest is refused. "" when neither can be said."""
    if v.deciding == "requests":
        g = cap.replace(gi, mem_fraction_static=0.99, context_length=4096)
        stages, _, msg = evaluate(model, g)
        if not stages:
            return f"; why: at mem-fraction-static 0.99 and context-length 4,096 SGLang refuses the pools ({msg})"
        tokens = min(s.sizes.full_max_total_num_tokens for s in stages)
        return (f"; why: at mem-fraction-static 0.99 the full pool holds {tokens:,} tokens, and {gi.min_requests:,} "
                f"requests of even 4,096 tokens need {gi.min_requests * 4096:,}"
                + (f" (with max-running-requests >= {gi.min_requests:,}, now {gi.pool.max_running_requests:,})"
                   if gi.pool.max_running_requests < gi.min_requests else ""))
    if resolve is None or gi.tp * 2 > MAX_PARALLEL:
        return ""
    refused = None
    for tp in (gi.tp * 8, gi.tp * 4, gi.tp * 2):    # the largest GPU count SGLang takes (a TP past the
        try:                                        # model's heads / output groups is refused)
            g = resolve({"tp_size": tp})
            break
        except InputError as e:
            refused = refused or f"; why: tp-size {tp} is refused ({str(e)[:160]})"
    else:
        return refused or ""
    _, v2, msg = evaluate(model, g)
    return f"; why: at {tp * gi.pp} GPUs (tp-size {tp}, weights ~{round(g.weights_gib_per_rank, 3)} GiB per rank) it is " \
        f"still {v2.level} ({v2.deciding}): {msg}"
