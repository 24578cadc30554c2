"""Where servers run: the one place that decides how a host's groups are started, stopped and
watched (issue 42's seam). Deploy, rollback, lifecycle and the gate ask :func:`service_for`."""

from __future__ import annotations

from ..hosts.service import backend
from .site import Site
from .slurmjobs import SlurmJobs


def service_for(site: Site, host: str, spec: dict | None = None, stop_spec: dict | None = None):
    """How groups are stopped, started and watched on ``host``: with ``deploy.backend: ssh`` the
    host's service (systemd or the launcher, :func:`dsv4ctl.hosts.service.backend`), with
    ``slurm`` the groups' Slurm jobs (:class:`dsv4ctl.deploy.slurmjobs.SlurmJobs`; ``spec`` the
    launch spec being started, ``stop_spec`` the one being stopped). The one place that decides
    where servers run: every start, stop and liveness check asks it."""
    if site.profile.deploy.backend == "slurm":
        return SlurmJobs(site, host, spec, stop_spec)
    f = site.facts.get(host)
    return backend(site.profile.deploy.service, bool(f and f.systemd))
