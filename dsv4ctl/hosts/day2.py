"""Day-2 facts of a host, each one read-only command and a pure parser: what runs (``status``),
the server logs (``logs``) and the audit log (``audit``).

Whether a group runs, which process and how often it restarted is not read here: where servers
run answers it (``dsv4ctl/deploy/service.py: process_reads``, each service's ``process_cmd``
printing the ``@alive``/``@proc``/``@ctr``/``@job`` lines this module parses), so the launcher,
systemd, Slurm jobs and containers answer the same question (tests/test_service_seam.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..remote import q
from .layout import HostFacts, Paths, facts_command, parse_facts

#: The container's process read lives with the container runtime (``hosts/container.py``); the
#: name stays importable here for tests/test_image_core.py, which reads a stand-in docker with it.
from .container import container_command  # noqa: E402,F401


@dataclass
class HostStatus:
    """One host: its facts, which of its groups' processes are alive, its last audit record."""

    facts: HostFacts
    alive: dict[str, bool] = field(default_factory=dict)
    last_audit: dict | None = None
    verify: dict | None = None       # the current release against its manifest (verify-only report)
    procs: dict[str, "GroupProcess"] = field(default_factory=dict)
    recent: list[dict] = field(default_factory=list)     # the audit records of the tail read, oldest first
    jobs: dict[str, dict] = field(default_factory=dict)  # slurm: {group: scontrol's record of its job}


@dataclass
class GroupProcess:
    """What a host knows of one group's process: ``pid`` (launcher pid file or systemd MainPID;
    None when unknown), ``uptime_s`` (seconds since that process started, from ``ps -o etimes``;
    None when it does not run), ``restarts`` (start and restart headers in the group's log since
    the active release's first start there: 0 for a server started once), ``exit_status`` (after
    the last header, as the launcher's exit line says; None while it runs or when unknown) and
    ``job`` (slurm: the group's job id from ``run/<group>.job``); on a release-image site
    ``container`` and ``image`` (64 hex each: the group's running container and its image id,
    :func:`dsv4ctl.hosts.container.container_command`), and then ``uptime_s`` is the container's
    (since its start)."""

    pid: int | None = None
    uptime_s: int | None = None
    restarts: int = 0
    exit_status: int | None = None
    job: str | None = None
    container: str | None = None
    image: str | None = None


#: Bytes at the end of ``audit.jsonl`` that ``status`` reads for the last record; a last line
#: this long or longer arrives cut and is reported as an unreadable last record.
AUDIT_TAIL_MAX = 65536


def parse_proc(line: str) -> tuple[str, GroupProcess] | None:
    """(group, :class:`GroupProcess`) from one ``@proc`` line
    (:func:`dsv4ctl.hosts.service.proc_command`), or None."""
    parts = line.split()
    if len(parts) != 7 or parts[0] != "@proc":
        return None

    def num(v: str) -> int | None:
        return int(v) if v.lstrip("-").isdigit() and v != "-" else None
    return parts[1], GroupProcess(pid=num(parts[2]), uptime_s=num(parts[3]), restarts=num(parts[4]) or 0,
                                  exit_status=num(parts[5]), job=parts[6] if parts[6].isdigit() else None)


def status_command(root: str, probes: dict[str, str], verify: str | None = None) -> str:
    """One shell command: the host's facts (:func:`facts_command`), then each group's process
    read ``probes`` ({group: shell printing ``@alive G yes|no``, ``@proc``, and ``@ctr`` / ``@job``
    where they apply}: where servers run answers them, ``dsv4ctl/deploy/service.py:
    process_reads``), then with ``verify`` (a command that reads a verify job on stdin,
    :func:`dsv4ctl.deploy.drift.verify_command`) ``@verify`` and its report on the current release,
    then ``@audit`` and the last :data:`AUDIT_TAIL_MAX` bytes of ``audit.jsonl`` (a huge last line
    costs neither the host nor this machine more)."""
    p = Paths(root)
    lines = [facts_command(root), *probes.values()]
    if verify:
        # environment files by RECORD size here (a multi-GB torch environment hashed on every
        # status would make it slow); verify and every switch hash them
        job = q('{"verify": ["' + p.current.replace("\\", "\\\\").replace('"', '\\"') + '"], "env_hash": false}')
        lines.append(f"echo @verify; if [ -d {q(p.current)} ]; then printf '%s' {job} | {verify} 2>&1 || true; fi")
    lines.append(f"echo @audit; tail -c {AUDIT_TAIL_MAX} {q(p.audit)} 2>/dev/null || true")
    return "\n".join(lines)


