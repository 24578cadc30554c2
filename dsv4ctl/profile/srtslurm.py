"""Import an NVIDIA srt-slurm SGLang recipe (``recipes/<model>/sglang/...yaml``) as a dsv4ctl profile
and one SGLang ``--config`` serve config per server group (``dsv4ctl profile import srt-slurm``).

What a recipe says and where it goes (docs/slurm.md, "Importing an srt-slurm recipe"):

* ``model`` (``path``, the served-model-name and ``identity.model.repo``) -> the profile's ``model``,
  DeepSeek-V4-Pro or -Flash (anything else is refused); ``model.container`` -> the profile's
  ``description`` and a header comment; ``model.precision`` -> a note when it is not FP4.
* ``resources`` (``gpu_type``, ``gpus_per_node``, ``{prefill,decode,agg}_{nodes,workers}``,
  ``gpus_per_{prefill,decode,agg}``) -> placeholder hosts (``<role>-<k>.invalid``: srt-slurm picks
  nodes at submit time) with the GPU's nvidia-smi name and memory, and one group per role: ``host``
  or ``nodes`` for one worker, ``replicas`` for several.
* ``backend.sglang_config.{prefill,decode,aggregated}`` -> the serve configs, keys as SGLang
  ``--config`` keys (dashes), spelled as SGLang 0.5.23 reads them from a file (:data:`RENAMES`,
  ``enable-dp-attention`` -> ``attn-dp-size``); the multi-node flags srt-slurm injects at launch
  (``nnodes``) written in, the ones dsv4ctl passes per node (``node-rank``, ``dist-init-addr``) left out.
* ``environment`` + ``backend.{prefill,decode,aggregated}_environment`` -> each group's ``env``.
* ``slurm`` (partition, account, time_limit) -> header comments.

Everything else is listed: known srt-slurm job settings as notes ("not imported"), keys this
importer does not know as warnings. Reads the recipe only; returns the files' text."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import InputError
from .yamlpos import Positions, dotted, parse_yaml

MAX_RECIPE_BYTES = 1 << 20
"""Largest recipe read (bytes): srt-slurm recipes are a few KiB."""

SGLANG_VERSION = "0.5.23"
"""The SGLang release the imported profile names (recipes run nightly images newer than it)."""

GPU_TYPES: dict[str, tuple[str, int, int]] = {
    "b200": ("NVIDIA B200", 183359, 8),
    "b300": ("NVIDIA B300", 275040, 8),
    "gb200": ("NVIDIA GB200", 189471, 4),
    "gb300": ("NVIDIA GB300", 284208, 4),
    "h200": ("NVIDIA H200", 143771, 8),
    "h100": ("NVIDIA H100 80GB HBM3", 81559, 8),
}
"""srt-slurm ``resources.gpu_type`` -> (nvidia-smi name, ``memory.total`` MiB, GPUs per node when the
recipe does not say). Memory: capacity reference §1.4 (H200 and B200 also in public logs; the
others from a third-party nvidia-smi fixture); GB200/GB300 compute trays hold 4 GPUs."""

MODELS = {"pro": ("deepseek-v4-pro", "deepseek-ai/DeepSeek-V4-Pro"),
          "flash": ("deepseek-v4-flash", "deepseek-ai/DeepSeek-V4-Flash")}

RENAMES = {"cuda-graph-max-bs": "cuda-graph-max-bs-decode", "speculative-algo": "speculative-algorithm"}
"""Recipe keys -> the key SGLang 0.5.23 reads from ``--config``: ``cuda-graph-max-bs`` is the
deprecated alias of ``cuda-graph-max-bs-decode`` (0.5.18-0.5.19 argument tables; gone in 0.5.20, and
an ambiguous abbreviation since); ``speculative-algo`` works only as an argparse abbreviation."""

INJECTED = ("node-rank", "dist-init-addr")
"""Per-node flags srt-slurm adds at launch and dsv4ctl passes per node: left out of serve configs."""

ROLES = {"prefill": ("prefill", "prefill"), "decode": ("decode", "decode"), "agg": ("colocated", "aggregated")}
"""srt-slurm role -> (dsv4ctl group role, ``sglang_config``/``*_environment`` section name)."""

KNOWN = {
    (): {"name", "model", "resources", "slurm", "frontend", "backend", "benchmark", "dynamo", "profiling",
         "output", "health_check", "infra", "telemetry", "observability", "sweep", "container_mounts",
         "environment", "extra_mount", "sbatch_directives", "srun_options", "setup_script",
         "enable_config_dump", "identity"},
    ("model",): {"path", "container", "precision"},
    ("resources",): {"gpu_type", "gpus_per_node", "prefill_nodes", "decode_nodes", "prefill_workers",
                     "decode_workers", "agg_nodes", "agg_workers", "gpus_per_prefill", "gpus_per_decode",
                     "gpus_per_agg"},
    ("slurm",): {"time_limit", "account", "partition"},
    ("backend",): {"type", "gpu_type", "prefill_environment", "decode_environment", "aggregated_environment",
                   "sglang_config", "kv_events_config"},
    ("backend", "sglang_config"): {"prefill", "decode", "aggregated"},
}
"""The recipe fields srt-slurm documents (its docs/config-reference.md), per mapping."""

IMPORTED_TOP = {"name", "model", "resources", "slurm", "backend", "environment"}


@dataclass
class Group:
    """One imported server group: where its servers run and its serve config's lines."""

    name: str
    role: str
    servers: list[list[str]]            # per worker: its nodes' host names in node-rank order
    gpus: list[int]
    serve: list[tuple[str, Any, str]]   # (key, value, comment)
    env: dict[str, str]
    topology: dict[str, Any] = field(default_factory=dict)


