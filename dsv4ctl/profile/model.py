"""Profiles: the deployment description every dsv4ctl command reads (``profiles/*.yaml``).

Structure is validated with JSON Schema (``PROFILE_SCHEMA``); cross-references and topology
(hosts named by groups, GPU indices, tp×pp(×dp) = GPUs) are checked after. Every error is one
line ``file:line: field: message`` (exit 2)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import InputError
from .yamlpos import Positions, dotted, load_yaml

ROLES = ("prefill", "decode", "colocated", "router")
GATEWAYS = {"sglang-router": "sglang_router.launch_router", "smg": "smg.launch_router"}
"""A router group's ``gateway`` -> the Python module its default launch runs (PyPI sglang-router
0.3.2, the default; PyPI smg 1.13.0, the gateway SGLang 0.5.23's README points to)."""
ROUTER_ONLY = ("gateway", "prometheus_host", "prometheus_port")

# Finite non-negative numbers (seconds, fractions); ``number`` excludes NaN/inf (see _validator).
_num = {"type": "number", "minimum": 0, "maximum": 1e9}
# GiB of memory: 100000 GiB per GPU or host is far beyond any hardware (typo / 1e300 guard).
MAX_GIB = 100000
_gib = {"type": "number", "minimum": 0, "maximum": MAX_GIB}
# GiB for every GPU of a group, or a list with one value per GPU (minimum/maximum apply to numbers only)
_gib_per_gpu = {"type": ["number", "array"], "minimum": 0, "maximum": MAX_GIB, "items": _gib, "minItems": 1}
_pos_int = {"type": "integer", "minimum": 1}
_par = {"type": "integer", "minimum": 1, "maximum": 1024}   # tp/dp/ep/pp sizes
_gpus = {"type": "array", "items": {"type": "integer", "minimum": 0}}
# a node: a host name (the group's ``gpus`` on it) or {host, gpus}
_nodes = {"type": "array", "minItems": 1, "items": {"oneOf": [
    {"type": "string", "minLength": 1, "description": "a host name"},
    {"type": "object", "description": "{host: NAME, gpus: [...]}", "additionalProperties": False, "required": ["host"],
     "properties": {"host": {"type": "string", "minLength": 1}, "gpus": _gpus}}]}}
