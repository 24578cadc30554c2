"""``dsv4ctl plan``: per-GPU-rank KV pool budgets of a profile, as SGLang 0.5.23 would size them.

Inputs per server group: the profile (topology, GPU memory, measured memory), the group's serve
config (server arguments), its env switches, the tree's index-K dtype/accounting, and what-if
overrides (``--set KEY=VALUE``). The arithmetic is :mod:`dsv4ctl.capacity`; this module
resolves inputs, walks ranks and builds a JSON-ready report (schema ``dsv4ctl.plan/1``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from . import capacity as cap
from .capacity import GIB, CapacityError
from ..errors import InputError
from .models import REPLICATED_WEIGHTS_GIB, load_model
from ..profile.model import MAX_GIB, Group, Profile
from ..profile.deployment import Deployment, as_deployment
from ..profile.serveconfig import ServeConfig, canonical

SCHEMA = "dsv4ctl.plan/1"
SGLANG_VERSION = "0.5.23"
# GiB a B200-class GPU has in use before weight load (CUDA context, NCCL): 179.06 - 177.0 (⚠).
PRELOAD_USED_GIB = 2.06
# Largest tp/dp/pp size accepted (a plan lists every rank; 1024 GPUs per group is far beyond
# any DSV4 deployment and keeps a typo from allocating millions of rank entries).
MAX_PARALLEL = 1024
# Largest number of ranks one group's plan lists: tp*pp*(dp unless dp-attention).
MAX_RANKS = 1024
# SGLang 0.5.23's --max-prefill-tokens default (srt/arg_groups/fields/schedule.py:71); the
# activation estimate uses it when chunked prefill is disabled (memory_hook.py:304-307).
DEFAULT_MAX_PREFILL_TOKENS = 16384
# What-if keys that change the weight bytes per rank (a measured figure no longer applies).
WEIGHT_TOPOLOGY_KEYS = ("model", "tp_size", "pp_size", "dp_size", "enable_dp_attention")

_BOOL_TRUE = {"1", "true", "yes", "on"}
_BOOL_FALSE = {"0", "false", "no", "off", ""}


def _bool(key: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in _BOOL_TRUE:
        return True
    if s in _BOOL_FALSE:
        return False
    raise InputError(f"{key}: expected a boolean, got {v!r}")


def _int(key: str, v: Any, minimum: int = 0) -> int:
    try:
        if isinstance(v, bool):
            raise ValueError
        x = int(str(v).replace("_", "")) if not isinstance(v, int) else v
    except ValueError:
        raise InputError(f"{key}: expected an integer, got {v!r}") from None
    if x < minimum:
        raise InputError(f"{key}: must be >= {minimum}, got {x}")
    return x


def _float(key: str, v: Any, minimum: float = 0.0, maximum: float = float("inf")) -> float:
    try:
        if isinstance(v, bool):
            raise ValueError
        x = float(v)
    except (TypeError, ValueError):
        raise InputError(f"{key}: expected a number, got {v!r}") from None
    if x != x or x < minimum or x == float("inf"):
        raise InputError(f"{key}: must be a finite number >= {minimum}, got {v!r}")
    if x > maximum:
        raise InputError(f"{key}: must be <= {maximum:g}, got {v!r}")
    return x


def _opt_str(v: Any) -> Optional[str]:
    if v is None:
        return None
    s = str(v)
    return None if s.lower() in ("", "none", "null") else s


# what-if keys → (kind, parser). Server arguments use SGLang's underscore names, env switches
# their env names; dsv4ctl's own inputs are documented in the README.
SET_KEYS: dict[str, str] = {
    "model": "str", "available_bytes": "int", "mem_fraction_static": "float",
    "max_running_requests": "int", "tp_size": "int", "dp_size": "int",
    "enable_dp_attention": "bool", "pp_size": "int", "page_size": "int",
    "swa_full_tokens_ratio": "float", "speculative_algorithm": "optstr",
    "speculative_num_draft_tokens": "int", "context_length": "int", "index_k_dtype": "str",
    "index_k_accounting": "str", "chunked_prefill_size": "chunk", "max_prefill_tokens": "int", "max_total_tokens": "int",
    "dsv4_attn_backend": "str", "enable_deepseek_v4_fp4_indexer": "bool",
    "disaggregation_mode": "optstr", "disaggregation_decode_extra_slots": "int",
    "disable_radix_cache": "bool", "disable_overlap_schedule": "bool", "swa_prefix_tails": "int",
    "moe_a2a_backend": "optstr", "cuda_graph_max_bs": "int", "disable_cuda_graph": "bool",
    "_swa_full_tokens_ratio_explicitly_set": "bool",
    "free_gib_before_load": "gib", "weights_gib_per_rank": "gib", "other_gib": "gib",
    "gpu_memory_mib": "mib",
    "SGLANG_DSV4_COMPRESS_STATE_DTYPE": "str", "SGLANG_OPT_USE_ONLINE_COMPRESS": "bool",
    "SGLANG_DSV4_KV_LAYOUT": "str", "SGLANG_DSV4_COMPRESSED_KV_LAYOUT": "str",
    "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP": "bool", "SGLANG_PP_LAYER_PARTITION": "str",
    "SGLANG_SWA_EVICTION_INTERVAL": "int",
}
# serve-config dashed names that plan reads (others are ignored by the capacity model).
SERVE_KEYS = {k.replace("_", "-"): k for k in SET_KEYS if k.islower() and not k.startswith("_")}
SERVE_KEYS.update({"cuda-graph-max-bs-decode": "cuda_graph_max_bs", "cuda-graph-max-bs": "cuda_graph_max_bs"})
for _k in ("model", "available_bytes", "index_k_dtype", "index_k_accounting", "free_gib_before_load",
           "weights_gib_per_rank", "other_gib", "gpu_memory_mib"):
    SERVE_KEYS.pop(_k.replace("_", "-"), None)
ENV_KEYS = [k for k in SET_KEYS if k.startswith("SGLANG_")]


def parse_set(items: list[str]) -> dict[str, Any]:
    """Parse ``KEY=VALUE`` what-if overrides into typed values. InputError names the bad item."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise InputError(f"--set {item!r}: expected KEY=VALUE")
        key, value = item.split("=", 1)
        key = key.strip()
        if key not in SET_KEYS:
            hint = key.replace("-", "_")
            more = f" (did you mean {hint}?)" if hint in SET_KEYS else ""
            raise InputError(f"--set {key}: unknown key{more}; known: {', '.join(sorted(SET_KEYS))}")
        out[key] = _coerce(f"--set {key}", SET_KEYS[key], value)
    return out


