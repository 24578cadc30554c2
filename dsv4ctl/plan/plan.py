"""``dsv4ctl plan``: per-GPU-rank KV pool budgets of a profile, as SGLang 0.5.23 would size them.

Inputs per server group: the profile (topology, GPU memory, measured memory), the group's serve
config (server arguments), its env switches, the tree's index-K dtype/accounting, and what-if
overrides (``--set KEY=VALUE``). The arithmetic is :mod:`dsv4ctl.capacity`; this module
resolves inputs, walks ranks and builds a JSON-ready report (schema ``dsv4ctl.plan/2``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from . import capacity as cap
from .capacity import GIB, CapacityError
from ..errors import InputError
from .models import CHECKPOINT_FORMATS, REPLICATED_WEIGHTS_GIB, load_model
from . import verdict as vd
from . import weights as wts
from .sglang_version import VersionChoice, resolve_version
from .versions import DEFAULT_VERSION, VersionRules, rules_for
from ..profile.model import MAX_GIB, Group, Profile
from ..profile.deployment import Deployment, as_deployment
from ..profile.serveconfig import ServeConfig, canonical

SCHEMA = "dsv4ctl.plan/2"   # /2: headroom_gib counts 2 MiB rounding, the allocator and the draft pool
SGLANG_VERSION = DEFAULT_VERSION      # the release planned for when nothing says otherwise
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


# SGLang 0.5.23 srt/server_args.py defaults of the topology a serve config may leave out
# (tp_size, dp_size, pp_size: 1; enable_dp_attention: False, attn_dp_size 1).
SGLANG_TOPOLOGY_DEFAULTS = {"tp_size": 1, "dp_size": 1, "pp_size": 1, "enable_dp_attention": False, "nnodes": 1}


def _attn_dp(args: dict, where: dict) -> None:
    """Map SGLang 0.5.23's ``attn-dp-size N`` (the replacement of ``--dp-size N
    --enable-dp-attention``, ``srt/arg_groups/fields/parallel.py:81-212``) and
    ``cuda-graph-max-bs-decode`` onto the plan's dp_size/enable_dp_attention and cuda_graph_max_bs."""
    if "attn_dp_size" in args:
        n = args.pop("attn_dp_size")
        loc = where.get("attn_dp_size", "--set")
        if n < 1:
            raise InputError(f"{loc}: attn-dp-size must be >= 1, got {n}")
        if args.get("dp_size", n) != n and args.get("enable_dp_attention"):
            raise InputError(f"{loc}: attn-dp-size {n} disagrees with dp-size {args['dp_size']}")
        if n > 1:
            args["dp_size"], args["enable_dp_attention"] = n, True
            where.setdefault("dp_size", loc)
            where.setdefault("enable_dp_attention", loc)
    if "cuda_graph_max_bs_decode" in args:
        args["cuda_graph_max_bs"] = args.pop("cuda_graph_max_bs_decode")
        where.setdefault("cuda_graph_max_bs", where.get("cuda_graph_max_bs_decode", "--set"))
    args.pop("cuda_graph_max_bs_prefill", None)   # the DSV4 prefill graph is disabled (cuda_graph_hook.py)


def _bool(key: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in _BOOL_TRUE:
        return True
    if s in _BOOL_FALSE:
        return False
    raise InputError(f"{key}: expected a boolean, got {v!r}")


_ENV_TRUE, _ENV_FALSE = ("true", "1", "yes", "y"), ("false", "0", "no", "n")


def _env_bool(key: str, v: Any) -> bool:
    """An SGLang boolean environment switch read exactly as SGLang 0.5.23's ``EnvBool.parse``
    (srt/environ.py:143-150: true/1/yes/y, false/0/no/n, any case). Any other text SGLang replaces
    by the switch's default with only a warning (``EnvField.get``): InputError here, so a profile
    never says ``off`` while the server runs with the default."""
    if isinstance(v, bool):
        return v
    s = str(v).lower()
    if s in _ENV_TRUE:
        return True
    if s in _ENV_FALSE:
        return False
    raise InputError(f"{key}: {v!r} is not a value SGLang's EnvBool reads (true/1/yes/y, false/0/no/n): "
                     "SGLang would warn and use the default")


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
    "attn_dp_size": "int", "cuda_graph_max_bs_decode": "int", "cuda_graph_max_bs_prefill": "int",
    "draft_weights_gib_per_rank": "gib", "checkpoint_format": "str", "min_requests": "int",
    "free_gib_before_load": "gib", "weights_gib_per_rank": "gib", "other_gib": "gib",
    "gpu_memory_mib": "mib", "base_gpu_id": "int", "gpu_id_step": "int", "nnodes": "int",
    "SGLANG_DSV4_COMPRESS_STATE_DTYPE": "str", "SGLANG_OPT_USE_ONLINE_COMPRESS": "envbool",
    "SGLANG_DSV4_KV_LAYOUT": "str", "SGLANG_DSV4_COMPRESSED_KV_LAYOUT": "str",
    "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP": "envbool", "SGLANG_PP_LAYER_PARTITION": "str",
    "SGLANG_SWA_EVICTION_INTERVAL": "int", "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK": "envbool",
}
# serve-config dashed names that plan reads (others are ignored by the capacity model).
SERVE_KEYS = {k.replace("_", "-"): k for k in SET_KEYS if k.islower() and not k.startswith("_")}
for _k in ("model", "available_bytes", "index_k_dtype", "index_k_accounting", "free_gib_before_load",
           "weights_gib_per_rank", "other_gib", "gpu_memory_mib", "draft_weights_gib_per_rank",
           "checkpoint_format", "min_requests",
           "cuda_graph_max_bs"):     # not a 0.5.23 option: an ambiguous abbreviation of -decode/-prefill
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
            raise InputError(f"--set {key}: unknown key{more}; known: {', '.join(sorted(k for k in SET_KEYS if not k.startswith('_')))}")
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
    if kind == "envbool":
        return _env_bool(label, value)
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
    rank_resident_gib: Optional[list[float]] = None   # per rank F (per-GPU memory), else uniform
    free_gib_per_gpu: Optional[list[float]] = None    # per-GPU P in the group's ``gpus`` order, else uniform
    other_gib_per_gpu: Optional[list[float]] = None   # per-GPU other memory (same order), else uniform
    gpus: tuple[int, ...] = ()                        # the GPU index of every rank (rank order)
    places: tuple[tuple[int, str, int], ...] = ()     # (node rank, host, GPU index) of every rank
    activation_reserve_gib: float = 0.0   # SGLang's reserve outside mfs, 10 GiB floor (memory_hook.py)
    activation_estimate_gib: float = 0.0  # the same estimate without the floor (verdict: fails below)
    draft_weights_gib_per_rank: float = 0.0
    checkpoint_format: str = "fp4"
    min_requests: int = 1
    min_requests_required: bool = True   # stated (profile plan.min_requests, --set): a shortfall fails, else tight
    logits_rows: int = 0                  # query rows of one prefill chunk (indexer logits transient)
    balance_check: bool = True            # SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK (environ.py:500): false → SGLang warns
    replica: Optional[int] = None         # with replicas: the one planned (the tightest)
    weights_fixed_gib: Optional[float] = None   # estimated weights that do not shrink with TP (plan.weights)

    def gpu_name(self, rank: int) -> str:
        """``GPU 3``, or ``GPU 3 of host h1 (node 1)`` for a multi-node server; ``GPU #5`` when the
        rank has no GPU of the profile (a what-if)."""
        if rank >= len(self.places):
            return f"GPU #{rank}"
        node, host, gpu = self.places[rank]
        multi = len({p[0] for p in self.places}) > 1
        return f"GPU {gpu} of host {host} (node {node})" if multi else f"GPU {gpu}"