def parse_status(host: str, root: str, text: str) -> HostStatus:
    """HostStatus from :func:`status_command`'s output (pure). A last audit line that is no JSON
    object is ``{"unreadable": its first 200 characters}``, plus ``"cut": true`` when it filled the
    :data:`AUDIT_TAIL_MAX` bytes read (longer than that on the host)."""
    lines = text.splitlines()
    i = lines.index("@audit") if "@audit" in lines else len(lines)
    head, tail = lines[:i], lines[i + 1:]
    alive: dict[str, bool] = {}
    keep = []
    ver = None
    if "@verify" in head:
        j = head.index("@verify")
        head, vlines = head[:j], [ln for ln in head[j + 1:] if ln.strip()]
        try:
            ver = json.loads(vlines[-1]) if vlines else None
        except ValueError:
            ver = {"error": vlines[-1][:200]}
        if ver is not None and not isinstance(ver, dict):
            ver = {"error": str(ver)[:200]}
    procs: dict[str, GroupProcess] = {}
    jobs: dict[str, dict] = {}
    job_of = None
    for ln in head:
        if job_of is not None:
            from .slurm import parse_job
            jobs[job_of], job_of = parse_job(ln), None
        elif ln.startswith("@alive "):
            _, g, v = ln.split(" ", 2)
            alive[g] = v == "yes"
        elif ln.startswith("@proc "):
            got = parse_proc(ln)
            if got is not None:
                procs[got[0]] = got[1]
        elif ln.startswith("@ctr "):
            w = ln.split()
            if len(w) == 5 and w[1] in procs:
                procs[w[1]].container, procs[w[1]].image = w[2], w[3].removeprefix("sha256:")
                procs[w[1]].uptime_s = max(0, int(w[4])) if w[4].lstrip("-").isdigit() else procs[w[1]].uptime_s
        elif ln.startswith("@job "):
            job_of = ln[5:].strip()
        else:
            keep.append(ln)
    last = None
    tail = [ln for ln in tail if ln.strip()]
    # every whole record of the tail (its first line may be cut: not JSON, left out)
    recent = [r for r in (_record(ln) for ln in tail[:-1]) if r is not None]
    if tail:
        # the host sent at most AUDIT_TAIL_MAX bytes (one replacement character per bad byte)
        if len(tail[-1].encode("utf-8", "surrogateescape")) >= AUDIT_TAIL_MAX - 1:
            last = {"unreadable": tail[-1][:200], "cut": True}
        else:
            last = _record(tail[-1])
            if last is None:
                last = {"unreadable": tail[-1][:200]}
            else:
                recent.append(last)
    return HostStatus(parse_facts(host, root, "\n".join(keep)), alive, last, ver, procs, recent, jobs)


def last_audit_text(rec: dict) -> str:
    """One printable line for a host's last audit record (pure): ``ts who action release
    result``, or ``unreadable last record`` (and why) with its start. Control characters and
    lone surrogates (a ``\\udcff`` escape in the JSON) are written out, never sent to the terminal."""
    from ..render import clip, printable

    def show(v) -> str:
        return printable(str(v).encode("utf-8", "backslashreplace").decode("utf-8"))
    if "unreadable" in rec:
        why = f" (longer than {AUDIT_TAIL_MAX} bytes: cut)" if rec.get("cut") else ""
        return f"unreadable last record{why}: {clip(show(rec['unreadable']), 80)}"
    words = [rec.get("ts", "?"), rec.get("who", "?"), rec.get("action", "?"), rec.get("release", ""),
             rec.get("result", "?")]
    return " ".join(clip(show(w), 120) for w in words if w not in ("", None))


#: Bytes of one server log line that reach dsv4ctl (the host cuts longer lines): a runaway line
#: of hundreds of MB must cost neither the host's awk nor this machine its memory. Every reader
#: of ``logs/<group>.log`` cuts there (``logs``, ``diagnose``, the gate's tail:
#: :func:`dsv4ctl.hosts.service.log_tail_cmd`).
LOG_LINE_MAX = 16384

#: Bytes one follow read (``logs -f``) takes at most; the rest comes with the next reads.
LOG_CHUNK_MAX = 4 << 20


