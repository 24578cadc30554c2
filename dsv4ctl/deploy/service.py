"""Where servers run: the one place that decides how a host's groups are started, stopped and
watched (issue 42's seam). Deploy, rollback, lifecycle and the gate ask :func:`service_for`; a
runbook's in-place restart asks :func:`restart_in_place`, the gate's failure text and ``logs``
read the server log through :func:`log_tail_cmd` and :data:`LOG_LINE_MAX`. Nothing above
``hosts/`` imports ``hosts/service.py`` but this module and the Slurm implementation
(tests/test_service_seam.py)."""

from __future__ import annotations

from ..errors import InputError, RemoteError
from ..hosts.service import LOG_LINE_MAX, backend, log_tail_cmd, run_restart
from ..remote import q, run_parallel
from .site import Site
from .slurmjobs import SlurmJobs

__all__ = ["LOG_LINE_MAX", "canary_first_refusal", "check_reachable", "gate_alive", "gate_answering",
           "gate_start_wait", "gate_step_text", "keeps_job_records", "limits_supported", "log_tail_cmd",
           "process_reads", "restart_in_place", "restarts_in_place", "runs_in_containers", "service_for",
           "submit_host", "submit_units", "test_submissions", "unusable_nodes"]


def service_for(site: Site, host: str, spec: dict | None = None, stop_spec: dict | None = None):
    """How groups are stopped, started and watched on ``host``: with ``deploy.backend: ssh`` the
    host's service (systemd or the launcher, :func:`dsv4ctl.hosts.service.backend`), with
    ``slurm`` the groups' Slurm jobs (:class:`dsv4ctl.deploy.slurmjobs.SlurmJobs`; ``spec`` the
    launch spec being started, ``stop_spec`` the one being stopped). The one place that decides
    where servers run: every start, stop and liveness check asks it."""
    if site.profile.deploy.backend == "slurm":
        return SlurmJobs(site, host, spec, stop_spec)
    f = site.facts.get(host)
    svc = backend(site.profile.deploy.service, bool(f and f.systemd))
    boxed = [s for sp in (spec, stop_spec) for s in (sp or {}).values() if "container" in s]
    if runs_in_containers(site.profile) or boxed:     # release images: the groups run in containers
        from ..hosts.container import ContainerService
        from .site import site_image
        return ContainerService(svc, site_image(site, boxed[0] if boxed else None))
    return svc


def runs_in_containers(profile) -> bool:
    """Whether ``profile``'s groups run in containers of release images (``sglang.image`` set):
    then ``status`` shows each group's container and image, and :func:`service_for` wraps the
    launcher/systemd command in :class:`dsv4ctl.hosts.container.ContainerService`."""
    return profile.sglang.image is not None


def limits_supported(profile) -> bool:
    """Whether where ``profile``'s servers run can take a limited deploy (``-g``/``--host``: some
    groups or hosts switched, the others left on their release). True over SSH; False on Slurm,
    where a switch cancels and resubmits each server's job from the host that acts for it."""
    return profile.deploy.backend != "slurm"


def canary_first_refusal(profile) -> str:
    """Why ``deploy --promote`` cannot switch its canary first where ``profile``'s servers run
    (the whole InputError text, exit 2), "" when it can. On Slurm with ``deploy.slurm.shared_root``
    or ``deploy.slurm.submit_host`` one host's switch cancels and submits every server's job at
    once (docs/slurm.md, what is not there yet)."""
    st = profile.deploy.slurm
    if profile.deploy.backend != "slurm" or st is None:
        return ""
    if st.shared_root:
        return (f"deploy --promote: not with deploy.slurm.shared_root yet: its one switch (on "
                f"{st.submit_host}) would switch every server's job at once, not the canary's first; "
                "deploy without --promote")
    if st.submit_host:
        return (f"deploy --promote: not with deploy.slurm.submit_host ({st.submit_host}) yet: the submit "
                "host would switch every server's job at once, not the canary's first; deploy without "
                "--promote, or let each server's node 0 submit (no submit_host)")
    return ""