def serve_args(serve: Optional[ServeConfig], version: str = DEFAULT_VERSION) -> tuple[dict[str, Any], dict[str, str]]:
    """({plan key: typed value}, {plan key: ``file:line``}) of the server arguments plan reads from
    a serve config, keys resolved as SGLang ``version``'s argparse does (aliases, unambiguous
    abbreviations; a key the release does not have is not read: SGLang refuses it at start-up and
    ``config lint`` says so) and ``attn-dp-size`` mapped onto dp_size + enable_dp_attention
    (:func:`_attn_dp`). ``({}, {})`` for None. InputError (exit 2) for a bad value, an ambiguous
    abbreviation or a key given twice."""
    args: dict[str, Any] = {}
    where: dict[str, str] = {}
    if serve is not None:
        from .argnames import AmbiguousOption, option_names, resolve_option
        known = option_names(version) if version != DEFAULT_VERSION else None   # 0.5.23 has every key plan reads
        for key, value in serve.args().items():
            if known is not None and key in SERVE_KEYS and key not in known:
                continue
            loc = serve.where(next((k for k in serve.data if canonical(k) == key), key))
            full = key
            if key not in SERVE_KEYS and any(k.startswith(key) for k in SERVE_KEYS):
                # could abbreviate an argument plan reads: resolve it as argparse does (the table is
                # only loaded then, for start-up time)
                try:
                    full = resolve_option(key, option_names(version)) or key
                except AmbiguousOption as e:
                    raise InputError(f"{loc}: {key}: SGLang rejects it: {e}") from None
            if full in SERVE_KEYS:
                name = SERVE_KEYS[full]
                if name in where:
                    raise InputError(f"{loc}: {key}: given twice ({full} at {where[name]})")
                args[name] = _coerce(f"{loc}: {key}", SET_KEYS[name], value)
                where[name] = loc
    _attn_dp(args, where)
    return args, where


