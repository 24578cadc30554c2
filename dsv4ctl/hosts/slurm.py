"""Slurm as a place servers run: the batch script of one server group (a builder) and the
parsers of what ``sbatch`` / ``scontrol`` print (facts). Pure: nothing here runs a command.

One server group of a release is one Slurm job: ``--nodes N --ntasks-per-node 1 --exclusive``,
one ``srun`` task per node (SGLang's ``--node-rank`` is the task's ``SLURM_NODEID``). The script
is built so that the job's fate is the server's (../shared/reference/slurm-images-kubernetes.md,
the five traps seen with SGLang's documented sbatch script on a real slurmctld):

1. the script ends with the ``srun`` step's own exit status, never a bare ``wait``: a rank
   killed ends the job ``FAILED``, not ``COMPLETED 0:0``;
2. ``srun --kill-on-bad-exit=1``: a rank that fails takes the other ranks down with it, so a
   crashed rank cannot leave rank 0 waiting in a job that holds its nodes until its time limit;
3. the ``--dist-init-addr`` port is derived from the release id and the job id
   (:func:`dist_init_port_expr`), so a rank of one release (or job) cannot join another's rank 0,
   and a rollback's rank 0 never meets "address already in use" from the job before it;
4. the serving processes are the batch job's own steps: nothing on the control machine (no
   ``srun --jobid`` client) has to stay alive;
5. a server process that returns on its own (exit 0) is a failure of the job (exit 75,
   ``EX_TEMPFAIL``): a server does not "complete". A job ended by ``scancel`` is ``CANCELLED``
   whatever its processes return.

Per-node output goes to ``LOG_DIR/node<rank>-<jobid>.out`` (srun's ``%n`` and ``%j``), the batch
script's own to ``LOG_DIR/job-<jobid>.out``.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass, field

from ..errors import InputError

# The block the dist-init port is drawn from: SGLang opens the dist-init port and, with attention
# DP, the ports after it (ZMQ; profile/deployment.py: dist_init_ports): 8 ports per slot.
DIST_INIT_BASE = 20000
DIST_INIT_SLOTS = 4000
DIST_INIT_STRIDE = 8
SERVER_RETURNED_EXIT = 75     # EX_TEMPFAIL: a server process that returned on its own

# What the node's task exports before the server starts (the launch command may use them).
NODE_ENV = ("DSV4_NODE_RANK", "DSV4_NODE_ADDR", "DSV4_DIST_INIT_ADDR", "DSV4_RELEASE", "DSV4_JOB_ID")

_TIME = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$|^\d+$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$")
_NODELIST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._,\[\]-]{0,1023}$")


@dataclass(frozen=True)
class JobSpec:
    """One server group of one release as a Slurm job.

    ``command``: the server's launch command for one node (a shell command line; it may use
    ``$DSV4_NODE_RANK``, ``$DSV4_NODE_ADDR`` and ``$DSV4_DIST_INIT_ADDR``, see
    :func:`node_args`). ``log_dir``: a folder every node can write (a shared filesystem path).
    ``nodelist``: Slurm hostlist expression pinning the job (``n[1-2]``), or None.
    ``avoid_ports``: ports the group serves on (HTTP, bootstrap): the dist-init block never
    overlaps them. ``time_limit``: Slurm's ``--time`` (``MM``, ``HH:MM:SS``, ``D-HH:MM``)."""

    profile: str
    group: str
    release: str
    nodes: int
    command: str
    log_dir: str
    workdir: str
    partition: str | None = None
    account: str | None = None
    reservation: str | None = None
    time_limit: str | None = None
    nodelist: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    avoid_ports: tuple[int, ...] = ()
    extra: tuple[str, ...] = field(default=())       # further "#SBATCH" options, verbatim
    instance: str = ""                                # tells apart deployments that share a profile name

    @property
    def job_name(self) -> str:
        """The job's name: ``dsv4ctl:PROFILE:GROUP[:INSTANCE]`` (what ``squeue -n`` finds)."""
        return job_name(self.profile, self.group, self.instance)

    @property
    def comment(self) -> str:
        """The job's comment: the release it runs (what ``scontrol show job`` tells back; one
        word: sbatch reads a ``#SBATCH`` value up to the first blank)."""
        return f"dsv4ctl:release={self.release}:group={self.group}"