PROFILE_SCHEMA: dict = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "model", "hosts", "groups"],
    "properties": {
        "version": {"const": 1},
        "name": {"type": "string", "minLength": 1},
        "description": {"type": "string"},
        "model": {"type": "string", "minLength": 1},
        "sglang": {
            "type": "object", "additionalProperties": False,
            "properties": {
                "version": {"type": "string"},
                "tree": {"type": ["string", "null"]},
                "base_ref": {"type": ["string", "null"]},
                "series": {"type": ["string", "null"]},
                "index_k_dtype": {"enum": ["fp8", "bf16", "fp4"]},
                "index_k_accounting": {"enum": ["fp8", "exact"]},
                "python": {"type": "string", "description": "unused (kept for old profiles): the interpreter is deploy.python"},
                # the Python environment the release runs on: a hashed lock shipped in the release
                "environment": {
                    "type": "object", "additionalProperties": False, "required": ["lock"],
                    "properties": {
                        "lock": {"type": "string", "minLength": 1,
                                 "description": "requirements lock with exact pins and hashes "
                                                "(uv pip compile --generate-hashes), relative to the profile"},
                        "uv": {"type": "string", "minLength": 1, "description": "uv on the hosts (default: uv)"},
                        "uv_args": {"type": "array", "items": {"type": "string"},
                                    "description": "extra uv pip sync arguments: how hosts reach packages"},
                    },
                },
                # releases as OCI images on the site's SGLang image (docs/images.md)
                "image": {
                    "type": "object", "additionalProperties": False, "required": ["base"],
                    "properties": {
                        "base": {"type": "string", "minLength": 1,
                                 "description": "the base image: REF@sha256:HEX (pinned), or a tag resolved to a "
                                                "digest at deploy (recorded); REF: a name, docker://, oci:DIR"},
                        "runtime": {"enum": ["podman", "docker"],
                                    "description": "the container runtime on the hosts (the control machine builds "
                                                   "with podman)"},
                        "gpus": {"enum": ["cdi", "none"],
                                 "description": "cdi: --device nvidia.com/gpu=N per GPU the group places (a host "
                                                "without a CDI spec is an error); none: CPU-only hosts"},
                        "shm_size": {"type": "string", "pattern": "^[0-9]+[bkmgBKMG]?$"},
                        "python": {"type": "string", "minLength": 1,
                                   "description": "the interpreter inside the image ({python}; default python3)"},
                        "store": {"type": "string", "minLength": 1,
                                  "description": "podman storage folder on the hosts ({root}: the deploy root); "
                                                 "default: the runtime's own"},
                        "runtime_args": {"type": "array", "items": {"type": "string"},
                                         "description": "global runtime arguments (--runtime runc, --cgroup-manager ...)"},
                        "run_args": {"type": "array", "items": {"type": "string"},
                                     "description": "extra run arguments (--ulimit nofile=N:N ...)"},
                        "mounts": {"type": "array", "items": {"type": "string", "pattern": "^/[^:]*(:/[^:]*)?$"},
                                   "description": "host folders mounted read-only: /src or /src:/dst"},
                        "build_host": {"type": "string", "minLength": 1,
                                       "description": "a host of hosts: (over SSH) that builds the images with its "
                                                      "podman; the build context goes there with rsync, the OCI "
                                                      "layout comes back (or is pushed to the registry from there); "
                                                      "default: this machine builds"},
                        "registry": {
                            "type": "object", "additionalProperties": False, "required": ["repository"],
                            "properties": {
                                "repository": {"type": "string", "pattern": "^[a-zA-Z0-9][^\\s@:/]*(:[0-9]+)?/[^\\s@:]+$",
                                               "description": "HOST[:PORT]/PATH releases are pushed to (tag: the "
                                                              "release id); the hosts pull from it"},
                                "auth_file": {"type": "string", "minLength": 1,
                                              "description": "containers auth.json / docker config.json with the "
                                                             "registry's credentials (relative to the profile); "
                                                             "never printed"},
                                "tls_verify": {"type": "boolean",
                                               "description": "false: plain HTTP or a self-signed certificate"},
                            },
                        },
                    },
                },
            },
        },
        "deploy": {
            "type": "object", "additionalProperties": False,
            "properties": {
                "root": {"type": "string"},
                "keep_releases": _pos_int,
                "service": {"enum": ["auto", "systemd", "launcher"]},
                # where servers run: ssh (a process per host under launcher/systemd) or slurm
                # (one Slurm job per server group, submitted from its node 0; docs/slurm.md)
                "backend": {"enum": ["ssh", "slurm"]},
                "slurm": {
                    "type": "object", "additionalProperties": False,
                    "properties": {
                        "partition": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}\\Z"},
                        "account": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}\\Z"},
                        "reservation": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}\\Z"},
                        "time_limit": {"type": "string", "pattern": "^(\\d+-)?\\d{1,2}(:\\d{2}){0,2}\\Z|^\\d+\\Z"},
                        "conf": {"type": "string", "minLength": 1,
                                 "description": "slurm.conf on the nodes (SLURM_CONF for sbatch/squeue/scancel); default: Slurm's own"},
                        "start_timeout_s": {"type": "number", "minimum": 1, "maximum": 1e9,
                                            "description": "seconds a server's new job may stay PENDING before the deploy fails and resubmits the previous release (default 600)"},
                        "submit_host": {"type": "string", "minLength": 1,
                                        "description": "the host of hosts: (a login host, or local: true for this machine) that runs sbatch/scancel/squeue/scontrol; default: each server's node 0"},
                        "shared_root": {"type": "boolean",
                                        "description": "every node's deploy root is one folder of a shared filesystem: one lock, one push, one current switch, per-node logs and pid files (logs/NODE/, run/NODE/); the submit host defaults to the first node (docs/slurm.md)"},
                    },
                },
                "health_timeout_s": _num,
                "python": {"type": "string"},
                "launch": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "plan": {
            # requests that must fit at the context length for plan's verdict (default 1)
            "type": "object", "additionalProperties": False,
            "properties": {"min_requests": _pos_int},
        },
        "check": {
            "type": "object", "additionalProperties": False,
            "properties": {
                "concurrency": {"oneOf": [_pos_int, {"type": "array", "items": _pos_int, "minItems": 1}]},
                "max_corruption": {"type": "number", "minimum": 0, "maximum": 1},
                "turns": _pos_int,
                "stall_timeout_s": _num,
                # the upgrade gate's paired A/B (deploy --promote; dsv4ctl/check/paired.py)
                "compare": {
                    "type": "object", "additionalProperties": False,
                    "properties": {
                        "pairs": _pos_int,
                        "baseline": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                        "delta": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                    },
                },
            },
        },
        "hosts": {
            "type": "array", "minItems": 1,
            "items": {
                "type": "object", "additionalProperties": False,
                "required": ["name", "address"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "address": {"type": "string", "minLength": 1},
                    "ssh": {
                        "type": "object", "additionalProperties": False,
                        "properties": {
                            "user": {"type": "string"},
                            "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                            "key": {"type": ["string", "null"]},
                            "jump": {"type": ["string", "null"]},
                            "known_hosts": {"type": ["string", "null"]},
                        },
                    },
                    "local": {"type": "boolean"},
                    "gpus": {
                        "type": "object", "additionalProperties": False,
                        "required": ["count", "memory_mib"],
                        "properties": {
                            "model": {"type": "string"},
                            "count": _pos_int,
                            "memory_mib": {"type": "integer", "minimum": 1, "maximum": MAX_GIB * 1024},
                        },
                    },
                    "ram_gib": _gib,
                    "root": {"type": "string"},
                },
            },
        },
        "groups": {
            "type": "array", "minItems": 1,
            "items": {
                "type": "object", "additionalProperties": False,
                "required": ["name", "role"],
                "properties": {
                    "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+\\Z"},
                    "role": {"enum": list(ROLES)},
                    "host": {"type": "string"},
                    # one server over several hosts: node-rank = position (SGLang --nnodes/--node-rank)
                    "nodes": _nodes,
                    # N independent servers of the group's shape, each on its own host(s)
                    "replicas": {"type": "array", "minItems": 1, "items": {"oneOf": [
                        {"type": "string", "minLength": 1, "description": "a host name"},
                        {"type": "object", "description": "{host: NAME} or {nodes: [...]}", "additionalProperties": False,
                         "properties": {"host": {"type": "string", "minLength": 1}, "nodes": _nodes,
                                        "gpus": _gpus}}]}},
                    "dist_init_port": {"type": "integer", "minimum": 1, "maximum": 65535},
                    "gpus": _gpus,
                    "tp": _par, "dp": _par, "ep": _par, "pp": _par,
                    "dp_attention": {"type": "boolean"},
                    "serve_config": {"type": "string"},
                    "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                    "env": {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}},
                    "memory": {
                        "type": "object", "additionalProperties": False,
                        "properties": {
                            # a number for every GPU of the group, or one per GPU (in ``gpus`` order)
                            "free_gib_before_load": _gib_per_gpu,
                            "weights_gib_per_rank": _gib,
                            "draft_weights_gib_per_rank": _gib,
                            "other_gib": _gib_per_gpu,
                        },
                    },
                    "prefill": {"type": "array", "items": {"type": "string"}},
                    "decode": {"type": "array", "items": {"type": "string"}},
                    "workers": {"type": "array", "items": {"type": "string"}},
                    "launch": {"type": "string"},
                    "gateway": {"enum": list(GATEWAYS)},
                    "prometheus_host": {"type": "string", "minLength": 1},
                    "prometheus_port": {"type": "integer", "minimum": 1, "maximum": 65535},
                },
            },
        },
    },
}