def topology(profile: Profile, group: Group, serve: Optional[ServeConfig], args: dict[str, Any],
             where: dict[str, str], overrides: dict[str, Any]) -> dict[str, Any]:
    """{tp_size, dp_size, pp_size, enable_dp_attention, nnodes} a group runs with (pure).

    SGLang reads only the serve config, so with one its values (or SGLang's defaults,
    :data:`SGLANG_TOPOLOGY_DEFAULTS`) are what runs. The profile says where: its nodes (``nnodes``
    = their count) and each node's GPUs must be where SGLang puts the ranks from ``base-gpu-id`` /
    ``gpu-id-step`` (:func:`node_placement`); its ``tp``/``dp``/``pp``/``dp_attention``, when
    given, must agree. A disagreement — including a key the serve config leaves to its default —
    is an InputError naming both places, as is a ``dist-init-addr`` whose host is not node 0's
    address. Without a serve config the profile's values count. ``--set`` of any of these is a
    what-if: not checked against the profile."""
    out = {}
    gi = profile.groups.index(group)
    prof = {"tp_size": group.tp, "dp_size": group.dp, "pp_size": group.pp,
            "enable_dp_attention": group.dp_attention, "nnodes": group.nnodes}
    for k, v in prof.items():
        pkey = {"enable_dp_attention": "dp_attention", "nnodes": "nodes"}.get(k, k.split("_")[0])
        stated = pkey in group.stated or k == "nnodes"      # the profile always says its nodes
        if k in overrides:
            out[k] = overrides[k]
            continue
        if serve is None:
            out[k] = v
            continue
        shown = f"{pkey}: {v}" if k != "nnodes" else f"{v} node(s)"
        if k in args:
            if stated and args[k] != v:
                raise InputError(f"{where[k]}: {k.replace('_', '-')}: {args[k]} disagrees with the profile's "
                                 f"group {group.name!r} ({shown})")
            out[k] = args[k]
            continue
        if stated and v != SGLANG_TOPOLOGY_DEFAULTS[k]:
            # without the key SGLang runs its default, whatever the profile says: planning the
            # profile's value would plan a server that never runs
            fix = (f"attn-dp-size: {group.dp}" if k in ("dp_size", "enable_dp_attention") and group.dp_attention
                   else f"{k.replace('_', '-')}: {v}")
            raise InputError(
                f"{serve.path}: no {k.replace('_', '-')}: SGLang runs {k.replace('_', '-')} "
                f"{SGLANG_TOPOLOGY_DEFAULTS[k]} (its default), but the profile's group {group.name!r} says "
                f"{shown} ({profile.positions.where(('groups', gi, pkey))}): put {fix} in the serve config")
        out[k] = SGLANG_TOPOLOGY_DEFAULTS[k]
    if serve is None and group.nnodes > 1 and not any(k in overrides for k in out):
        try:        # the profile's values are what is planned: SGLang must be able to split them
            node_placement(out["tp_size"], out["pp_size"], 1, group.nnodes)
        except ValueError as e:
            raise InputError(f"{profile.positions.where(('groups', gi, 'nodes'))}: group {group.name!r}: {e}") from None
    if serve is None or any(k in overrides for k in (*out, "base_gpu_id", "gpu_id_step")):
        return out
    tp, pp, nn = out["tp_size"], out["pp_size"], out["nnodes"]
    if nn > 1 and out["dp_size"] > 1 and not out["enable_dp_attention"]:
        # SGLang 0.5.23 arg_groups/validation_hook.py check_server_args
        raise InputError(f"{where.get('dp_size', serve.path)}: dp-size {out['dp_size']} with nnodes {nn}: SGLang "
                         "refuses data-parallel replicas across nodes: use attn-dp-size, or the group's replicas")
    base, step = args.get("base_gpu_id", 0), args.get("gpu_id_step", 1)
    try:
        places = node_placement(tp, pp, 1 if out["enable_dp_attention"] else out["dp_size"], nn, base, step)
    except ValueError as e:
        raise InputError(f"{where.get('nnodes', serve.path)}: {e}") from None
    for n, node in enumerate(group.nodes):
        mine = [g for (nr, g) in places if nr == n]
        if sorted(mine) == sorted(node.gpus):
            continue
        at = where.get("base_gpu_id") or serve.path
        want = sorted(node.gpus)
        path = ("groups", gi, "nodes", n) if group.nnodes > 1 else ("groups", gi, "gpus")
        on = f" node {n} ({node.host})" if group.nnodes > 1 else ""
        fix = ("make the profile's gpus the GPUs SGLang uses" if len(want) != len(mine) or
               [g for (nr, g) in node_placement(tp, pp, 1 if out["enable_dp_attention"] else out["dp_size"], nn,
                                                want[0], step) if nr == n] != want
               else f"set base-gpu-id: {want[0]} in the serve config")
        raise InputError(
            f"{at}: SGLang puts group {group.name!r}{on} on GPUs {_gpu_list(mine) or 'none'} (base-gpu-id {base}, "
            f"gpu-id-step {step}, {len(mine)} rank(s){f' of {len(places)} over {nn} nodes' if nn > 1 else ''}), "
            f"but the profile lists GPUs {_gpu_list(node.gpus)} ({profile.positions.where(path)}): {fix}")
    key = _given_as(serve, "dist-init-addr")
    if key is not None:
        from ..profile.deployment import parse_host_port
        addr, loc = serve.data[key], serve.where(key)
        try:
            host = parse_host_port(str(addr))[0]
        except ValueError as e:
            raise InputError(f"{loc}: {key}: {addr}: SGLang cannot parse it ({e})") from None
    if key is not None and nn > 1:
        node0 = profile.hosts[group.nodes[0].host]
        others = {h.address: h.name for h in profile.hosts.values() if h.name != node0.name}
        others.update({h.name: h.name for h in profile.hosts.values() if h.name != node0.name})
        if group.replicas > 1:
            raise InputError(f"{loc}: {key}: {addr}: the group has {group.replicas} replicas, each with its own "
                             "node 0: remove it (dsv4ctl passes --dist-init-addr per server; the port is "
                             "the group's dist_init_port)")
        if host not in (node0.address, node0.name) and (host in others or _is_ip(host) and _is_ip(node0.address)):
            raise InputError(f"{loc}: {key}: {addr}: node 0 of group {group.name!r} is host {node0.name} "
                             f"({node0.address}): the other nodes would wait for a rendezvous that never comes")
    return out


def _is_ip(x: str) -> bool:
    import ipaddress
    try:
        ipaddress.ip_address(x)
        return True
    except ValueError:
        return False


def _given_as(serve: ServeConfig, full: str) -> Optional[str]:
    """The key of ``serve`` that SGLang's parser reads as the argument ``full`` (its name, an
    alias or an unambiguous abbreviation: :mod:`dsv4ctl.plan.argnames`), None when none does."""
    from .argnames import AmbiguousOption, resolve_option
    for k in serve.data:
        if not isinstance(k, str) or "_" in k:
            continue
        if canonical(k) == full:
            return k
        if full.startswith(k) or any(a.startswith(k) for a in ("nccl-init-addr",) if full == "dist-init-addr"):
            try:
                if resolve_option(k) == full:
                    return k
            except AmbiguousOption:
                continue
    return None


def topo_keys_set(overrides: dict) -> bool:
    """True when ``overrides`` (--set) change a topology key (a what-if topology)."""
    return any(k in overrides for k in ("tp_size", "pp_size", "dp_size", "enable_dp_attention", "nnodes"))


