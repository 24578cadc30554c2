"""Where ``dsv4ctl check`` sends traffic: a URL given on the command line, or a profile's router
(entry point) and server groups (workers), read from the profile and its serve configs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import InputError

DEFAULT_SERVER_PORT = 30000      # SGLang's default --port
DEFAULT_ROUTER_PORT = 8000       # the port the reference launches the router on (§1.3, §3.4)


@dataclass
class Targets:
    """``entry``: the URL clients use (router, else the first server); ``workers``: smoke.Worker
    objects for every server group (health, server_info, /metrics)."""

    entry: str
    workers: list


def normalize_url(url: str) -> str:
    """``http(s)://host[:port]`` without a trailing slash; InputError otherwise."""
    u = url.strip().rstrip("/")
    if not u.startswith(("http://", "https://")) or len(u.split("://", 1)[1]) == 0:
        raise InputError(f"{url}: a URL must start with http:// or https://")
    return u


def _host_url(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"http://{host}:{port}"


def from_profile(profile) -> Targets:
    """Targets of a loaded :class:`dsv4ctl.profile.Profile`.

    A server group's port is its ``port``, else its serve config's ``port``, else 30000; its
    configured HiCache switch is the serve config's ``enable-hierarchical-cache`` (alias
    ``enable-hicache``). The entry is the first router group (``port``, default 8000), else the
    first server group. InputError (exit 2) on an unreadable serve config."""
    from ..serveconfig import read_serve_config
    from .smoke import Worker

    workers = []
    for g in profile.servers():
        args = {}
        if g.serve_config is not None:
            args, _ = read_serve_config(g.serve_config)
        port = g.port or args.get("port") or DEFAULT_SERVER_PORT
        host = profile.hosts[g.host]
        workers.append(Worker(name=g.name, url=_host_url(host.address, int(port)),
                              hicache_configured=bool(args.get("enable-hierarchical-cache", False))))
    routers = [g for g in profile.groups if g.role == "router"]
    entry: Optional[str] = None
    if routers:
        r = routers[0]
        entry = _host_url(profile.hosts[r.host].address, r.port or DEFAULT_ROUTER_PORT)
    elif workers:
        entry = workers[0].url
    if entry is None:
        raise InputError(f"{profile.path}: no router or server group to send traffic to")
    return Targets(entry=entry, workers=workers)