@dataclass
class Host:
    """One SSH-reachable GPU host. ``gpu_memory_mib`` is nvidia-smi's memory.total (MiB)."""

    name: str
    address: str
    user: Optional[str] = None
    port: int = 22
    key: Optional[str] = None
    jump: Optional[str] = None
    known_hosts: Optional[str] = None
    local: bool = False
    gpu_model: Optional[str] = None
    gpu_count: int = 0
    gpu_memory_mib: Optional[int] = None
    ram_gib: Optional[float] = None
    root: Optional[str] = None


@dataclass
class Memory:
    """Measured inputs (GiB): free before weight load (P), weights per rank (W), draft (MTP/EAGLE)
    weights per rank, other resident memory. ``free_gib_before_load`` and ``other_gib`` may be one
    value per GPU of the group (a list in ``gpus`` order, as ``dsv4ctl facts`` writes them): real
    hosts differ per GPU (field report C6) and SGLang sizes the pools from the minimum."""

    free_gib_before_load: Optional[float | list[float]] = None
    weights_gib_per_rank: Optional[float] = None
    other_gib: float | list[float] = 0.0
    draft_weights_gib_per_rank: Optional[float] = None

    def per_gpu(self, n: int) -> Optional[tuple[list[Optional[float]], list[float]]]:
        """(free before load, other) per GPU when either is a list, else None."""
        if not isinstance(self.free_gib_before_load, list) and not isinstance(self.other_gib, list):
            return None
        free = self.free_gib_before_load if isinstance(self.free_gib_before_load, list) else [self.free_gib_before_load] * n
        other = self.other_gib if isinstance(self.other_gib, list) else [self.other_gib] * n
        return list(free), list(other)


@dataclass(frozen=True)
class Node:
    """One node of an SGLang server: a host and the GPU indices the server uses on it. A server's
    nodes are in node-rank order (SGLang ``--node-rank`` = position; node 0 serves HTTP)."""

    host: str
    gpus: tuple[int, ...] = ()


TOPOLOGY_KEYS = ("tp", "dp", "pp", "ep", "dp_attention")
"""A group's topology keys in the profile: optional, since SGLang reads its topology from the serve
config; when given they must agree with it (:func:`dsv4ctl.plan.plan.topology`)."""


