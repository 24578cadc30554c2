"""The seam where servers run (issue 42 item 2, docs/architecture.md): deploy, rollback,
lifecycle, promote, status, diagnose, runbooks and watch reach a host's server only through
``dsv4ctl/deploy/service.py`` (``service_for`` and its few helpers). The launcher/systemd
builders of ``dsv4ctl/hosts/service.py`` are imported by the seam and by the service
implementations and host-side readers only."""

from __future__ import annotations

import ast
import functools
import subprocess

from tests.test_import_direction import PKG, module_name
from tests.test_import_direction import import_graph as _import_graph

#: one scan of the package for every test of this module
import_graph = functools.lru_cache(maxsize=1)(_import_graph)

BUILDERS = "dsv4ctl.hosts.service"
ALLOWED = {
    "dsv4ctl.deploy.service": "the seam: service_for, restart_in_place, log_tail_cmd",
    "dsv4ctl.deploy.slurmjobs": "the Slurm implementation (routers still run over SSH)",
    "dsv4ctl.hosts.container": "the container implementation (wraps the launcher/systemd command)",
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


#: The builders of "is it running, which process, how often restarted" (issue 42 item 1): each
#: service implementation's own, reached from commands only through ``process_reads``.
PROCESS_READS = {"proc_command", "process_cmd", "container_command"}
READERS = {"dsv4ctl.hosts.service": "the launcher's pid file and systemd's unit (proc_command, process_cmd)",
           "dsv4ctl.hosts.container": "the container's read (container_command, ContainerService.process_cmd)",
           "dsv4ctl.deploy.slurmjobs": "the Slurm job's read (SlurmJobs.process_cmd)",
           "dsv4ctl.deploy.service": "the seam: process_reads",
           "dsv4ctl.hosts.day2": "container_command's old name, kept for tests/test_image_core.py (no call)"}


def _uses(tree: ast.AST) -> set[str]:
    """The process-read builder names a module imports or calls (``x.process_cmd(...)`` included)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            out |= {a.name for a in node.names if a.name in PROCESS_READS}
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in PROCESS_READS:
                out.add(name)
    return out


def test_status_and_diagnose_read_processes_only_through_the_seam():
    """No command reaches a process read (pid file, unit MainPID, container, Slurm job) but through
    ``deploy/service.py: process_reads``; hosts/day2.py only assembles and parses what the service
    answers (it imports no service builder), and the modules that send status's host command ask
    the seam for its probes."""
    offenders, senders, graph = {}, {}, import_graph()
    for path in sorted(PKG.rglob("*.py")):
        mod, tree = module_name(path), ast.parse(path.read_text())
        used = _uses(tree)
        if used and mod not in READERS:
            offenders[mod] = sorted(used)
        calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        if calls & {"status_command", "host_command"} and mod not in ("dsv4ctl.hosts.day2", "dsv4ctl.diagnose.collect"):
            senders[mod] = "dsv4ctl.deploy.service" in graph[mod]
    assert not offenders, f"{offenders} read a server's process directly: ask dsv4ctl/deploy/service.py process_reads"
    assert senders == {"dsv4ctl.commands.day2": True, "dsv4ctl.diagnose.run": True}, senders
    assert not graph["dsv4ctl.hosts.day2"] & {BUILDERS, "dsv4ctl.deploy.service"}, graph["dsv4ctl.hosts.day2"]


def test_every_backend_answers_is_it_running_through_one_interface(tmp_path):
    """``process_reads`` asks where servers run: the launcher/systemd read both (a pid file or a
    unit), a Slurm group its job (squeue, and the job's line), a release image its container
    (podman ps by labels), each printing the lines ``parse_status`` reads. The launcher's read, run
    for real on a root whose pid file names a live process, says it runs, with that pid."""
    import copy
    import os

    import yaml

    from dsv4ctl.deploy.service import process_reads, service_for
    from dsv4ctl.deploy.site import Options, open_site
    from dsv4ctl.hosts.day2 import parse_status, status_command
    from dsv4ctl.profile.deployment import resolve
    from dsv4ctl.profile.model import load_profile
    from tests.test_golden import LocalWorld
    w = LocalWorld(tmp_path)
    slurm = {"backend": "slurm", "slurm": {"partition": "p", "conf": "/etc/s.conf", "time_limit": "60"}}
    variants = {"launcher": {}, "slurm": {"deploy": slurm},
                "image": {"sglang": {"image": {"base": "/b", "gpus": "none", "store": "{root}/containers"}}}}
    reads, kinds = {}, {}
    for name, over in variants.items():
        prof = copy.deepcopy(w.prof)
        for k, v in over.items():
            prof[k].update(v)
        site = open_site(resolve(load_profile(w.write_profile(f"{name}.yaml", prof))), Options())
        reads[name] = process_reads(site, "h1", ["decode"])
        kinds[name] = type(service_for(site, "h1")).__name__
        site.close()
    assert kinds == {"launcher": "Launcher", "slurm": "SlurmJobs", "image": "ContainerService"}
    for name, cmd in reads.items():
        assert "echo '@alive decode yes'" in cmd["decode"] and "echo \"@proc decode" in cmd["decode"], name
    assert "squeue -h -n dsv4ctl:golden-local:decode:" in reads["slurm"]["decode"] and "@job decode" in reads["slurm"]["decode"]
    assert "ps --no-trunc --filter" in reads["image"]["decode"] and "squeue" not in reads["image"]["decode"]
    assert "squeue" not in reads["launcher"]["decode"] and "@ctr" not in reads["launcher"]["decode"]
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (root / "run" / "decode.pid").write_text(str(sleeper.pid))
        probe = reads["launcher"]["decode"].replace(str(w.roots["h1"]), str(root))
        out = subprocess.run(["/bin/sh", "-c", status_command(str(root), {"decode": probe})], capture_output=True,
                             text=True, timeout=30, env={"PATH": os.environ["PATH"]}).stdout
    finally:
        sleeper.kill()
        sleeper.wait()
    st = parse_status("h1", str(root), out)
    assert st.alive == {"decode": True} and st.procs["decode"].pid == sleeper.pid, out[-500:]


#: Where a backend may be named (issue 42 item 2): the seam, the Slurm implementation, and the
#: layers below it (hosts/ runs things on a host, profile/ reads and checks ``deploy.backend``).
BRANCH_OK = ("deploy/service.py", "deploy/slurmjobs.py", "deploy/slurmwait.py", "hosts/", "profile/")


def _backend_branches(path, tree: ast.AST) -> list[str]:
    """``path:line`` of each comparison against ``X.backend`` or the literal ``"slurm"`` and each
    ``hasattr(..., "job_state_cmd")`` (asking the service object what it is) in ``tree``."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Compare):
            parts = [n.left, *n.comparators]
            if any(isinstance(x, ast.Attribute) and x.attr == "backend" for x in parts) or \
                    any(isinstance(x, ast.Constant) and x.value == "slurm" for x in parts):
                out.append(f"{path}:{n.lineno}")
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "hasattr":
            if any(isinstance(a, ast.Constant) and a.value == "job_state_cmd" for a in n.args):
                out.append(f"{path}:{n.lineno}")
    return out


def test_no_backend_branch_outside_the_seam():
    """Commands, deploy, rollback, lifecycle, promote and the gate ask ``deploy/service.py``
    what where servers run can do (``limits_supported``, ``canary_first_refusal``, ``gate_alive``,
    ``gate_start_wait``, ``gate_answering``, ``keeps_job_records``, ``submit_host``,
    ``runs_in_containers``, ``restarts_in_place``): no module outside the seam and the Slurm
    implementation compares ``deploy.backend`` or ``"slurm"``, nor asks ``hasattr(svc,
    "job_state_cmd")``. (Image branches on the release format, build/ship/verify, are allowed by
    docs/architecture.md: they do not compare a backend.)"""
    found, scanned = [], 0
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel.startswith(BRANCH_OK):
            continue
        scanned += 1
        found += _backend_branches(rel, ast.parse(path.read_text()))
    assert scanned > 100, f"the scan read {scanned} modules: it no longer reads the package"
    assert not found, f"backend branches outside dsv4ctl/deploy/service.py: {found} (ask the seam)"


def test_the_branch_scan_sees_each_kind_of_branch():
    """The scan itself: each form it must catch is caught, a field of the same name elsewhere is not."""
    src = ('if dep.deploy.backend == "slurm": pass\n'
           'if "slurm" != kind: pass\n'
           'if hasattr(svc, "job_state_cmd"): pass\n'
           'x = opts.io_backend == "direct"\n')
    assert _backend_branches("m.py", ast.parse(src)) == ["m.py:1", "m.py:2", "m.py:3"]