def _coerce(label: str, kind: str, value: Any) -> Any:
    if kind == "int":
        return _int(label, value)
    if kind == "chunk":   # --chunked-prefill-size: -1 (or 0) disables chunked prefill in SGLang
        return _int(label, value, minimum=-1)
    if kind == "float":
        return _float(label, value)
    if kind == "gib":     # memory in GiB: the profile schema's bound (profile.MAX_GIB)
        return _float(label, value, maximum=MAX_GIB)
    if kind == "mib":
        x = _int(label, value, minimum=1)
        if x > MAX_GIB * 1024:
            raise InputError(f"{label}: must be <= {MAX_GIB * 1024}, got {x}")
        return x
    if kind == "bool":
        return _bool(label, value)
    if kind == "optstr":
        return _opt_str(value)
    return str(value)


@dataclass
class GroupInputs:
    """Everything resolved for one server group before the per-rank arithmetic."""

    tp: int
    dp: int
    pp: int
    dp_attention: bool
    mem_fraction_static: float
    mfs_source: str
    context_length: int
    gpu_memory_mib: int
    free_gib_before_load: float
    weights_gib_per_rank: float
    other_gib: float
    estimated: list[str]
    available_bytes_override: Optional[int]
    pp_partition: Optional[tuple[int, ...]]
    pool: cap.PoolInputs
    activation_reserve_gib: float = 0.0   # SGLang's own activation/graph estimate (memory_hook.py)