@dataclass
class Group:
    """A serving group: one SGLang server (or the router), or ``replicas`` servers of one shape.

    ``servers``: every server of the group, each a tuple of :class:`Node` in node-rank order (one
    node for a one-host server). ``host`` / ``gpus`` are node 0 of the first server (where its
    HTTP endpoint is); ``stated``: the topology keys the profile gives (:data:`TOPOLOGY_KEYS`)."""

    name: str
    role: str
    host: str
    gpus: list[int] = field(default_factory=list)
    servers: list[tuple[Node, ...]] = field(default_factory=list)
    stated: frozenset = frozenset()
    dist_init_port: Optional[int] = None
    tp: int = 1
    dp: int = 1
    ep: int = 1
    pp: int = 1
    dp_attention: bool = False
    serve_config: Optional[Path] = None
    port: Optional[int] = None
    env: dict[str, str] = field(default_factory=dict)
    memory: Memory = field(default_factory=Memory)
    prefill: list[str] = field(default_factory=list)
    decode: list[str] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)
    launch: Optional[str] = None
    gateway: Optional[str] = None
    prometheus_host: Optional[str] = None
    prometheus_port: Optional[int] = None
    line: int = 1

    @property
    def is_server(self) -> bool:
        """True for SGLang servers (everything but the router)."""
        return self.role != "router"

    @property
    def nodes(self) -> tuple[Node, ...]:
        """The first server's nodes in node-rank order (one for a one-host group)."""
        return self.servers[0] if self.servers else (Node(self.host, tuple(self.gpus)),)

    @property
    def nnodes(self) -> int:
        """Nodes per server (SGLang ``--nnodes``)."""
        return len(self.nodes)

    @property
    def replicas(self) -> int:
        """Independent servers of the group (1 without ``replicas``)."""
        return max(len(self.servers), 1)

    @property
    def server_gpus(self) -> list[tuple[int, str, int]]:
        """(node rank, host, GPU index) of every GPU of the first server, node-major."""
        return [(n, node.host, g) for n, node in enumerate(self.nodes) for g in node.gpus]

    @property
    def hosts(self) -> list[str]:
        """Every host the group runs on (all nodes of all servers), first use order, once each."""
        return list(dict.fromkeys(node.host for srv in (self.servers or [self.nodes]) for node in srv))

    @property
    def attn_dp_size(self) -> int:
        """Attention DP size SGLang uses for pool sizing (dp with --enable-dp-attention, else 1)."""
        return self.dp if self.dp_attention else 1


@dataclass
class Profile:
    """A loaded, validated profile. Relative paths are resolved against the profile's folder."""

    path: Path
    name: str
    model: str
    hosts: dict[str, Host]
    groups: list[Group]
    sglang: dict[str, Any]
    deploy: dict[str, Any]
    check: dict[str, Any]
    positions: Positions
    raw: dict

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    def group(self, name: str) -> Group:
        """The group called ``name``; InputError listing the names otherwise."""
        for g in self.groups:
            if g.name == name:
                return g
        raise InputError(f"{self.path}: no group {name!r} (groups: {', '.join(g.name for g in self.groups)})")

    def servers(self) -> list[Group]:
        """Groups that run an SGLang server (not the router)."""
        return [g for g in self.groups if g.is_server]

    @property
    def index_k_dtype(self) -> str:
        return self.sglang.get("index_k_dtype", "fp8")

    @property
    def index_k_accounting(self) -> str:
        return self.sglang.get("index_k_accounting", "fp8")


def _fail(pos: Positions, path: tuple, msg: str) -> InputError:
    return InputError(f"{pos.where(path)}: {dotted(path)}: {msg}")


_TYPES = {
    "object": lambda x: isinstance(x, dict),
    "array": lambda x: isinstance(x, list),
    "string": lambda x: isinstance(x, str),
    "boolean": lambda x: isinstance(x, bool),
    "null": lambda x: x is None,
    "integer": lambda x: isinstance(x, int) and not isinstance(x, bool),
    "number": lambda x: (isinstance(x, int) and not isinstance(x, bool)) or (isinstance(x, float) and math.isfinite(x)),
}


def conforms(schema: dict, x: Any) -> bool:
    """True when ``x`` is valid under ``schema`` with the same rules as :func:`_validator` (strict
    ``integer``/``number``), for the keywords PROFILE_SCHEMA uses (type, enum, const, minimum,
    maximum, exclusiveMinimum, exclusiveMaximum, minLength, pattern, required, properties,
    additionalProperties, items, minItems, oneOf, description; any other keyword raises KeyError, so a schema edit cannot slip past it).

    Own code, not jsonschema, because importing jsonschema costs 86 ms, two thirds of ``import
    typer`` (min of 12 runs on this machine kind; benchmarks/startup.py): a valid profile never
    imports it, and an invalid one gets jsonschema's first error, by line (:func:`_validate_schema`)."""
    for k, v in schema.items():
        if k == "type":
            if not any(_TYPES[ty](x) for ty in ([v] if isinstance(v, str) else v)):
                return False
        elif k == "enum":
            if not any(x == e and type(x) is type(e) for e in v):
                return False
        elif k == "const":
            if not (x == v and type(x) is type(v)):
                return False
        elif k in ("minimum", "maximum"):
            if _TYPES["number"](x) and (x < v if k == "minimum" else x > v):
                return False
        elif k in ("exclusiveMinimum", "exclusiveMaximum"):
            if _TYPES["number"](x) and (x <= v if k == "exclusiveMinimum" else x >= v):
                return False
        elif k == "minLength":
            if isinstance(x, str) and len(x) < v:
                return False
        elif k == "pattern":
            import re
            if isinstance(x, str) and not re.search(v, x):
                return False
        elif k == "required":
            if isinstance(x, dict) and any(r not in x for r in v):
                return False
        elif k == "properties":
            if isinstance(x, dict) and not all(conforms(v[n], x[n]) for n in v if n in x):
                return False
        elif k == "additionalProperties":
            if isinstance(x, dict):
                extra = [n for n in x if n not in schema.get("properties", {})]
                if v is False and extra or isinstance(v, dict) and not all(conforms(v, x[n]) for n in extra):
                    return False
        elif k == "items":
            if isinstance(x, list) and not all(conforms(v, i) for i in x):
                return False
        elif k == "minItems":
            if isinstance(x, list) and len(x) < v:
                return False
        elif k == "oneOf":
            if sum(conforms(s, x) for s in v) != 1:
                return False
        elif k == "description":
            continue
        else:
            raise KeyError(f"conforms: schema keyword {k!r} is not implemented")
    return True


