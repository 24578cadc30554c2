"""Server groups as Slurm jobs (``deploy.backend: slurm``): the service a deploy's, rollback's and
lifecycle's steps use on a host, in place of the launcher or systemd.

Releases are placed on every node as over SSH (pushed, verified, environment built, switched:
the hosts of the profile are the Slurm nodes, by their Slurm node names). What differs is how a
group runs: one Slurm job per server (a group's, or each of its replicas': ``GROUP@R`` for
replica R > 0; every node of a multi-node server is one task of it), built by
:func:`dsv4ctl.hosts.slurm.batch_script`, stored beside the release on the host that acts for
the server (``ROOT/run/<unit>-<release>.sbatch``) and submitted from there. That host is the
server's node 0, or ``deploy.slurm.submit_host`` for every server (a login host, or this machine:
its switch step stops and starts the groups it runs no node of, :meth:`SlurmJobs.acted_groups`).
Every verb of a server (stop, start) is run by that one host, so the nodes of one server never
race (one node's stop must not cancel the job another node just submitted); the nodes' own steps
only switch their ``current`` link (and stop what ran before Slurm). Each node's task writes the server's output to
that node's own ``ROOT/logs/<group>.log`` with the launcher's start header and exit line, so
``logs``, ``diagnose`` and the gate's log tail read the same files as over SSH.

The job's fate is the server's (:mod:`dsv4ctl.hosts.slurm`): a rank that dies ends the job
FAILED, a crashed rank takes the others down, the dist-init port is derived from the release and
the job. Stop: ``scancel`` by the group's job name, waited for until Slurm lists no job of it
(the nodes are free for the next job), the ended jobs written to the log. Alive: a job of the
group pending, configuring or running. A router group is no Slurm job: it runs on its host as
over SSH (the launcher or systemd), in front of the jobs' node 0."""

from __future__ import annotations

import hashlib
import re

from ..hosts.layout import Paths
from ..hosts.service import backend, group_script
from ..hosts.slurm import JobSpec, batch_script, job_name, job_verdict, parse_job, parse_nodes
from ..hosts.slurmrecord import ended_cmd, job_line_cmd, records_path, submitted_cmd
from ..remote import q
from .site import Site, spec_servers, start_command

#: Seconds a stop waits for Slurm to list no job of the group (scancel, KillWait, epilog).
STOP_WAIT_S = 120
#: Seconds one Slurm command (squeue, scancel, sbatch, scontrol) may take: a controller that
#: stops answering fails the step instead of hanging it.
SLURM_TIMEOUT_S = 30