def node_placement(tp: int, pp: int, replicas: int = 1, nnodes: int = 1, base: int = 0,
                   step: int = 1) -> list[tuple[int, int]]:
    """(node rank, GPU index) of every rank of a server, in rank order (dp replica, pp rank, tp
    rank), as SGLang 0.5.23 places them (srt/entrypoints/engine.py ``_calculate_rank_ranges`` and
    the GPU id ``base_gpu_id + (pp_rank % pp_per_node) * tp_per_node + (tp_rank % tp_per_node) *
    gpu_id_step``): node n holds pp ranks ``[pp_per_node * (n // nodes_per_pp), ...)`` and tp ranks
    ``[tp_per_node * (n % nodes_per_pp), ...)``. Each DP replica (DP without attention DP; one node
    only) is ``tp * pp * gpu_id_step`` further on (srt/managers/data_parallel_controller.py);
    ``replicas`` is 1 with attention DP. ValueError when SGLang's ranges leave a node without its
    share (``tp * pp`` not a multiple of ``nnodes``, or a pp/nnodes split SGLang cannot make)."""
    if (tp * pp) % nnodes:
        raise ValueError(f"tp-size {tp} x pp-size {pp} is not a multiple of nnodes {nnodes} "
                         "(SGLang: tp_size must be divisible by number of nodes)")
    pp_per_node = max(pp // nnodes, 1)
    nodes_per_pp = max(nnodes // pp, 1)
    tp_per_node = tp // nodes_per_pp
    if (pp % nnodes if pp >= nnodes else nnodes % pp) or tp % nodes_per_pp:
        raise ValueError(f"nnodes {nnodes} with tp-size {tp} and pp-size {pp}: SGLang's rank ranges "
                         "(engine.py _calculate_rank_ranges) need pp-size a multiple of nnodes, or nnodes a "
                         "multiple of pp-size with tp-size a multiple of nnodes / pp-size")
    one = [((p // pp_per_node) * nodes_per_pp + t // tp_per_node,
            base + (p % pp_per_node) * tp_per_node + (t % tp_per_node) * step)
           for p in range(pp) for t in range(tp)]
    return [(n, g + d * tp * pp * step) for d in range(replicas) for (n, g) in one]


def placement(tp: int, pp: int, replicas: int, base: int = 0, step: int = 1) -> list[int]:
    """GPU index of every rank of a one-node server, in rank order (dp replica, pp rank, tp rank):
    :func:`node_placement` on one node."""
    return [g for _, g in node_placement(tp, pp, replicas, 1, base, step)]


def _gpu_list(gpus) -> str:
    return ",".join(str(g) for g in gpus)


def resolve_group(profile: Profile, group: Group, model: cap.ModelGeometry, facts,
                  overrides: dict[str, Any], tree_idx: Optional[dict] = None,
                  serve: Optional[ServeConfig] = None, rules: Optional[VersionRules] = None) -> GroupInputs:
    """Resolve a server group's inputs: serve config < profile < ``--set`` overrides, with the
    rules of the SGLang release ``rules`` (default: 0.5.23; :mod:`dsv4ctl.plan.versions`).

    Raises InputError (exit 2) for invalid values or a serve config that disagrees with the
    profile's topology."""
    rules = rules or rules_for(DEFAULT_VERSION)
    args, where = serve_args(serve, rules.version)
    overrides = dict(overrides)
    _attn_dp(overrides, {k: "--set" for k in overrides})
    args.update(topology(profile, group, serve, args, where, overrides))
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
    nnodes = args.get("nnodes", group.nnodes)
    if not 1 <= nnodes <= MAX_PARALLEL:
        raise InputError(f"{'--set ' if 'nnodes' in overrides else ''}nnodes: must be within 1..{MAX_PARALLEL}, "
                         f"got {nnodes}")
    if "nnodes" in overrides or topo_keys_set(overrides):
        try:
            node_placement(tp, pp, 1 if dpa else dp, nnodes)
        except ValueError as e:
            raise InputError(f"--set: {e}") from None
        if nnodes > 1 and dp > 1 and not dpa:
            raise InputError(f"--set: dp_size {dp} with nnodes {nnodes}: SGLang refuses data-parallel replicas "
                             "across nodes (use attn_dp_size)")
    gidx = profile.groups.index(group)

    def src(key: str, profile_path: tuple) -> str:
        if key in overrides:
            return f"--set {key}"
        return f"{profile.positions.where(('groups', gidx) + profile_path)}: groups[{gidx}].{'.'.join(profile_path)}"

    n_ranks = tp * pp * (1 if dpa else dp)
    topo_set = [k for k in ("tp_size", "pp_size", "dp_size", "enable_dp_attention", "nnodes") if k in overrides]
    places = group.server_gpus
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
        moe_a2a_backend=args.get("moe_a2a_backend"), graph_bs_capped_by_mrr=rules.graph_bs_capped_by_mrr)
    mfs = args.get("mem_fraction_static")
    if mfs is None:
        mfs = cap.default_mem_fraction_static(mem_args)
    if not mfs < 1 or (mfs <= 0 and "mem_fraction_static" in args):
        # SGLang's own default may be <= 0 (memory_hook.py: its activation estimate above the GPU's
        # memory): SGLang takes it and refuses at KV sizing, so the plan fails as SGLang does
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
    hypothetical = bool(topo_set and places and (n_ranks != len(places) or args.get("nnodes", 1) != group.nnodes))
    if hypothetical:
        # "what if TP8 / two nodes?": planned on GPUs the group does not have, said so (issue 25)
        estimated.append(f"what-if: --set {', '.join(topo_set)} plans {n_ranks} rank(s) on hypothetical GPUs like "
                         f"host {host.name}'s ({host.gpu_model or 'GPU'}, {gpu_mib:,} MiB), not the group's "
                         + (f"{len(places)} GPU(s) {_gpu_list(g for _, _, g in places)}" if group.nnodes == 1
                            else f"{len(places)} GPU(s) on {group.nnodes} nodes"))
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
        **rules.pool_flags(),
    )
    try:
        pool.validate()
    except CapacityError as e:
        raise InputError(f"group {group.name}: {e}") from None

    mem = group.memory
    per_gpu = None
    replica = None
    if "free_gib_before_load" not in args and "other_gib" not in args and not topo_set:
        lists = [v for v in (mem.free_gib_before_load, mem.other_gib) if isinstance(v, list)]
        n = len(places)
        per_gpu = mem.per_gpu(len(lists[0]) if lists else n)
        if per_gpu is not None and len(per_gpu[0]) > n:
            # one value per GPU of every replica (replica-major): plan the tightest replica
            def least(r: int) -> tuple[bool, float]:
                # a replica SGLang refuses to start (unbalanced free memory) first, then the least memory
                frees = [f for f in per_gpu[0][r * n:(r + 1) * n] if f is not None]
                return (not (args["tp_size"] > 1 and vd.unbalanced(frees)),
                        min((f if f is not None else float("inf")) - o for f, o in
                            zip(per_gpu[0][r * n:(r + 1) * n], per_gpu[1][r * n:(r + 1) * n])))
            replica = min(range(group.replicas), key=least)
            per_gpu = (per_gpu[0][replica * n:(replica + 1) * n], per_gpu[1][replica * n:(replica + 1) * n])
            places = [(k, node.host, g) for k, node in enumerate(group.servers[replica]) for g in node.gpus]
    p_gib = args.get("free_gib_before_load", mem.free_gib_before_load)
    given = [v for v in (per_gpu[0] if per_gpu is not None else p_gib if isinstance(p_gib, list) else [p_gib])
             if isinstance(v, (int, float))]
    if per_gpu is not None:
        p_gib = min(per_gpu[0]) if None not in per_gpu[0] else None
    elif isinstance(p_gib, list):
        p_gib = min(p_gib)
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
    if gpu_mib and given and max(given) > gpu_mib / 1024:
        raise InputError(f"group {group.name}: free_gib_before_load {max(given)} GiB is more than the GPU's memory "
                         f"({gpu_mib:,} MiB = {gpu_mib / 1024:.3f} GiB): measure it (dsv4ctl facts) or fix "
                         "gpus.memory_mib")
    w_gib = args.get("weights_gib_per_rank", mem.weights_gib_per_rank)
    topology_changed = sorted(k for k in WEIGHT_TOPOLOGY_KEYS if k in overrides)
    if "weights_gib_per_rank" not in overrides and mem.weights_gib_per_rank is not None and topology_changed:
        # the measured figure belongs to the profile's model and topology, not to the what-if
        w_gib = None
        estimated.append(f"measured weights_gib_per_rank ({mem.weights_gib_per_rank}) ignored: "
                         f"--set {', '.join(topology_changed)} changes the weights per rank")
    fmt = str(args.get("checkpoint_format", "fp4")).lower()
    if fmt not in CHECKPOINT_FORMATS:
        raise InputError(f"--set checkpoint_format: {fmt!r} not in {'|'.join(CHECKPOINT_FORMATS)}")
    # the EAGLE/MTP draft worker loads its nextn layer after the target (F counts both, reference §3.2)
    dw_gib = args.get("draft_weights_gib_per_rank", getattr(mem, "draft_weights_gib_per_rank", None))
    w_fixed = None
    if w_gib is None or (spec_algo and dw_gib is None):
        # checkpoint headers or the shipped table, sharded as SGLang does (dsv4ctl.plan.weights)
        est = wts.estimate(facts, getattr(facts, "config_path", None), fmt,
                           wts.sharding_from_args(args, tp, dp, pp, dpa, pp_partition), model.num_hidden_layers)
        if est is None:
            raise InputError(f"group {group.name}: memory.{'weights' if w_gib is None else 'draft_weights'}"
                             "_gib_per_rank is required for a custom model (a config.json without its checkpoint)")
        if w_gib is None:
            w_gib, w_fixed = est.target_gib, est.fixed_gib
            estimated.append(est.note)
        if spec_algo and dw_gib is None:
            dw_gib = est.draft_gib
            estimated.append(est.draft_note)
    dw_gib = float(dw_gib or 0.0) if spec_algo else 0.0
    other = args.get("other_gib", mem.other_gib)
    rank_resident = None
    if per_gpu is not None:
        frees = [p_gib if f is None else f for f in per_gpu[0]]
        # F per GPU; SGLang MIN-reduces P and F across the world (reference §3.2)
        rank_resident = [round(f - w_gib - dw_gib - o, 3) for f, o in zip(frees, per_gpu[1])]
        other = max(per_gpu[1])
    ctx = args.get("context_length", model.context_len)
    if ctx <= 0:
        raise InputError(f"context_length must be > 0, got {ctx}")
    min_req = args.get("min_requests", (profile.raw.get("plan") or {}).get("min_requests", 1))
    min_req_stated = "min_requests" in args or "min_requests" in (profile.raw.get("plan") or {})
    if min_req < 1:
        raise InputError(f"--set min_requests: must be >= 1, got {min_req}")
    avail = args.get("available_bytes")
    if avail is not None and gpu_mib and avail > gpu_mib * (1 << 20):
        raise InputError(f"available_bytes {avail:,} B is more than the GPU's memory ({gpu_mib:,} MiB = "
                         f"{gpu_mib * (1 << 20):,} B): it cannot be SGLang's number for this group")
    # one prefill chunk of query rows scores the C4 indexer (decode rows are graph-captured: no budget)
    logits_rows = 0 if disagg == "decode" else (chunked if chunked > 0 else max_prefill)
    return GroupInputs(activation_reserve_gib=round(cap.reserved_mb(mem_args) / 1024, 3),
                       activation_estimate_gib=round(cap.reserved_mb(mem_args, floor=False) / 1024, 3),
                       draft_weights_gib_per_rank=dw_gib, checkpoint_format=fmt, rank_resident_gib=rank_resident,
                       free_gib_per_gpu=frees if per_gpu is not None else None,
                       other_gib_per_gpu=list(per_gpu[1]) if per_gpu is not None else None,
                       gpus=() if hypothetical else tuple(g for _, _, g in places),
                       places=() if hypothetical else tuple(places), replica=replica,
                       min_requests=min_req, min_requests_required=min_req_stated, logits_rows=logits_rows,
                       balance_check=bool(args.get("SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK", True)),
                       tp=tp, dp=dp, pp=pp, dp_attention=dpa, mem_fraction_static=mfs,
                       mfs_source=mfs_source, context_length=ctx, gpu_memory_mib=gpu_mib,
                       free_gib_before_load=p_gib, weights_gib_per_rank=w_gib, other_gib=other,
                       estimated=estimated, available_bytes_override=args.get("available_bytes"),
                       pp_partition=pp_partition, pool=pool, weights_fixed_gib=w_fixed)


def _gib(x: float) -> float:
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
    concurrent: int = 0
    verdict: vd.Verdict = None


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
        return [cap.Configurator(model, p, cap.pp_layer_range(model.num_hidden_layers, gi.pp, r, gi.pp_partition))
                for r in range(gi.pp)]

    def solve(confs: list[cap.Configurator]) -> list[cap.PoolSizes]:
        fulls = [c.solve_full_tokens(avail)[0] for c in confs]
        cap_tokens = min(fulls) if gi.pp > 1 else None
        return [c.calculate_pool_sizes(avail, max_tokens_cap=cap_tokens) for c in confs]

    confs, exact_confs = stage_confs(pool), stage_confs(exact_pool)
    sizes, exact_sizes = solve(confs), solve(exact_confs)
    resident = int(resident_gib(gi) * GIB)
    total = gi.gpu_memory_mib * (1 << 20) if gi.gpu_memory_mib else None
    logits = vd.indexer_logits_bytes(gi.logits_rows, gi.context_length, total, mfs)
    out = []
    for r in range(gi.pp):
        c, s = confs[r], sizes[r]
        budget = cap.allocated_bytes(c, s, c.idx_budget)
        real = cap.allocated_bytes(c, s, c.idx_real)
        r2t = s.num_req_slots * gi.context_length * 4
        memory = vd.rank_memory(c, s, c.idx_real, resident, r2t)
        conc = cap.max_concurrent_requests(c, s, gi.context_length)
        verdict = _as_given(gi, vd.decide(memory.headroom, int(gi.activation_estimate_gib * GIB),
                                          int(gi.activation_reserve_gib * GIB), logits, conc, gi.min_requests,
                                          gi.min_requests_required))
        out.append(StagePlan(pp_rank=r, conf=c, sizes=s, exact_conf=exact_confs[r],
                             exact_sizes=exact_sizes[r], alloc_budget=budget, alloc_real=real,
                             req_to_token_bytes=r2t,
                             headroom_bytes=memory.headroom,
                             headroom_budgeted_bytes=resident - budget.total - r2t,
                             memory=memory, logits_bytes=logits, concurrent=conc, verdict=verdict))
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
    verdict: Optional[dict] = None

    def rank_layout(self) -> list[tuple[int, int, int, StagePlan]]:
        """(rank, tp_rank, dp_rank, stage) of every GPU rank, in the group's GPU order."""
        gi = self.inputs
        replicas = 1 if gi.dp_attention else gi.dp
        out = []
        for rep in range(replicas):
            for st in self.stages:
                for tp_rank in range(gi.tp):
                    dp_rank = tp_rank // (gi.tp // gi.dp) if gi.dp_attention else rep
                    out.append((len(out), tp_rank, dp_rank, st))
        return out

    def ranks(self) -> list[dict]:
        """Every GPU rank: rank, gpu, tp/pp/dp rank and that rank's pool numbers and verdict."""
        gi = self.inputs
        out = []
        for rank, tp_rank, dp_rank, st in self.rank_layout():
            own = None
            if gi.rank_resident_gib and rank < len(gi.rank_resident_gib):
                own = int(gi.rank_resident_gib[rank] * GIB)
            node, host, gpu = gi.places[rank] if rank < len(gi.places) else (None, None, None)
            out.append(dict(rank=rank, node=node, host=host, gpu=gpu,
                            tp_rank=tp_rank, pp_rank=st.pp_rank, dp_rank=dp_rank,
                            **_stage_numbers(self, st, own)))
        return out

    def to_dict(self) -> dict:
        g, gi = self.group, self.inputs
        return dict(
            name=g.name, role=g.role, host=g.host, nnodes=g.nnodes, replicas=g.replicas,
            nodes=[dict(host=n.host, gpus=list(n.gpus)) for n in
                   (g.servers[gi.replica] if gi.replica is not None else g.nodes)],
            replica=gi.replica, tp=gi.tp, dp=gi.dp, pp=gi.pp, ep=g.ep,
            dp_attention=gi.dp_attention, mem_fraction_static=gi.mem_fraction_static,
            mem_fraction_static_source=gi.mfs_source, context_length=gi.context_length,
            activation_reserve_gib=gi.activation_reserve_gib,
            gpu_memory_mib=gi.gpu_memory_mib,
            memory_inputs=dict(free_gib_before_load=gi.free_gib_before_load,
                               weights_gib_per_rank=gi.weights_gib_per_rank, other_gib=gi.other_gib,
                               available_bytes_override=gi.available_bytes_override,
                               estimated=gi.estimated,
                               draft_weights_gib_per_rank=gi.draft_weights_gib_per_rank,
                               checkpoint_format=gi.checkpoint_format,
                               rank_resident_gib=gi.rank_resident_gib),
            server_args={k: v for k, v in asdict(gi.pool).items()},
            ranks=self.ranks(), warnings=self.warnings, errors=self.errors, fixes=self.fixes,
            index_k_source=self.index_k_source,
            activation_estimate_gib=gi.activation_estimate_gib,
            verdict=self.verdict)


def _rank_verdict(gi: GroupInputs, st: StagePlan, own_resident: Optional[int]) -> tuple[vd.RankMemory, vd.Verdict]:
    if own_resident is None:
        return st.memory, st.verdict
    mem = cap.replace(st.memory, resident=own_resident)
    return mem, vd.decide(mem.headroom, int(gi.activation_estimate_gib * GIB), int(gi.activation_reserve_gib * GIB),
                          st.logits_bytes, st.concurrent, gi.min_requests, gi.min_requests_required)


def _stage_numbers(gp: GroupPlan, st: StagePlan, own_resident: Optional[int] = None) -> dict:
    s, e = st.sizes, st.exact_sizes
    gi = gp.inputs
    mem, v = _rank_verdict(gi, st, own_resident)
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
        headroom_gib=_gib(mem.headroom),
        max_concurrent_requests=st.concurrent,
        resident_gib=_gib(mem.resident),
        rounding_gib=_gib(mem.pools_rounding),
        allocator_gib=_gib(mem.allocator),
        draft_pool_gib=_gib(mem.draft_pool),
        indexer_logits_gib=_gib(st.logits_bytes),
        verdict=v.level,
        deciding=v.deciding,
        slack=v.slack if v.deciding == "requests" else _gib(v.slack),
    )