def job_name(profile: str, group: str, instance: str = "") -> str:
    """``dsv4ctl:PROFILE:GROUP`` plus ``:INSTANCE`` when given: the name every job of one server
    group of one deployment has (and no other deployment's: ``instance`` is derived from where
    the deployment lives, so two copies of a profile on other roots never cancel each other)."""
    return f"dsv4ctl:{profile}:{group}" + (f":{instance}" if instance else "")


#: Characters a path in an ``#SBATCH`` line or the batch script may not hold: sbatch ends a
#: directive at a blank, expands ``%`` in ``--output``, and a quote or ``$``/backquote would be
#: the shell's.
_BAD_PATH = re.compile(r"[\s'\"`$%\\;&|<>()*?\[\]{}!#~]")


def check_path(path: str, what: str = "path") -> None:
    """InputError (exit 2) for a path a batch script cannot carry whole (:data:`_BAD_PATH`, not
    absolute, a newline)."""
    if not path.startswith("/") or _BAD_PATH.search(path):
        raise InputError(f"slurm: {what} {path!r} must be an absolute path of letters, digits and / . _ - + = @ , : "
                         "(sbatch ends a directive at a blank and expands %)")


def _check(spec: JobSpec) -> None:
    if spec.nodes < 1:
        raise InputError(f"slurm: group {spec.group}: nodes must be >= 1 (got {spec.nodes})")
    for what, v in (("profile", spec.profile), ("group", spec.group), ("partition", spec.partition),
                    ("account", spec.account), ("reservation", spec.reservation)):
        if v is not None and not _NAME.match(v):
            raise InputError(f"slurm: {what} {v!r} is not a Slurm name (letters, digits, ._:@+-)")
    if not re.fullmatch(r"r?[0-9a-f]{6,64}", spec.release):
        raise InputError(f"slurm: release id {spec.release!r} is not a release id (r + hex digits)")
    if spec.time_limit is not None and not _TIME.match(spec.time_limit):
        raise InputError(f"slurm: time limit {spec.time_limit!r} is not Slurm's --time (MM, HH:MM:SS, D-HH:MM)")
    if spec.nodelist is not None and not _NODELIST.match(spec.nodelist):
        raise InputError(f"slurm: node list {spec.nodelist!r} is not a Slurm hostlist (n[1-2],n5)")
    for k, _ in spec.env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise InputError(f"slurm: environment name {k!r} is not a shell variable name")
    if re.search(r"^DSV4_NODE$", spec.command, re.M):
        raise InputError("slurm: the launch command may not contain a line 'DSV4_NODE'")
    for d in (spec.log_dir, spec.workdir):
        check_path(d)
    if spec.instance and not re.fullmatch(r"[0-9a-f]{1,16}", spec.instance):
        raise InputError(f"slurm: instance {spec.instance!r} is not hex")


def release_seed(release: str) -> int:
    """A number derived from the release id (stable across hosts and runs): the release's part
    of the dist-init port."""
    return int(hashlib.sha256(release.encode()).hexdigest()[:8], 16) % DIST_INIT_SLOTS


def dist_init_port(release: str, job_id: int, avoid: tuple[int, ...] = ()) -> int:
    """The dist-init port of ``release`` running as job ``job_id`` (what the batch script
    computes, in Python for tests and for ``status``): ``DIST_INIT_BASE + STRIDE * slot`` where
    ``slot = (release_seed + job_id) % SLOTS``, moved on by one slot while the block of
    ``STRIDE`` ports would cover a port in ``avoid``."""
    slot = (release_seed(release) + job_id) % DIST_INIT_SLOTS
    for _ in range(DIST_INIT_SLOTS):
        port = DIST_INIT_BASE + DIST_INIT_STRIDE * slot
        if not any(port <= a < port + DIST_INIT_STRIDE for a in avoid):
            return port
        slot = (slot + 1) % DIST_INIT_SLOTS
    raise InputError("slurm: no dist-init port block is free of the group's ports")