class SlurmJobs:
    """The slurm service of ``host`` for the groups of ``spec`` (the release being started) and
    ``stop_spec`` (the one being stopped). Same methods as
    :class:`dsv4ctl.hosts.service.Launcher`: each returns one shell command."""

    name = "slurm"

    def __init__(self, site: Site, host: str, spec: dict | None = None, stop_spec: dict | None = None):
        self.site, self.host = site, host
        self.spec, self.stop_spec = spec or {}, stop_spec or {}
        self.settings = site.profile.deploy.slurm
        self.profile = site.profile.name
        f = site.facts.get(host)
        self.ssh = backend(site.profile.deploy.service, bool(f and f.systemd))   # routers run as over SSH

    def _role(self, group: str) -> str | None:
        """The group's role: from the launch specs, else from the profile (a liveness check
        asked without a spec)."""
        for sp in (self.spec, self.stop_spec):
            if group in sp:
                return sp[group].get("role")
        g = self.site.profile.groups.get(group)
        return g.role if g is not None else None

    # -- who acts for a group ------------------------------------------------------------------
    def servers(self, group: str) -> list[list[str]]:
        """The servers of ``group`` (each its hosts in node-rank order; one per replica): from the
        new spec, else the stopped one, else the profile."""
        for sp in (self.spec, self.stop_spec):
            if group in sp:
                return spec_servers(sp[group])
        g = self.site.profile.groups.get(group)
        return [[n.host for n in srv] for srv in g.server_nodes] if g is not None else []

    def node0(self, group: str) -> str | None:
        """Node 0 of the group's first server (replica 0)."""
        srv = self.servers(group)
        return srv[0][0] if srv else None

    @property
    def submit_host(self) -> str | None:
        """The host that runs sbatch/scancel/squeue/scontrol for every group
        (``deploy.slurm.submit_host``), or None: each server's node 0 does."""
        return self.settings.submit_host if self.settings else None

    def replica_of(self, group: str, host: str | None = None) -> int:
        """The replica of ``group`` that runs on ``host`` (default: this host); 0 when none does."""
        host = host or self.host
        return next((r for r, srv in enumerate(self.servers(group)) if host in srv), 0)

    def actor(self, group: str, replica: int = 0) -> str | None:
        """The host that submits, cancels and asks Slurm for replica ``replica`` of ``group``: the
        submit host, else that server's node 0."""
        srv = self.servers(group)
        return self.submit_host or (srv[replica][0] if replica < len(srv) else None)

    #: {group: replicas} this host acts for, when a lifecycle step acts for some (None: all)
    only: dict | None = None

    def acts(self, group: str) -> list[int]:
        """The replicas of ``group`` whose job this host submits and cancels (of :attr:`only`)."""
        return [r for r in range(len(self.servers(group))) if self.actor(group, r) == self.host
                and (self.only is None or r in self.only.get(group, ()))]

    def acted_groups(self, groups: list[str]) -> list[str]:
        """Of ``groups`` (names in the specs), the server groups this host submits for without
        running a node of them (the submit host): the switch adds their stop and start."""
        return [g for g in groups if self._role(g) != "router" and self.acts(g)
                and not any(self.host in srv for srv in self.servers(g))]

    def instance(self, group: str) -> str:
        """8 hex digits of where this deployment keeps the group (node 0's host and deploy root):
        two copies of a profile with one ``name`` on other roots are other jobs."""
        h = self.node0(group)
        if h is None:
            g = self.site.profile.groups.get(group)
            h = g.group.nodes[0].host if g is not None else self.host
        root = self.site.paths[h].root if h in self.site.paths else ""
        return hashlib.sha256(f"{h}\0{root}".encode()).hexdigest()[:8]

    def unit(self, group: str, replica: int = 0) -> str:
        """What a replica's job, script and job-id file are named by: the group, ``GROUP@R`` for
        replica R > 0 (``@`` is no group-name character)."""
        return group if replica == 0 else f"{group}@{replica}"

    def job_file(self, p: Paths, group: str, replica: int = 0) -> str:
        """Where the acting host records the replica's job id: ``run/<group>.job`` on the
        server's node 0 (each replica has its own node 0: what ``status`` reads there), and
        ``run/<unit>.job`` on a submit host (it acts for every replica)."""
        return f"{p.root}/run/{self.unit(group, replica) if self.submit_host else group}.job"

    def records(self, p: Paths, group: str, replica: int = 0) -> str:
        """The replica's job records (:func:`dsv4ctl.hosts.slurmrecord.records_path`), named as
        :meth:`job_file` is: by the group on a node 0 (what ``status`` reads there), by the unit
        on a submit host."""
        return records_path(p.root, self.unit(group, replica) if self.submit_host else group)

    def job_name(self, group: str, replica: int = 0) -> str:
        """The job name of replica ``replica`` of ``group`` (:func:`dsv4ctl.hosts.slurm.job_name`
        with :meth:`instance`)."""
        return job_name(self.profile, self.unit(group, replica), self.instance(group))

    def _env(self) -> str:
        conf = self.settings.conf if self.settings else None
        return f"export SLURM_CONF={q(conf)}; " if conf else ""

    # -- the service verbs -------------------------------------------------------------------
    def stop_cmd(self, p: Paths, group: str) -> str:
        """On the host that acts for each replica of the group (:meth:`acts`): cancel every job
        named for the replica and wait (at most :data:`STOP_WAIT_S` s) until Slurm lists none;
        the ended job ids go to the group's log. Every node also stops what the launcher or
        systemd runs of the group (a release of the ``ssh`` backend before). A router runs on
        its host as over SSH."""
        if self._role(group) == "router":
            return self.ssh.stop_cmd(p, group)
        # a server the launcher or systemd started (the profile ran with deploy.backend: ssh
        # before) is stopped on every node, or it would keep the port and answer the gate
        parts = [self.ssh.stop_cmd(p, group)] if any(self.host in srv for srv in self.servers(group)) else []
        parts += [self._cancel_cmd(p, group, r) for r in self.acts(group)]
        return "; ".join(parts) or "true"

    def _cancel_cmd(self, p: Paths, group: str, replica: int) -> str:
        name, lf, t = q(self.job_name(group, replica)), q(p.logfile(group)), SLURM_TIMEOUT_S
        what = self.unit(group, replica)
        return (f"{self._env()}jobs=$(timeout {t} squeue -h -n {name} -o '%i (%T)') || exit 1; "
                f"ids=$(echo \"$jobs\" | cut -d' ' -f1); jobs=$(echo \"$jobs\" | paste -sd, -); "
                f"if [ -n \"$jobs\" ]; then timeout {t} scancel --name={name} || exit 1; "
                f"end=$(( $(date +%s) + {STOP_WAIT_S} )); "
                f"while [ -n \"$(timeout {t} squeue -h -n {name} -o %i || echo ?)\" ]; do "
                f"if [ $(date +%s) -gt $end ]; then echo \"slurm job(s) $jobs of {what} still listed after {STOP_WAIT_S} s\" >&2; exit 1; fi; "
                f"sleep 0.1; done; mkdir -p {q(p.logdir)}; "
                f"echo \"=== dsv4ctl: slurm job(s) $jobs of {what} cancelled at $(date -u +%Y-%m-%dT%H:%M:%SZ)\" >> {lf}; fi; "
                # the final state of each job cancelled, and of the unit's last job when it ended
                # on its own, recorded while Slurm still knows it (MinJobAge; hosts/slurmrecord.py)
                f"{self._record_ended(p, group, replica, '$ids $(cat ' + q(self.job_file(p, group, replica)) + ' 2>/dev/null)')}")

    def _record_ended(self, p: Paths, group: str, replica: int, jids_expr: str) -> str:
        return ended_cmd(self._env(), SLURM_TIMEOUT_S, jids_expr, self.records(p, group, replica), p.root + "/logs/slurm")

    def start_cmd(self, p: Paths, group: str, rid: str, command: str, env: dict) -> str:
        """On the host that acts for each replica of the group (:meth:`acts`): write the
        replica's batch script beside the release (atomic, once: later starts submit it as
        stored) and submit it; its job id goes to ``run/<unit>.job`` and the log. Every node of
        the group makes its log folders (a node's task writes its log there, node 0's batch
        step its ``logs/slurm`` output). ``command`` and ``env`` are this host's; the script
        renders every node's own from the launch spec. A router runs as over SSH."""
        if self._role(group) == "router":
            return self.ssh.start_cmd(p, group, rid, command, env)
        parts = ([f"mkdir -p {q(p.root + '/logs/slurm')}"] if any(self.host in srv for srv in self.servers(group))
                 else [])
        parts += [self._submit_cmd(p, group, rid, r) for r in self.acts(group)]
        return "; ".join(parts) or "true"

    def _submit_cmd(self, p: Paths, group: str, rid: str, replica: int) -> str:
        unit = self.unit(group, replica)
        script = batch_script(self.job_spec(group, rid, replica))
        path = f"{p.root}/run/{unit}-{rid}.sbatch"
        lf, jf = q(p.logfile(group)), q(self.job_file(p, group, replica))
        # the release's script is written once and submitted as stored (a rollback submits what
        # ran before, not a script rendered again from today's profile); a failed sbatch or an
        # answer that is no job id fails the step (set -e does not hold inside an && chain)
        return (f"{self._env()}mkdir -p {q(p.root + '/run')} {q(p.root + '/logs/slurm')} {q(p.logdir)} || exit 1; "
                f"if [ ! -s {q(path)} ]; then t=$(mktemp {q(path)}.XXXXXX) && printf %s {q(script)} > \"$t\" "
                f"&& mv -f \"$t\" {q(path)} || exit 1; fi; "
                # the unit's last job, when it ended on its own (no stop ran: a start after a failed
                # rank), gets its final state recorded before run/<unit>.job names the new one
                f"{self._record_ended(p, group, replica, '$(cat ' + jf + ' 2>/dev/null)')}; "
                f"jid=$(timeout {SLURM_TIMEOUT_S} sbatch --parsable {q(path)}) || exit 1; jid=${{jid%%;*}}; "
                f"case \"$jid\" in ''|*[!0-9]*) echo \"sbatch printed no job id: $jid\" >&2; exit 1;; esac; "
                f"echo \"$jid\" > {jf}.tmp && mv -f {jf}.tmp {jf} || exit 1; "
                f"{{ {submitted_cmd(self.records(p, group, replica), '$jid', rid, unit)}; }} 2>/dev/null "
                f"|| echo \"dsv4ctl: job $jid not recorded in {self.records(p, group, replica)}\" >&2; "
                f"echo \"=== dsv4ctl: {unit} release {rid} submitted as slurm job $jid "
                f"at $(date -u +%Y-%m-%dT%H:%M:%SZ)\" >> {lf}")

    def alive_cmd(self, p: Paths, group: str) -> str:
        """Exit 0 while a job of the group's replica on this host is pending, configuring or
        running (squeue on this host: a node has Slurm's clients, its batch script runs srun); a
        router's process as over SSH."""
        if self._role(group) == "router":
            return self.ssh.alive_cmd(p, group)
        name = q(self.job_name(group, self.replica_of(group)))
        return f"{self._env()}timeout {SLURM_TIMEOUT_S} squeue -h -n {name} -t PD,CF,R -o %i | grep -q ."

    def process_cmd(self, p: Paths, group: str, containers: bool = True, kept: bool = False) -> str:
        """Status's and diagnose's read of ``group`` on this host: ``@alive`` (its job pending,
        configuring or running, :meth:`alive_cmd`; ``kept``: a server's job the submit host keeps
        the record of, named ``GROUP@R`` for replica R > 0, whose liveness the host's own service
        answers), ``@proc`` (:func:`dsv4ctl.hosts.service.proc_command`: the job id from
        ``run/<group>.job``, the log's start headers), ``@ctr`` on a release-image site
        (``containers``), then ``@job G`` and the job's line (:meth:`show_job_cmd`) when this
        host keeps its job id."""
        from ..hosts.service import process_cmd
        lines = [process_cmd(p, group, None if kept else self.alive_cmd(p, group))]
        image = self.site.profile.sglang.image
        if containers and image is not None:
            from ..hosts.container import container_command, runtime_cmd
            lines.append(container_command(runtime_cmd(image, p.root), p.root, group))
        jf = q(f"{p.root}/run/{group}.job")
        lines.append(f"if [ -s {jf} ]; then echo {q('@job ' + group)}; jid=$( {{ tr -dc 0-9 < {jf}; }} 2>/dev/null); "
                     f"{self.show_job_cmd('$jid', group)} | head -n 1; fi")
        return "\n".join(lines)

    def show_job_cmd(self, jid_expr: str, unit: str | None = None) -> str:
        """``scontrol show job -o`` of the job whose id the shell expression ``jid_expr`` gives
        (``$jid``), bounded; Slurm's error text on stdout when it no longer knows the job. With
        ``unit`` (a group, ``GROUP@R``): one line from :func:`dsv4ctl.hosts.slurmrecord.job_line_cmd`
        (the final state dsv4ctl recorded once Slurm forgot the job; the unit's release and
        restart count)."""
        if unit is not None:
            p = self.site.paths[self.host]
            return job_line_cmd(self._env(), SLURM_TIMEOUT_S, jid_expr, records_path(p.root, unit), p.root + "/logs/slurm")
        return f"{{ {self._env()}timeout {SLURM_TIMEOUT_S} scontrol show job -o {jid_expr}; }} 2>&1 || true"

    def job_state_cmd(self, p: Paths, group: str, replica: int | None = None, out: bool = True) -> str:
        """Read-only, on the host that acts for the replica (``replica``; default: the one on
        this host): its recorded job id, ``scontrol show job`` of it, ``scontrol show node`` of
        its nodes and (``out``: this host is the server's node 0, where the batch step writes)
        the last lines of the job's own output (Slurm's ``srun: error: NODE: task N: Exited
        ...`` names the node that failed): :func:`parse_job_state` reads it; :func:`job_state`
        asks the right hosts."""
        r = self.replica_of(group) if replica is None else replica
        jf, t = q(self.job_file(p, group, r)), SLURM_TIMEOUT_S
        srv = self.servers(group)
        nodes = ",".join(srv[r] if r < len(srv) else [])
        node_part = f"timeout {t} scontrol show node -o {q(nodes)} 2>/dev/null; " if nodes else ""
        return (f"{self._env()}jid=$(cat {jf} 2>/dev/null); echo \"@job $jid\"; [ -n \"$jid\" ] || exit 0; "
                f"{job_line_cmd('', t, '$jid', self.records(p, group, r), p.root + '/logs/slurm')}; "
                f"echo @nodes; {node_part}"
                + (f"echo @out; {job_out_cmd(p, '$jid')}" if out else ""))

    def test_submit_cmd(self, nodes: list[str]) -> str:
        """Read-only: ``sbatch --test-only`` of a job shaped like a group's (its nodes, the
        profile's partition, account, reservation, time limit): exit 0 when Slurm would take it."""
        st = self.settings
        opts = [f"--nodes={len(nodes)}", "--ntasks-per-node=1", "--exclusive", f"--nodelist={','.join(nodes)}"]
        for opt, v in (("partition", st and st.partition), ("account", st and st.account),
                       ("reservation", st and st.reservation), ("time", st and st.time_limit)):
            if v:
                opts.append(f"--{opt}={v}")
        return f"{self._env()}timeout {SLURM_TIMEOUT_S} sbatch --test-only {' '.join(q(o) for o in opts)} --wrap true"

    def nodes_cmd(self, nodes: list[str]) -> str:
        """Read-only: ``scontrol show node -o`` of ``nodes`` (bounded)."""
        return f"{self._env()}timeout {SLURM_TIMEOUT_S} scontrol show node -o {q(','.join(nodes))}"

    def ping_cmd(self) -> str:
        """Exit 0 when the Slurm controller answers (``scontrol ping`` says UP), within
        :data:`SLURM_TIMEOUT_S` s."""
        return (f"{self._env()}out=$(timeout {SLURM_TIMEOUT_S} scontrol ping 2>&1); rc=$?; echo \"$out\"; "
                f"[ $rc = 0 ] && echo \"$out\" | grep -q ' is UP'")

    # -- the batch script --------------------------------------------------------------------
    def node_command(self, host: str, group: str, rid: str) -> str:
        """What ``host``'s task runs: its log opened for append with the launcher's start
        header, the release folder, the group's environment and :func:`group_script` (the
        launch command with SGLang's multi-node options; the dist-init port the job's own)."""
        s = self.spec[group]
        p = self.site.paths[host]
        cmd = start_command(self.site, host, rid, group, s, dist_init_port="$DSV4_DIST_INIT_PORT")
        envs = " ".join(q(f"{k}={v}") for k, v in sorted((s.get("env") or {}).items()))
        lf = q(p.logfile(group))
        return (f"mkdir -p {q(p.logdir)}; exec >>{lf} 2>&1; "
                f"echo \"=== dsv4ctl start {group} release {rid} at $(date -u +%Y-%m-%dT%H:%M:%SZ) "
                f"(slurm job $SLURM_JOB_ID, node $SLURMD_NODENAME)\"; cd {q(p.release(rid))}; "
                f"env {envs} sh -c {q(group_script(group, cmd))}")

    def job_spec(self, group: str, rid: str, replica: int = 0) -> JobSpec:
        """The :class:`JobSpec` of replica ``replica`` of ``group`` of release ``rid``: its nodes
        pinned by name, each node's command chosen by ``$SLURMD_NODENAME``."""
        s = self.spec[group]
        nodes = spec_servers(s)[replica]
        cases = [f"  {h}) {self.node_command(h, group, rid)} ;;" for h in nodes]
        cases.append(f'  *) echo "dsv4ctl: node $SLURMD_NODENAME runs no node of {group}" >&2; exit 2 ;;')
        command = 'case "$SLURMD_NODENAME" in\n' + "\n".join(cases) + "\nesac"
        p0 = self.site.paths[nodes[0]]
        st = self.settings
        avoid = tuple(x for x in (s.get("port"), s.get("bootstrap_port")) if isinstance(x, int))
        return JobSpec(profile=self.profile, group=self.unit(group, replica), release=rid, nodes=len(nodes),
                       command=command, log_dir=f"{p0.root}/logs/slurm", workdir=p0.root, nodelist=",".join(nodes),
                       partition=st.partition if st else None, account=st.account if st else None,
                       reservation=st.reservation if st else None, time_limit=st.time_limit if st else None,
                       avoid_ports=avoid, instance=self.instance(group))