TIGHT_TEXT_GIB = vd.TIGHT_MARGIN_BYTES / GIB


def _message(gi: GroupInputs, st: StagePlan, v: vd.Verdict) -> str:
    """One line naming the deciding term first, with the same headroom as the table row."""
    m = st.memory
    h = _gib(m.headroom)
    if v.level == "fits":
        return (f"headroom {h} GiB, {_gib(v.slack)} GiB above the largest need ({v.deciding}: SGLang's "
                f"activation estimate {gi.activation_estimate_gib} GiB, reserve {gi.activation_reserve_gib} GiB, "
                f"indexer logits {_gib(st.logits_bytes)} GiB)")
    if v.deciding == "pools":
        return (f"the pools ({_gib(m.pools)} GiB as allocated + {_gib(m.pools_rounding)} GiB 2 MiB rounding), "
                f"req_to_token ({_gib(m.req_to_token)} GiB), SGLang's allocator ({_gib(m.allocator)} GiB)"
                + (f" and the draft pool ({_gib(m.draft_pool)} GiB)" if m.draft_pool else "")
                + f" exceed the {_gib(m.resident)} GiB left after weights: headroom {h} GiB")
    if v.deciding == "activation":
        return (f"headroom {h} GiB is below 90 % of SGLang's activation/CUDA-graph estimate "
                f"({gi.activation_estimate_gib} GiB, memory_hook.py, a heuristic SGLang uses only to choose "
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
        return (f"headroom {h} GiB is under SGLang's {gi.activation_reserve_gib} GiB activation reserve "
                f"(its estimate without the floor: {gi.activation_estimate_gib} GiB)")
    if v.deciding == "indexer_logits":
        return (f"headroom {h} GiB is under SGLang's activation estimate ({gi.activation_estimate_gib} GiB) plus the "
                f"indexer logits of one prefill chunk ({_gib(st.logits_bytes)} GiB at {gi.logits_rows:,} rows x "
                f"{gi.context_length:,} context): SGLang chunks the logits under free memory, long prefills slow down")
    if v.deciding == "margin":
        need = h - _gib(v.slack)
        return f"headroom {h} GiB is within {TIGHT_TEXT_GIB:g} GiB of what the rank needs ({round(need, 3)} GiB)"
    return f"headroom {h} GiB"


def _evaluate(model, gi: GroupInputs) -> tuple[Optional[list[StagePlan]], vd.Verdict, str]:
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


def _replanned(model, gi: GroupInputs) -> Optional[tuple[vd.Verdict, Optional[float]]]:
    """(verdict, tightest headroom GiB) of a candidate fix, or None when it still fails or lands
    under 90 % of SGLang's activation estimate (``tight: activation``: not a fix worth printing)."""
    stages, v, _ = _evaluate(model, gi)
    if v.level == "fails" or stages is None or v.deciding == "activation":
        return None
    return v, min(_gib(s.headroom_bytes) for s in stages)


def _with_pool(gi: GroupInputs, **changes) -> GroupInputs:
    return cap.replace(gi, pool=cap.replace(gi.pool, **changes))


def _search_mfs(model, gi: GroupInputs, down: bool) -> Optional[tuple[float, tuple]]:
    """The closest 3-decimal mem_fraction_static below (``down``) or above the current one whose
    re-plan does not fail."""
    cur = gi.mem_fraction_static
    step = -0.01 if down else 0.01
    m, last_bad = round(cur + step, 3), cur
    while 0.3 <= m <= 0.99:
        r = _replanned(model, cap.replace(gi, mem_fraction_static=m))
        if r is not None:
            # refine between the last failing value and m, 0.001 at a time
            fine = round(last_bad + step / 10, 3)
            while (fine > m) if down else (fine < m):
                rf = _replanned(model, cap.replace(gi, mem_fraction_static=fine))
                if rf is not None:
                    return fine, rf
                fine = round(fine + step / 10, 3)
            return m, r
        last_bad, m = m, round(m + step, 3)
    return None


def _chunk_fix(model, gi: GroupInputs, resolve) -> list[str]:
    """With SGLang's default ``mem_fraction_static``, a smaller ``chunked-prefill-size`` shrinks
    the activation estimate SGLang reserves (memory_hook.py: 1.5 MB per chunk token) and so raises
    its default: the largest halving (down to 2,048) whose re-plan passes (``resolve(overrides)``
    re-resolves the group, defaults included), as a one-item list, else []."""
    cur = gi.pool.chunked_prefill_size * (gi.dp if gi.dp_attention else 1)
    c = cur // 2
    while c >= 2048:
        g2 = resolve({"chunked_prefill_size": c})
        r = _replanned(model, g2)
        if r is not None:
            return [f"set chunked-prefill-size: {c} (from {cur}) in the serve config: SGLang's default "
                    f"mem-fraction-static becomes {g2.mem_fraction_static} (re-planned: {r[0].level}, headroom {r[1]} GiB)"]
        c //= 2
    return []


def _first_passing_mfs(model, gi: GroupInputs) -> str:
    """What SGLang's "Raise --mem-fraction-static above X" leaves out: X is its minimum for any KV
    memory (``1 - F/P``), and just above it the pools may still hold no request (SGLang's
    configurator refuses that too). The smallest 3-decimal value up to 0.99 at which the plan no
    longer fails (tight allowed), as a clause for the message, so the hint never contradicts it."""
    def passes(m: float):
        stages, v, _ = _evaluate(model, cap.replace(gi, mem_fraction_static=m))
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
            f"headroom {min(_gib(st.headroom_bytes) for st in stages)} GiB)")