def dist_init_port_expr(spec: JobSpec) -> list[str]:
    """The bash lines computing ``DSV4_DIST_INIT_PORT`` from ``SLURM_JOB_ID`` exactly as
    :func:`dist_init_port` does."""
    avoid = " ".join(str(p) for p in sorted(set(spec.avoid_ports)))
    return [
        f"slot=$(( ({release_seed(spec.release)} + SLURM_JOB_ID) % {DIST_INIT_SLOTS} ))",
        f"for _ in $(seq {DIST_INIT_SLOTS}); do",
        f"  port=$(( {DIST_INIT_BASE} + {DIST_INIT_STRIDE} * slot )); clash=0",
        f"  for a in {avoid or '0'}; do [ \"$a\" -ge \"$port\" ] && [ \"$a\" -lt $(( port + {DIST_INIT_STRIDE} )) ] && clash=1; done",
        f"  [ \"$clash\" = 0 ] && break; slot=$(( (slot + 1) % {DIST_INIT_SLOTS} ))",
        "done",
        "export DSV4_DIST_INIT_PORT=$port",
    ]


def node_args(nodes: int) -> str:
    """SGLang's multi-node arguments for a node of a Slurm job, as shell words the node's task
    expands (``--nnodes N --node-rank $DSV4_NODE_RANK --dist-init-addr $DSV4_DIST_INIT_ADDR``);
    empty for one node."""
    if nodes <= 1:
        return ""
    return f'--nnodes {nodes} --node-rank "$DSV4_NODE_RANK" --dist-init-addr "$DSV4_DIST_INIT_ADDR"'


_NODE_ADDR = ("scontrol show node -o \"$1\" 2>/dev/null | tr ' ' '\\n' "
              "| sed -n 's/^NodeAddr=//p' | head -n 1")