def resolve_group(profile: Profile, group: Group, model: cap.ModelGeometry, facts,
                  overrides: dict[str, Any], tree_idx: Optional[dict] = None,
                  serve: Optional[ServeConfig] = None) -> GroupInputs:
    """Resolve a server group's inputs: serve config < profile < ``--set`` overrides.

    Raises InputError (exit 2) for invalid values or a serve config that disagrees with the
    profile's topology."""
    args: dict[str, Any] = {}
    where = {}
    if serve is not None:
        for key, value in serve.args().items():
            if key in SERVE_KEYS:
                name = SERVE_KEYS[key]
                loc = serve.where(next((k for k in serve.data if canonical(k) == key), key))
                args[name] = _coerce(f"{loc}: {key}", SET_KEYS[name], value)
                where[name] = loc
    topo = {"tp_size": group.tp, "dp_size": group.dp, "pp_size": group.pp,
            "enable_dp_attention": group.dp_attention}
    for k, v in topo.items():
        if k in args and args[k] != v and k not in overrides:
            raise InputError(f"{where[k]}: {k.replace('_', '-')}: {args[k]} disagrees with the profile's "
                             f"group {group.name!r} ({k.split('_')[0] if k != 'enable_dp_attention' else 'dp_attention'}: {v})")
        args[k] = v
    env: dict[str, Any] = {}
    for k, v in group.env.items():
        if k in SET_KEYS:
            env[k] = _coerce(f"{profile.path}: groups.{group.name}.env.{k}", SET_KEYS[k], v)
    args.update(env)
    args.update(overrides)
    host = profile.hosts[group.host]

    tp, dp, pp = args["tp_size"], args["dp_size"], args["pp_size"]
    for k in ("tp_size", "dp_size", "pp_size"):
        if not 1 <= args[k] <= MAX_PARALLEL:
            raise InputError(f"{k} must be within 1..{MAX_PARALLEL}, got {args[k]}")
    dpa = args["enable_dp_attention"]
    gidx = profile.groups.index(group)

    def src(key: str, profile_path: tuple) -> str:
        if key in overrides:
            return f"--set {key}"
        return f"{profile.positions.where(('groups', gidx) + profile_path)}: groups[{gidx}].{'.'.join(profile_path)}"

    n_ranks = tp * pp * (1 if dpa else dp)
    if n_ranks > MAX_RANKS:
        what = "tp_size*pp_size" if dpa else "tp_size*pp_size*dp_size"
        raise InputError(f"group {group.name}: {what} = {n_ranks} ranks exceeds {MAX_RANKS} "
                         "(a plan lists every rank)")
    if pp > model.num_hidden_layers:
        raise InputError(f"{src('pp_size', ('pp',))}: pp_size {pp} exceeds num_hidden_layers "
                         f"{model.num_hidden_layers}")
    if dpa and tp % dp:
        raise InputError(f"group {group.name}: dp_size {dp} must divide tp_size {tp} with enable_dp_attention")
    gpu_mib = args.get("gpu_memory_mib", host.gpu_memory_mib)
    disagg = args.get("disaggregation_mode")
    if disagg not in (None, "null", "prefill", "decode"):
        raise InputError(f"group {group.name}: disaggregation_mode {disagg!r} not in prefill|decode")
    disagg = None if disagg == "null" else disagg
    if disagg is None and group.role in ("prefill", "decode"):
        disagg = group.role
    spec_algo = args.get("speculative_algorithm")
    spec_algo = spec_algo.upper() if spec_algo else None
    draft = args.get("speculative_num_draft_tokens")
    estimated: list[str] = []
    if spec_algo and not draft:
        draft = 4
        estimated.append("speculative_num_draft_tokens=4 (SGLang's EAGLE default for DSV4 is resolved at start-up)")
    user_mrr = args.get("max_running_requests")
    chunked_user = args.get("chunked_prefill_size")
    max_prefill = args.get("max_prefill_tokens", DEFAULT_MAX_PREFILL_TOKENS)
    # chunked prefill disabled (<= 0): SGLang sizes activations by max_prefill_tokens instead
    # (sglang 0.5.23 srt/arg_groups/memory_hook.py:304-307).
    act_chunk = max_prefill if chunked_user is not None and chunked_user <= 0 else chunked_user
    mfs_source = "serve config" if "mem_fraction_static" in where else "default (memory_hook.py)"
    if "mem_fraction_static" in overrides:
        mfs_source = "--set"
    mem_args = cap.MemoryArgs(
        gpu_memory_mib=gpu_mib, tp_size=tp, pp_size=pp, dp_size=dp, enable_dp_attention=dpa,
        disaggregation_mode=disagg, max_running_requests=user_mrr,
        speculative_num_draft_tokens=draft if spec_algo else None,
        chunked_prefill_size=act_chunk, cuda_graph_max_bs=args.get("cuda_graph_max_bs"),
        disable_cuda_graph=args.get("disable_cuda_graph", False),
        moe_a2a_backend=args.get("moe_a2a_backend"))
    mfs = args.get("mem_fraction_static")
    if mfs is None:
        mfs = cap.default_mem_fraction_static(mem_args)
    if not 0 < mfs < 1:
        raise InputError(f"group {group.name}: mem_fraction_static must be in (0, 1), got {mfs}")
    chunked = chunked_user if chunked_user is not None else cap.default_chunked_prefill_size(gpu_mib)
    attn_dp = dp if dpa else 1
    if dpa and chunked > 0:
        chunked = chunked // dp
    # disaggregation_decode_extra_slots auto default (pd_disaggregation_hook.py)
    extra = args.get("disaggregation_decode_extra_slots")
    if extra is None:
        extra = 0
        if disagg == "decode" and user_mrr is not None and user_mrr // attn_dp <= 32:
            extra = 2 * (user_mrr // attn_dp)
    backend = args.get("dsv4_attn_backend", "auto")
    if backend == "auto":
        backend = "flashmla"
    ratio_explicit = args.get("_swa_full_tokens_ratio_explicitly_set")
    if ratio_explicit is None:
        ratio_explicit = model.model_type == "deepseek_v4" or "swa_full_tokens_ratio" in args
    tree_idx = tree_idx or {}   # from the series applied to sglang.tree (dsv4ctl.patches.planfacts)
    idx_dtype = args.get("index_k_dtype", tree_idx.get("index_k_dtype", profile.index_k_dtype))
    idx_acc = args.get("index_k_accounting", tree_idx.get("index_k_accounting", profile.index_k_accounting))
    part = args.get("SGLANG_PP_LAYER_PARTITION")
    pp_partition = None
    if part:
        psrc = src("SGLANG_PP_LAYER_PARTITION", ("env", "SGLANG_PP_LAYER_PARTITION"))
        try:
            pp_partition = tuple(int(x) for x in str(part).split(","))
        except ValueError:
            raise InputError(f"{psrc}: SGLANG_PP_LAYER_PARTITION {part!r}: expected comma-separated integers") from None
        if any(x < 1 for x in pp_partition):
            raise InputError(f"{psrc}: SGLANG_PP_LAYER_PARTITION {part}: every stage needs >= 1 layer")
        try:
            for r in range(pp):
                cap.pp_layer_range(model.num_hidden_layers, pp, r, pp_partition)
        except CapacityError as e:
            raise InputError(f"{psrc}: {e}") from None
    sm100 = gpu_mib is None or gpu_mib >= 160 * 1024 or "B" in (host.gpu_model or "")
    pool = cap.PoolInputs(
        page_size=args.get("page_size", 256),
        max_running_requests=user_mrr if user_mrr is not None else 256,
        swa_full_tokens_ratio=args.get("swa_full_tokens_ratio", 0.1),
        swa_ratio_explicit=ratio_explicit,
        chunked_prefill_size=chunked,
        attn_dp_size=attn_dp,
        speculative_algorithm=spec_algo,
        speculative_num_draft_tokens=draft if spec_algo else None,
        attention_backend=backend,
        kv_layout=str(args.get("SGLANG_DSV4_KV_LAYOUT", "v4")).lower(),
        compressed_kv_layout=str(args.get("SGLANG_DSV4_COMPRESSED_KV_LAYOUT", "auto")).lower(),
        compress_state_dtype=args.get("SGLANG_DSV4_COMPRESS_STATE_DTYPE", "float32"),
        online_compress=args.get("SGLANG_OPT_USE_ONLINE_COMPRESS", False),
        online_c128_mtp=args.get("SGLANG_EXPERIMENTAL_ONLINE_C128_MTP", False),
        swa_eviction_interval=args.get("SGLANG_SWA_EVICTION_INTERVAL", 128),
        swa_prefix_tails=args.get("swa_prefix_tails"),
        disable_radix_cache=args.get("disable_radix_cache", False),
        disable_overlap_schedule=args.get("disable_overlap_schedule", False),
        disaggregation_mode=disagg,
        disaggregation_decode_extra_slots=extra,
        max_total_tokens=args.get("max_total_tokens"),
        index_k_dtype=idx_dtype,
        index_k_accounting=idx_acc,
        fp4_indexer=args.get("enable_deepseek_v4_fp4_indexer", False),
        sm100=sm100,
    )
    try:
        pool.validate()
    except CapacityError as e:
        raise InputError(f"group {group.name}: {e}") from None

    mem = group.memory
    p_gib = args.get("free_gib_before_load", mem.free_gib_before_load)
    if p_gib is None:
        if gpu_mib is None:
            raise InputError(f"group {group.name}: host {host.name} has no gpus.memory_mib")
        p_gib = round(gpu_mib / 1024 - PRELOAD_USED_GIB, 3)
        estimated.append(f"free_gib_before_load={p_gib} (GPU memory - {PRELOAD_USED_GIB} GiB)")
    if p_gib <= 0:
        if "free_gib_before_load" in overrides:
            src = "--set free_gib_before_load"
        elif mem.free_gib_before_load is not None:
            gidx = profile.groups.index(group)
            src = (f"{profile.positions.where(('groups', gidx, 'memory', 'free_gib_before_load'))}: "
                   f"groups[{gidx}].memory.free_gib_before_load")
        else:
            src = f"group {group.name}: free_gib_before_load (estimated from gpu_memory_mib {gpu_mib})"
        raise InputError(f"{src}: must be > 0 GiB, got {p_gib}")
    w_gib = args.get("weights_gib_per_rank", mem.weights_gib_per_rank)
    topology_changed = sorted(k for k in WEIGHT_TOPOLOGY_KEYS if k in overrides)
    if "weights_gib_per_rank" not in overrides and mem.weights_gib_per_rank is not None and topology_changed:
        # the measured figure belongs to the profile's model and topology, not to the what-if
        w_gib = None
        estimated.append(f"measured weights_gib_per_rank ({mem.weights_gib_per_rank}) ignored: "
                         f"--set {', '.join(topology_changed)} changes the weights per rank")
    if w_gib is None:
        if facts.checkpoint_gib is None:
            raise InputError(f"group {group.name}: memory.weights_gib_per_rank is required for a custom model")
        w_gib = round(facts.checkpoint_gib / (tp * pp) + REPLICATED_WEIGHTS_GIB, 3)
        estimated.append(f"weights_gib_per_rank={w_gib} (checkpoint/(tp*pp) + {REPLICATED_WEIGHTS_GIB} GiB)")
    other = args.get("other_gib", mem.other_gib)
    ctx = args.get("context_length", model.context_len)
    if ctx <= 0:
        raise InputError(f"context_length must be > 0, got {ctx}")
    return GroupInputs(activation_reserve_gib=round(cap.reserved_mb(mem_args) / 1024, 3),
                       tp=tp, dp=dp, pp=pp, dp_attention=dpa, mem_fraction_static=mfs,
                       mfs_source=mfs_source, context_length=ctx, gpu_memory_mib=gpu_mib,
                       free_gib_before_load=p_gib, weights_gib_per_rank=w_gib, other_gib=other,
                       estimated=estimated, available_bytes_override=args.get("available_bytes"),
                       pp_partition=pp_partition, pool=pool)


def _gib(x: float) -> float:
    return round(x / GIB, 3)


@dataclass
class StagePlan:
    """One PP stage of a group (identical for all its TP/DP ranks)."""

    pp_rank: int
    conf: cap.Configurator
    sizes: cap.PoolSizes
    exact_conf: cap.Configurator
    exact_sizes: cap.PoolSizes
    alloc_budget: cap.Allocation
    alloc_real: cap.Allocation
    req_to_token_bytes: int
    headroom_bytes: int           # after the real allocation
    headroom_budgeted_bytes: int  # had the buffer held what was budgeted


def _available(gi: GroupInputs, mfs: float) -> int:
    if gi.available_bytes_override is not None:
        return gi.available_bytes_override
    free_before_kv = gi.free_gib_before_load - gi.weights_gib_per_rank - gi.other_gib
    return cap.available_bytes_from_memory(gi.free_gib_before_load, free_before_kv, mfs)


def plan_stages(model: cap.ModelGeometry, gi: GroupInputs, mfs: Optional[float] = None,
                pool: Optional[cap.PoolInputs] = None) -> list[StagePlan]:
    """Per-PP-stage pool decisions with the PP MIN of full tokens (config_from_budget).

    Raises CapacityError when SGLang would refuse to start (no memory, SWA too small)."""
    mfs = gi.mem_fraction_static if mfs is None else mfs
    pool = pool or gi.pool
    avail = _available(gi, mfs)
    if avail <= 0:
        free_before_kv = gi.free_gib_before_load - gi.weights_gib_per_rank - gi.other_gib
        need = cap.min_viable_mem_fraction_static(gi.free_gib_before_load, free_before_kv)
        if need >= 1:
            raise CapacityError(
                f"the weights ({gi.weights_gib_per_rank} GiB per rank) and other memory do not fit in "
                f"{gi.free_gib_before_load} GiB free per GPU: use more GPUs per group (tp/pp) or larger GPUs")
        raise CapacityError(
            f"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static={mfs}. "
            f"Raise --mem-fraction-static above {need}")
    exact_pool = cap.replace(pool, index_k_accounting="exact")

    def stage_confs(p: cap.PoolInputs) -> list[cap.Configurator]:
        return [cap.Configurator(model, p, cap.pp_layer_range(model.num_hidden_layers, gi.pp, r, gi.pp_partition))
                for r in range(gi.pp)]

    def solve(confs: list[cap.Configurator]) -> list[cap.PoolSizes]:
        fulls = [c.solve_full_tokens(avail)[0] for c in confs]
        cap_tokens = min(fulls) if gi.pp > 1 else None
        return [c.calculate_pool_sizes(avail, max_tokens_cap=cap_tokens) for c in confs]

    confs, exact_confs = stage_confs(pool), stage_confs(exact_pool)
    sizes, exact_sizes = solve(confs), solve(exact_confs)
    out = []
    for r in range(gi.pp):
        c, s = confs[r], sizes[r]
        budget = cap.allocated_bytes(c, s, c.idx_budget)
        real = cap.allocated_bytes(c, s, c.idx_real)
        r2t = s.num_req_slots * gi.context_length * 4
        resident = int((gi.free_gib_before_load - gi.weights_gib_per_rank - gi.other_gib) * GIB)
        out.append(StagePlan(pp_rank=r, conf=c, sizes=s, exact_conf=exact_confs[r],
                             exact_sizes=exact_sizes[r], alloc_budget=budget, alloc_real=real,
                             req_to_token_bytes=r2t,
                             headroom_bytes=resident - real.total - r2t,
                             headroom_budgeted_bytes=resident - budget.total - r2t))
    return out


@dataclass
class GroupPlan:
    """The plan of one server group, JSON-ready through :meth:`to_dict`."""

    group: Group
    inputs: GroupInputs
    stages: list[StagePlan]
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)
    index_k_source: str = "profile"

    def ranks(self) -> list[dict]:
        """Every GPU rank: rank, gpu, tp/pp/dp rank and that rank's pool numbers."""
        gi, g = self.inputs, self.group
        replicas = 1 if gi.dp_attention else gi.dp
        out = []
        rank = 0
        for rep in range(replicas):
            for st in self.stages:
                for tp_rank in range(gi.tp):
                    dp_rank = tp_rank // (gi.tp // gi.dp) if gi.dp_attention else rep
                    out.append(dict(rank=rank, gpu=g.gpus[rank] if rank < len(g.gpus) else None,
                                    tp_rank=tp_rank, pp_rank=st.pp_rank, dp_rank=dp_rank,
                                    **_stage_numbers(self, st)))
                    rank += 1
        return out

    def to_dict(self) -> dict:
        g, gi = self.group, self.inputs
        return dict(
            name=g.name, role=g.role, host=g.host, tp=gi.tp, dp=gi.dp, pp=gi.pp, ep=g.ep,
            dp_attention=gi.dp_attention, mem_fraction_static=gi.mem_fraction_static,
            mem_fraction_static_source=gi.mfs_source, context_length=gi.context_length,
            activation_reserve_gib=gi.activation_reserve_gib,
            gpu_memory_mib=gi.gpu_memory_mib,
            memory_inputs=dict(free_gib_before_load=gi.free_gib_before_load,
                               weights_gib_per_rank=gi.weights_gib_per_rank, other_gib=gi.other_gib,
                               available_bytes_override=gi.available_bytes_override,
                               estimated=gi.estimated),
            server_args={k: v for k, v in asdict(gi.pool).items()},
            ranks=self.ranks(), warnings=self.warnings, errors=self.errors, fixes=self.fixes,
            index_k_source=self.index_k_source)