def keeps_job_records(profile) -> bool:
    """Whether where ``profile``'s servers run keeps records of the jobs submitted for each
    release on the hosts (Slurm: ``run/*.job`` lines, :mod:`dsv4ctl.hosts.slurmrecord`, which
    outlive Slurm's MinJobAge): ``releases`` then lists each release's ``slurm_jobs``."""
    return profile.deploy.backend == "slurm"


def submit_host(site: Site) -> str | None:
    """The one host that submits and cancels every server's Slurm job
    (``deploy.slurm.submit_host``), else None (each server's node 0 acts for it, or SSH)."""
    st = site.profile.deploy.slurm
    return st.submit_host if site.profile.deploy.backend == "slurm" and st else None


def gate_step_text(site: Site, spec: dict, group: str, text: str) -> str:
    """The words of ``group``'s gate step ``text`` (``wait for GET .../health = 200 ...``) where
    its server runs: unchanged over SSH and for a router; for a Slurm job the start wait before
    (at most :func:`dsv4ctl.deploy.slurmwait.start_timeout` s) and the proof after that the
    process answering is that job's."""
    if site.profile.deploy.backend != "slurm" or spec[group].get("role") == "router":
        return text
    from .slurmwait import start_timeout
    return (f"wait for the Slurm job of {group} to leave PENDING (at most {start_timeout(site):g} s), then "
            + text[len("wait for "):] + "; the process answering is that job's")


def gate_alive(site: Site, host: str, group: str, nodes: list[str]):
    """The gate's liveness check of ``group``'s server whose node 0 is ``host`` (``nodes``: its
    other nodes): a callable answering True while it may still come up, False when its one
    process has exited, or (host, why) naming the node whose process exited or the host that
    cannot be reached (:data:`dsv4ctl.deploy.netloss.UNREACHABLE`, no verdict). Over SSH each
    node's service alive command (:func:`service_for`); for a Slurm job its state, which says for
    every node (:func:`dsv4ctl.deploy.slurmjobs.job_state`, asked where Slurm's clients run)."""
    from .netloss import UNREACHABLE
    if isinstance(service_for(site, host), SlurmJobs):
        from .slurmjobs import job_state, parse_job_state

        def job_alive():
            try:
                up, why, node = parse_job_state(job_state(site, host, group))
            except RemoteError as e:               # the host is lost: no verdict (netloss)
                return host, f"{UNREACHABLE}: {e}"
            return True if up else (node if node in site.transports else host, why)
        return job_alive
    checks = [(x, _alive_on(site, x, group)) for x in [host, *nodes]]

    def alive():
        for rank, (x, check) in enumerate(checks):
            try:
                up = check()
            except RemoteError as e:        # the host is lost: no verdict (netloss)
                return x, f"{UNREACHABLE}: {e}"
            if not up:
                if not nodes:
                    return False
                return x, f"the server process of node {rank} (of {len(checks)}) exited"
        return True
    return alive


def _alive_on(site: Site, host: str, group: str):
    """A callable: does ``group``'s process run on ``host`` (its service's alive command)."""
    t, p = site.transports[host], site.paths[host]
    cmd = service_for(site, host).alive_cmd(p, group)
    return lambda: t.run(cmd, check=False, timeout=30).code == 0


def gate_start_wait(site: Site, steps: list, cap: float | None, every: float) -> list:
    """Before the gate's health wait: wait while a server that must be scheduled first has not
    started (a Slurm job PENDING: queue time is not start time,
    :func:`dsv4ctl.deploy.slurmwait.start_wait`). [] at once over SSH; else one
    :class:`~dsv4ctl.hosts.health.Failure` per server still waiting after its limit (``cap``
    s at most when given), progress lines every ``every`` s."""
    from .slurmwait import start_wait
    return start_wait(site, steps, cap, every)


def gate_answering(site: Site, steps: list) -> list:
    """After a health wait that passed: proof that each server answering is the one the run
    started. Over SSH nothing more to prove ([]); for a Slurm job, the process listening on its
    port on node 0 must be of the job just submitted
    (:func:`dsv4ctl.deploy.slurmwait.answering_jobs`): one Failure per server it is not."""
    from .slurmwait import answering_jobs
    return answering_jobs(site, steps)


