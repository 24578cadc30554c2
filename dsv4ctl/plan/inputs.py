"""Input resolution of ``dsv4ctl plan`` (pure): a server group's serve config, the profile
(topology, GPU memory, measured memory, env switches), the tree's index-K facts and the what-if
overrides (``--set KEY=VALUE``) become one :class:`GroupInputs`, read as the SGLang release's own
argparse and server-argument resolution read them (:mod:`dsv4ctl.plan.versions`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from . import capacity as cap
from .capacity import CapacityError
from ..errors import InputError
from .models import CHECKPOINT_FORMATS
from . import verdict as vd
from .versions import DEFAULT_VERSION, VersionRules, rules_for
from ..profile.model import MAX_GIB, Group, Profile
from ..profile.serveconfig import ServeConfig, canonical

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
WEIGHT_TOPOLOGY_KEYS = ("model", "tp_size", "pp_size", "dp_size", "enable_dp_attention", "enable_dp_lm_head",
                        "moe_a2a_backend")

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
    "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "envbool",
    # issue 44.2: every key SGLang reads for DSV4 memory (dsv4ctl/data/memory_keys.json)
    "enable_dp_lm_head": "bool", "disable_decode_cuda_graph": "bool", "cuda_graph_backend_decode": "optstr",
    "cuda_graph_bs_decode": "intlist", "cuda_graph_config": "graphcfg", "enable_symm_mem": "bool",
    "cpu_offload_gb": "gib", "offload_group_size": "int", "dcp_size": "int", "attn_cp_size": "int",
    "enable_hisparse": "bool",
}
# serve-config dashed names that plan reads (others are ignored by the capacity model).
SERVE_KEYS = {k.replace("_", "-"): k for k in SET_KEYS if k.islower() and not k.startswith("_")}
_SERVE_PREFIXES = frozenset(k[:i] for k in SERVE_KEYS for i in range(len(k) + 1))
"""Every prefix of a SERVE_KEYS key ("" included): ``key in`` it is ``any(k.startswith(key) ...)``."""
for _k in ("model", "available_bytes", "index_k_dtype", "index_k_accounting", "free_gib_before_load",
           "weights_gib_per_rank", "other_gib", "gpu_memory_mib", "draft_weights_gib_per_rank",
           "checkpoint_format", "min_requests",
           "cuda_graph_max_bs"):     # not a 0.5.23 option: an ambiguous abbreviation of -decode/-prefill
    SERVE_KEYS.pop(_k.replace("_", "-"), None)
ENV_KEYS = [k for k in SET_KEYS if k.startswith("SGLANG_")]


def parse_set(items: list[str]) -> dict[str, Any]:
    """Parse ``KEY=VALUE`` what-if overrides into typed values. A server argument may be spelled
    as SGLang's option (``mem-fraction-static``, ``--mem-fraction-static``) or with underscores;
    the result is keyed by the underscore name. InputError names the bad item."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise InputError(f"--set {item!r}: expected KEY=VALUE")
        key, value = item.split("=", 1)
        key = key.strip()
        option = key.lstrip("-").replace("-", "_")
        if key not in SET_KEYS and option.islower() and option in SET_KEYS and option.replace("_", "-") in SERVE_KEYS:
            key = option
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
    if kind == "intlist":     # --cuda-graph-bs-decode 1 2 4 (nargs='+'): a YAML list, or "1,2,4" / "1 2 4"
        items = value if isinstance(value, list) else str(value).replace(",", " ").split()
        if not items:
            raise InputError(f"{label}: expected one or more integers, got {str(value)[:60]!r}")
        return [_int(label, x, minimum=1) for x in items]
    if kind == "graphcfg":
        return _graph_config(label, value)
    return str(value)


