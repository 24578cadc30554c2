"""The Slurm parts of a gate (``deploy.backend: slurm``): the start wait before the health wait,
and the proof of which job answers after it.

Start wait: a server's job that is PENDING has not started; its queue time is not the server's
start time (the health timeout counts from when the job runs). While a job pends, progress lines
say its queue position among the pending jobs of its partition (``squeue -t PD`` in Slurm's
priority order) and Slurm's reason (``Resources``, ``Priority``, ``ReqNodeNotAvail...``); a job
still PENDING after ``deploy.slurm.start_timeout_s`` (default :data:`START_TIMEOUT_S`) is a
verdict with that reason: the gate fails, the run cancels the job and resubmits the previous
release's stored script (the caller's rollback).

Which job answers: a ``/health`` 200 proves a server answers on the port, not that it is the
job just submitted — a server left from another job, or one started outside Slurm, can hold the
port while the new job's rank 0 dies on "address already in use". After the health wait, on
each server's node 0 the processes listening on the server's port (``ss -ltnp``) are read with
the ``SLURM_JOB_ID`` of their environment (``/proc/PID/environ``); the gate fails unless every
one is a process of the job the run submitted."""

from __future__ import annotations

import re
import time
from urllib.parse import urlsplit

from ..errors import RemoteError
from ..hosts.health import Failure
from ..hosts.slurm import parse_job
from ..remote import q
from .site import Site
from .slurmjobs import SLURM_TIMEOUT_S, SlurmJobs, job_state, parse_job_state

#: Seconds a server's new job may stay PENDING before it is a verdict (``deploy.slurm.start_timeout_s``).
START_TIMEOUT_S = 600.0
#: Seconds between two reads of the pending jobs' state.
POLL_S = 1.0


def start_timeout(site: Site) -> float:
    """``deploy.slurm.start_timeout_s`` of the profile, else :data:`START_TIMEOUT_S` (s)."""
    st = site.profile.deploy.slurm
    v = getattr(st, "start_timeout_s", None) if st is not None else None
    return START_TIMEOUT_S if v is None else float(v)


def slurm_targets(site: Site, steps: list) -> list:
    """The health gate steps of ``steps`` whose server is a Slurm job (none over SSH; a router
    runs as over SSH)."""
    if site.profile.deploy.backend != "slurm":
        return []
    return [s for s in steps if s.extra.get("kind") == "health"
            and SlurmJobs(site, s.host)._role(s.extra["group"]) != "router"]


def _job_of(text: str) -> tuple[str, dict]:
    """(job id, its record) from :meth:`SlurmJobs.job_state_cmd` text."""
    jid, lines = "", []
    for line in text.splitlines():
        if line.startswith("@job"):
            jid = line[4:].strip()
        elif line in ("@nodes", "@out"):
            break
        else:
            lines.append(line)
    return jid, parse_job("\n".join(lines))


def queue_position(site: Site, host: str, group: str, jid: str, partition: str) -> str:
    """``position K of N pending in partition P`` of job ``jid`` (Slurm's priority order, then
    job id), asked where Slurm's clients run for the group; "" when Slurm does not list it."""
    svc = SlurmJobs(site, host)
    actor = svc.actor(group, svc.replica_of(group)) or host
    cmd = f"{svc._env()}timeout {SLURM_TIMEOUT_S} squeue -h -t PD -o '%i|%P' -S -p,i"
    try:
        out = site.transports[actor].run(cmd, check=False, timeout=60).out
    except RemoteError:
        return ""
    ids = [ln.split("|")[0] for ln in out.splitlines() if ln.count("|") == 1 and ln.split("|")[1] == partition]
    return f"position {ids.index(jid) + 1} of {len(ids)} pending in partition {partition}" if jid in ids else ""


def _pending(site: Site, steps: list) -> dict:
    """{step: (job id, Slurm's reason, queue position text)} of the steps whose job is PENDING
    (and can start: a job waiting on a down or drained node is the health gate's verdict)."""
    out = {}
    for s in steps:
        g = s.extra["group"]
        try:
            text = job_state(site, s.host, g)
        except RemoteError:
            continue                        # a lost host: the health gate says so
        jid, rec = _job_of(text)
        if rec.get("JobState") != "PENDING" or not parse_job_state(text)[0]:
            continue
        out[s] = (jid, rec.get("Reason", "None"), queue_position(site, s.host, g, jid, rec.get("Partition", "")))
    return out