def job_out_cmd(p: Paths, jid_expr: str) -> str:
    """The last lines of a job's batch output on its node 0 (``ROOT/logs/slurm/job-ID.out``)."""
    return f"tail -n 12 {q(p.root + '/logs/slurm')}/job-\"{jid_expr}\".out 2>/dev/null | cut -c1-300"


def job_state(site: Site, host: str, group: str) -> str:
    """The :meth:`SlurmJobs.job_state_cmd` text of the replica of ``group`` whose node 0 is
    ``host``: asked on the host that acts for it (the submit host or ``host``), the job's batch
    output read on ``host`` (a second round trip when the two differ). RemoteError when a host
    cannot be reached."""
    svc = SlurmJobs(site, host)
    r = svc.replica_of(group)
    actor = svc.actor(group, r) or host
    if actor == host:
        return site.transports[host].run(svc.job_state_cmd(site.paths[host], group, r), check=False, timeout=60).out
    a = SlurmJobs(site, actor)
    text = site.transports[actor].run(a.job_state_cmd(site.paths[actor], group, r, out=False), check=False, timeout=60).out
    jid = next((ln[4:].strip() for ln in text.splitlines() if ln.startswith("@job")), "")
    if jid.isdigit():
        out = site.transports[host].run(job_out_cmd(site.paths[host], jid), check=False, timeout=60).out
        text += "\n@out\n" + out
    return text