def _fixes(model, gi: GroupInputs, v: vd.Verdict, stages: Optional[list[StagePlan]]) -> list[str]:
    """Fixes that work: every candidate is re-planned and kept only when it no longer fails;
    smallest change first (serve-config values by relative change, then tree changes, then GPUs)."""
    out: list[tuple[tuple, str]] = []

    def add(cost: tuple, text: str, r: tuple) -> None:
        out.append((cost, f"{text} (re-planned: {r[0].level}, headroom {r[1]} GiB)"))

    cur = gi.mem_fraction_static
    if v.deciding in ("pools", "activation") and gi.available_bytes_override is None:
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
        for mult in (2, 4, 8):
            tp = gi.tp * mult
            if tp > MAX_PARALLEL:
                break
            fixed = REPLICATED_WEIGHTS_GIB if gi.weights_fixed_gib is None else gi.weights_fixed_gib
            w = round((gi.weights_gib_per_rank - fixed) / mult + fixed, 3)
            g2 = cap.replace(gi, tp=tp, weights_gib_per_rank=w,
                             draft_weights_gib_per_rank=round(gi.draft_weights_gib_per_rank / mult, 3),
                             rank_resident_gib=None, free_gib_per_gpu=None, other_gib_per_gpu=None)
            r = _replanned(model, g2)
            if r is not None:
                add((2, mult), f"use {gi.tp * gi.pp * mult} GPUs per group (tp-size: {tp}, weights ~{w} GiB per rank)", r)
                break
    out.sort(key=lambda x: x[0])
    return [text if i == 0 else "or " + text for i, (_, text) in enumerate(out)]


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


