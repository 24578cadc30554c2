"""The resolved deployment: a profile and its serve configs, read once, answering every question a
command asks (see ``../shared/design/architecture.md``, idea 1).

:func:`resolve` turns a validated :class:`~dsv4ctl.profile.model.Profile` into a :class:`Deployment`.
Every default of the ``sglang``, ``deploy`` and ``check`` sections is declared once here, next to
its typed setting; the port and URL rule (IPv6-safe), the served model, the bootstrap port, the
host root, the python, the launch template and the SGLang tree / patch series paths each have one
home. Serve configs are read lazily, at most once per Deployment (:mod:`.serveconfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import InputError
from .model import Group, Host, Profile
from .serveconfig import ServeConfig, read_serve_config

# SGLang 0.5.23 srt/server_args.py: ``port: int = 30000``; the router's port in the reference
# launch (ops §1.3, §3.4) is 8000.
DEFAULT_SERVER_PORT = 30000
DEFAULT_ROUTER_PORT = 8000
# SGLang 0.5.23 srt/server_args.py: ``disaggregation_bootstrap_port: int = 8998``: where a prefill
# server's KV bootstrap listener is when its serve config does not say.
DEFAULT_BOOTSTRAP_PORT = 8998
DEFAULT_GATEWAY = "sglang-router"
# A multi-node server's torch.distributed rendezvous port on node 0 when neither the group's
# ``dist_init_port`` nor the serve config's ``dist-init-addr`` gives one (dsv4ctl's choice).
DEFAULT_DIST_INIT_PORT = 5000
ZMQ_PORTS = 6                 # server_args.py PortArgs: NUM_DERIVED_PORTS (port_base .. + 5)
ZMQ_TCP_PORT_DELTA = 233      # server_args.py: one-node attention DP's ports start at port + 233
# Both gateways open a Prometheus listener, default 0.0.0.0:29000; a second router on the host
# then dies with "Address already in use". dsv4ctl passes router port + this offset instead
# (8000 -> 29000, the gateway's own default), minus it when that is over 65535.
PROMETHEUS_PORT_OFFSET = 21000
DEFAULT_PROMETHEUS_HOST = "0.0.0.0"

DEFAULT_LAUNCH = {
    "server": "env PYTHONPATH={tree}/python {python} -m sglang.launch_server --config {config} --port {port}",
    "router": "{python} -m {module} {router_args} --host 0.0.0.0 --port {port}",
}
"""Built-in launch templates; ``{module}`` of the router's is filled from its ``gateway`` when the
Deployment is resolved (:data:`~dsv4ctl.profile.model.GATEWAYS`), the rest at launch."""


@dataclass(frozen=True)
class SGLangSettings:
    """The profile's ``sglang:`` section. ``tree``/``series`` are absolute (relative paths are
    taken from the profile's folder); an unset ``series`` means no patch series, for plan and
    deploy alike (the release is ``base_ref`` as is, and plan takes index-K from the profile)."""

    version: str = "0.5.23"
    tree: Optional[Path] = None
    base_ref: Optional[str] = None
    series: Optional[Path] = None
    index_k_dtype: str = "fp8"
    index_k_accounting: str = "fp8"
    environment: Optional["EnvironmentSettings"] = None
    image: Optional["ImageSettings"] = None


@dataclass(frozen=True)
class ImageSettings:
    """``sglang.image``: releases ship as OCI images (docs/images.md). ``base`` the base image
    reference as written (``REF@sha256:HEX`` pins it; a tag is resolved to a digest when the
    release's image is built, and the digest recorded); ``runtime`` (podman); ``gpus``: ``cdi``
    (one ``--device nvidia.com/gpu=N`` per GPU the group places on the host) or ``none``
    (CPU-only hosts); ``shm_size`` (``--shm-size``; SGLang's NCCL and its scheduler's shared
    memory); ``python`` the interpreter inside the image; ``store`` podman's storage folder on
    the hosts (``{root}``: the deploy root; None: the runtime's default); ``runtime_args``
    global runtime arguments, ``run_args`` extra ``run`` arguments, ``mounts`` host folders
    mounted read-only (``/src`` or ``/src:/dst``); ``registry`` (``HOST[:PORT]/PATH``: releases
    are pushed there and the hosts pull from it, in place of the registry-free ship),
    ``registry_auth_file`` (absolute: a containers auth.json / docker config.json with its
    credentials; never printed, sent to a host on stdin for its pull only) and
    ``registry_tls_verify`` (False: plain HTTP or a self-signed certificate); ``build_host`` the
    host of ``hosts:`` (over SSH) that builds the images with its podman (None: the control
    machine builds; docs/images.md, "A build host")."""

    base: str
    runtime: str = "podman"
    gpus: str = "cdi"
    shm_size: str = "32g"
    python: str = "python3"
    store: Optional[str] = None
    runtime_args: tuple[str, ...] = ()
    run_args: tuple[str, ...] = ()
    mounts: tuple[str, ...] = ()
    registry: Optional[str] = None
    registry_auth_file: Optional[Path] = None
    registry_tls_verify: bool = True
    build_host: Optional[str] = None


@dataclass(frozen=True)
class EnvironmentSettings:
    """``sglang.environment``: ``lock`` (absolute path of the hashed requirements lock the
    release ships as ``environment.lock``), ``uv`` (the uv command on the hosts) and ``uv_args``
    (extra ``uv pip sync`` arguments: index URL, ``--find-links``, ``--cache-dir``; not part of
    the release id, the hashes pin the content)."""

    lock: Path
    uv: str = "uv"
    uv_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class SlurmSettings:
    """The profile's ``deploy.slurm:`` section: where a server group's job runs (Slurm's
    ``--partition``, ``--account``, ``--reservation``, ``--time``) and the ``slurm.conf`` the
    nodes' Slurm commands read (``SLURM_CONF``; None: Slurm's default)."""

    partition: Optional[str] = None
    account: Optional[str] = None
    reservation: Optional[str] = None
    time_limit: Optional[str] = None
    conf: Optional[str] = None
    submit_host: Optional[str] = None     # the host (of hosts:) that runs sbatch/scancel/squeue/scontrol; None: each server's node 0
    start_timeout_s: Optional[float] = None   # how long a new job may stay PENDING (None: 600 s; deploy/slurmwait.py)
    shared_root: bool = False             # every node's root is one folder of a shared filesystem (docs/slurm.md)


@dataclass(frozen=True)
class DeploySettings:
    """The profile's ``deploy:`` section (seconds for timeouts)."""

    root: str = "/srv/dsv4ctl"
    keep_releases: int = 5
    service: str = "auto"
    backend: str = "ssh"                     # ssh | slurm (where servers run)
    slurm: "SlurmSettings | None" = None      # deploy.slurm (with backend slurm)
    health_timeout_s: float = 900.0
    python: str = "python3"
    launch: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CheckSettings:
    """The profile's ``check:`` section: the load gate (``check load`` and ``--promote``)."""

    concurrency: tuple[int, ...] = (64,)
    max_corruption: float = 0.01
    turns: int = 8
    stall_timeout_s: float = 60.0
    compare_pairs: Optional[int] = None      # check.compare.pairs: None = sized (dsv4ctl.check.paired)
    compare_baseline: float = 0.01           # check.compare.baseline: the running release's assumed rate
    compare_delta: float = 0.01              # check.compare.delta: the regression to detect

    @property
    def concurrency_arg(self) -> str:
        """``--concurrency`` spelling: ``64`` or ``1,20,40``."""
        return ",".join(map(str, self.concurrency))


def http_url(address: str, port: int) -> str:
    """``http://address:port``; an IPv6 literal gets brackets (``http://[::1]:30000``)."""
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"http://{host}:{int(port)}"


def _abs_root(value: str, where: str) -> str:
    import posixpath
    root = str(value).rstrip("/")
    if not root.startswith("/") or posixpath.normpath(root) in ("/", "//") or "\n" in root:
        raise InputError(f"{where}: {value!r}: must be an absolute path other than /")
    return root


def parse_host_port(addr: str) -> tuple[str, int]:
    """(host, port) of a ``host:port`` / ``[v6]:port`` string as SGLang 0.5.23 parses
    ``--dist-init-addr`` (srt/utils/network.py ``NetworkAddress.parse``). ValueError (its message
    style) for an empty string, a missing port or closing bracket, a bare IPv6 address, or a port
    that is not an integer in 1..65535."""
    import ipaddress
    addr = str(addr)
    if not addr:
        raise ValueError("empty address")
    if addr.startswith("["):
        close = addr.find("]")
        if close == -1:
            raise ValueError(f"missing closing bracket in IPv6 address {addr!r}")
        host, rest = addr[1:close], addr[close + 1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"invalid IPv6 address inside brackets {host!r}") from None
        if not rest.startswith(":") or len(rest) < 2:
            raise ValueError(f"expected ':port' after the closing bracket in {addr!r}")
        port = rest[1:]
    else:
        if ":" not in addr:
            raise ValueError(f"missing port (host:port expected) in {addr!r}")
        host, port = addr.rsplit(":", 1)
        if not host:
            raise ValueError(f"empty host in {addr!r}")
        if ":" in host:
            raise ValueError(f"a bare IPv6 address is ambiguous: {addr!r} (write [{host}]:{port})")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"port {port!r} is not a port number (1..65535)")
    return host, int(port)