def restarts_in_place(profile) -> bool:
    """Whether where ``profile``'s servers run restarts a running one-node server in place (its
    process stopped and the same command line started again on the same host, no new placement):
    True over SSH (the launcher, systemd, and release images, whose container is the launcher's or
    the unit's command). False on Slurm: the server is the job's one ``srun`` step, and the batch
    script ends when that step ends, so no server can be restarted inside its allocation
    (``scontrol requeue`` would only put the same script back in the queue, without dsv4ctl's job
    record). There a restart is the lifecycle's: the group's job cancelled (waited for until Slurm
    lists it no more) and the active release's batch script submitted again from the host that
    acts for it (:class:`dsv4ctl.deploy.slurmjobs.SlurmJobs` through :func:`service_for`): a new
    job id, its nodes asked of Slurm again, ``status``'s restart count one more."""
    return profile.deploy.backend != "slurm"


def restart_in_place(t, python: str, root: str, group: str, stop_timeout: float = 30.0) -> dict:
    """Restart ``group`` in place on the host behind transport ``t`` (deploy root ``root``, the
    host's ``python`` runs the restart script): the launcher's process group stopped and the same
    command line started again, or ``systemctl restart`` of its unit
    (:func:`dsv4ctl.hosts.service.run_restart`). Returns ``{"how", "old_pid", "new_pid"}`` (and
    ``unit`` under systemd); RemoteError (exit 3) naming the host when the group does not run
    under dsv4ctl there. Only where :func:`restarts_in_place` holds: a Slurm job is restarted by
    cancelling it and submitting the active release's script again (the runbook's
    ``service.restart`` asks :func:`restarts_in_place` first)."""
    return run_restart(t, python, root, group, stop_timeout)


def process_reads(site: Site, host: str, groups: list[str], kept: list[str] = (),
                  containers: bool = True) -> dict[str, str]:
    """{group: one read-only shell command} answering, for status and diagnose on ``host``, "is
    it running, which process, how often restarted": where servers run answers it
    (``service_for(site, host).process_cmd``: the launcher's pid file or systemd's unit, a Slurm
    group's job, a release image's container), each printing ``@alive G yes|no`` and ``@proc``
    (then ``@ctr`` with ``containers`` on a release-image site, ``@job`` for a Slurm job) that
    :func:`dsv4ctl.hosts.day2.parse_status` reads. ``kept``: the units a Slurm submit host keeps
    the job records of (:func:`submit_units`), read after ``groups`` for their ``@job`` lines."""
    svc, p = service_for(site, host), site.paths[host]
    out = {g: svc.process_cmd(p, g, containers) for g in groups}
    for u in kept:
        if u not in out:
            out[u] = svc.process_cmd(p, u, containers, kept=True)
    return out


def submit_units(site: Site) -> tuple[str | None, dict[str, tuple[str, str]]]:
    """With ``deploy.slurm.submit_host``: (that host, {unit: (group, the server's node 0)}) for
    every server (``GROUP``, ``GROUP@R`` for replica R > 0): the submit host keeps each one's job
    id and records under the unit's name, so ``status`` reads them there and shows them at the
    server's node 0. (None, {}) otherwise."""
    sub = submit_host(site)
    if not sub:
        return None, {}
    return sub, {(g.name if r == 0 else f"{g.name}@{r}"): (g.name, srv[0].host)
                 for g in site.profile.servers() for r, srv in enumerate(g.server_nodes)}