def _graph_config(label: str, value: Any) -> dict:
    """``--cuda-graph-config``'s decode phase as the plan reads it: ``{"backend", "max_bs", "bs"}``
    (those given). SGLang 0.5.23 takes a JSON object (or a ``--config`` mapping) whose per-phase
    keys win over every other graph flag (``srt/arg_groups/cuda_graph_hook.py``
    ``parse_cuda_graph_config``, "explicit JSON > convenience > legacy > defaults")."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise InputError(f"{label}: not a JSON object: {value[:60]!r}") from None
    if not isinstance(value, dict):
        raise InputError(f"{label}: expected a mapping of phases (decode, prefill), got {str(value)[:60]!r}")
    dec = value.get("decode") or {}
    if not isinstance(dec, dict):
        raise InputError(f"{label}: decode: expected a mapping, got {str(dec)[:60]!r}")
    out: dict = {}
    if dec.get("backend") is not None:
        out["backend"] = str(dec["backend"]).lower()
    if dec.get("max_bs") is not None:
        out["max_bs"] = _int(f"{label}: decode.max_bs", dec["max_bs"], minimum=1)
    if dec.get("bs") is not None:
        out["bs"] = _coerce(f"{label}: decode.bs", "intlist", dec["bs"])
    return out


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
    draft_freed_gib_per_rank: float = 0.0  # of the draft weights: its own embed/head, freed after its pool (plan.weights)
    checkpoint_format: str = "fp4"
    min_requests: int = 1
    min_requests_required: bool = True   # stated (profile plan.min_requests, --set): a shortfall fails, else tight
    logits_rows: int = 0                  # query rows of one prefill chunk (indexer logits transient)
    logits_chunked: bool = True           # the release splits those logits under free memory (versions.py)
    balance_check: bool = True            # SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK (environ.py:500): false → SGLang warns
    graph_max_bs: int = 0                 # the decode CUDA graph's largest batch (0: no decode graph; memory_hook.py)
    replica: Optional[int] = None         # with replicas: the one planned (the tightest)
    weights_fixed_gib: Optional[float] = None   # estimated weights that do not shrink with TP (plan.weights)
    # SGLang's estimate / reserve at the prefill chunk a DP-attention rank runs (None: the same as SGLang's)
    rank_estimate_gib: Optional[float] = None
    rank_reserve_gib: Optional[float] = None

    @property
    def need_estimate_gib(self) -> float:
        """The activation estimate the verdict judges a rank against (:func:`rank_activation`)."""
        return self.activation_estimate_gib if self.rank_estimate_gib is None else self.rank_estimate_gib

    @property
    def need_reserve_gib(self) -> float:
        """The floored reserve the verdict judges a rank against (:func:`rank_activation`)."""
        return self.activation_reserve_gib if self.rank_reserve_gib is None else self.rank_reserve_gib

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
        known = None        # 0.5.23 has every key plan reads; the argument names are loaded only when needed
        if version != DEFAULT_VERSION:
            from .argnames import option_names
            known = option_names(version)
        written: dict[str, str] = {}        # canonical key -> its first spelling in the file
        for k in serve.data:
            written.setdefault(canonical(k), k)
        for key, value in serve.args().items():
            if known is not None and key in SERVE_KEYS and key not in known:
                continue
            loc = serve.where(written.get(key, key))
            full = key
            if key not in SERVE_KEYS and key in _SERVE_PREFIXES:
                # could abbreviate an argument plan reads: resolve it as argparse does (the table is
                # only loaded then, for start-up time)
                from .argnames import AmbiguousOption, option_names, resolve_option
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
    _check_placement(profile, group, serve, args, where, out)
    _check_dist_init(profile, group, serve, out["nnodes"])
    return out


def _check_placement(profile: Profile, group: Group, serve: ServeConfig, args: dict, where: dict,
                     out: dict) -> None:
    """The serve config's topology ``out`` puts each node's ranks on the GPUs the profile lists
    (``base-gpu-id`` / ``gpu-id-step``, :func:`node_placement`); InputError naming both otherwise."""
    gi = profile.groups.index(group)
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


def _check_dist_init(profile: Profile, group: Group, serve: ServeConfig, nn: int) -> None:
    """A ``dist-init-addr`` in the serve config parses, and on a multi-node group names node 0."""
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


def _is_ip(x: str) -> bool:
    import ipaddress
    try:
        ipaddress.ip_address(x)
        return True
    except ValueError:
        return False


def _given_as(serve: ServeConfig, full: str) -> Optional[str]:
    """The key of ``serve`` that SGLang's parser reads as the argument ``full`` (its name, an
    alias or an unambiguous abbreviation: :mod:`dsv4ctl.plan.argnames`, imported only for a key that
    could abbreviate it), None when none does."""
    for k in serve.data:
        if not isinstance(k, str) or "_" in k:
            continue
        if canonical(k) == full:
            return k
        if full.startswith(k) or any(a.startswith(k) for a in ("nccl-init-addr",) if full == "dist-init-addr"):
            from .argnames import AmbiguousOption, resolve_option
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


def _where(profile: Profile, group: Group, overrides: dict, key: str, profile_path: tuple) -> str:
    """Where a value came from, for error lines: ``--set KEY`` or the profile's ``file:line:
    groups[i].path``."""
    if key in overrides:
        return f"--set {key}"
    gidx = profile.groups.index(group)
    return f"{profile.positions.where(('groups', gidx) + profile_path)}: groups[{gidx}].{'.'.join(profile_path)}"


def check_startup(profile: Profile, group: Group, serve: Optional[ServeConfig], overrides: dict,
                  rules: VersionRules) -> None:
    """Refuse what SGLang ``rules.version`` refuses at start-up for this group's serve config with
    the ``--set`` server arguments applied (:func:`dsv4ctl.plan.startup.validate`, the rule set
    ``config lint``, the preflight and ``config set`` share). InputError (exit 2):
    ``file:line: KEY: reason (SGLang X refuses it at start-up: FILE)``."""
    from .argtable import load_table
    from .startup import OWN_RULE, first_error, is_sm100, validate
    newest = load_table(version=DEFAULT_VERSION).by_dest
    table = load_table(version=rules.version)
    sets = {k: v for k, v in overrides.items() if k in newest or k in table.by_dest}
    if str(sets.get("speculative_algorithm") or "").upper() == "EAGLE":
        # the what-if "EAGLE" is the published DeepSeek-V4 recipe: top-k 1 with explicit steps
        sets = {"speculative_eagle_topk": 1, "speculative_num_steps": 3, **sets}
    host = profile.hosts[group.host]
    sm100 = is_sm100(host.gpu_model, sets.get("gpu_memory_mib", host.gpu_memory_mib))
    refusals, _ = validate(serve.data if serve is not None else {}, table, sm100=sm100, role=group.role,
                           overrides=sets)
    bad = first_error(refusals)
    if bad is None:
        return
    at = serve.where(bad.key) if serve is not None and bad.key in serve.data else \
        (serve.path if serve is not None and not (bad.key or "").startswith("--set") else f"group {group.name}")
    if bad.source.startswith(OWN_RULE):
        raise InputError(f"{at}: {bad.message} (dsv4ctl refuses it: {bad.source[len(OWN_RULE):]})")
    raise InputError(f"{at}: {bad.message} (SGLang {rules.version} refuses it at start-up: {bad.source})")


def _merged_args(profile: Profile, group: Group, serve: Optional[ServeConfig], overrides: dict,
                 rules: VersionRules) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """(args, where, overrides): serve config < topology (SGLang's defaults, checked against the
    profile) < the group's env switches < ``--set`` overrides, keys as the release reads them."""
    check_startup(profile, group, serve, overrides, rules)
    args, where = serve_args(serve, rules.version)
    overrides = dict(overrides)
    _attn_dp(overrides, {k: "--set" for k in overrides})
    args.update(topology(profile, group, serve, args, where, overrides))
    for k, v in group.env.items():
        if k in SET_KEYS:
            args[k] = _coerce(f"{profile.path}: groups.{group.name}.env.{k}", SET_KEYS[k], v)
    args.update(overrides)
    return args, where, overrides