def log_read_command(p: Paths, group: str, offset: int | None, lines: int) -> str:
    """Shell: print the size S of the group's log, then its last ``lines`` lines (``offset``
    None; each cut to :data:`LOG_LINE_MAX` bytes on the host), or the bytes
    [offset, min(S, offset + LOG_CHUNK_MAX)) — bytes not read now are read next time, never
    twice (:func:`follow_offset`). Both service backends append to ``logs/<group>.log``."""
    lf = q(p.logfile(group))
    off = int(offset or 0)
    body = (f"tail -n {int(lines)} {lf} | cut -b1-{LOG_LINE_MAX}" if offset is None else
            f"n=$((s - {off})); [ $n -gt {LOG_CHUNK_MAX} ] && n={LOG_CHUNK_MAX}; tail -c +{off + 1} {lf} | head -c $n")
    return f"if [ -f {lf} ]; then s=$(wc -c < {lf}); echo $s; {body}; else echo -1; fi"


def follow_offset(offset: int, chunk: bytes) -> tuple[int, bytes]:
    """(next offset, the complete lines of ``chunk`` to show) after a follow read at ``offset``:
    an unterminated last line waits for its end, unless the chunk is a full LOG_CHUNK_MAX of one
    line (a runaway line is shown in pieces rather than never)."""
    done, nl, partial = chunk.rpartition(b"\n")
    if not nl:
        if len(chunk) >= LOG_CHUNK_MAX:
            return offset + len(chunk), chunk + b"\n"
        return offset, b""
    return offset + len(done) + 1, done + b"\n"


def parse_log_read(text: str) -> tuple[int, str]:
    """(log size in bytes, or -1 when there is no log; the text) from :func:`log_read_command`."""
    first, _, rest = text.partition("\n")
    try:
        return int(first.strip()), rest
    except ValueError:
        return -1, ""


def audit_command(p: Paths) -> str:
    """Shell: the host's whole audit log (empty when there is none)."""
    return f"cat {q(p.audit)} 2>/dev/null || true"


#: Where a record begins: every audit record is one JSON object whose first key is ``ts``
#: (:func:`dsv4ctl.hosts.audit.audit_record`, :func:`dsv4ctl.hosts.audit.stamped_json_cmd`); inside a
#: JSON string the quotes are escaped, so this text starts a record and nothing else.
_RECORD_START = '{"ts":'


def _record(text: str) -> dict | None:
    """One JSON object, or None (not JSON, not an object, nested too deep)."""
    try:
        rec = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return rec if isinstance(rec, dict) else None


def parse_audit(host: str, text: str) -> list[dict]:
    """Audit records of one host (JSON lines). An unreadable line is kept as a record with
    ``unreadable`` (its first 200 characters) and action ``?``. A line torn by a full disk that
    the next append continued (``{"ts":…,"act{"ts":…}``, written before appends started on a
    fresh line) is split: the torn part is the unreadable record, the whole record after it is
    read as usual."""
    def bad(ln: str) -> dict:
        return {"ts": "", "host": host, "action": "?", "result": "?", "unreadable": ln[:200]}

    out = []
    for ln in text.splitlines():
        if not ln.strip():
            continue
        rec = _record(ln)
        if rec is None:
            # the last whole record appended onto a torn one (at most a few tries per line)
            i, tries = ln.find(_RECORD_START, 1), 0
            while i > 0 and tries < 8:
                rec = _record(ln[i:])
                if rec is not None:
                    out.append(bad(ln[:i]))
                    break
                i, tries = ln.find(_RECORD_START, i + 1), tries + 1
            if rec is None:
                rec = bad(ln)
        rec.setdefault("host", host)
        out.append(rec)
    return out