def _stage_numbers(gp: GroupPlan, st: StagePlan) -> dict:
    s, e = st.sizes, st.exact_sizes
    conc = cap.max_concurrent_requests(st.conf, s, gp.inputs.context_length)
    return dict(
        layers=list(s.layers),
        available_bytes=s.available_bytes,
        bytes_per_full_token=s.bytes_per_full_token,
        bytes_per_swa_token=s.bytes_per_swa_token,
        fixed_bytes=s.fixed_bytes,
        full_max_total_num_tokens=s.full_max_total_num_tokens,
        swa_max_total_num_tokens=s.swa_max_total_num_tokens,
        c4_max_total_num_tokens=s.c4_max_total_num_tokens,
        c128_max_total_num_tokens=s.c128_max_total_num_tokens,
        c4_state_pool_size=s.c4_state_pool_size,
        c128_state_pool_size=s.c128_state_pool_size,
        max_running_requests=s.max_running_requests,
        swa_mode=s.swa_mode,
        pools_gib={k: _gib(v) for k, v in asdict(st.alloc_real).items()},
        allocated_gib=_gib(st.alloc_real.total),
        index_k_gib=_gib(st.alloc_real.c4_index_k),
        index_k=dict(
            dtype=cap.index_k_dtype_of(st.conf.inputs),
            accounting=st.conf.inputs.index_k_accounting,
            budget_bytes_per_slot=s.index_k_budget_bytes,
            real_bytes_per_slot=s.index_k_real_bytes,
            budget_gib=_gib(st.alloc_budget.c4_index_k),
            real_gib=_gib(st.alloc_real.c4_index_k),
            overcommit_gib=_gib(st.alloc_real.c4_index_k - st.alloc_budget.c4_index_k),
            exact=dict(bytes_per_full_token=e.bytes_per_full_token,
                       full_max_total_num_tokens=e.full_max_total_num_tokens,
                       swa_max_total_num_tokens=e.swa_max_total_num_tokens,
                       c4_max_total_num_tokens=e.c4_max_total_num_tokens,
                       c128_max_total_num_tokens=e.c128_max_total_num_tokens,
                       c4_state_pool_size=e.c4_state_pool_size,
                       c128_state_pool_size=e.c128_state_pool_size),
        ),
        req_to_token_gib=_gib(st.req_to_token_bytes),
        headroom_gib=_gib(st.headroom_bytes),
        max_concurrent_requests=conc,
    )