def _port(value: Any, where: str, what: str = "port") -> int:
    """A TCP port from a serve config value: an integer (or integer string) in 1..65535."""
    if isinstance(value, bool) or isinstance(value, float) or not str(value).strip().lstrip("+").isdigit():
        raise InputError(f"{where}: {what}: {value!r} is not a port number (1..65535)")
    n = int(str(value).strip())
    if not 1 <= n <= 65535:
        raise InputError(f"{where}: {what}: {value!r} is not a port number (1..65535)")
    return n


@dataclass(frozen=True)
class ServerNode:
    """One node of one server of a group: ``server`` is the group's name for the first server and
    ``NAME#R`` for replica R (as :attr:`GroupView.replica_urls`); ``node`` is SGLang's
    ``--node-rank`` of ``nnodes``; ``gpus`` the GPU indices it uses on ``host``."""

    server: str
    replica: int
    node: int
    nnodes: int
    host: str
    gpus: tuple[int, ...]


class GroupView:
    """One group as a command sees it: the profile's :class:`Group` plus what its serve config and
    the host say. The serve config is read on first use and kept."""

    def __init__(self, dep: "Deployment", group: Group):
        self._dep = dep
        self.group = group
        self._serve: Optional[ServeConfig] = None

    def __repr__(self) -> str:
        return f"GroupView({self.name!r})"

    @property
    def name(self) -> str:
        return self.group.name

    @property
    def role(self) -> str:
        return self.group.role

    @property
    def is_server(self) -> bool:
        return self.group.is_server

    @property
    def host(self) -> Host:
        return self._dep.profile.hosts[self.group.host]

    @property
    def serve_config_path(self) -> Optional[Path]:
        return self.group.serve_config

    @property
    def serve(self) -> Optional[ServeConfig]:
        """The parsed serve config (None for a group without one, e.g. the router).

        Raises InputError (exit 2) naming the profile line for a missing file, and the errors of
        :func:`read_serve_config`."""
        if self._serve is None and self.group.serve_config is not None:
            p = self._dep.profile
            gi = p.groups.index(self.group)
            if not self.group.serve_config.exists():
                raise InputError(f"{p.positions.where(('groups', gi, 'serve_config'))}: "
                                 f"groups[{gi}].serve_config: no such file {self.group.serve_config}")
            if not self.group.serve_config.is_file():
                raise InputError(f"{p.positions.where(('groups', gi, 'serve_config'))}: "
                                 f"groups[{gi}].serve_config: not a regular file "
                                 f"({'a folder' if self.group.serve_config.is_dir() else 'a device, pipe or socket'}) "
                                 f"{self.group.serve_config}")
            self._serve = read_serve_config(self.group.serve_config)
        return self._serve

    def arg(self, key: str, default: Any = None) -> Any:
        """Canonical serve-config argument ``key`` (an alias counts), else ``default``."""
        s = self.serve
        return s.get(key, default) if s is not None else default

    @property
    def port(self) -> int:
        """The group's HTTP port: the profile's ``port``, else the serve config's ``port``, else
        SGLang's default 30000 (router: 8000)."""
        if self.group.port:
            return int(self.group.port)
        v = self.arg("port")
        if v is not None:
            return _port(v, self.serve.where("port"))
        return DEFAULT_ROUTER_PORT if self.role == "router" else DEFAULT_SERVER_PORT

    @property
    def url(self) -> str:
        """``http://<host address>:<port>``, IPv6-safe."""
        return http_url(self.host.address, self.port)

    @property
    def replica_urls(self) -> list[tuple[str, str]]:
        """(name, URL) of every server of the group, at its node 0: the group's name for the first,
        ``NAME#R`` for replica R."""
        return [(srv[0].server, http_url(self._dep.profile.hosts[srv[0].host].address, self.port))
                for srv in self.server_nodes]

    @property
    def server_nodes(self) -> list[list["ServerNode"]]:
        """Every server of the group (replica order), each its nodes in node-rank order (the
        router: one server of one node). The one walk over ``servers``/``nodes`` that day-2
        commands use."""
        if self.role == "router":
            return [[ServerNode(self.name, 0, 0, 1, self.group.host, ())]]
        out = []
        for r, srv in enumerate(self.group.servers or [self.group.nodes]):
            name = self.name if r == 0 else f"{self.name}#{r}"
            out.append([ServerNode(name, r, n, len(srv), node.host, tuple(node.gpus)) for n, node in enumerate(srv)])
        return out

    def node_on(self, host: str) -> Optional[tuple[int, int]]:
        """(replica, node rank) of the group's server node on ``host``, or None when the group
        does not run there. A host has at most one node of a group (the profile allows one node
        per host, and replicas share GPU indices and ports)."""
        return next(((n.replica, n.node) for srv in self.server_nodes for n in srv if n.host == host), None)

    def url_with(self, serve: ServeConfig) -> str:
        """The URL the group has when it runs ``serve`` (e.g. the live file on its host): the
        profile's ``port``, else that file's ``port``, else the default."""
        if self.group.port:
            return self.url
        v = serve.get("port")
        return http_url(self.host.address, _port(v, serve.where("port")) if v is not None else
                        (DEFAULT_ROUTER_PORT if self.role == "router" else DEFAULT_SERVER_PORT))

    @property
    def served_model(self) -> str:
        """``served-model-name`` of the serve config, else ``default`` (what SGLang answers
        ``model`` with when unset is the model path; ``default`` is accepted by the server)."""
        return str(self.arg("served-model-name") or "default")

    @property
    def bootstrap_port(self) -> Optional[int]:
        """``disaggregation-bootstrap-port`` of the serve config (None when unset)."""
        v = self.arg("disaggregation-bootstrap-port")
        return _port(v, self.serve.where("disaggregation-bootstrap-port"), "disaggregation-bootstrap-port") \
            if v is not None else None

    @property
    def bootstrap_port_effective(self) -> int:
        """The port the prefill's KV bootstrap listener is on: the serve config's
        ``disaggregation-bootstrap-port``, else SGLang's default 8998 (what a gateway must send
        as ``bootstrap_port``; ``none`` would make it send null)."""
        b = self.bootstrap_port
        return DEFAULT_BOOTSTRAP_PORT if b is None else b

    @property
    def dist_init_port(self) -> int:
        """Node 0's ``--dist-init-addr`` port of a multi-node server: the group's
        ``dist_init_port``, else the serve config's ``dist-init-addr`` port, else 5000."""
        if self.group.dist_init_port:
            return int(self.group.dist_init_port)
        v = self.arg("dist-init-addr")
        if v is not None:
            try:
                return parse_host_port(str(v))[1]
            except ValueError as e:
                raise InputError(f"{self.serve.where('dist-init-addr')}: dist-init-addr: {e}") from None
        return DEFAULT_DIST_INIT_PORT

    def binds(self, attn_dp: int = 1) -> list[tuple[str, int, int, str, str, int]]:
        """(host, first port, last port, what, where, replica) of the TCP ports each server of
        this group listens on, as SGLang 0.5.23 opens them: node 0's HTTP port; a prefill
        server's KV bootstrap port; with several nodes the torch.distributed store on
        :attr:`dist_init_port`; with attention DP (``attn_dp`` > 1) the six ZMQ ports after it
        (``port_base`` = dist-init port + 1, or - 7 near 65535; server_args.py ``PortArgs``), on
        one node from the HTTP port + 233 (``ZMQ_TCP_PORT_DELTA``) unless ``dist-init-addr`` is
        set; a router's port and Prometheus port. ``where`` is ``file:line``. A ``dist-init-addr``
        SGLang cannot parse adds no dist-init ports (DSV120 reports it)."""
        p = self._dep.profile
        gi = p.groups.index(self.group)

        def at(key: str, profile_key: str) -> str:
            if self.serve is not None and self.serve.get(key) is not None and not (
                    profile_key == "port" and self.group.port):
                return self.serve.where(key)
            return p.positions.where(("groups", gi, profile_key))
        if self.role == "router":
            return [(self.group.host, self.port, self.port, "port", at("port", "port"), 0),
                    (self.group.host, self.prometheus_port, self.prometheus_port, "Prometheus port",
                     p.positions.where(("groups", gi, "prometheus_port")), 0)]
        out = []
        for r, srv in enumerate(self.group.servers):
            h = srv[0].host
            out.append((h, self.port, self.port, "HTTP port", at("port", "port"), r))
            if self.role == "prefill":
                b = self.bootstrap_port_effective
                out.append((h, b, b, "KV bootstrap port", at("disaggregation-bootstrap-port", "serve_config"), r))
            given = self.group.dist_init_port or self.arg("dist-init-addr") is not None
            if len(srv) == 1 and attn_dp <= 1:
                continue
            try:
                d = self.dist_init_port
            except InputError:
                continue
            where = at("dist-init-addr", "dist_init_port")
            if len(srv) == 1 and not given:
                d = self.port + ZMQ_TCP_PORT_DELTA if self.port + ZMQ_TCP_PORT_DELTA <= 65535 else \
                    self.port - ZMQ_TCP_PORT_DELTA
                where = at("port", "port")
            out.append((h, d, d, "dist-init port", where, r))
            if attn_dp > 1:
                base = d + 1 if d + ZMQ_PORTS <= 65535 else d - ZMQ_PORTS - 1
                out.append((h, base, base + ZMQ_PORTS - 1, "attention-DP ZMQ ports", where, r))
        return out

    @property
    def gateway(self) -> str:
        """A router group's gateway (``sglang-router`` or ``smg``; default sglang-router)."""
        return self.group.gateway or DEFAULT_GATEWAY

    @property
    def gateway_module(self) -> str:
        """The module the router's default launch runs (``python -m MODULE``)."""
        from .model import GATEWAYS
        return GATEWAYS[self.gateway]

    @property
    def prometheus_host(self) -> str:
        """Address the router's Prometheus listener binds (``prometheus_host``, else 0.0.0.0)."""
        return self.group.prometheus_host or DEFAULT_PROMETHEUS_HOST

    @property
    def prometheus_port(self) -> int:
        """The router's Prometheus port: ``prometheus_port``, else the router port + 21000
        (8000 -> 29000, the gateways' own default), or - 21000 when that is over 65535; two
        routers on different ports never share it."""
        if self.group.prometheus_port:
            return int(self.group.prometheus_port)
        p = self.port + PROMETHEUS_PORT_OFFSET
        return p if p <= 65535 else self.port - PROMETHEUS_PORT_OFFSET

    @property
    def metrics_url(self) -> Optional[str]:
        """A router's Prometheus endpoint, ``http://ADDRESS:PROMETHEUS_PORT/metrics``: the host's
        address when the listener binds a wildcard (0.0.0.0, ::), else the bound address. None for
        a server group (its /metrics is on its own port)."""
        if self.role != "router":
            return None
        h = self.prometheus_host
        return http_url(self.host.address if h in ("0.0.0.0", "::", "[::]") else h, self.prometheus_port) + "/metrics"

    @property
    def hicache_configured(self) -> bool:
        """True when the serve config turns HiCache on."""
        return bool(self.serve is not None and self.serve.hicache_enabled)

    @property
    def root(self) -> str:
        """The host's deploy root (``hosts[].root``, else ``deploy.root``), no trailing slash."""
        return self._dep.host_root(self.group.host)

    @property
    def launch_template(self) -> str:
        """Launch command template: group ``launch`` > ``deploy.launch[role]`` >
        ``deploy.launch.server|router`` > built-in (``python -m sglang.launch_server --config``;
        ``python -m sglang_router.launch_router`` or ``smg.launch_router`` as ``gateway`` says,
        ops reference §1.1, §3.4)."""
        launch = self._dep.deploy.launch
        kind = "router" if self.role == "router" else "server"
        t = self.group.launch or launch.get(self.role) or launch.get(kind)
        if t:
            return t
        return DEFAULT_LAUNCH[kind].replace("{module}", self.gateway_module) if kind == "router" else DEFAULT_LAUNCH[kind]

    @property
    def env(self) -> dict[str, str]:
        return dict(self.group.env)