def _validator():
    """Draft 2020-12 validator whose ``integer`` is a real int (not bool, not ``4.0``) and whose
    ``number`` is a finite int/float (not bool, NaN or ±inf): jsonschema's defaults accept
    ``4.0`` as an integer and NaN passes ``minimum``."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine_many({
        "integer": lambda _c, x: isinstance(x, int) and not isinstance(x, bool),
        "number": lambda _c, x: (isinstance(x, int) and not isinstance(x, bool))
        or (isinstance(x, float) and math.isfinite(x)),
    })
    return jsonschema.validators.extend(base, type_checker=checker)(PROFILE_SCHEMA)


def _validate_schema(data: Any, pos: Positions) -> None:
    """Validate ``data`` against PROFILE_SCHEMA; InputError on the first error by line.

    A valid document is checked by :func:`conforms` alone; only an invalid one imports jsonschema,
    whose first error (by line) is reported."""
    if conforms(PROFILE_SCHEMA, data):
        return
    validator = _validator()
    errors = sorted(validator.iter_errors(data), key=lambda e: (pos.line(tuple(e.absolute_path)), list(e.absolute_path)))
    if errors:
        _explain(errors[0], pos)


def _explain(e, pos: Positions) -> None:
    """InputError (file:line) for jsonschema error ``e``. A ``oneOf`` (a node: a host name or a
    mapping) is explained by the one alternative of the value's own type (a mapping without
    ``host``: "'host' is required"), else by naming the alternatives."""
    p = tuple(e.absolute_path)
    if e.validator == "oneOf":
        alts = e.validator_value
        same = [i for i, a in enumerate(alts) if "type" in a and conforms({"type": a["type"]}, e.instance)]
        subs = sorted((c for c in e.context if c.relative_schema_path and c.relative_schema_path[0] in same),
                      key=lambda c: (pos.line(tuple(c.absolute_path)), list(c.absolute_path)))
        if len(same) == 1 and subs:
            _explain(subs[0], pos)
        words = {"string": "a name", "object": "a mapping", "array": "a list", "integer": "an integer",
                 "number": "a number", "boolean": "true or false"}
        want = " or ".join(a.get("description") or words.get(a.get("type"), "a value") for a in alts)
        raise _fail(pos, p, f"expected {want}, got {e.instance!r}")
    if e.validator == "additionalProperties":
        extra = sorted(set(e.instance) - set(e.schema.get("properties", {})), key=lambda k: (str(type(k)), str(k)))
        p = p + (extra[0],)
        raise _fail(pos, p, "unknown field")
    if e.validator == "required":
        raise _fail(pos, p, e.message.replace("is a required property", "is required"))
    if e.validator == "type" and isinstance(e.instance, float) and not math.isfinite(e.instance):
        raise _fail(pos, p, f"must be a finite number, got {e.instance!r}")
    raise _fail(pos, p, e.message)


def _env(env: dict, pos: Positions, path: tuple) -> dict[str, str]:
    """A group's environment: names must be shell variable names (``SGLANG_X``), values strings."""
    import re
    out = {}
    for k, v in env.items():
        if not isinstance(k, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise _fail(pos, path + (k,), f"{k!r} is not an environment variable name")
        out[k] = str(v)
    return out


NAME_MAX = 255       # bytes of one path component (Linux)
PATH_MAX = 4095      # bytes of a whole path


def _path_problem(value: str) -> Optional[str]:
    """Why ``value`` cannot be a path on this system (None when it can): a NUL byte, a component
    over NAME_MAX bytes or a path over PATH_MAX bytes (the system refuses them with ENAMETOOLONG,
    which used to escape as a traceback)."""
    raw = value.encode("utf-8", "surrogateescape")
    if b"\0" in raw:
        return "not a usable path (a NUL byte)"
    if len(raw) > PATH_MAX:
        return f"not a usable path ({len(raw)} bytes, the limit is {PATH_MAX})"
    if any(len(part) > NAME_MAX for part in raw.split(b"/")):
        return f"not a usable path (a name over {NAME_MAX} bytes)"
    return None


def _check_paths(data: dict, pos: Positions) -> None:
    """Every path field of the profile can be a path on this system (see :func:`_path_problem`)."""
    fields = [("sglang", "tree"), ("sglang", "series"), ("sglang", "environment", "lock"), ("deploy", "root")]
    fields += [("groups", i, "serve_config") for i in range(len(data.get("groups") or []))]
    for i, h in enumerate(data.get("hosts") or []):
        fields += [("hosts", i, "root"), ("hosts", i, "ssh", "key"), ("hosts", i, "ssh", "known_hosts")]
    for f in fields:
        v = data
        for k in f:
            v = v.get(k) if isinstance(v, dict) else (v[k] if isinstance(v, list) and k < len(v) else None)
            if v is None:
                break
        if isinstance(v, str) and (why := _path_problem(v)):
            raise _fail(pos, f, why)


def _servers(g: dict, gp: tuple, hosts: dict[str, Host], pos: Positions) -> list[tuple[Node, ...]]:
    """The servers of a profile group: ``host`` (one server, one node), ``nodes`` (one server over
    several hosts) or ``replicas`` (several servers, each a ``host``, a host name or ``nodes``).
    A node's GPUs are its own ``gpus``, else the replica's, else the group's. InputError (file:line)
    for none or two of the three, an unknown host or a host twice in one server."""
    given = [k for k in ("host", "nodes", "replicas") if k in g]
    if len(given) != 1:
        what = "none" if not given else " and ".join(given)
        raise _fail(pos, gp + ((given[1],) if len(given) > 1 else ("name",)),
                    f"a group runs on one of host, nodes or replicas (got {what})")
    gpus = tuple(g.get("gpus", ()))

    def nodes(items: list, path: tuple, default: tuple) -> tuple[Node, ...]:
        out = []
        for k, it in enumerate(items):
            host, own = (it, default) if isinstance(it, str) else (it["host"], tuple(it.get("gpus", default)))
            where = path + (k,) if isinstance(it, str) else path + (k, "host")
            if host not in hosts:
                raise _fail(pos, where, f"unknown host {host!r} (hosts: {', '.join(hosts)})")
            if any(n.host == host for n in out):
                raise _fail(pos, where, f"host {host!r} is already node {[n.host for n in out].index(host)} "
                                        "of this server (one node per host)")
            out.append(Node(host, own))
        return tuple(out)

    if "host" in g:
        if g["host"] not in hosts:
            raise _fail(pos, gp + ("host",), f"unknown host {g['host']!r} (hosts: {', '.join(hosts)})")
        return [(Node(g["host"], gpus),)]
    if "nodes" in g:
        return [nodes(g["nodes"], gp + ("nodes",), gpus)]
    out = []
    for r, rep in enumerate(g["replicas"]):
        rp = gp + ("replicas", r)
        if isinstance(rep, str):
            if rep not in hosts:
                raise _fail(pos, rp, f"unknown host {rep!r} (hosts: {', '.join(hosts)})")
            out.append((Node(rep, gpus),))
            continue
        if ("host" in rep) == ("nodes" in rep):
            raise _fail(pos, rp, "a replica runs on host or nodes (one of them)")
        own = tuple(rep.get("gpus", gpus))
        out.append(nodes([rep["host"]] if "host" in rep else rep["nodes"],
                         rp + (("nodes",) if "nodes" in rep else ()), own))
    return out


def _check_server_gpus(g: dict, gp: tuple, grp: Group, hosts: dict[str, Host],
                       used: dict[tuple[str, int], str], pos: Positions) -> None:
    """Every node of every server of ``grp`` has GPU indices its host has, none twice, none used
    by another server (of this or another group), the same count on every node of a server (SGLang
    puts tp*pp/nnodes ranks on each), and its host's ``memory_mib``. InputError (file:line)."""
    for r, srv in enumerate(grp.servers):
        for n, node in enumerate(srv):
            host = hosts[node.host]
            if "replicas" in g:
                rep = g["replicas"][r]
                path = gp + (("replicas", r, "nodes", n) if isinstance(rep, dict) and "nodes" in rep
                             else ("replicas", r))
            elif "nodes" in g:
                path = gp + ("nodes", n)
            else:
                path = gp + ("gpus",)
            label = "" if len(srv) == 1 and len(grp.servers) == 1 else (
                f"node {n} ({node.host})" + (f" of replica {r}" if len(grp.servers) > 1 else "") + ": ")
            if not node.gpus:
                raise _fail(pos, path, f"{label}a server group needs GPU indices (gpus)")
            if len(set(node.gpus)) != len(node.gpus):
                raise _fail(pos, path, f"{label}GPU index listed twice")
            for gi in node.gpus:
                if host.gpu_count and gi >= host.gpu_count:
                    raise _fail(pos, path, f"{label}GPU {gi} outside host {host.name}'s {host.gpu_count} GPUs")
                if (host.name, gi) in used:
                    raise _fail(pos, path, f"{label}GPU {gi} of {host.name} already used by {used[(host.name, gi)]}")
                used[(host.name, gi)] = f"group {grp.name!r}" + (f" replica {r}" if len(grp.servers) > 1 else "")
            first = grp.servers[0][0]
            if len(srv) != len(grp.servers[0]):
                raise _fail(pos, path, f"replica {r} has {len(srv)} node(s), replica 0 has {len(grp.servers[0])}: "
                                       "replicas run one serve config, so they have one shape")
            if sorted(node.gpus) != sorted(first.gpus):
                # one serve config (base-gpu-id, gpu-id-step) places the ranks of every node alike
                raise _fail(pos, path, f"{label}GPUs {','.join(map(str, node.gpus))}, but node 0"
                                       f"{' of replica 0' if len(grp.servers) > 1 else ''} has "
                                       f"{','.join(map(str, first.gpus))}: every node runs the same serve config, "
                                       "which puts its ranks on the same GPU indices on each node")
            others = [hosts[x.host] for x in srv[:n]]
            if host.local and any(o.local for o in others) or any(o.address == host.address for o in others):
                raise _fail(pos, path, f"{label}host {host.name} is the same machine as another node of this server "
                                       f"({'local: true' if host.local else 'address ' + host.address}): one node "
                                       "per machine")
            if not host.gpu_memory_mib:
                raise _fail(pos, ("hosts", list(hosts).index(host.name), "gpus"),
                            "memory_mib is required for hosts that run server groups")


def load_profile(path: Path | str) -> Profile:
    """Load and validate a profile file. Raises InputError (exit 2) naming file:line and field."""
    path = Path(path)
    data, pos = load_yaml(path)
    if data is None:
        raise InputError(f"{path}:1: empty profile")
    if not isinstance(data, dict):
        raise InputError(f"{path}:1: a profile must be a mapping")
    _validate_schema(data, pos)
    _check_paths(data, pos)
    hosts = _hosts(data, pos)
    submit = ((data.get("deploy") or {}).get("slurm") or {}).get("submit_host")
    if submit is not None and submit not in hosts:
        raise _fail(pos, ("deploy", "slurm", "submit_host"),
                    f"submit_host {submit!r} is no host of hosts: (hosts: {', '.join(hosts)})")

    groups: list[Group] = []
    names: set[str] = set()
    used: dict[tuple[str, int], str] = {}
    for i, g in enumerate(data["groups"]):
        gp = ("groups", i)
        if g["name"] in names:
            raise _fail(pos, gp + ("name",), f"duplicate group name {g['name']!r}")
        names.add(g["name"])
        grp = _group(g, gp, path, hosts, pos)
        if grp.is_server:
            _check_server_group(g, gp, grp, hosts, used, pos)
        groups.append(grp)
    for i, g in enumerate(groups):
        for key in ("prefill", "decode", "workers"):
            for ref in getattr(g, key):
                if ref not in names or ref == g.name:
                    raise _fail(pos, ("groups", i, key), f"unknown group {ref!r}")
    return Profile(path=path, name=data["name"], model=data["model"], hosts=hosts, groups=groups,
                   sglang=dict(data.get("sglang", {})), deploy=dict(data.get("deploy", {})),
                   check=dict(data.get("check", {})), positions=pos, raw=data)


def _hosts(data: dict, pos) -> dict[str, Host]:
    """name -> :class:`Host` of the profile's ``hosts:`` list, in file order; InputError for a
    duplicate name."""
    hosts: dict[str, Host] = {}
    for i, h in enumerate(data["hosts"]):
        if h["name"] in hosts:
            raise _fail(pos, ("hosts", i, "name"), f"duplicate host name {h['name']!r}")
        ssh = h.get("ssh", {})
        gpus = h.get("gpus", {})
        hosts[h["name"]] = Host(
            name=h["name"], address=h["address"], user=ssh.get("user"), port=ssh.get("port", 22),
            key=ssh.get("key"), jump=ssh.get("jump"), known_hosts=ssh.get("known_hosts"),
            local=h.get("local", False), gpu_model=gpus.get("model"), gpu_count=gpus.get("count", 0),
            gpu_memory_mib=gpus.get("memory_mib"), ram_gib=h.get("ram_gib"), root=h.get("root"))
    return hosts


def _group(g: dict, gp: tuple, path: Path, hosts: dict[str, Host], pos) -> Group:
    """The :class:`Group` of entry ``g`` (at ``gp`` = ``("groups", i)``) of the profile at ``path``
    (serve configs relative to it), with its servers placed on ``hosts``; InputError for a setting
    of the other kind of group (router vs server) or a router's Prometheus port equal to its own."""
    servers = _servers(g, gp, hosts, pos)
    node0 = servers[0][0]
    grp = Group(
        name=g["name"], role=g["role"], host=node0.host, gpus=list(node0.gpus), servers=servers,
        stated=frozenset(k for k in TOPOLOGY_KEYS if k in g), dist_init_port=g.get("dist_init_port"),
        tp=g.get("tp", 1), dp=g.get("dp", 1), ep=g.get("ep", 1), pp=g.get("pp", 1),
        dp_attention=g.get("dp_attention", False),
        serve_config=(path.parent / g["serve_config"]) if g.get("serve_config") else None,
        port=g.get("port"), env=_env(g.get("env", {}), pos, gp + ("env",)),
        memory=Memory(**g.get("memory", {})), prefill=list(g.get("prefill", [])),
        decode=list(g.get("decode", [])), workers=list(g.get("workers", [])),
        launch=g.get("launch"), gateway=g.get("gateway"), prometheus_host=g.get("prometheus_host"),
        prometheus_port=g.get("prometheus_port"), line=pos.line(gp))
    for key in ROUTER_ONLY:
        if key in g and grp.is_server:
            raise _fail(pos, gp + (key,), f"{key} is a router group's setting (this group is {grp.role})")
    if not grp.is_server:
        for key in ("nodes", "replicas", "dist_init_port"):
            if key in g:
                raise _fail(pos, gp + (key,), f"{key} is a server group's setting (this group is the router)")
    if grp.prometheus_port is not None and grp.prometheus_port == grp.port:
        raise _fail(pos, gp + ("prometheus_port",), f"prometheus_port {grp.prometheus_port} is the router's own port")
    return grp


def _check_server_group(g: dict, gp: tuple, grp: Group, hosts: dict[str, Host], used: dict, pos) -> None:
    """InputError unless server group ``grp`` (entry ``g`` at ``gp``) holds together: its GPUs
    (:func:`_check_server_gpus`; ``used``: (host, GPU) -> group, filled), tp*pp(*dp) equal to its
    GPUs when stated or without a serve config, no plain DP across nodes (SGLang 0.5.23
    arg_groups/validation_hook.py check_server_args), per-GPU memory lists of one GPU count, and
    dp dividing tp with dp_attention."""
    _check_server_gpus(g, gp, grp, hosts, used, pos)
    n_gpus = len(grp.server_gpus)
    # without a serve config the profile's values are what is planned: they must fit
    if grp.stated & {"tp", "pp", "dp"} or grp.serve_config is None:
        need = grp.tp * grp.pp * (1 if grp.dp_attention else grp.dp)
        if need != n_gpus:
            what = "tp*pp" if grp.dp_attention or grp.dp == 1 else "tp*pp*dp"
            where = "" if grp.nnodes == 1 else f" ({grp.nnodes} nodes x {len(grp.gpus)})"
            raise _fail(pos, gp + ("tp" if "tp" in g else "pp" if "pp" in g else "dp",),
                        f"{what} = {need} does not match the {n_gpus} GPUs of the group{where}")
    if grp.nnodes > 1 and grp.dp > 1 and not grp.dp_attention:
        # SGLang 0.5.23 arg_groups/validation_hook.py check_server_args
        raise _fail(pos, gp + ("dp",), "SGLang refuses data-parallel replicas across nodes "
                    "(multi-node DP is not supported): use attention DP (dp_attention: true) or replicas")
    _check_memory_lists(g, gp, n_gpus, grp.replicas, pos)
    if grp.dp_attention and grp.tp % grp.dp:
        raise _fail(pos, gp + ("dp",), f"dp {grp.dp} must divide tp {grp.tp} with dp_attention")


def _check_memory_lists(g: dict, gp: tuple, n_gpus: int, replicas: int, pos) -> None:
    """InputError unless the group's per-GPU ``memory`` lists (free_gib_before_load, other_gib)
    have one value per GPU of one server (``n_gpus``) or of all ``replicas``, both the same count."""
    lists = {}
    for key in ("free_gib_before_load", "other_gib"):
        v = g.get("memory", {}).get(key)
        total = n_gpus * replicas
        if isinstance(v, list) and len(v) not in (n_gpus, total):
            count = f"{n_gpus}" if total == n_gpus else f"{n_gpus} (one server) or {total} (all replicas)"
            raise _fail(pos, gp + ("memory", key),
                        f"{len(v)} per-GPU values for the group's {count} GPUs")
        if isinstance(v, list):
            lists[key] = len(v)
    if len(set(lists.values())) > 1:
        raise _fail(pos, gp + ("memory", "other_gib"),
                    f"{lists['other_gib']} per-GPU values, but free_gib_before_load has "
                    f"{lists['free_gib_before_load']}: give both for the same GPUs")