@dataclass
class Recipe:
    """What an srt-slurm recipe says, as a profile: groups, hosts' GPU, model and what was left out."""

    path: Path
    name: str
    model: str
    gpu_type: str
    gpus_per_node: int
    groups: list[Group]
    container: Optional[str] = None
    slurm: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _where(pos: Positions, path: tuple) -> str:
    return f"{pos.where(path)}: {dotted(path)}"


def _dig(data: Any, path: tuple) -> Any:
    """``data`` at ``path`` through mappings; None when a step is missing or is no mapping."""
    for k in path:
        data = data.get(k) if isinstance(data, dict) else None
    return data


#: The largest count a recipe may give (GPUs per node, nodes, workers): srt-slurm's largest
#: DeepSeek-V4 recipes use 12 prefill workers and 16-node decode; a mistaken 10**8 must not
#: build a list of that many GPUs or hosts.
MAX_COUNT = 4096


def _get(data: dict, pos: Positions, path: tuple, kind: type, required: bool = False) -> Any:
    """``data`` at ``path`` when it is a ``kind`` (None when absent and not required); InputError else."""
    v = _dig(data, path)
    if v is None:
        if required:
            raise InputError(f"{_where(pos, path)}: missing (an srt-slurm SGLang recipe has model, resources "
                             "and backend.sglang_config)")
        return None
    ok = isinstance(v, kind) and not (kind is int and isinstance(v, bool))
    if not ok or (kind is int and not 0 <= v <= MAX_COUNT):
        want = {dict: "a mapping", str: "a string", int: f"a whole number from 0 to {MAX_COUNT}"}[kind]
        raise InputError(f"{_where(pos, path)}: must be {want}, got {str(v)[:80]!r}")
    if kind is str and any(ord(c) < 32 or ord(c) == 127 for c in v):
        # values go into the profile's comments and YAML: a newline would end a comment and write keys
        raise InputError(f"{_where(pos, path)}: {v[:80]!r} has a control character (a newline, a tab...)")
    return v


def _unknown_keys(data: dict, pos: Positions) -> tuple[list[str], list[str]]:
    """(warnings for keys srt-slurm does not document here, the documented top-level keys not imported)."""
    warnings = []
    for path, known in KNOWN.items():
        v = _dig(data, path)
        if isinstance(v, dict):
            extra = [str(k) for k in v if k not in known]
            if extra:
                warnings.append(f"{pos.where(path + (extra[0],))}: unknown recipe key(s) "
                                f"{', '.join(dotted(path + (k,)) for k in extra)}: not imported")
    skipped = sorted(str(k) for k in data if k in KNOWN[()] and k not in IMPORTED_TOP)
    return warnings, skipped


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