def _suggest_mfs(model, gi: GroupInputs, target_headroom: int) -> Optional[float]:
    """Largest mfs (3 decimals, below the current) whose real allocation leaves at least
    ``target_headroom`` bytes; None if none does."""
    m = round(gi.mem_fraction_static - 0.001, 3)
    while m > 0.3:
        try:
            stages = plan_stages(model, gi, mfs=m)
        except CapacityError:
            return None
        if min(st.headroom_bytes for st in stages) >= target_headroom:
            return m
        m = round(m - 0.001, 3)
    return None


def plan_group(profile: Profile, group: Group, model, facts, overrides: dict, tree=None,
               serve: Optional[ServeConfig] = None) -> GroupPlan:
    """Plan one server group (``serve``: its parsed serve config); capacity errors become plan
    errors (verdict), not exceptions. ``tree``: :class:`dsv4ctl.patches.planfacts.TreeFacts`, or None."""
    tree_idx, tree_notes = tree.for_env(group.env) if tree else ({}, [])
    gi = resolve_group(profile, group, model, facts, overrides, tree_idx, serve)
    source = "--set" if {"index_k_dtype", "index_k_accounting"} & set(overrides) else (
        tree.source(tree_idx) if tree_idx else "profile")
    try:
        stages = plan_stages(model, gi)
    except CapacityError as e:
        gp = GroupPlan(group=group, inputs=gi, stages=[], index_k_source=source)
        gp.errors.append(str(e))
        return gp
    gp = GroupPlan(group=group, inputs=gi, stages=stages, index_k_source=source)
    gp.warnings.extend(tree_notes)
    for note in gi.estimated:
        gp.warnings.append(f"estimated input: {note}; measure it for an exact plan")
    st = min(stages, key=lambda s: s.headroom_bytes)
    over = st.alloc_real.c4_index_k - st.alloc_budget.c4_index_k
    dtype = cap.index_k_dtype_of(st.conf.inputs)
    if st.headroom_budgeted_bytes < 0 and gi.available_bytes_override is None:
        # nothing to do with index-K: the budget itself leaves no room (req_to_token, weights, mfs)
        gp.errors.append(f"the pools as SGLang budgets them, the weights and req_to_token "
                         f"({_gib(st.req_to_token_bytes)} GiB) exceed the GPU by {_gib(-st.headroom_budgeted_bytes)} GiB")
        m = _suggest_mfs(model, gi, 0) if gi.available_bytes_override is None else None
        if m is not None:
            gp.fixes.append(f"set mem-fraction-static: {m} (from {gi.mem_fraction_static}) in the serve config")
        if st.req_to_token_bytes > GIB:
            gp.fixes.append("or lower context-length / max-running-requests (req_to_token is "
                            f"{_gib(st.req_to_token_bytes)} GiB)")
    elif st.headroom_budgeted_bytes < 0:
        # --set available_bytes is taken as given (SGLang's own number, e.g. from a log); but with
        # this group's weights and req_to_token it does not fit the GPU: the inputs disagree
        gp.warnings.append(f"the given available_bytes ({gi.available_bytes_override:,} B), the weights and "
                           f"req_to_token exceed the GPU by {_gib(-st.headroom_budgeted_bytes)} GiB: check the "
                           f"available_bytes value against weights_gib_per_rank and the GPU memory")
    if over > 0 and not (st.headroom_budgeted_bytes < 0 and gi.available_bytes_override is None):
        msg = (f"index-K is {dtype} ({st.sizes.index_k_real_bytes} B/slot) but SGLang budgets "
               f"{st.sizes.index_k_budget_bytes} B/slot: {_gib(over)} GiB per rank over budget, "
               f"taken from the {_gib(st.headroom_budgeted_bytes)} GiB headroom")
        if over > st.headroom_budgeted_bytes:
            gp.errors.append(msg + " — exceeds it: the pools do not fit")
            e = st.exact_sizes
            gp.fixes.append(f"apply the index-K sizing patch (index_k_accounting: exact): full tokens "
                            f"{st.sizes.full_max_total_num_tokens:,} -> {e.full_max_total_num_tokens:,}")
            m = _suggest_mfs(model, gi, st.headroom_budgeted_bytes) if gi.available_bytes_override is None else None
            if m is not None:
                gp.fixes.append(f"set mem-fraction-static: {m} (from {gi.mem_fraction_static}) in the serve config")
            gp.fixes.append("or store index-K in fp8 (index_k_dtype: fp8)")
        else:
            gp.warnings.append(f"{msg} SGLang budgets ({_gib(st.headroom_bytes)} GiB left after the real "
                               f"allocation: the table's headroom row)")
    elif over < 0 and not (st.headroom_budgeted_bytes < 0 and gi.available_bytes_override is None):
        gp.warnings.append(f"index-K is {dtype} ({st.sizes.index_k_real_bytes} B/slot) but SGLang budgets "
                           f"{st.sizes.index_k_budget_bytes} B/slot: {_gib(-over)} GiB per rank budgeted and unused")
    reserve = gp.inputs.activation_reserve_gib
    if 0 <= st.headroom_bytes < reserve * GIB / 2:
        gp.warnings.append(f"headroom {_gib(st.headroom_bytes)} GiB after allocation is under half of SGLang's "
                           f"own activation/CUDA-graph estimate ({reserve} GiB, memory_hook.py): OOM likely under load")
    return gp