def _check_parallel(profile: Profile, group: Group, model: cap.ModelGeometry, args: dict, overrides: dict) -> int:
    """Refuse parallel sizes SGLang (or a plan listing every rank) cannot take; the number of ranks."""
    tp, dp, pp, dpa = args["tp_size"], args["dp_size"], args["pp_size"], args["enable_dp_attention"]
    for k in ("tp_size", "dp_size", "pp_size"):
        if not 1 <= args[k] <= MAX_PARALLEL:
            raise InputError(f"{k} must be within 1..{MAX_PARALLEL}, got {args[k]}")
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
    n_ranks = tp * pp * (1 if dpa else dp)
    if n_ranks > MAX_RANKS:
        what = "tp_size*pp_size" if dpa else "tp_size*pp_size*dp_size"
        raise InputError(f"group {group.name}: {what} = {n_ranks} ranks exceeds {MAX_RANKS} "
                         "(a plan lists every rank)")
    if pp > model.num_hidden_layers:
        raise InputError(f"{_where(profile, group, overrides, 'pp_size', ('pp',))}: pp_size {pp} exceeds "
                         f"num_hidden_layers {model.num_hidden_layers}")
    if dpa and tp % dp:
        raise InputError(f"group {group.name}: dp_size {dp} must divide tp_size {tp} with enable_dp_attention")
    refused = model_refusal(group.name, model, args)
    if refused:
        raise InputError(refused)
    return n_ranks


def _disaggregation(group: Group, args: dict) -> Optional[str]:
    """``prefill``, ``decode`` or None: the serve config's mode, else the group's PD role."""
    disagg = args.get("disaggregation_mode")
    if disagg not in (None, "null", "prefill", "decode"):
        raise InputError(f"group {group.name}: disaggregation_mode {disagg!r} not in prefill|decode")
    disagg = None if disagg == "null" else disagg
    if disagg is None and group.role in ("prefill", "decode"):
        disagg = group.role
    return disagg


