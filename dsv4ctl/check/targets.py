"""Where ``dsv4ctl check`` sends traffic: a URL given on the command line, or a profile's router
(entry point) and server groups (workers), read from the profile and its serve configs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import InputError



@dataclass
class Targets:
    """``entry``: the URL clients use (router, else the first server); ``workers``: smoke.Worker
    objects for every server group (health, server_info, /metrics); ``gateway_metrics``: the
    entry router's own Prometheus URL (None without a router); ``gateway_router``: that router
    group's name; ``other_routers``: the profile's other router groups, which get none of the
    check's traffic and whose metrics are not scraped."""

    entry: str
    workers: list
    gateway_metrics: Optional[str] = None
    gateway_router: Optional[str] = None
    other_routers: tuple = ()
    pd_groups: tuple = ()
    profile: str = ""

    def load_entry(self, command: str = "check load --profile {profile}",
                   sent: str = "load sent to the prefill alone never decodes",
                   url_form: Optional[str] = "dsv4ctl check load http://ROUTER:PORT") -> str:
        """Where ``check load --profile`` (or ``command``; ``{profile}`` is the profile) sends its
        traffic: :attr:`entry`. A PD profile (prefill and decode groups, ``pd_groups``) without
        a router has no entry a client can use: the first server group is a prefill, which never
        decodes, and SGLang answers a request sent to one PD server without a bootstrap room
        with HTTP 400 ("Disaggregated request received without bootstrap room id",
        ``srt/managers/scheduler.py`` 0.5.23): InputError (exit 2) saying what to do instead of
        a run that measures nothing (``sent``: what would go wrong; ``url_form``: the command
        given the router's URL, None where the command takes none)."""
        if self.pd_groups and self.gateway_router is None:
            raise InputError(f"{command.format(profile=self.profile)}: PD groups ({', '.join(self.pd_groups)}) and no router "
                             f"group: {sent}; add a router group (role: router, prefill: [...], decode: [...]) to the "
                             "profile" + (f", or give the router's URL: {url_form}" if url_form else ""))
        return self.entry

    def gateway_scope(self) -> Optional[str]:
        """One line saying whose gateway metrics are scraped and why only its (None without a
        router): the check's traffic goes to the entry router only."""
        if self.gateway_router is None:
            return None
        return (f"gateway metrics: {self.gateway_metrics} of router group {self.gateway_router}, the entry the "
                f"check's traffic goes to" + (f" (not scraped: router group(s) {', '.join(self.other_routers)}, "
                                              f"which get none of it)" if self.other_routers else ""))


def normalize_url(url: str) -> str:
    """``http(s)://host[:port]`` without a trailing slash; InputError otherwise (also for
    credentials in the URL, whose text the error does not repeat)."""
    u = url.strip().rstrip("/")
    if not u.startswith(("http://", "https://")) or len(u.split("://", 1)[1]) == 0:
        raise InputError(f"{url}: a URL must start with http:// or https://")
    if "@" in u.split("://", 1)[1].split("/", 1)[0]:
        # never echoed: the user:password part would land in records, reports and error lines
        raise InputError("a URL with user:password@ is not accepted (it would be written to records and "
                         "reports); SGLang takes a bearer token: use --api-key or DSV4CTL_API_KEY")
    return u


def from_profile(profile) -> Targets:
    """Targets of a :class:`~dsv4ctl.profile.deployment.Deployment` (a Profile is resolved first).

    A server group's URL and port are the Deployment's (each replica's at its node 0, named ``GROUP#R``) (``port``, else the serve config's, else
    30000; IPv6-safe); its configured HiCache switch is the serve config's. The entry is the first
    router group, else the first server group; ``gateway_metrics`` that router's Prometheus URL
    (its ``prometheus_host``/``prometheus_port``): only the entry router gets the check's traffic,
    so only its metrics are scraped (:meth:`Targets.gateway_scope` says so). InputError (exit 2) on an unreadable serve config."""
    from ..profile.deployment import as_deployment
    from .smoke import Worker

    dep = as_deployment(profile)
    workers = [Worker(name=name, url=url, hicache_configured=g.hicache_configured)
               for g in dep.servers() for name, url in g.replica_urls]      # every replica, at its node 0
    routers = dep.routers()
    entry: Optional[str] = routers[0].url if routers else (workers[0].url if workers else None)
    if entry is None:
        raise InputError(f"{dep.path}: no router or server group to send traffic to")
    return Targets(entry=entry, workers=workers, gateway_metrics=routers[0].metrics_url if routers else None,
                   gateway_router=routers[0].name if routers else None,
                   other_routers=tuple(r.name for r in routers[1:]),
                   pd_groups=tuple(g.name for g in dep.servers() if g.role in ("prefill", "decode")),
                   profile=str(getattr(dep, "path", "") or dep.name))