#: :meth:`Deployment.once` keys whose value does not depend on the serve configs (kept by
#: :meth:`Deployment.with_serve_texts`): the environment lock's bytes and its digest, the patch
#: series, the tree's versions and its index-K facts (:mod:`dsv4ctl.patches.resolved`).
SERVE_FREE = frozenset({"environment", "environment_digest", "series", "tree_versions", "tree_facts"})


@dataclass
class Deployment:
    """A resolved profile. ``groups``: name → :class:`GroupView` in profile order."""

    profile: Profile
    sglang: SGLangSettings
    deploy: DeploySettings
    check: CheckSettings
    groups: dict[str, GroupView] = field(default_factory=dict)
    shared_hosts: tuple = ()        # deploy.slurm.shared_root: the hosts whose deploy root is that one folder

    @property
    def path(self) -> Path:
        return self.profile.path

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def hosts(self) -> dict[str, Host]:
        return self.profile.hosts

    def group(self, name: str) -> GroupView:
        """The group called ``name``; InputError listing the names otherwise."""
        self.profile.group(name)
        return self.groups[name]

    def with_serve_texts(self, texts: dict[str, str]) -> "Deployment":
        """This deployment with the serve configs of some groups replaced by ``texts`` {group: new
        text} (an edit judged before it is written): those parsed from the text, every other
        group's as already read, and what does not depend on serve configs (the SGLang release
        the tree says) kept, not derived again. InputError for a text that is no serve config."""
        from .serveconfig import parse_serve_config
        new = resolve(self.profile)
        for name, g in new.groups.items():
            if name in texts:
                g._serve = parse_serve_config(texts[name], str(g.serve_config_path))
            elif self.groups[name]._serve is not None:
                g._serve = self.groups[name]._serve
        kept = getattr(self, "_version_choice", None)
        if kept is not None:
            new._version_choice = kept
        for key, value in getattr(self, "_derived", {}).items():
            if key in SERVE_FREE:        # the environment does not depend on serve configs: not read again
                new.__dict__.setdefault("_derived", {})[key] = value
        return new

    def once(self, key: str, make):
        """The value ``make()`` gives, computed once for this Deployment and kept under ``key``:
        what higher floors derive from the resolved profile (``deploy/release.py``: the launch
        spec with each server's nodes, the environment lock's bytes and digest), so a command
        asks the Deployment again instead of deriving (or reading) it again. A Deployment from
        :meth:`with_serve_texts` keeps the values of :data:`SERVE_FREE` keys and derives the rest."""
        kept = self.__dict__.setdefault("_derived", {})
        if key not in kept:
            kept[key] = make()
        return kept[key]

    def servers(self) -> list[GroupView]:
        """Groups that run an SGLang server (not the router), in profile order."""
        return [g for g in self.groups.values() if g.is_server]

    def routers(self) -> list[GroupView]:
        return [g for g in self.groups.values() if g.role == "router"]

    def router_pairs(self) -> list[tuple[str, str]]:
        """(prefill, decode) group pairs behind each router of the profile."""
        return [(p, d) for r in self.routers() for p in r.group.prefill for d in r.group.decode]

    def host_root(self, host: str) -> str:
        """A host's deploy root (``hosts[].root`` else ``deploy.root``), absolute, no trailing slash."""
        h = self.profile.hosts[host]
        if h.root is not None:
            i = list(self.profile.hosts).index(host)
            return _abs_root(h.root, f"{self.profile.positions.where(('hosts', i, 'root'))}: hosts[{i}].root")
        return _abs_root(self.deploy.root, f"{self.profile.positions.where(('deploy', 'root'))}: deploy.root")

    def root_owner(self, host: str) -> str:
        """The host that takes the lock, pushes, switches and writes state for ``host``'s deploy
        root: the submit host when ``host`` shares the root (``deploy.slurm.shared_root``), else
        ``host`` itself."""
        if host in self.shared_hosts:
            return self.deploy.slurm.submit_host
        return host

    def node_tag(self, host: str) -> Optional[str]:
        """The per-node name of ``host``'s own files in a shared root (its logs and pid files:
        ``logs/<host>/``, ``run/<host>/``), None when its root is its own."""
        return host if host in self.shared_hosts else None

    def tree(self, override: Optional[str] = None, *, required: bool = False) -> Optional[Path]:
        """The SGLang tree: ``--tree`` (relative to the working directory) else ``sglang.tree``
        (relative to the profile). InputError when it is not a folder, or when ``required`` and unset."""
        p = Path(override).expanduser() if override else self.sglang.tree
        if p is None:
            if required:
                raise InputError(f"{self.profile.path}: sglang.tree: no SGLang git checkout given "
                                 "(set it or pass --tree)")
            return None
        if not p.is_dir():
            raise InputError(f"{p}: SGLang tree not found (sglang.tree / --tree)")
        return p