def _pp_partition(profile: Profile, group: Group, model: cap.ModelGeometry, args: dict,
                  overrides: dict) -> Optional[tuple[int, ...]]:
    """``SGLANG_PP_LAYER_PARTITION`` as layers per stage (None when unset), checked as SGLang does."""
    part = args.get("SGLANG_PP_LAYER_PARTITION")
    if not part:
        return None
    psrc = _where(profile, group, overrides, "SGLANG_PP_LAYER_PARTITION", ("env", "SGLANG_PP_LAYER_PARTITION"))
    try:
        pp_partition = tuple(int(x) for x in str(part).split(","))
    except ValueError:
        raise InputError(f"{psrc}: SGLANG_PP_LAYER_PARTITION {part!r}: expected comma-separated integers") from None
    if any(x < 1 for x in pp_partition):
        raise InputError(f"{psrc}: SGLANG_PP_LAYER_PARTITION {part}: every stage needs >= 1 layer")
    try:
        for r in range(args["pp_size"]):
            cap.pp_layer_range(model.num_hidden_layers, args["pp_size"], r, pp_partition)
    except CapacityError as e:
        raise InputError(f"{psrc}: {e}") from None
    return pp_partition


def _pool_inputs(profile: Profile, group: Group, model: cap.ModelGeometry, args: dict, rules: VersionRules,
                 tree_idx: dict, disagg: Optional[str], chunked: int, draft: Optional[int],
                 spec_algo: Optional[str], sm100: bool) -> cap.PoolInputs:
    """The configurator's inputs (:class:`dsv4ctl.plan.capacity.PoolInputs`), validated: SGLang's
    defaults for what the serve config leaves out, the release's flags (``rules.pool_flags()``)."""
    user_mrr = args.get("max_running_requests")
    dpa, dp = args["enable_dp_attention"], args["dp_size"]
    attn_dp = dp if dpa else 1
    # disaggregation_decode_extra_slots auto default (pd_disaggregation_hook.py)
    extra = args.get("disaggregation_decode_extra_slots")
    if extra is None:
        extra = 0
        if disagg == "decode" and user_mrr is not None and user_mrr // attn_dp <= 32:
            extra = 2 * (user_mrr // attn_dp)
    backend = args.get("dsv4_attn_backend", "auto")
    ratio_explicit = args.get("_swa_full_tokens_ratio_explicitly_set")
    if ratio_explicit is None:
        ratio_explicit = model.model_type == "deepseek_v4" or "swa_full_tokens_ratio" in args
    pool = cap.PoolInputs(
        page_size=args.get("page_size", 256),
        max_running_requests=user_mrr if user_mrr is not None else 256,
        swa_full_tokens_ratio=args.get("swa_full_tokens_ratio", 0.1),
        swa_ratio_explicit=ratio_explicit,
        chunked_prefill_size=chunked // dp if dpa and chunked > 0 else chunked,
        attn_dp_size=attn_dp,
        speculative_algorithm=spec_algo,
        speculative_num_draft_tokens=draft if spec_algo else None,
        attention_backend="flashmla" if backend == "auto" else backend,
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
        # from the series applied to sglang.tree (dsv4ctl.patches.planfacts), else the profile
        index_k_dtype=args.get("index_k_dtype", tree_idx.get("index_k_dtype", profile.index_k_dtype)),
        index_k_accounting=args.get("index_k_accounting", tree_idx.get("index_k_accounting", profile.index_k_accounting)),
        fp4_indexer=args.get("enable_deepseek_v4_fp4_indexer", False),
        sm100=sm100,
        **rules.pool_flags(),
    )
    try:
        pool.validate()
    except CapacityError as e:
        raise InputError(f"group {group.name}: {e}") from None
    return pool


@dataclass
class _Free:
    """Free memory of a group: ``p_gib`` (the tightest GPU's free GiB before load), ``per_gpu``
    ((free, other) lists per GPU) or None, the replica planned (its tightest) and its GPU places."""

    p_gib: float
    per_gpu: Optional[tuple[list, list]]
    replica: Optional[int]
    places: list


def _free_memory(profile: Profile, group: Group, args: dict, overrides: dict, topo_set: list[str],
                 gpu_mib: Optional[int], estimated: list[str]) -> _Free:
    """The group's measured (or estimated) free memory before load, per GPU when the profile gives
    lists; with several replicas, the tightest one (one SGLang refuses to start first). InputError
    for values no GPU can have."""
    mem, host = group.memory, profile.hosts[group.host]
    places, per_gpu, replica = group.server_gpus, None, None
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
        if "free_gib_before_load" in overrides or mem.free_gib_before_load is not None:
            src = _where(profile, group, overrides, "free_gib_before_load", ("memory", "free_gib_before_load"))
        else:
            src = f"group {group.name}: free_gib_before_load (estimated from gpu_memory_mib {gpu_mib})"
        raise InputError(f"{src}: must be > 0 GiB, got {p_gib}")
    if gpu_mib and given and max(given) > gpu_mib / 1024:
        raise InputError(f"group {group.name}: free_gib_before_load {max(given)} GiB is more than the GPU's memory "
                         f"({gpu_mib:,} MiB = {gpu_mib / 1024:.3f} GiB): measure it (dsv4ctl facts) or fix "
                         "gpus.memory_mib")
    return _Free(p_gib, per_gpu, replica, places)


def _weights(group: Group, model: cap.ModelGeometry, facts, args: dict, overrides: dict,
             spec_algo: Optional[str], pp_partition, estimated: list[str]) -> tuple[float, Optional[float], float, str, float]:
    """(target GiB per rank, the part that does not shrink with TP or None, draft GiB per rank,
    checkpoint format, the part of the draft GiB freed after the draft pool: its own embed/head, 0
    when measured): measured when the profile or ``--set`` gives them (a measured figure is
    dropped by a what-if that changes the topology), else from the checkpoint headers or the shipped
    table, sharded as SGLang does (:mod:`dsv4ctl.plan.weights`)."""
    mem = group.memory
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
    w_fixed, dw_freed = None, 0.0
    if w_gib is None or (spec_algo and dw_gib is None):
        # checkpoint headers or the shipped table, sharded as SGLang does (dsv4ctl.plan.weights;
        # imported here: a plan whose profile gives the figures never loads it, benchmarks/startup.py)
        from . import weights as wts
        tp, dp, pp, dpa = args["tp_size"], args["dp_size"], args["pp_size"], args["enable_dp_attention"]
        est = wts.estimate(facts, getattr(facts, "config_path", None), fmt,
                           wts.sharding_from_args(args, tp, dp, pp, dpa, pp_partition), model.num_hidden_layers)
        if est is None:
            raise InputError(f"group {group.name}: memory.{'weights' if w_gib is None else 'draft_weights'}"
                             "_gib_per_rank is required for a custom model (a config.json without its checkpoint)")
        if w_gib is None:
            w_gib, w_fixed = est.target_gib, est.fixed_gib
            estimated.append(est.note)
        if spec_algo and dw_gib is None:
            dw_gib, dw_freed = est.draft_gib, est.draft_freed_gib
            estimated.append(est.draft_note)
    _offload_notes(args, estimated)
    return w_gib, w_fixed, (float(dw_gib or 0.0) if spec_algo else 0.0), fmt, (dw_freed if spec_algo else 0.0)


def _offload_notes(args: dict, estimated: list[str]) -> None:
    """The memory keys SGLang reads that the plan reads but does not size (issue 44.2): said, with
    which way they move the plan, never dropped silently (``dsv4ctl/data/memory_keys.json``)."""
    if args.get("cpu_offload_gb"):
        estimated.append(f"cpu-offload-gb {args['cpu_offload_gb']}: SGLang keeps up to that many GB of each "
                         "rank's weights in host memory (srt/model_loader, --cpu-offload-gb); the plan counts "
                         "them on the GPU, so its headroom is low by up to that much")
    if args.get("offload_group_size"):
        estimated.append(f"offload-group-size {args['offload_group_size']}: SGLang offloads layer groups to host "
                         "memory; the plan counts their weights on the GPU (headroom low)")
    for key, what in (("dcp_size", "decode context parallel splits the KV cache over"),
                      ("attn_cp_size", "attention context parallel splits a prefill's tokens over")):
        if (args.get(key) or 1) > 1:
            estimated.append(f"{key.replace('_', '-')} {args[key]}: {what} {args[key]} ranks; the plan sizes "
                             "weights and pools as without it")
    if args.get("enable_hisparse"):
        estimated.append("enable-hisparse: HiSparse's device pools (srt/model_executor/pool_configurator.py) "
                         "are not sized by the plan")
    if args.get("enable_symm_mem"):
        estimated.append("enable-symm-mem: SGLang preallocates SGLANG_SYMM_MEM_PREALLOC_GB_SIZE (default 4) GB "
                         "of symmetric memory per rank (srt/arg_groups/memory_hook.py); the plan does not count "
                         "it: give it in memory.other_gib")


def _hypothetical_note(group: Group, host, topo_set: list[str], n_ranks: int, gpu_mib, places) -> str:
    """The "what-if" line of a ``--set`` topology planned on GPUs the group does not have."""
    return (f"what-if: --set {', '.join(topo_set)} plans {n_ranks} rank(s) on hypothetical GPUs like "
            f"host {host.name}'s ({host.gpu_model or 'GPU'}, {gpu_mib:,} MiB), not the group's "
            + (f"{len(places)} GPU(s) {_gpu_list(g for _, _, g in places)}" if group.nnodes == 1
               else f"{len(places)} GPU(s) on {group.nnodes} nodes"))


def _decode_graph(args: dict) -> tuple[Optional[int], bool]:
    """(the decode CUDA graph's largest batch size as given, or None for SGLang's default; whether
    the decode graph is off), with SGLang 0.5.23's precedence (``srt/arg_groups/cuda_graph_hook.py``
    ``parse_cuda_graph_config``): ``--disable-cuda-graph`` < ``--disable-decode-cuda-graph`` <
    ``--cuda-graph-backend-decode`` / ``--cuda-graph-max-bs-decode`` / ``--cuda-graph-bs-decode`` <
    ``--cuda-graph-config``'s ``decode`` object; a batch-size list sets the largest to its maximum
    (``memory_hook.py`` ``decode_cuda_graph_config.max_bs = max(decode_cuda_graph_config.bs)``)."""
    off = bool(args.get("disable_cuda_graph", False)) or bool(args.get("disable_decode_cuda_graph", False))
    if args.get("cuda_graph_backend_decode") is not None:
        off = str(args["cuda_graph_backend_decode"]).lower() == "disabled"
    max_bs, bs = args.get("cuda_graph_max_bs"), args.get("cuda_graph_bs_decode")
    cfg = args.get("cuda_graph_config") or {}
    if "backend" in cfg:
        off = cfg["backend"] == "disabled"
    max_bs, bs = cfg.get("max_bs", max_bs), cfg.get("bs", bs)
    return (max(bs) if bs else max_bs), off


def _memory_args(group: Group, args: dict, gpu_mib: Optional[int], disagg: Optional[str],
                 draft: Optional[int], rules: VersionRules) -> tuple[cap.MemoryArgs, float]:
    """(SGLang's activation-estimate inputs, the mem_fraction_static that runs): the serve
    config's or ``--set``'s fraction, else SGLang's default from those inputs (memory_hook.py, with
    the release's decode-graph rule). InputError for a given value outside (0, 1); a default <= 0
    is kept (SGLang takes it and refuses at KV sizing: the plan fails as SGLang does)."""
    chunked_user = args.get("chunked_prefill_size")
    max_prefill = args.get("max_prefill_tokens", DEFAULT_MAX_PREFILL_TOKENS)
    # chunked prefill disabled (<= 0): SGLang sizes activations by max_prefill_tokens instead
    # (sglang 0.5.23 srt/arg_groups/memory_hook.py:304-307).
    act_chunk = max_prefill if chunked_user is not None and chunked_user <= 0 else chunked_user
    graph_max_bs, graph_off = _decode_graph(args)
    mem_args = cap.MemoryArgs(
        gpu_memory_mib=gpu_mib, tp_size=args["tp_size"], pp_size=args["pp_size"], dp_size=args["dp_size"],
        enable_dp_attention=args["enable_dp_attention"], disaggregation_mode=disagg,
        max_running_requests=args.get("max_running_requests"), speculative_num_draft_tokens=draft,
        chunked_prefill_size=act_chunk, cuda_graph_max_bs=graph_max_bs, disable_cuda_graph=graph_off,
        moe_a2a_backend=args.get("moe_a2a_backend"), graph_bs_capped_by_mrr=rules.graph_bs_capped_by_mrr)
    mfs = args.get("mem_fraction_static")
    if mfs is None:
        mfs = cap.default_mem_fraction_static(mem_args)
    if not mfs < 1 or (mfs <= 0 and "mem_fraction_static" in args):
        raise InputError(f"group {group.name}: mem_fraction_static must be in (0, 1), got {mfs}")
    return mem_args, mfs


def rank_activation(mem_args: cap.MemoryArgs, dpa: bool, dp: int, disagg: Optional[str]) -> tuple[Optional[float], Optional[float]]:
    """``(estimate, reserve)`` GiB of SGLang's activation formula (:func:`capacity.reserved_mb`) at the
    prefill chunk a DP-attention rank runs, or ``(None, None)`` when that is SGLang's own chunk.

    SGLang 0.5.23 sizes its reserve in ``memory_hook.py`` before ``parallel_hook.py`` (l.326-336)
    divides ``chunked_prefill_size`` by ``attn_dp_size``: the reserve counts ``1.5 MB x`` the
    undivided chunk, a rank prefills chunk / attn-dp tokens. Calibrated on SemiAnalysisAI/InferenceX
    #2226 (B300, V4-Pro, DEP4, chunk 32,768, decode graph 128): SGLang's estimate 50.75 GiB, at the
    rank's 8,192 tokens 14.75 GiB; the report's free 2.9-4.8 GiB at its OOM puts what the rank held at
    run time at 13.0-15.2 GiB (docs/plan-calibration.md)."""
    if not dpa or dp <= 1 or disagg == "decode":
        return None, None
    chunk = mem_args.chunked_prefill_size or cap.default_chunked_prefill_size(mem_args.gpu_memory_mib)
    if chunk <= 0:
        return None, None
    ranked = cap.replace(mem_args, chunked_prefill_size=max(1, chunk // dp))
    return round(cap.reserved_mb(ranked, floor=False) / 1024, 3), round(cap.reserved_mb(ranked) / 1024, 3)


def _context_length(group: Group, model: cap.ModelGeometry, args: dict) -> int:
    """The group's context length (default: the model's derived one). InputError for one SGLang
    refuses at start-up: not positive, or past the derived length without
    ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN`` (sglang 0.5.18-0.5.23
    ``srt/configs/model_config.py`` ``ModelConfig._derive_context_length``)."""
    ctx = args.get("context_length", model.context_len)
    if ctx <= 0:
        raise InputError(f"context_length must be > 0, got {ctx}")
    return ctx


def model_refusal(group_name: str, model: cap.ModelGeometry, args: dict) -> Optional[str]:
    """Why SGLang cannot serve the model with the group's resolved arguments ``args`` (``tp_size``,
    ``dp_size``, ``enable_dp_attention``, ``context_length``, the server's env switches), found
    only when it builds the model, not by its argument resolution (:mod:`dsv4ctl.plan.startup`);
    None when it can. One rule for ``plan`` (an InputError, exit 2) and ``config lint`` (DSV124):
    the attention-TP split of the attention projections (:meth:`ModelGeometry.attn_tp_refusal`)
    and a context past the derived one without ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN``
    (sglang 0.5.18-0.5.23 ``srt/configs/model_config.py`` ``ModelConfig._derive_context_length``)."""
    tp, dp, dpa = args["tp_size"], args["dp_size"], args["enable_dp_attention"]
    refused = model.attn_tp_refusal(tp // dp if dpa and dp else tp)
    if refused:
        how = "" if refused.endswith("(dsv4ctl refuses it)") else "SGLang refuses it when it builds the model: "
        where = "" if not how else " (srt/models/deepseek_v4.py, srt/distributed/utils.py)"
        return f"group {group_name}: tp_size {tp}{f' / dp_size {dp}' if dpa else ''}: {how}{refused}{where}"
    ctx = args.get("context_length", model.context_len)
    if ctx > model.context_len and not args.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"):
        return (f"group {group_name}: context_length {ctx} is greater than the derived context_length "
                f"({model.context_len}): SGLang refuses it at start-up unless "
                "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 (srt/configs/model_config.py)")
    return None


def merged_args(profile: Profile, group: Group, serve: Optional[ServeConfig], rules: VersionRules) -> dict[str, Any]:
    """The group's resolved arguments as ``plan`` reads them without ``--set`` (serve config <
    topology < env switches). InputError for what ``plan`` refuses on the way."""
    return _merged_args(profile, group, serve, {}, rules)[0]


def resolve_group(profile: Profile, group: Group, model: cap.ModelGeometry, facts,
                  overrides: dict[str, Any], tree_idx: Optional[dict] = None,
                  serve: Optional[ServeConfig] = None, rules: Optional[VersionRules] = None) -> GroupInputs:
    """Resolve a server group's inputs: serve config < profile < ``--set`` overrides, with the
    rules of the SGLang release ``rules`` (default: 0.5.23; :mod:`dsv4ctl.plan.versions`).

    Raises InputError (exit 2) for invalid values or a serve config that disagrees with the
    profile's topology."""
    rules = rules or rules_for(DEFAULT_VERSION)
    args, where, overrides = _merged_args(profile, group, serve, overrides, rules)
    host = profile.hosts[group.host]
    n_ranks = _check_parallel(profile, group, model, args, overrides)
    tp, dp, pp, dpa = args["tp_size"], args["dp_size"], args["pp_size"], args["enable_dp_attention"]
    topo_set = [k for k in ("tp_size", "pp_size", "dp_size", "enable_dp_attention", "nnodes") if k in overrides]
    gpu_mib = args.get("gpu_memory_mib", host.gpu_memory_mib)
    disagg = _disaggregation(group, args)
    spec_algo = args.get("speculative_algorithm")
    spec_algo = spec_algo.upper() if spec_algo else None
    draft = args.get("speculative_num_draft_tokens")
    estimated: list[str] = []
    if spec_algo and not draft:
        draft = 4
        estimated.append("speculative_num_draft_tokens=4 (SGLang's EAGLE default for DSV4 is resolved at start-up)")
    chunked_user = args.get("chunked_prefill_size")
    max_prefill = args.get("max_prefill_tokens", DEFAULT_MAX_PREFILL_TOKENS)
    mfs_source = "--set" if "mem_fraction_static" in overrides else \
        "serve config" if "mem_fraction_static" in where else "default (memory_hook.py)"
    mem_args, mfs = _memory_args(group, args, gpu_mib, disagg, draft if spec_algo else None, rules)
    chunked = chunked_user if chunked_user is not None else cap.default_chunked_prefill_size(gpu_mib)
    pp_partition = _pp_partition(profile, group, model, args, overrides)
    places = group.server_gpus
    hypothetical = bool(topo_set and places and (n_ranks != len(places) or args.get("nnodes", 1) != group.nnodes))
    if hypothetical:
        # "what if TP8 / two nodes?": planned on GPUs the group does not have, said so (issue 25)
        estimated.append(_hypothetical_note(group, host, topo_set, n_ranks, gpu_mib, places))
    sm100 = gpu_mib is None or gpu_mib >= 160 * 1024 or "B" in (host.gpu_model or "")
    pool = _pool_inputs(profile, group, model, args, rules, tree_idx or {}, disagg, chunked, draft, spec_algo, sm100)
    free = _free_memory(profile, group, args, overrides, topo_set, gpu_mib, estimated)
    w_gib, w_fixed, dw_gib, fmt, dw_freed = _weights(group, model, facts, args, overrides, spec_algo, pp_partition, estimated)
    other = args.get("other_gib", group.memory.other_gib)
    rank_resident = frees = None
    if free.per_gpu is not None:
        frees = [free.p_gib if f is None else f for f in free.per_gpu[0]]
        # F per GPU; SGLang MIN-reduces P and F across the world (reference §3.2)
        rank_resident = [round(f - w_gib - dw_gib - o, 3) for f, o in zip(frees, free.per_gpu[1])]
        other = max(free.per_gpu[1])
    elif isinstance(other, list):    # per-GPU lists with a topology --set (GPUs the group lacks): the most
        other = max((o or 0.0) for o in other) if other else 0.0
    ctx = _context_length(group, model, args)
    plan_section = profile.raw.get("plan") or {}
    min_req = args.get("min_requests", plan_section.get("min_requests", 1))
    if min_req < 1:
        raise InputError(f"--set min_requests: must be >= 1, got {min_req}")
    avail = args.get("available_bytes")
    if avail is not None and gpu_mib and avail > gpu_mib * (1 << 20):
        raise InputError(f"available_bytes {avail:,} B is more than the GPU's memory ({gpu_mib:,} MiB = "
                         f"{gpu_mib * (1 << 20):,} B): it cannot be SGLang's number for this group")
    places = free.places
    # one prefill chunk of query rows scores the C4 indexer (decode rows are graph-captured: no budget)
    logits_rows = 0 if disagg == "decode" else (pool.chunked_prefill_size if chunked > 0 else max_prefill)
    rank_est, rank_res = rank_activation(mem_args, dpa, dp, disagg)
    return GroupInputs(activation_reserve_gib=round(cap.reserved_mb(mem_args) / 1024, 3),
                       rank_estimate_gib=rank_est, rank_reserve_gib=rank_res,
                       activation_estimate_gib=round(cap.reserved_mb(mem_args, floor=False) / 1024, 3),
                       draft_weights_gib_per_rank=dw_gib, draft_freed_gib_per_rank=dw_freed, checkpoint_format=fmt, rank_resident_gib=rank_resident,
                       free_gib_per_gpu=frees,
                       other_gib_per_gpu=list(free.per_gpu[1]) if free.per_gpu is not None else None,
                       gpus=() if hypothetical else tuple(g for _, _, g in places),
                       places=() if hypothetical else tuple(places), replica=free.replica,
                       min_requests=min_req, min_requests_required="min_requests" in args or "min_requests" in plan_section,
                       logits_rows=logits_rows, logits_chunked=rules.logits_chunked,
                       balance_check=bool(args.get("SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK", True)), graph_max_bs=0 if
                       mem_args.disable_cuda_graph or disagg == "prefill" else cap.decode_graph_max_bs(mem_args),
                       tp=tp, dp=dp, pp=pp, dp_attention=dpa, mem_fraction_static=mfs,
                       mfs_source=mfs_source, context_length=ctx, gpu_memory_mib=gpu_mib,
                       free_gib_before_load=free.p_gib, weights_gib_per_rank=w_gib, other_gib=other,
                       estimated=estimated, available_bytes_override=avail,
                       pp_partition=pp_partition, pool=pool, weights_fixed_gib=w_fixed)
