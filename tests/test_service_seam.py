"""The seam where servers run (issue 42 item 2, docs/architecture.md): deploy, rollback,
lifecycle, promote, status, diagnose, runbooks and watch reach a host's server only through
``dsv4ctl/deploy/service.py`` (``service_for`` and its few helpers). The launcher/systemd
builders of ``dsv4ctl/hosts/service.py`` are imported by the seam and by the service
implementations and host-side readers only."""

from __future__ import annotations

from tests.test_import_direction import import_graph

BUILDERS = "dsv4ctl.hosts.service"
ALLOWED = {
    "dsv4ctl.deploy.service": "the seam: service_for, restart_in_place, log_tail_cmd",
    "dsv4ctl.deploy.slurmjobs": "the Slurm implementation (routers still run over SSH)",
    "dsv4ctl.hosts.container": "the container implementation (wraps the launcher/systemd command)",
    "dsv4ctl.hosts.day2": "status's read-only process facts (pid file or unit MainPID)",
}


def test_only_the_seam_and_the_service_implementations_import_the_launcher_and_systemd_builders():
    users = {mod for mod, deps in import_graph().items() if BUILDERS in deps}
    assert users, "the scan found no importer of hosts/service.py: it no longer reads the package"
    outside = sorted(users - set(ALLOWED))
    assert not outside, (f"{outside} import {BUILDERS} directly: go through dsv4ctl/deploy/service.py "
                         "(service_for, restart_in_place, log_tail_cmd) so that Slurm jobs and images plug in")


def test_every_command_family_reaches_servers_through_the_seam():
    """The modules that start, stop, restart or read a server import the seam (and not the builders)."""
    graph = import_graph()
    for mod in ("dsv4ctl.deploy.engine", "dsv4ctl.deploy.servers", "dsv4ctl.deploy.steps",
                "dsv4ctl.runbook.actions", "dsv4ctl.commands.day2"):
        assert "dsv4ctl.deploy.service" in graph[mod], mod
        assert BUILDERS not in graph[mod], mod