def _opt_path(base: Path, value: Any) -> Optional[Path]:
    if value is None or value == "":
        return None
    p = Path(str(value)).expanduser()
    return p if p.is_absolute() else base / p


def series_path(base: Path, value: Any) -> Optional[Path]:
    """``sglang.series`` as a folder: absolute as given; relative from the profile's folder; a
    bare name (no ``/``) that is no folder there names a shipped series (``sglang-0.5.23``: the
    installation's ``patches/NAME``), so a profile written by ``profile init`` keeps working when
    dsv4ctl is reinstalled elsewhere."""
    p = _opt_path(base, value)
    if p is not None and "/" not in str(value) and not p.exists():
        from ..resources import shipped_dir
        shipped = shipped_dir("patches") / str(value)
        if shipped.is_dir():
            return shipped
    return p


def resolve(profile: Profile) -> Deployment:
    """Resolve a loaded profile into a :class:`Deployment` (no file is read yet: serve configs are
    read on first use). Raises InputError (exit 2) for a deploy root that is not absolute."""
    sg, dp, ck = profile.sglang, profile.deploy, profile.check
    base = profile.base_dir
    sglang = SGLangSettings(
        version=str(sg.get("version", "0.5.23")), tree=_opt_path(base, sg.get("tree")),
        base_ref=sg.get("base_ref") or None, series=series_path(base, sg.get("series")),
        index_k_dtype=sg.get("index_k_dtype", "fp8"), index_k_accounting=sg.get("index_k_accounting", "fp8"),
        environment=None if not sg.get("environment") else EnvironmentSettings(
            lock=_opt_path(base, sg["environment"]["lock"]), uv=sg["environment"].get("uv", "uv"),
            uv_args=tuple(sg["environment"].get("uv_args") or ())),
        image=None if not sg.get("image") else ImageSettings(
            base=sg["image"]["base"], runtime=sg["image"].get("runtime", "podman"),
            gpus=sg["image"].get("gpus", "cdi"), shm_size=str(sg["image"].get("shm_size", "32g")),
            python=sg["image"].get("python", "python3"), store=sg["image"].get("store"),
            registry=(sg["image"].get("registry") or {}).get("repository"),
            registry_auth_file=_opt_path(base, (sg["image"].get("registry") or {}).get("auth_file")),
            registry_tls_verify=bool((sg["image"].get("registry") or {}).get("tls_verify", True)),
            build_host=sg["image"].get("build_host") or None,
            **{k: tuple(sg["image"].get(k) or ()) for k in ("runtime_args", "run_args", "mounts")}))
    deploy = DeploySettings(
        root=dp.get("root", DeploySettings.root), keep_releases=int(dp.get("keep_releases", DeploySettings.keep_releases)),
        service=dp.get("service", DeploySettings.service), backend=dp.get("backend", DeploySettings.backend),
        slurm=SlurmSettings(**dp["slurm"]) if dp.get("slurm") is not None else
        (SlurmSettings() if dp.get("backend") == "slurm" else None),
        health_timeout_s=float(dp.get("health_timeout_s", DeploySettings.health_timeout_s)),
        python=dp.get("python", DeploySettings.python), launch=dict(dp.get("launch") or {}))
    conc = ck.get("concurrency", CheckSettings.concurrency)
    check = CheckSettings(
        concurrency=tuple(conc) if isinstance(conc, (list, tuple)) else (int(conc),),
        max_corruption=float(ck.get("max_corruption", CheckSettings.max_corruption)),
        turns=int(ck.get("turns", CheckSettings.turns)),
        stall_timeout_s=float(ck.get("stall_timeout_s", CheckSettings.stall_timeout_s)),
        compare_pairs=(ck.get("compare") or {}).get("pairs"),
        compare_baseline=float((ck.get("compare") or {}).get("baseline", CheckSettings.compare_baseline)),
        compare_delta=float((ck.get("compare") or {}).get("delta", CheckSettings.compare_delta)))
    dep = Deployment(profile=profile, sglang=sglang, deploy=deploy, check=check)
    dep.groups = {g.name: GroupView(dep, g) for g in profile.groups}
    if "root" in dp:
        _abs_root(dp["root"], f"{profile.positions.where(('deploy', 'root'))}: deploy.root")
    for i, h in enumerate(profile.hosts.values()):
        if h.root is not None:
            _abs_root(h.root, f"{profile.positions.where(('hosts', i, 'root'))}: hosts[{i}].root")
    if sglang.image is not None and deploy.backend == "slurm":
        raise InputError(f"{profile.positions.where(('sglang', 'image'))}: sglang.image with deploy.backend: slurm is "
                         "not supported yet: a container runs under conmon, outside its Slurm job (the gate cannot "
                         "tie the server to the job, and a cancelled job may leave it running); use the ssh backend "
                         "for image releases, or srun the image by hand (docs/images.md, Slurm and Kubernetes)")
    if sglang.image is not None and sglang.image.build_host is not None:
        _check_build_host(profile, sglang.image.build_host)
    if deploy.slurm is not None and deploy.slurm.shared_root:
        _resolve_shared_root(dep)
    return dep