@dataclass
class PlanReport:
    """The whole plan. ``ok`` is False when any group has an error (exit 1)."""

    profile: Profile
    model: cap.ModelGeometry
    groups: list[GroupPlan]

    @property
    def ok(self) -> bool:
        return not any(g.errors for g in self.groups)

    def to_dict(self) -> dict:
        """The ``dsv4ctl.plan/1`` JSON document (see README, "plan JSON")."""
        return dict(schema=SCHEMA, sglang_version=SGLANG_VERSION, profile=self.profile.name,
                    profile_path=str(self.profile.path), model=self.model.name, ok=self.ok,
                    groups=[g.to_dict() for g in self.groups])


def build_plan(deployment: "Deployment | Profile", overrides: Optional[dict] = None,
               groups: Optional[list[str]] = None) -> PlanReport:
    """Plan every server group of the deployment (a Profile is resolved first), or the named ``groups``.

    ``overrides`` come from :func:`parse_set`. Raises InputError for bad input (exit 2)."""
    dep = as_deployment(deployment)
    profile = dep.profile
    overrides = dict(overrides or {})
    if "model" in overrides:
        model_ref, where = overrides["model"], "--set model"
    else:
        model_ref, where = profile.model, f"{profile.positions.where(('model',))}: model"
    try:
        model, facts = load_model(model_ref, profile.base_dir)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    if "model" in overrides:
        base, _ = load_model(profile.model, profile.base_dir)
        if cap.replace(base, name="") == cap.replace(model, name=""):
            overrides.pop("model")      # the same model by another name: measured weights still apply
    selected = profile.servers()
    if groups:
        selected = [profile.group(n) for n in dict.fromkeys(groups)]   # -g a -g a plans a once
        for g in selected:
            if not g.is_server:
                raise InputError(f"group {g.name!r} is the router: it has no KV pools")
    tree = None
    if dep.sglang.tree is not None and dep.sglang.series is not None:  # imported only when needed: start-up
        from ..patches.planfacts import tree_facts
        tree = tree_facts(dep.sglang)
    return PlanReport(profile=profile, model=model,
                      groups=[plan_group(profile, g, model, facts, overrides, tree, dep.groups[g.name].serve)
                              for g in selected])