def start_wait(site: Site, steps: list, cap: float | None = None, every: float = 30.0) -> list:
    """Before the health wait: wait while any Slurm job of ``steps``' servers is PENDING, with a
    progress line at once and every ``every`` s (the health wait's
    :func:`dsv4ctl.deploy.engine.progress_interval`; job,
    reason, queue position, elapsed of the limit). Returns [] once none pends, else one
    :class:`~dsv4ctl.hosts.health.Failure` per job still PENDING after :func:`start_timeout` s
    (Slurm's reason in it; at most ``cap`` s when given: a restored release's wait). An
    interrupt propagates (the caller puts the old release back)."""
    todo = slurm_targets(site, steps)
    if not todo:
        return []
    limit, t0 = start_timeout(site) if cap is None else min(cap, start_timeout(site)), time.monotonic()
    next_line = t0
    while True:
        pend = _pending(site, todo)
        if not pend:
            return []
        todo = list(pend)
        now = time.monotonic()
        what = "; ".join(f"{s.extra['group']} job {jid} pending ({why})" + (f", {pos}" if pos else "")
                         for s, (jid, why, pos) in pend.items())
        if now - t0 >= limit:
            return [Failure(s.host, s.extra["group"],
                            f"Slurm: job {jid} still PENDING after {limit:g} s (reason {why}"
                            + (f", {pos}" if pos else "") + "): it did not start")
                    for s, (jid, why, pos) in pend.items()]
        if now >= next_line:
            site.opts.log(f"slurm: waiting for {len(pend)} job(s) to start, {now - t0:.0f} s of {limit:g} s: {what}")
            next_line = now + every
        time.sleep(POLL_S)


def listeners_cmd(port: int) -> str:
    """Shell: ``ss -Hltnp`` lines of the sockets listening on ``port`` (without ``ss``: one
    ``LISTEN 0 0 *:PORT *:* pid=P`` line per process holding a listening socket of that port in
    ``/proc/net/tcp{,6}``, any address), then ``@pid PID JOB`` for each of their processes
    (``JOB`` its ``SLURM_JOB_ID``, ``-`` when it has none, ``?`` when its environment cannot be
    read: another user's process)."""
    hexport = f"{port:04X}"
    proc = ("ino=$(awk '$4==\"0A\" && $2 ~ /:" + hexport + "$/ {print $10}' /proc/net/tcp /proc/net/tcp6 2>/dev/null); "
            "for i in $ino; do find /proc/[0-9]*/fd -maxdepth 1 -lname \"socket:\\[$i\\]\" 2>/dev/null; done "
            "| cut -d/ -f3 | sort -u | sed 's/^/LISTEN 0 0 *:" + str(port) + " *:* pid=/'")
    return (f"if command -v ss >/dev/null 2>&1; then l=$(ss -Hltnp {q(f'sport = :{port}')} 2>/dev/null); "
            f"else l=$({proc}); fi; echo \"$l\"; "
            "for p in $(echo \"$l\" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do "
            "if [ -r /proc/$p/environ ]; then "
            "j=$(tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | sed -n 's/^SLURM_JOB_ID=//p' | head -n 1); "
            "else j='?'; fi; echo \"@pid $p ${j:--}\"; done")


def parse_listeners(text: str, address: str) -> dict[str, str]:
    """{pid: its SLURM_JOB_ID or "-"} of the processes listening on ``address`` (or on every
    address: ``0.0.0.0``, ``*``, ``[::]``) in :func:`listeners_cmd` output."""
    pids: set[str] = set()
    jobs: dict[str, str] = {}
    wild = {"0.0.0.0", "*", "[::]", "::", "[::ffff:0.0.0.0]"}
    for line in text.splitlines():
        if line.startswith("@pid "):
            _, pid, job = (line.split() + ["-"])[:3]
            jobs[pid] = job
            continue
        cols = line.split()
        if len(cols) < 4:
            continue
        local = cols[3].rsplit(":", 1)[0]
        if local.strip("[]") == address.strip("[]") or local in wild:
            pids.update(p.split("=", 1)[1] for p in re.findall(r"pid=\d+", line))
    return {p: jobs.get(p, "-") for p in sorted(pids, key=int)}


def answering_jobs(site: Site, steps: list) -> list:
    """After a health wait that passed: one :class:`~dsv4ctl.hosts.health.Failure` per Slurm
    server whose port, on its node 0, is held by a process that is not of the job the run
    submitted (read from ``run/<unit>.job``), or when no process can be seen listening there;
    [] when every answering server is its new job's."""
    fails = []
    for s in slurm_targets(site, steps):
        g, url = s.extra["group"], urlsplit(s.extra["url"])
        try:
            jid, _ = _job_of(job_state(site, s.host, g))
            text = site.transports[s.host].run(listeners_cmd(url.port), check=False, timeout=60).out
        except RemoteError as e:
            fails.append(Failure(s.host, g, f"could not tell which process answers on port {url.port}: {e}"))
            continue
        owners = parse_listeners(text, url.hostname or "")
        strangers = {p: j for p, j in owners.items() if j != jid}
        if not owners:
            fails.append(Failure(s.host, g, f"no process is seen listening on {url.hostname}:{url.port} "
                                            f"(ss -ltnp), so the answer cannot be tied to Slurm job {jid}"))
        elif strangers:
            who = ", ".join(f"pid {p} (" + ("no Slurm job" if j == "-" else "its environment cannot be read" if j == "?"
                                          else f"Slurm job {j}") + ")" for p, j in strangers.items())
            fails.append(Failure(s.host, g, f"the server answering on {url.hostname}:{url.port} is {who}, not "
                                            f"Slurm job {jid} that this run submitted (a leftover server holds the port)"))
    return fails