def _as_given(gi, v: vd.Verdict) -> vd.Verdict:
    """``--set available_bytes`` is taken as given (SGLang's own number, e.g. from a log): when,
    with the group's weights and what SGLang builds before serving, it does not fit the GPU, the
    inputs disagree: ``tight`` with the deciding term ``available_bytes`` (for the rank and the
    group alike), not a verdict on the pools."""
    if gi.available_bytes_override is not None and v.deciding in ("pools", "activation"):
        return vd.Verdict("tight", "available_bytes", v.slack)
    return v


def plan_group(profile: Profile, group: Group, model, facts, overrides: dict, tree=None,
               serve: Optional[ServeConfig] = None, rules: Optional[VersionRules] = None) -> GroupPlan:
    """Plan one server group (``serve``: its parsed serve config); capacity errors become plan
    errors (verdict ``fails``), not exceptions. ``tree``: :class:`dsv4ctl.patches.planfacts.TreeFacts`, or None.

    The group's verdict is its worst rank's (:mod:`dsv4ctl.plan.verdict`): ``fails`` is an error
    (exit 1) with fixes that were each re-planned and pass; ``tight`` is a warning."""
    tree_idx, tree_notes = tree.for_env(group.env) if tree else ({}, [])
    gi = resolve_group(profile, group, model, facts, overrides, tree_idx, serve, rules)
    source = "--set" if {"index_k_dtype", "index_k_accounting"} & set(overrides) else (
        tree.source(tree_idx) if tree_idx else "profile")
    stages, v, msg = _evaluate(model, gi)
    if v.deciding == "no_kv_memory" and "Raise --mem-fraction-static above" in msg:
        if gi.mem_fraction_static <= 0:
            at = f"--mem-fraction-static={gi.mem_fraction_static}"
            msg = msg.replace(at, f"{at} (SGLang's default for these flags: memory_hook.py reserves "
                                  f"{gi.activation_reserve_gib} GiB for activations and CUDA graphs, more than the "
                                  f"GPU's {round(gi.gpu_memory_mib / 1024, 3)} GiB)", 1)
        msg += _first_passing_mfs(model, gi)
    gp = GroupPlan(group=group, inputs=gi, stages=stages or [], index_k_source=source)
    if v.deciding == "available_bytes" and gi.available_bytes_override is not None:
        msg = (f"the given available_bytes ({gi.available_bytes_override:,} B), the weights and what SGLang builds "
               f"before serving exceed the GPU ({msg}): check the available_bytes value against "
               f"weights_gib_per_rank and the GPU memory")
    if stages and gi.rank_resident_gib and len(set(gi.rank_resident_gib)) > 1:
        r = gi.rank_resident_gib.index(min(gi.rank_resident_gib))
        msg += f" (rank {r}, {gi.gpu_name(r)}: the tightest of the group's per-GPU memory)"
    gp.verdict = dict(level=v.level, deciding=v.deciding, message=msg)
    if v.level == "fails":
        gp.errors.append(msg)
        gp.fixes.extend(_fixes(model, gi, v, stages))
        if v.deciding in ("no_kv_memory", "pools") and gi.mfs_source.startswith("default"):
            gp.fixes.extend(("or " if gp.fixes else "") + f for f in
                            _chunk_fix(model, gi, lambda o: resolve_group(profile, group, model, facts, {**overrides, **o},
                                                                          tree_idx, serve, rules)))
    elif v.level == "tight":
        gp.warnings.append(f"tight: {msg}")
    if not stages:
        return gp
    gp.warnings[0:0] = tree_notes      # what the tree carries first, as before the verdict
    if gi.replica is not None:
        gp.warnings.append(f"replica {gi.replica} of {group.replicas} planned: the one with the least free GPU "
                           "memory (memory lists give every replica's GPUs); the others have at least its headroom")
    for note in gi.estimated:
        gp.warnings.append(f"estimated input: {note}; measure it for an exact plan")
    st = min(stages, key=lambda s: s.headroom_bytes)
    over = st.alloc_real.c4_index_k - st.alloc_budget.c4_index_k
    dtype = cap.index_k_dtype_of(st.conf.inputs)
    if over > 0:
        gp.warnings.append(f"index-K is {dtype} ({st.sizes.index_k_real_bytes} B/slot) but SGLang budgets "
                           f"{st.sizes.index_k_budget_bytes} B/slot: {_gib(over)} GiB per rank over budget, "
                           f"taken from the {_gib(st.headroom_budgeted_bytes)} GiB headroom SGLang budgets "
                           f"({_gib(st.headroom_bytes)} GiB left before serving: the table's headroom row)")
    elif over < 0:
        gp.warnings.append(f"index-K is {dtype} ({st.sizes.index_k_real_bytes} B/slot) but SGLang budgets "
                           f"{st.sizes.index_k_budget_bytes} B/slot: {_gib(-over)} GiB per rank budgeted and unused")
    if gi.pool.speculative_algorithm == "DSPARK":
        gp.warnings.append("DSPARK's draft pool is not modelled (EAGLE's is): headroom is optimistic")
    frees = gi.free_gib_per_gpu or []
    if gi.tp > 1 and not gi.balance_check and vd.unbalanced(frees):
        gp.warnings.append(f"unbalanced: free before load {min(frees)} GiB on one GPU < {vd.BALANCE_FRACTION:g} x "
                           f"{max(frees)} GiB on another; with SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=false SGLang "
                           "only warns and starts: pools are sized from the GPU with the least free memory")
    return gp