def _check_build_host(profile: Profile, name: str) -> None:
    """``sglang.image.build_host`` names a host of ``hosts:`` reached over SSH; InputError (exit 2,
    at its line) otherwise (the control machine builds when it is unset)."""
    where = profile.positions.where(("sglang", "image", "build_host"))
    if name not in profile.hosts:
        raise InputError(f"{where}: sglang.image.build_host: {name} is not a host of hosts: "
                         f"({', '.join(profile.hosts)})")
    if profile.hosts[name].local:
        raise InputError(f"{where}: sglang.image.build_host: {name} is this machine (local: true): leave "
                         "build_host unset to build here")


def _resolve_shared_root(dep: "Deployment") -> None:
    """``deploy.slurm.shared_root``: every server node's deploy root must be one folder (else
    InputError, exit 2, naming the first host that differs); the hosts with that root are
    :attr:`Deployment.shared_hosts`, and the submit host is the first of them (in ``hosts:``
    order) unless ``submit_host`` names one (which must see that root too)."""
    import dataclasses
    where = dep.profile.positions.where(("deploy", "slurm", "shared_root"))
    if dep.deploy.backend != "slurm":
        raise InputError(f"{where}: deploy.slurm.shared_root needs deploy.backend: slurm")
    nodes = [n.host for g in dep.servers() for srv in g.server_nodes for n in srv]
    if not nodes:
        return
    root = dep.host_root(nodes[0])
    for h in nodes[1:] + ([dep.deploy.slurm.submit_host] if dep.deploy.slurm.submit_host else []):
        if dep.host_root(h) != root:
            raise InputError(f"{where}: deploy.slurm.shared_root: host {h}'s deploy root {dep.host_root(h)} is not "
                             f"the shared root {root} of {nodes[0]} (every node and the submit host must see one folder)")
    dep.shared_hosts = tuple(h for h in dep.hosts if dep.host_root(h) == root)
    if not dep.deploy.slurm.submit_host:
        slurm = dataclasses.replace(dep.deploy.slurm, submit_host=dep.shared_hosts[0])
        dep.deploy = dataclasses.replace(dep.deploy, slurm=slurm)
    owner = dep.deploy.slurm.submit_host
    for r in dep.routers():      # a router is switched with the root by its owner, or has a root of its own
        if r.group.host in dep.shared_hosts and r.group.host != owner:
            raise InputError(f"{where}: deploy.slurm.shared_root: router group {r.name} runs on {r.group.host}, which "
                             f"shares the root of {owner} (the host that switches it): run the router on {owner}, "
                             "or on a host with a deploy root of its own")


def load_deployment(path: Path | str) -> Deployment:
    """Load, validate and resolve the profile at ``path`` (:func:`~dsv4ctl.profile.model.load_profile`)."""
    from .model import load_profile
    return resolve(load_profile(path))


def as_deployment(x: "Profile | Deployment") -> Deployment:
    """``x`` itself when it is a Deployment, else ``resolve(x)`` (for callers holding a Profile)."""
    return x if isinstance(x, Deployment) else resolve(x)