def batch_script(spec: JobSpec) -> str:
    """The sbatch script of ``spec`` (text; stored in the release and hashed with it).
    InputError for a spec Slurm or the shell could misread."""
    _check(spec)
    q = shlex.quote
    lines = ["#!/bin/bash", f"#SBATCH --job-name={spec.job_name}", f"#SBATCH --comment={spec.comment}",
             f"#SBATCH --nodes={spec.nodes}", "#SBATCH --ntasks-per-node=1", "#SBATCH --exclusive",
             f"#SBATCH --chdir={spec.workdir}", f"#SBATCH --output={spec.log_dir}/job-%j.out",
             "#SBATCH --open-mode=append", "#SBATCH --no-requeue", "#SBATCH --kill-on-invalid-dep=yes"]
    for opt, v in (("partition", spec.partition), ("account", spec.account),
                   ("reservation", spec.reservation), ("time", spec.time_limit), ("nodelist", spec.nodelist)):
        if v is not None:
            lines.append(f"#SBATCH --{opt}={v}")
    lines += [f"#SBATCH {x}" for x in spec.extra]
    lines += ["# generated by dsv4ctl: one server group of one release (dsv4ctl/hosts/slurm.py)",
              "set -u", f"node_addr() {{ {_NODE_ADDR}; }}",
              'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              'head_addr=$(node_addr "$head"); head_addr=${head_addr:-$head}']
    lines += dist_init_port_expr(spec)
    lines += ['export DSV4_DIST_INIT_ADDR="$head_addr:$DSV4_DIST_INIT_PORT"',
              f"export DSV4_RELEASE={spec.release} DSV4_JOB_ID=$SLURM_JOB_ID"]
    lines += [f"export {k}={q(v)}" for k, v in spec.env]
    lines += [f'echo "dsv4ctl: release {spec.release} group {spec.group} job $SLURM_JOB_ID on '
              '$SLURM_JOB_NODELIST, dist-init $DSV4_DIST_INIT_ADDR"',
              "read -r -d '' NODE_CMD <<'DSV4_NODE'",
              f"node_addr() {{ {_NODE_ADDR}; }}",
              'export DSV4_NODE_RANK=$SLURM_NODEID',
              'DSV4_NODE_ADDR=$(node_addr "$SLURMD_NODENAME"); export DSV4_NODE_ADDR=${DSV4_NODE_ADDR:-$SLURMD_NODENAME}',
              'echo "dsv4ctl: node $DSV4_NODE_RANK ($SLURMD_NODENAME, $DSV4_NODE_ADDR) starting"',
              f"( {spec.command}\n)",                 # a subshell: an ``exec`` in the command keeps the trailer
              "rc=$?",
              'echo "dsv4ctl: node $DSV4_NODE_RANK server exited $rc" >&2',
              f'[ "$rc" = 0 ] && rc={SERVER_RETURNED_EXIT}',
              "exit $rc",
              "DSV4_NODE",
              f"srun --kill-on-bad-exit=1 --nodes={spec.nodes} --ntasks-per-node=1 "
              f"--output={spec.log_dir}/node%n-%j.out bash -c \"$NODE_CMD\"",
              "rc=$?",
              'echo "dsv4ctl: srun exited $rc"',
              "exit $rc", ""]
    return "\n".join(lines)


# ---- facts: what scontrol / sbatch print ----

def parse_job(text: str) -> dict[str, str]:
    """``scontrol show job -o JOBID`` (one line of ``Key=Value`` words) as a dict; {} when
    Slurm no longer knows the job (``Invalid job id``). Values with spaces (``Comment``,
    ``Reason``) are kept whole up to the next ``Key=``."""
    text = text.strip()
    if not text or "Invalid job id" in text:
        return {}
    out: dict[str, str] = {}
    key = None
    for word in text.split(" "):
        m = re.match(r"^([A-Za-z][A-Za-z0-9_:/]*)=(.*)$", word)
        if m:
            key = m.group(1)
            out[key] = m.group(2)
        elif key is not None and word:
            out[key] += " " + word
    return out


def parse_sbatch(text: str) -> str:
    """The job id ``sbatch --parsable`` printed (``123`` or ``123;cluster``). InputError when
    the output is not a job id."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    jid = first.split(";")[0]
    if not jid.isdigit():
        raise InputError(f"sbatch printed no job id: {text.strip()[:200]!r}")
    return jid


TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                      "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"})


# ---- commands (builders: the exact command line; the engine runs it on the submit host) ----

def submit_cmd(script: str) -> str:
    """Submit the stored batch script at ``script`` (a path the submit host sees); prints the
    job id (:func:`parse_sbatch`)."""
    return f"sbatch --parsable {shlex.quote(script)}"


def cancel_cmd(job_id: str) -> str:
    """Cancel job ``job_id`` (Slurm signals every step: SIGTERM, then SIGKILL after KillWait)."""
    return f"scancel {int(job_id)}"


def show_job_cmd(job_id: str) -> str:
    """One line of ``Key=Value`` words for the job (:func:`parse_job`); exit 0 with "Invalid job
    id" on stderr once Slurm forgot it (after ``MinJobAge``)."""
    return f"scontrol show job -o {int(job_id)} 2>&1 || true"


SQUEUE_FORMAT = "%i|%T|%r|%k|%N"


def group_jobs_cmd(profile: str, group: str, instance: str = "") -> str:
    """The live jobs (pending, running, completing) of one server group, found by job name:
    ``JOBID|STATE|REASON|COMMENT|NODES`` lines (:func:`parse_squeue`)."""
    name = job_name(profile, group, instance)
    return f"squeue -h -n {shlex.quote(name)} -o {shlex.quote(SQUEUE_FORMAT)}"


def nodes_cmd(nodelist: str) -> str:
    """``scontrol show node -o`` of a hostlist (:func:`parse_nodes`)."""
    if not _NODELIST.match(nodelist):
        raise InputError(f"slurm: node list {nodelist!r} is not a Slurm hostlist (n[1-2],n5)")
    return f"scontrol show node -o {shlex.quote(nodelist)}"


def parse_squeue(text: str) -> list[dict[str, str]]:
    """Lines of :data:`SQUEUE_FORMAT` as dicts (``job``, ``state``, ``reason``, ``comment``,
    ``nodes``); blank and malformed lines are skipped."""
    out = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 5 and parts[0].isdigit():
            out.append(dict(zip(("job", "state", "reason", "comment", "nodes"), parts)))
    return out


def release_of(comment: str) -> str | None:
    """The release id a job comment (:attr:`JobSpec.comment`) names, or None."""
    m = re.search(r"(?:^|:)release=(r?[0-9a-f]{6,64})(?::|$)", comment or "")
    return m.group(1) if m else None


def parse_nodes(text: str) -> dict[str, dict[str, str]]:
    """``scontrol show node -o`` lines as {node name: its fields} (``State`` like ``IDLE``,
    ``ALLOCATED``, ``DOWN+NOT_RESPONDING``, ``IDLE+DRAIN``; ``Reason``; ``NodeAddr``)."""
    out = {}
    for line in text.splitlines():
        rec = parse_job(line)
        if "NodeName" in rec:
            out[rec["NodeName"]] = rec
    return out


@dataclass(frozen=True)
class JobVerdict:
    """What a job's record means for its server: ``phase`` is ``pending``, ``running`` or
    ``ended``; ``ok`` is False for a verdict (a failed, timed-out or cancelled job, a node that
    cannot run it); ``message`` is one line for the operator (with Slurm's reason)."""

    phase: str
    ok: bool
    message: str


_BAD_NODE = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "INVALID")