#: What Slurm's clients print when the controller does not answer (not a job's verdict).
_NO_ANSWER = ("Socket timed out", "Unable to contact slurm controller", "Connection refused",
              "Zero Bytes were transmitted", "Transport endpoint", "slurm_load_jobs error: Unexpected")


def parse_job_state(text: str) -> tuple[bool, str, str | None]:
    """``(alive, why, node)`` from :meth:`SlurmJobs.job_state_cmd` output: alive while the job is
    pending (unless a node it needs is down or drained), configuring or running; else why not,
    in one line (the job's verdict, :func:`dsv4ctl.hosts.slurm.job_verdict`, and the line of its
    output where Slurm names the task that failed first) and ``node``, the node of that task
    (the one whose log says why), or None."""
    sections: dict[str, list[str]] = {"job": [], "nodes": [], "out": []}
    cur = "job"
    jid = ""
    for line in text.splitlines():
        if line.startswith("@job"):
            jid = line[4:].strip()
            continue
        if line in ("@nodes", "@out"):
            cur = line[1:]
            continue
        sections[cur].append(line)
    if not jid:
        return False, "no Slurm job was submitted for the group (run/<group>.job is missing)", None
    said = "\n".join(sections["job"])
    if not said.strip() or any(x in said for x in _NO_ANSWER):
        # the controller did not answer (or timed out): no verdict, the gate keeps waiting
        return True, "the Slurm controller does not answer: " + (said.strip().splitlines() or ["(nothing)"])[-1][:200], None
    rec = parse_job(said)
    v = job_verdict(rec, parse_nodes("\n".join(sections["nodes"])))
    if v.ok:
        return True, v.message, None
    errors = [ln.strip() for ln in sections["out"] if ln.startswith("srun: error:")]
    # the task that failed on its own ("Exited with exit code N", a signal), not those srun
    # terminated after it (--kill-on-bad-exit)
    first = next((e for e in errors if "Terminated" not in e), errors[0] if errors else None)
    m = re.match(r"srun: error: ([^:\s]+): task \d+:", first or "")
    return False, f"Slurm: {v.message}" + (f": {first}" if first else ""), (m.group(1) if m else None)