def recipe_model(data: dict, pos: Positions, override: Optional[str] = None) -> str:
    """``deepseek-v4-pro`` or ``deepseek-v4-flash`` from the recipe's names of its model (``identity.model.repo``,
    each ``served-model-name``, ``model.path``: DeepSeek-V4-Pro, dsv4-pro, dspro...) or ``override``.
    InputError (exit 2) for another model, names that disagree, or none that says which."""
    if override is not None:
        o = _norm(override)
        hit = [k for k, (name, repo) in MODELS.items() if o in (_norm(name), _norm(repo), k)]
        if not hit:
            raise InputError(f"--model {override}: dsv4ctl plans {' or '.join(n for n, _ in MODELS.values())}")
        return MODELS[hit[0]][0]
    names: list[tuple[tuple, str]] = []
    sections = _dig(data, ("backend", "sglang_config"))
    candidates = [("identity", "model", "repo")] + [
        ("backend", "sglang_config", sec, key) for sec in (sections if isinstance(sections, dict) else ())
        for key in ("served-model-name", "served_model_name")] + [("model", "path")]
    for where in candidates:
        if isinstance(_dig(data, where), str):
            names.append((where, _dig(data, where)))
    found = {}
    for where, n in names:
        m = re.search(r"(?:deepseekv4|dsv4|ds)(pro|flash)", _norm(n))
        if m:
            found.setdefault(m.group(1), (where, n))
    if len(found) > 1:
        (w1, n1), (w2, n2) = found.values()
        raise InputError(f"{_where(pos, w1)}: {n1} but {dotted(w2)} is {n2}: which model does the recipe serve? "
                         "(--model deepseek-v4-pro|deepseek-v4-flash)")
    if not found:
        shown = ", ".join(f"{dotted(w)} {n}" for w, n in names) or "no model.path"
        raise InputError(f"{pos.where(('model',))}: {shown}: not DeepSeek-V4-Pro or -Flash, the models dsv4ctl plans "
                         "(a cluster alias for one of them: --model deepseek-v4-pro|deepseek-v4-flash)")
    return MODELS[next(iter(found))][0]