def merge_audit(per_host: dict[str, list[dict]], since: str | None = None, host: str | None = None,
                offsets: dict[str, float] | None = None) -> list[dict]:
    """Every host's records merged by time (``ts``, ISO 8601 UTC), optionally from ``since`` on
    and of one ``host``. ``offsets`` ({host: seconds its clock is ahead of this machine's,
    :attr:`dsv4ctl.hosts.clock.ClockReading.applied`}): ``since`` (this machine's time) is compared
    with each host's records in that host's time, and records are ordered by this machine's time
    (a record keeps the ``ts`` its host wrote)."""
    from .clock import host_cutoff_iso
    offsets = offsets or {}
    pairs = [(h, r) for h, rs in per_host.items() if host in (None, h) for r in rs]
    if since:
        cut = {h: host_cutoff_iso(since, offsets[h]) if offsets.get(h) else since for h in per_host}
        pairs = [(h, r) for h, r in pairs if str(r.get("ts", "")) >= cut[h]]

    def when(h: str, r: dict) -> str:
        ts = str(r.get("ts", ""))
        return host_cutoff_iso(ts, -offsets[h]) if offsets.get(h) else ts
    pairs.sort(key=lambda p: (when(*p), p[1].get("host", "")))
    return [r for _, r in pairs]


#: Audit actions that start, stop or replace a group's process: the last one of these that
#: concerns a group says whether a group that is down was stopped on purpose.
PROCESS_ACTIONS = frozenset({"deploy", "rollback", "start", "stop", "restart", "service-start", "service-restart",
                             "hicache-on", "hicache-off", "config-set"})


def _groups_of(rec: dict) -> set[str] | None:
    """The groups an audit record concerns (``groups``, ``group``; a ``stop`` record written
    before it carried ``groups``: the servers its detail names), or None for every group."""
    if isinstance(rec.get("groups"), list):
        return {str(g).split("#")[0] for g in rec["groups"]}
    if rec.get("group"):
        return {str(rec["group"]).split("#")[0]}
    d = str(rec.get("detail", ""))
    if rec.get("action") == "stop" and d.startswith("stopped "):
        return {w.split("#")[0].split(" ")[0] for w in d[len("stopped "):].split(", ")}
    return None


def stop_record(recent: list[dict], group: str) -> dict | None:
    """The audit record of a ``dsv4ctl stop`` that left ``group`` stopped (pure): the last record
    of :data:`PROCESS_ACTIONS` concerning ``group`` when it is a ``stop`` that succeeded; None when
    the last one started or replaced it (or none is in ``recent``, the records of the tail read)."""
    for r in reversed(recent):
        gs = _groups_of(r)
        if r.get("action") not in PROCESS_ACTIONS or (gs is not None and group not in gs):
            continue
        return r if r.get("action") == "stop" and r.get("result") == "ok" else None
    return None


def group_state(alive: bool, health: str | None, proc: "GroupProcess | None", stopped: dict | None,
                drifted: bool, grace_s: float, node: int = 0, nnodes: int = 1) -> tuple[str, str, bool]:
    """(state, in words, unhealthy?) of one node of a group on a host (pure):

    * ``stopped`` — not running, and the last audit record that concerns it is a ``dsv4ctl stop``
      (``stopped``: that record; its who and ts are the words): not unhealthy;
    * ``crashed`` — not running otherwise (with the exit status the launcher logged);
    * ``drifted`` — running a release whose files differ from its manifest;
    * ``starting`` — running, /health not answering yet, younger than ``grace_s`` (the deploy's
      health timeout, ``deploy.health_timeout_s``): not unhealthy;
    * ``unhealthy`` — running, /health failing past that;
    * ``running`` — running and healthy (a node other than 0, ``health`` None: its process runs).
    """
    if not alive:
        if stopped is not None:
            msg = f' ("{stopped["message"]}")' if stopped.get("message") else ""
            return "stopped", f"stopped by {stopped.get('who', '?')} at {stopped.get('ts', '?')}{msg}", False
        ex = proc.exit_status if proc is not None else None
        words = "process not running" + (f" (exited with status {ex})" if ex is not None else "")
        if nnodes > 1 and node > 0:
            words = (f"node {node} of {nnodes}: {words} (node 0 stalls in its collectives until its watchdog "
                     "ends it)")
        return "crashed", words, True
    if drifted:
        return "drifted", "its release differs from its manifest", True
    if health in (None, "ok"):
        return "running", "ok", False
    up = proc.uptime_s if proc is not None else None
    if up is not None and up < grace_s:
        return "starting", f"{health} (started {up} s ago; the health timeout is {grace_s:g} s)", False
    return "unhealthy", health, True


def uptime_text(s: int | None) -> str:
    """``45 s``, ``12 min``, ``3.5 h``, ``2.1 d`` (``-`` for None)."""
    if s is None:
        return "-"
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s / 3600:.1f} h" if s < 172800 else f"{s / 86400:.1f} d"