def job_verdict(rec: dict[str, str], nodes: dict[str, dict[str, str]] | None = None) -> JobVerdict:
    """The :class:`JobVerdict` of a job record (:func:`parse_job`) and, optionally, the nodes it
    asked for (:func:`parse_nodes`): a PENDING job whose nodes are down or drained cannot start
    (a verdict naming each node and Slurm's reason); a job Slurm forgot (``{}``) has ended with
    an unknown state (dsv4ctl's own record says how)."""
    if not rec:
        return JobVerdict("ended", False, "Slurm no longer knows the job (MinJobAge passed; no accounting)")
    state = rec.get("JobState", "?")
    reason = rec.get("Reason", "None")
    jid = rec.get("JobId", "?")
    if state == "PENDING":
        bad = {n: r for n, r in (nodes or {}).items() if any(b in r.get("State", "") for b in _BAD_NODE)}
        if bad:
            why = "; ".join(f"{n} {r.get('State')} ({r.get('Reason', 'no reason')})" for n, r in sorted(bad.items()))
            return JobVerdict("pending", False, f"job {jid} cannot start: node {why}")
        return JobVerdict("pending", True, f"job {jid} pending ({reason})")
    if state in ("RUNNING", "CONFIGURING"):
        return JobVerdict("running", True, f"job {jid} running on {rec.get('NodeList', '?')}")
    if state == "COMPLETING":
        return JobVerdict("ended", False, f"job {jid} ending (COMPLETING, exit {rec.get('ExitCode', '?')})")
    detail = {"TIMEOUT": "reached its time limit", "NODE_FAIL": "lost a node",
              "OUT_OF_MEMORY": "ran out of memory", "CANCELLED": "was cancelled",
              "PREEMPTED": "was preempted", "BOOT_FAIL": "could not boot its nodes",
              "DEADLINE": "passed its deadline", "COMPLETED": "ended although a server never completes",
              "FAILED": "failed"}.get(state, state.lower())
    return JobVerdict("ended", False, f"job {jid} {detail} ({state}, exit {rec.get('ExitCode', '?')}, "
                                      f"reason {reason})")
