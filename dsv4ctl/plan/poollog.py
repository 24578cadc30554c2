"""Parse DeepSeek-V4 pool sizing lines out of an SGLang 0.5.23 server log (pure, no I/O).

Lines understood (``srt/model_executor/pool_configurator.py``, ``DSV4PoolConfigurator``):

* ``DSV4 memory calculation: unified=…, bytes_per_full_token=7086.75, available_bytes=128.97 GB,
  c128_state_fixed=2.53 GB, …, full_token=19158016`` (``calculate_pool_sizes``; "GB" is GiB,
  2 decimals).
* ``DSV4 pool sizes: full=…, swa=…, c4=…, c128=…, c4_state=…, c128_state=…`` (``_to_config``).
  In stock 0.5.23 this line is printed *before* ``finalize_with_max_running_requests``, so its
  ``c128_state`` is always 0: it is not a final value and is not compared.
* ``max_total_num_tokens=…, chunked_prefill_size=…, max_prefill_tokens=…, max_running_requests=…``
  (``srt/managers/scheduler.py:1267-1276``): SGLang's generic line, used only when a rank has no
  DSV4 pool line (a log cut short, or another log level): compared on the full pool alone.
* ``DSV4_POOL_PLAN {json}`` — the final sizes, from the ``0002-dsv4-log-pool-plan`` patch of
  ``patches/sglang-0.5.23`` (keys ``full swa c4 c128 c4_state c128_state max_running_requests
  bytes_per_full_token available_bytes fixed_bytes …``).

The rank comes from SGLang's logger prefix ``[TIME DP0 PP1 TP3 EP3]`` (``scheduler.py``: DP, PP,
ATTN_CP, MOE_DP, TP, EP; only the parts whose size is > 1 are printed, DP always when set)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Optional

POOLS = ("full", "swa", "c4", "c128", "c4_state", "c128_state")
# plan JSON (dsv4ctl.plan/2) rank field for each pool
PLAN_FIELDS = {"full": "full_max_total_num_tokens", "swa": "swa_max_total_num_tokens",
               "c4": "c4_max_total_num_tokens", "c128": "c128_max_total_num_tokens",
               "c4_state": "c4_state_pool_size", "c128_state": "c128_state_pool_size"}

_RANK_RE = re.compile(r"\b(DP|PP|ATTN_CP|MOE_DP|TP|EP)(\d+)\b")
_SIZES_RE = re.compile(r"DSV4 pool sizes: full=(\d+), swa=(\d+), c4=(\d+), c128=(\d+), "
                       r"c4_state=(\d+), c128_state=(\d+)")
_CALC_RE = re.compile(r"DSV4 memory calculation: (.*)$")
_PLAN_RE = re.compile(r"DSV4_POOL_PLAN (\{.*\})\s*$")
_GB_RE = re.compile(r"^([0-9.]+) GB$")
# SGLang's generic start-up line (srt/managers/scheduler.py:1267-1276, tp_rank 0 of each DP/PP
# rank): for DeepSeek-V4 its max_total_num_tokens is the full pool (full_max_total_num_tokens).
_GENERIC_RE = re.compile(r"\bmax_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+), "
                         r"max_prefill_tokens=(\d+), max_running_requests=(\d+)")
# bytes per full token: the memory calculation line prints it with 2 decimals at most
BPFT_TOLERANCE = 0.006


class LogFormatError(ValueError):
    """A pool line whose fields have the wrong type (``line`` 1-based, ``field`` the key)."""

    def __init__(self, line: int, field: str, message: str):
        super().__init__(f"{line}: {field}: {message}")
        self.line, self.field, self.message = line, field, message


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(no: int, key: str, v, optional: bool = True) -> Optional[float]:
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise LogFormatError(no, key, f"expected a finite number, got {v!r}")
    return v


@dataclass
class RankPools:
    """What one rank's log says. ``pools``: pool → value; ``final`` pools come from a
    DSV4_POOL_PLAN line (exact); else the stock line (``c128_state`` omitted, see module doc)."""

    rank: dict                       # {"DP": 0, "TP": 3, ...} from the prefix; {} when none
    pools: dict = field(default_factory=dict)
    source: str = ""                 # "DSV4_POOL_PLAN" | "DSV4 pool sizes"
    line: int = 0                    # 1-based line of the record used
    bytes_per_full_token: Optional[float] = None
    available_bytes: Optional[int] = None      # exact (DSV4_POOL_PLAN)
    available_gib: Optional[float] = None      # 2 decimals (memory calculation line)
    full_token: Optional[int] = None
    max_running_requests: Optional[int] = None

    @property
    def key(self) -> tuple:
        return tuple(sorted(self.rank.items()))

    def label(self) -> str:
        return " ".join(f"{k}{v}" for k, v in self.rank.items()) or "(no rank prefix)"


def _rank(line: str, marker_at: int) -> dict:
    head = line[:marker_at]
    start = head.rfind("[")
    if start < 0:
        return {}
    return {k: int(v) for k, v in _RANK_RE.findall(head[start:])}


def parse_log(text: str) -> list[RankPools]:
    """One :class:`RankPools` per rank, in first-seen order. For each rank the *last* pool record
    wins (a ``--max-total-tokens`` or PP cap re-derives the sizes and logs them again), and a
    DSV4_POOL_PLAN record beats a stock "DSV4 pool sizes" record. Lines that merely mention the
    markers without the expected fields are ignored (a DSV4_POOL_PLAN line that is not JSON or
    lacks a pool key). Raises :class:`LogFormatError` for a record with the fields but wrong
    types (a string pool size, ``bytes_per_full_token=abc``)."""
    ranks: dict[tuple, RankPools] = {}

    def get(rank: dict) -> RankPools:
        key = tuple(sorted(rank.items()))
        if key not in ranks:
            ranks[key] = RankPools(rank=rank)
        return ranks[key]

    for no, line in enumerate(text.splitlines(), 1):
        m = _PLAN_RE.search(line)
        if m:
            try:
                doc = json.loads(m.group(1))
            except (ValueError, RecursionError):     # not JSON, or nested too deep to be a pool record
                continue
            if not isinstance(doc, dict) or not all(p in doc for p in POOLS):
                continue
            for p in POOLS:
                if not _is_int(doc[p]) or doc[p] < 0:
                    raise LogFormatError(no, f"DSV4_POOL_PLAN.{p}", f"expected an integer >= 0, got {doc[p]!r}")
            for k in ("available_bytes", "max_running_requests"):
                if doc.get(k) is not None and not _is_int(doc[k]):
                    raise LogFormatError(no, f"DSV4_POOL_PLAN.{k}", f"expected an integer, got {doc[k]!r}")
            bpt = _number(no, "DSV4_POOL_PLAN.bytes_per_full_token", doc.get("bytes_per_full_token"))
            r = get(_rank(line, m.start()))
            r.pools = {p: doc[p] for p in POOLS}
            r.source, r.line = "DSV4_POOL_PLAN", no
            r.bytes_per_full_token = bpt if bpt is not None else r.bytes_per_full_token
            r.available_bytes = doc.get("available_bytes")
            r.max_running_requests = doc.get("max_running_requests")
            continue
        m = _SIZES_RE.search(line)
        if m:
            r = get(_rank(line, m.start()))
            if r.source != "DSV4_POOL_PLAN":
                vals = [int(x) for x in m.groups()]
                r.pools = dict(zip(POOLS[:5], vals[:5]))
                r.source, r.line = "DSV4 pool sizes", no
            continue
        m = _GENERIC_RE.search(line)
        if m:
            r = get(_rank(line, m.start()))
            if r.source in ("", "max_total_num_tokens"):
                r.pools = {"full": int(m.group(1))}
                r.source, r.line = "max_total_num_tokens", no
                r.max_running_requests = int(m.group(4))
            continue
        m = _CALC_RE.search(line)
        if m:
            r = get(_rank(line, m.start()))
            for part in m.group(1).split(", "):
                k, _, v = part.partition("=")
                if k == "bytes_per_full_token":
                    try:
                        x = float(v)
                    except ValueError:
                        raise LogFormatError(no, k, f"expected a number, got {v!r}") from None
                    r.bytes_per_full_token = _number(no, k, x, optional=False)
                elif k == "available_bytes" and _GB_RE.match(v):
                    r.available_gib = float(_GB_RE.match(v).group(1))
                elif k == "full_token" and v.isdigit():
                    r.full_token = int(v)
    return [r for r in ranks.values() if r.pools]


@dataclass
class PoolDiff:
    pool: str
    planned: int
    logged: int

    @property
    def diff(self) -> int:
        return self.logged - self.planned

    @property
    def pct(self) -> float:
        return 0.0 if self.planned == 0 else round(100.0 * self.diff / self.planned, 3)


def compare(planned_rank: dict, logged: RankPools) -> list[PoolDiff]:
    """Per pool: the plan's value (a ``dsv4ctl.plan/2`` rank dict) vs the log's. Only pools the
    log states are compared (the stock line has no final ``c128_state``)."""
    return [PoolDiff(p, planned_rank[PLAN_FIELDS[p]], logged.pools[p])
            for p in POOLS if p in logged.pools]


def match_rank(plan_ranks: list[dict], logged: RankPools) -> Optional[dict]:
    """The plan rank a log record belongs to: by TP / PP / DP rank from the prefix (absent parts
    are 0, as SGLang omits them when the size is 1). None when no plan rank matches."""
    want = {"tp_rank": logged.rank.get("TP", 0), "pp_rank": logged.rank.get("PP", 0),
            "dp_rank": logged.rank.get("DP", 0)}
    for r in plan_ranks:
        if all(r.get(k) == v for k, v in want.items()):
            return r
    return None