def check_reachable(site: Site) -> None:
    """Before anything changes: where servers run must answer and can run the groups. With
    ``deploy.backend: slurm``, from every host that runs Slurm's clients for a server
    (``deploy.slurm.submit_host``, else each server's node 0): the controller (``scontrol
    ping``; RemoteError, exit 3, naming the hosts it does not answer from), the nodes' states (a
    node down or drained: exit 3) and ``sbatch --test-only`` of each server's job (a partition,
    account, reservation or time limit Slurm refuses: InputError, exit 2). InputError too for a
    deploy root a batch script cannot carry. Then every node of a server gets its ``logs/slurm``
    folder (where the batch step and each node's task write their Slurm output: it must be
    there before a job starts, and a submit host's step cannot make it). Nothing to ask over SSH alone (the lock step has just reached every host)."""
    if site.profile.deploy.backend != "slurm":
        return
    from ..hosts.slurm import check_path
    for g in site.profile.servers():
        for h in g.group.hosts:
            if h in site.paths:
                check_path(site.paths[h].root, f"host {h}'s deploy root")
    actors = sorted(set(_actors(site)) & set(site.transports))
    if not actors:
        return
    cmd = SlurmJobs(site, actors[0]).ping_cmd()
    res = run_parallel({h: site.transports[h] for h in actors},
                       lambda t: t.run(cmd, check=False, timeout=60), timeout=90)
    bad = {h: (r.value.error_text() if r.ok else r.error) for h, r in res.items() if not r.ok or r.value.code != 0}
    if bad:
        raise RemoteError("the Slurm controller does not answer from " + "; ".join(f"{h}: {why}" for h, why in bad.items())
                          + ": nothing was changed")
    unusable = unusable_nodes(site, actors[0])
    if unusable:
        raise RemoteError(f"Slurm node(s) {unusable}: a new job could not start there (the running one would be "
                          "cancelled for nothing); nothing was changed. Resume the node (scontrol update "
                          "nodename=NODE state=resume) or take it out of the profile")
    refused = test_submissions(site)
    if refused:
        raise InputError(f"Slurm would refuse the job of {refused}; nothing was changed")
    nodes = {h for g in site.profile.servers() for h in g.group.hosts} & set(site.transports)
    if nodes:
        res = run_parallel({h: site.transports[h] for h in nodes},
                           lambda t: t.run(f"mkdir -p {q(site.paths[t.name].root + '/logs/slurm')}", timeout=60), timeout=90)
        bad = [f"{h}: {r.error}" for h, r in res.items() if not r.ok]
        if bad:
            raise RemoteError("making the job output folder failed on " + "; ".join(bad) + ": nothing else was changed")


def _actors(site: Site) -> dict[str, tuple[str, int, list[str]]]:
    """{host that submits: (group, replica, nodes)} of the profile's servers (one entry per
    submit host: the first server it acts for)."""
    out: dict[str, tuple[str, int, list[str]]] = {}
    sub = site.profile.deploy.slurm.submit_host if site.profile.deploy.slurm else None
    for g in site.profile.servers():
        for r, srv in enumerate(g.server_nodes):
            out.setdefault(sub or srv[0].host, (g.name, r, [n.host for n in srv]))
    return out


def unusable_nodes(site: Site, host: str) -> str:
    """The nodes of the profile's server groups that Slurm has down, drained or failing, as one
    text (``h3 IDLE+DRAIN (xid 79)``), asked from ``host``; "" when every node can take a job."""
    from ..hosts.slurm import job_verdict, parse_nodes
    nodes = sorted({h for g in site.profile.servers() for h in g.group.hosts})
    svc = SlurmJobs(site, host)
    r = site.transports[host].run(svc.nodes_cmd(nodes), check=False, timeout=60)
    v = job_verdict({"JobId": "-", "JobState": "PENDING"}, parse_nodes(r.out))
    return "" if v.ok else v.message.split("cannot start: node ", 1)[-1]


def test_submissions(site: Site) -> str:
    """What ``sbatch --test-only`` says of each server's job (its partition, account,
    reservation, time limit and nodes, asked from the host that submits it before anything is
    cancelled): "" when Slurm would take every one, else ``group: Slurm's words``."""
    sub = site.profile.deploy.slurm.submit_host if site.profile.deploy.slurm else None
    for g in site.profile.servers():
        for r, srv in enumerate(g.server_nodes):
            h = sub or srv[0].host
            if h not in site.transports:
                continue
            res = site.transports[h].run(SlurmJobs(site, h).test_submit_cmd([n.host for n in srv]),
                                         check=False, timeout=60)
            if res.code != 0:
                return f"{g.name}" + (f" replica {r}" if r else "") + f": {res.error_text()}"
    return ""