@dataclass
class PlanReport:
    """The whole plan. ``ok`` is False when any group has an error (exit 1)."""

    profile: Profile
    model: cap.ModelGeometry
    groups: list[GroupPlan]
    sglang: Optional[VersionChoice] = None

    @property
    def ok(self) -> bool:
        return not any(g.errors for g in self.groups)

    @property
    def sglang_version(self) -> str:
        return self.sglang.version if self.sglang else DEFAULT_VERSION

    def to_dict(self) -> dict:
        """The ``dsv4ctl.plan/2`` JSON document (see README, "plan JSON"); ``sglang_version`` is the
        release planned for, ``sglang_version_source`` where it came from."""
        return dict(schema=SCHEMA, sglang_version=self.sglang_version,
                    sglang_version_source=self.sglang.source if self.sglang else "default",
                    profile=self.profile.name,
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
    choice = resolve_version(dep)
    tree = None
    if dep.sglang.tree is not None and dep.sglang.series is not None:  # imported only when needed: start-up
        from ..patches.planfacts import tree_facts
        tree = tree_facts(dep.sglang)
    return PlanReport(profile=profile, model=model, sglang=choice,
                      groups=[plan_group(profile, g, model, facts, overrides, tree, dep.groups[g.name].serve,
                                         choice.rules)
                              for g in selected])