def _role_placement(data: dict, pos: Positions, role: str, gpn: int) -> Optional[tuple[list[list[str]], list[int], list[str]]]:
    """(servers as host-name lists, GPU indices on each node, warnings) of srt-slurm role ``role``
    (``prefill``, ``decode``, ``agg``), or None when the recipe runs no such worker. A worker takes
    ``gpus_per_<role>`` GPUs (else its share of ``<role>_nodes``): whole nodes when it spans several,
    else the first GPUs of its own node. InputError for counts that do not place."""
    at = ("resources",)
    nodes = _get(data, pos, at + (f"{role}_nodes",), int)
    workers = _get(data, pos, at + (f"{role}_workers",), int)
    explicit = _get(data, pos, at + (f"gpus_per_{role}",), int)
    if not workers:
        if nodes:
            raise InputError(f"{_where(pos, at + (f'{role}_nodes',))}: {nodes} node(s) but no {role}_workers: "
                             "how many servers run on them?")
        return None
    if nodes == 0:
        raise InputError(f"{_where(pos, at + (f'{role}_nodes',))}: 0 ({role} workers on another role's nodes) is not "
                         f"imported: dsv4ctl runs one server per host and group; give {role} its own nodes")
    gpw = explicit or (nodes * gpn // workers if nodes else gpn)
    if gpw == 0:
        raise InputError(f"{_where(pos, at + (f'{role}_workers',))}: {workers} workers on {nodes} node(s) of {gpn} "
                         "GPUs leave no GPU per worker")
    if gpw >= gpn and gpw % gpn:
        raise InputError(f"{_where(pos, at + (f'gpus_per_{role}',))}: {gpw} GPUs per worker is not a whole number of "
                         f"{gpn}-GPU nodes (a server over several nodes uses each node whole)")
    if gpw < gpn and workers > 1 and gpn // gpw > 1:
        raise InputError(f"{_where(pos, at + (f'{role}_workers',))}: {workers} workers of {gpw} GPUs share {gpn}-GPU "
                         f"nodes (srt-slurm packs them): dsv4ctl runs one server of a group per host; give each "
                         f"{role} worker a node (gpus_per_{role}: {gpn}) or import a one-worker recipe")
    k = max(gpw // gpn, 1)
    need = workers * k
    warnings = []
    if nodes is not None and need > nodes:
        raise InputError(f"{_where(pos, at + (f'{role}_nodes',))}: {nodes}, but {workers} worker(s) of {gpw} GPUs "
                         f"need {need} node(s) of {gpn} GPUs")
    if nodes is not None and need < nodes:
        warnings.append(f"{_where(pos, at + (f'{role}_nodes',))}: {nodes}, but the {workers} worker(s) use {need}: "
                        "the other nodes are not imported")
    servers = [[f"{role}-{w * k + j}" for j in range(k)] for w in range(workers)]
    return servers, list(range(min(gpw, gpn))), warnings


def _placements(data: dict, pos: Positions) -> tuple[str, int, dict, list[str]]:
    """(gpu_type, GPUs per node, {role: placement}, warnings) of the recipe's ``resources``."""
    _get(data, pos, ("resources",), dict, required=True)
    gpu_type = _get(data, pos, ("resources", "gpu_type"), str)
    if gpu_type is None:
        raise InputError(f"{pos.where(('resources',))}: resources.gpu_type is not set: the plan needs the GPU "
                         f"({', '.join(GPU_TYPES)})")
    if gpu_type.lower() not in GPU_TYPES:
        raise InputError(f"{_where(pos, ('resources', 'gpu_type'))}: {gpu_type!r} is not a GPU dsv4ctl knows "
                         f"({', '.join(GPU_TYPES)})")
    gpu_type = gpu_type.lower()
    warnings = []
    gpn = _get(data, pos, ("resources", "gpus_per_node"), int)
    if not gpn:
        gpn = GPU_TYPES[gpu_type][2]
        warnings.append(f"{pos.where(('resources',))}: resources.gpus_per_node is not set (srt-slurm takes it from "
                        f"srtslurm.yaml): {gpn}, a {gpu_type} node's GPUs")
    placed = {}
    for role in ROLES:
        p = _role_placement(data, pos, role, gpn)
        if p is not None:
            placed[role] = p
            warnings += p[2]
    if "agg" in placed and len(placed) > 1:
        raise InputError(f"{pos.where(('resources',))}: resources has both aggregated and prefill/decode workers "
                         "(srt-slurm runs one mode)")
    if not placed:
        raise InputError(f"{pos.where(('resources',))}: resources names no workers (prefill_workers and "
                         "decode_workers, or agg_workers)")
    if "agg" not in placed and len(placed) != 2:
        missing = "decode" if "prefill" in placed else "prefill"
        raise InputError(f"{pos.where(('resources',))}: prefill/decode recipe without {missing} workers "
                         f"({missing}_workers): a PD deployment needs both")
    return gpu_type, gpn, placed, warnings


PARALLEL = {"tp": ("tp-size", "tensor-parallel-size", "tp"), "dp": ("dp-size", "data-parallel-size", "dp"),
            "ep": ("ep-size", "expert-parallel-size", "ep"), "pp": ("pp-size", "pipeline-parallel-size", "pp"),
            "attn_dp": ("attn-dp-size", "attention-data-parallel-size")}
"""SGLang 0.5.23's spellings of the parallel sizes (names, aliases, the abbreviations argparse takes)."""


def _size(items: list[list], what: str) -> tuple[Optional[int], int]:
    """(index in ``items`` of the key giving parallel size ``what``, its value; 1 when absent)."""
    for i, (k, v, _c) in enumerate(items):
        if k in PARALLEL[what] and isinstance(v, str) and v.strip().isdigit():
            v = int(v)              # srt-slurm passes values as command-line text: "8" is 8
        if k in PARALLEL[what] and isinstance(v, int) and not isinstance(v, bool):
            return i, v
    return None, 1


def _dp_attention(items: list[list], notes: list[str], label: str) -> None:
    """``enable-dp-attention`` as SGLang 0.5.23 reads ``--config`` (it refuses the deprecated flag
    there): true -> ``attn-dp-size: <dp-size>`` with dp-size dropped (``parallel_hook.py``
    ``_handle_deprecated_dp_attention``); false -> left out."""
    flag = next((i for i, it in enumerate(items) if it[0] == "enable-dp-attention"), None)
    if flag is None:
        return
    on = items[flag][1] is True
    a, _ = _size(items, "attn_dp")
    d, dp = _size(items, "dp")
    if on and a is None:
        items[flag] = ["attn-dp-size", dp, f"enable-dp-attention with dp-size {dp} (SGLang 0.5.23 --config spelling)"]
        if d is not None:
            del items[d]
        notes.append(f"{label}: enable-dp-attention + dp-size {dp} written as attn-dp-size: {dp} (SGLang 0.5.23 "
                     "refuses the deprecated flag in --config)")
    else:
        del items[flag]
        notes.append(f"{label}: enable-dp-attention {'left out beside attn-dp-size' if on else 'false left out'}")


def serve_items(section: dict, pos: Positions, spath: tuple, role: str, nnodes: int, repo: str,
                notes: list[str]) -> list[list]:
    """The serve config of one recipe section as ``[key, value, comment]`` lines, keys as SGLang 0.5.23
    reads ``--config`` (dashes, :data:`RENAMES`, attention DP as ``attn-dp-size``), ``nnodes`` for a
    multi-node server, the per-node flags left out, and what a DeepSeek-V4 server of ``role`` needs and
    srt-slurm adds itself (model-path, disaggregation-mode) or dsv4ctl's lint requires (the parsers).
    ``notes`` gets a line per change. InputError for a key given twice or a contradicting ``nnodes``."""
    label = dotted(spath)
    items: list[list] = []
    for raw, v in section.items():
        k = str(raw).replace("_", "-")
        if k in RENAMES:
            notes.append(f"{label}: {raw} written as {RENAMES[k]} (SGLang 0.5.23)")
            k = RENAMES[k]
        if any(it[0] == k for it in items):
            raise InputError(f"{_where(pos, spath + (raw,))}: {k} given twice")
        if k in INJECTED:
            notes.append(f"{label}: {raw} left out (dsv4ctl passes it per node)")
            continue
        items.append([k, v, ""])
    _dp_attention(items, notes, label)
    given = {it[0]: it for it in items}
    if "nnodes" in given and given["nnodes"][1] != nnodes:
        raise InputError(f"{_where(pos, spath + ('nnodes',))}: {given['nnodes'][1]}, but resources put the server "
                         f"on {nnodes} node(s)")
    added = []
    if nnodes > 1 and "nnodes" not in given:
        added.append(["nnodes", nnodes, "srt-slurm adds --nnodes at launch; dsv4ctl reads it here"])
    if "model-path" not in given:
        added.append(["model-path", repo, "srt-slurm passes --model-path /model (its mount of model.path)"])
    if role in ("prefill", "decode") and "disaggregation-mode" not in given:
        added.append(["disaggregation-mode", role, "srt-slurm sets it from the worker's role"])
    for key, want in (("tool-call-parser", "deepseekv4"), ("reasoning-parser", "deepseek-v4")):
        if key not in given:
            added.append([key, want, "DeepSeek-V4 needs it behind an SGLang gateway (config lint DSV108)"])
    for it in added:
        notes.append(f"{label}: {it[0]}: {it[1]} added ({it[2]})")
    return items + added


def topology(items: list[list]) -> dict[str, int]:
    """tp/dp/ep/pp and attention-DP sizes a serve config's lines give (SGLang's 1 when absent)."""
    return {w: _size(items, w)[1] for w in PARALLEL}


def _backend(data: dict, pos: Positions) -> dict:
    """``backend.sglang_config`` of an SGLang recipe; InputError for another backend or none."""
    _get(data, pos, ("backend",), dict, required=True)
    kind = _get(data, pos, ("backend", "type"), str) or "sglang"
    other = [k for k in data["backend"] if str(k).endswith("_config") and k not in ("sglang_config", "kv_events_config")]
    if kind != "sglang":
        raise InputError(f"{_where(pos, ('backend', 'type'))}: {kind}: dsv4ctl runs SGLang; only backend.type "
                         "sglang recipes import")
    if other:
        raise InputError(f"{_where(pos, ('backend', other[0]))}: dsv4ctl runs SGLang; only "
                         "backend.sglang_config imports")
    return _get(data, pos, ("backend", "sglang_config"), dict, required=True)


def _env(data: dict, pos: Positions, section: str) -> dict[str, str]:
    """``environment`` (every worker) overlaid with ``backend.<section>_environment``, values as text."""
    out: dict[str, str] = {}
    for path in (("environment",), ("backend", f"{section}_environment")):
        env = _get(data, pos, path, dict) or {}
        for k, v in env.items():
            if isinstance(v, (dict, list)) or v is None:
                raise InputError(f"{_where(pos, path + (k,))}: an environment value is a string or number, got {v!r}")
            out[str(k)] = v if isinstance(v, str) else json.dumps(v)
    return out


def read_recipe(path: Path, model: Optional[str] = None) -> Recipe:
    """The srt-slurm SGLang recipe at ``path`` as a :class:`Recipe` (``model`` overrides the model the
    recipe names, for cluster aliases). Reads at most :data:`MAX_RECIPE_BYTES`. InputError (exit 2,
    one line with file:line) for what cannot be imported: not YAML, no mapping, a config with variants
    (``base``/``override_*``), another backend, another model, resources that do not place, a
    ``sglang_config`` section missing for a role, GPUs per worker that are not the section's tp x pp x dp."""
    from ..resources import read_file_capped
    raw = read_file_capped(path, MAX_RECIPE_BYTES, str(path), ": not an srt-slurm recipe")
    data, pos = parse_yaml(raw, str(path))
    if not isinstance(data, dict):
        raise InputError(f"{path}:1: not an srt-slurm recipe (a YAML mapping with model, resources and backend)")
    if "base" in data or any(str(k).startswith("override_") for k in data):
        raise InputError(f"{path}:1: a recipe with variants (base, override_*): write the variant to import out as "
                         "one recipe")
    sections = _backend(data, pos)
    name = _get(data, pos, ("name",), str) or path.stem
    rec = Recipe(path=path, name=name, model=recipe_model(data, pos, model), gpu_type="", gpus_per_node=0,
                 groups=[], container=_get(data, pos, ("model", "container"), str))
    rec.warnings, skipped = _unknown_keys(data, pos)
    rec.gpu_type, rec.gpus_per_node, placed, warn = _placements(data, pos)
    rec.warnings += warn
    repo = dict(MODELS.values())[rec.model]
    for role, (servers, gpus, _w) in placed.items():
        kind, section = ROLES[role]
        spath = ("backend", "sglang_config", section)
        cfg = _get(data, pos, spath, dict)
        if cfg is None:
            raise InputError(f"{pos.where(spath[:2])}: backend.sglang_config.{section} is missing: resources run "
                             f"{role} workers")
        items = serve_items(cfg, pos, spath, kind, len(servers[0]), repo, rec.notes)
        topo = topology(items)
        need = topo["tp"] * topo["pp"] * topo["dp"]
        have = len(gpus) * len(servers[0])
        if need != have:
            raise InputError(f"{pos.where(spath)}: {dotted(spath)}: tp {topo['tp']} x pp {topo['pp']} x dp {topo['dp']} "
                             f"= {need} GPUs, but resources give each {role} worker {have}")
        rec.groups.append(Group(name=role, role=kind, servers=servers, gpus=gpus, serve=items,
                                env=_env(data, pos, section), topology=topo))
    unused = [s for s in sections if s not in {ROLES[r][1] for r in placed}]
    if unused:
        rec.warnings.append(f"{pos.where(('backend', 'sglang_config', unused[0]))}: backend.sglang_config."
                            f"{', '.join(map(str, unused))}: no such workers in resources: not imported")
    _record_rest(data, pos, rec, skipped)
    return rec


def _record_rest(data: dict, pos: Positions, rec: Recipe, skipped: list[str]) -> None:
    """Notes for what the profile does not carry: precision, slurm settings, srt-slurm job keys."""
    prec = _get(data, pos, ("model", "precision"), str)
    if prec and "fp4" not in prec.lower():
        rec.notes.append(f"model.precision {prec}: plan estimates FP4-expert weights; for an FP8 checkpoint run "
                         "plan with --set checkpoint_format=fp8")
    for k in ("partition", "account", "time_limit"):
        v = _get(data, pos, ("slurm", k), str)
        if v:
            rec.slurm[k] = v
    if skipped:
        rec.notes.append(f"not imported (srt-slurm job settings): {', '.join(skipped)}")
    frontend = _get(data, pos, ("frontend", "type"), str)
    if frontend and "prefill" in {g.name for g in rec.groups}:
        rec.notes.append(f"frontend.type {frontend}: the profile's router group runs sglang-router in front instead")


def _yaml(v: Any) -> str:
    """``v`` as a one-line YAML value (JSON is YAML: strings double-quoted, mappings and lists in flow)."""
    if v is None:
        return "null"
    return json.dumps(v, ensure_ascii=False)


def _key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", k) else json.dumps(k, ensure_ascii=False)


def serve_text(rec: Recipe, g: Group) -> str:
    """The serve config file of group ``g``: the recipe section's keys in its order, then what was added."""
    lines = [f"# SGLang {SGLANG_VERSION} --config for the {g.name} server of srt-slurm recipe {rec.name}",
             f"# (dsv4ctl profile import srt-slurm {rec.path.name}); comments say what the import changed"]
    for k, v, c in g.serve:
        lines.append(f"{_key(k)}: {_yaml(v)}" + (f"   # {c}" if c else ""))
    return "\n".join(lines) + "\n"


def _where_runs(g: Group) -> list[str]:
    """The profile lines saying where group ``g``'s servers run (host, nodes or replicas)."""
    if len(g.servers) == 1:
        (srv,) = g.servers
        return [f"    host: {srv[0]}"] if len(srv) == 1 else [f"    nodes: [{', '.join(srv)}]   # node-rank = position"]
    if len(g.servers[0]) == 1:
        return [f"    replicas: [{', '.join(s[0] for s in g.servers)}]   # srt-slurm's {g.name}_workers"]
    return [f"    replicas:   # srt-slurm's {g.name}_workers, each over {len(g.servers[0])} nodes"] + [
        f"      - nodes: [{', '.join(s)}]" for s in g.servers]


def profile_text(rec: Recipe, name: str, serve_rel: dict[str, str]) -> str:
    """The profile (no schema line) for ``rec`` named ``name``; ``serve_rel``: group -> serve config
    path relative to the profile. Hosts are placeholders ``<role>-<k>`` at ``<role>-<k>.invalid``."""
    gpu_name, mib, _ = GPU_TYPES[rec.gpu_type]
    desc = f"srt-slurm recipe {rec.name}" + (f", container {rec.container}" if rec.container else "")
    out = [f"# From srt-slurm recipe {rec.path.name} ({rec.name}): one group per role, one serve config each.",
           f"# container image: {rec.container or '(not in the recipe)'}"]
    if rec.slurm:
        out.append("# slurm: " + ", ".join(f"{k} {v}" for k, v in rec.slurm.items()) + " (srt-slurm job settings)")
    out += ["# Hosts are placeholders (NAME.invalid): srt-slurm picks nodes at submit time. Set each host's",
            "# address (and ssh), sglang.tree, and the serve configs' model-path before deploying.",
            "version: 1", f"name: {name}", f"description: {_yaml(desc)}", f"model: {rec.model}", "",
            "sglang:",
            f"  version: \"{SGLANG_VERSION}\"   # the recipe's image is a nightly: set the release your hosts run",
            "  index_k_dtype: fp8", "  index_k_accounting: fp8", "", "hosts:"]
    for g in rec.groups:
        for srv in g.servers:
            for h in srv:
                out += [f"  - name: {h}",
                        f"    address: {h}.invalid   # placeholder: the node's address",
                        f"    gpus: {{model: {gpu_name}, count: {rec.gpus_per_node}, memory_mib: {mib}}}   "
                        f"# {rec.gpu_type}: nvidia-smi memory.total"]
    out += ["", "groups:"]
    for g in rec.groups:
        out += [f"  - name: {g.name}", f"    role: {g.role}", *_where_runs(g),
                f"    gpus: [{', '.join(map(str, g.gpus))}]" + ("   # on every node" if len(g.servers[0]) > 1 else ""),
                f"    serve_config: {serve_rel[g.name]}"]
        if g.env:
            out.append("    env:")
            out += [f"      {_key(k)}: {_yaml(v)}" for k, v in g.env.items()]
    if {"prefill", "decode"} <= {g.name for g in rec.groups}:
        head = next(g for g in rec.groups if g.name == "prefill").servers[0][0]
        out += ["  - name: router", "    role: router", f"    host: {head}", "    port: 8000",
                "    prefill: [prefill]", "    decode: [decode]"]
    return "\n".join(out) + "\n"
