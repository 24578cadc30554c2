"""A plan rank's GPU memory as stacked segments, in GiB: what the HTML bar, the terminal bar
and ``plan --csv`` draw (one source for the three). Pure.

For a rank of a ``dsv4ctl.plan/2`` group, left to right the segments fill the GPU:

    before load (CUDA context, other processes) + weights + other resident
    + SWA / c4 / c128 latent + compressor states (c4 attention, c4 index, c128)
    + index-K as SGLang budgets it + index-K over that budget (the warning)
    + req_to_token + headroom (SGLang's activation reserve, then the rest)

``GPU = before_load + free_gib_before_load`` and ``free_gib_before_load = weights + other +
allocated (real) + req_to_token + headroom`` (dsv4ctl/plan/plan.py), so the segments sum to the
GPU's memory up to the JSON's 3-decimal rounding. When the headroom is smaller than SGLang's
activation reserve the reserve segment is cut to the headroom and :attr:`Bar.reserve_short_gib`
says by how much; a negative headroom (the plan does not fit) leaves no headroom segment and the
bar runs past the GPU line."""

from __future__ import annotations

from typing import Optional

#: (key, label, colour, terminal glyph) in drawing order.
SEGMENTS = (
    ("before_load", "in use before load", "#d0d0d0", "·"),
    ("weights", "weights", "#5b6c8f", "█"),
    ("other", "other resident", "#a0a8b8", "▒"),
    ("swa_latent", "SWA latent", "#4e79a7", "▓"),
    ("c4_latent", "c4 latent", "#76b7b2", "▓"),
    ("c128_latent", "c128 latent", "#59a14f", "▓"),
    ("states", "compressor states", "#b6992d", "▒"),
    ("index_k_budget", "index-K as budgeted", "#9c755f", "▒"),
    ("index_k_over", "index-K over budget", "#d62728", "!"),
    ("req_to_token", "req_to_token", "#b07aa1", "▒"),
    ("headroom_reserved", "headroom: activation reserve (SGLang)", "#f1ce63", "░"),
    ("headroom_free", "headroom beyond the reserve", "#e6f2e6", " "),
)
LABELS = {k: label for k, label, _, _ in SEGMENTS}
COLOURS = {k: c for k, _, c, _ in SEGMENTS}
GLYPHS = {k: g for k, _, _, g in SEGMENTS}


class Bar:
    """One rank's bar: ``segments`` [(key, GiB)] in :data:`SEGMENTS` order (all keys, zeros
    kept), the GPU's memory (GiB, None if the plan does not know it), the headroom (GiB, may be
    negative), SGLang's activation reserve (GiB), how much of it the headroom lacks (GiB, >= 0),
    requests at the context length, the context length (tokens). A plain class, not a
    dataclass: ``plan`` imports this module to draw its bar, and a dataclass costs 1 ms to
    create at import."""

    __slots__ = ("title", "group", "ranks", "segments", "gpu_gib", "headroom_gib", "reserve_gib",
                 "reserve_short_gib", "requests", "context_length")

    def __init__(self, title: str, group: str, ranks: list[int], segments: list[tuple[str, float]],
                 gpu_gib: Optional[float], headroom_gib: float, reserve_gib: float, reserve_short_gib: float,
                 requests: int, context_length: int):
        self.title, self.group, self.ranks, self.segments = title, group, ranks, segments
        self.gpu_gib, self.headroom_gib, self.reserve_gib = gpu_gib, headroom_gib, reserve_gib
        self.reserve_short_gib, self.requests, self.context_length = reserve_short_gib, requests, context_length

    @property
    def total_gib(self) -> float:
        """Sum of the segments (GiB)."""
        return sum(v for _, v in self.segments)

    def value(self, key: str) -> float:
        """GiB of segment ``key``."""
        return dict(self.segments)[key]


def rank_segments(group: dict, rank: dict) -> list[tuple[str, float]]:
    """[(segment key, GiB)] of one rank of a ``dsv4ctl.plan/2`` group, in :data:`SEGMENTS`
    order, each rounded to 3 decimals (the plan's own precision)."""
    mi = group["memory_inputs"]
    gpu = group["gpu_memory_mib"] / 1024 if group.get("gpu_memory_mib") else None
    free = mi["free_gib_before_load"]
    pools = rank["pools_gib"]
    ik = rank["index_k"]
    real = pools.get("c4_index_k", rank.get("index_k_gib", 0.0)) or 0.0
    budget = min(ik["budget_gib"], real)
    headroom = rank["headroom_gib"]
    reserve = group.get("activation_reserve_gib") or 0.0
    seg = {
        "before_load": max(0.0, gpu - free) if gpu is not None else 0.0,
        "weights": mi["weights_gib_per_rank"],
        "other": mi.get("other_gib") or 0.0,
        "swa_latent": pools["swa_latent"],
        "c4_latent": pools["c4_latent"],
        "c128_latent": pools["c128_latent"],
        "states": pools["c4_attn_state"] + pools["c4_index_state"] + pools["c128_state"],
        "index_k_budget": budget,
        "index_k_over": max(0.0, ik.get("overcommit_gib", real - budget)),   # the plan's own number
        "req_to_token": rank["req_to_token_gib"],
        "headroom_reserved": max(0.0, min(reserve, headroom)),
        "headroom_free": max(0.0, headroom - reserve),
    }
    return [(k, round(seg[k], 3)) for k, *_ in SEGMENTS]


RANK_PLACE_KEYS = ("rank", "gpu", "tp_rank", "dp_rank", "node", "host")
"""Keys of a plan rank that say where it runs, not what its pools are."""


def rank_sets(group: dict) -> list[list[dict]]:
    """The ranks of a ``dsv4ctl.plan/2`` group in sets of identical pools: ranks that differ
    only in where they run (:data:`RANK_PLACE_KEYS`: GPU, host, node, TP and attention-DP rank)
    share a set, in rank order."""
    sets: dict = {}
    for r in group["ranks"]:
        sets.setdefault(tuple((k, str(v)) for k, v in r.items() if k not in RANK_PLACE_KEYS), []).append(r)
    return list(sets.values())


def rank_label(ranks: list[dict]) -> str:
    """``rank 3``, ``ranks 0-15`` (contiguous) or ``ranks 0,2,5``."""
    nums = [x["rank"] for x in ranks]
    if len(nums) == 1:
        return f"rank {nums[0]}"
    return f"ranks {nums[0]}-{nums[-1]}" if nums == list(range(nums[0], nums[-1] + 1)) else \
        "ranks " + ",".join(map(str, nums))


def plan_bars(doc: dict) -> list[Bar]:
    """One :class:`Bar` per group and set of identical ranks of a ``dsv4ctl.plan/2`` document
    (ranks of one :func:`rank_sets` set share a bar, titled ``decode ranks 0-3``),
    in document order. Groups that failed before sizing have no ranks and no bar."""
    bars = []
    for g in doc["groups"]:
        for rs in rank_sets(g):
            r = rs[0]
            nums = [x["rank"] for x in rs]
            label = rank_label(rs)
            reserve = g.get("activation_reserve_gib") or 0.0
            bars.append(Bar(title=f"{g['name']} {label}", group=g["name"], ranks=nums,
                            segments=rank_segments(g, r),
                            gpu_gib=round(g["gpu_memory_mib"] / 1024, 3) if g.get("gpu_memory_mib") else None,
                            headroom_gib=r["headroom_gib"], reserve_gib=reserve,
                            reserve_short_gib=round(max(0.0, reserve - max(0.0, r["headroom_gib"])), 3),
                            requests=r["max_concurrent_requests"], context_length=g["context_length"]))
    return bars
