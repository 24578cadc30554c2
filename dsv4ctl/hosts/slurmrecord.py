"""dsv4ctl's own record of the Slurm jobs it submits and cancels (builders of the shell that writes
and reads it, and the parser): Slurm without accounting (no ``slurmdbd``: ``sacct`` says
"accounting storage is disabled") forgets a finished job ``MinJobAge`` seconds after it ends
(300 s by default; slurm.conf(5)), and then ``scontrol show job`` says only "Invalid job id".

The record is ``ROOT/run/<unit>.jobs.jsonl`` beside ``run/<unit>.job`` on the host that submits
the unit's jobs (a server's node 0, or the submit host), one JSON object per line, appended with
one ``printf >>`` each (one ``write(2)`` of less than ``PIPE_BUF`` bytes to an ``O_APPEND`` file:
lines never interleave):

- ``{"job": "ID", "event": "submitted", "release": RID, "unit": UNIT, "at": ISO}`` by every submit;
- ``{"job": "ID", "event": "ended", "slurm": "JobState=... ExitCode=... Reason=...", "at": ISO}``
  by every stop (cancel) for each job it cancelled and for the unit's last job when that one
  ended on its own (a rank that failed, a time limit): its final state as ``scontrol`` (or
  ``sacct``) gave it before Slurm forgot the job.

:func:`job_line_cmd` prints one ``scontrol show job -o``-shaped line for a job: Slurm's own
while it knows the job; else ``sacct``'s when accounting answers, else the record's final state,
else what the job's batch output (``logs/slurm/job-ID.out``) says of srun's exit — marked
``Dsv4Source=sacct|record|output`` — followed by ``Dsv4Release=RID Dsv4Restarts=N`` from the
record (:func:`restarts`)."""

from __future__ import annotations

import json

from ..remote import q

#: Slurm job states that are no final state yet (the job may still run or be torn down).
LIVE_STATES = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING")


def records_path(root: str, unit: str) -> str:
    """The record file of ``unit`` (a group, or ``GROUP@R``) under deploy root ``root``."""
    return f"{root}/run/{unit}.jobs.jsonl"


def _now() -> str:
    return "$(date -u +%Y-%m-%dT%H:%M:%SZ)"


def submitted_cmd(path: str, jid_expr: str, rid: str, unit: str) -> str:
    """Shell appending the ``submitted`` record of job ``jid_expr`` (``$jid``) of ``unit``'s
    release ``rid`` to ``path`` (fails the step when it cannot be written)."""
    fmt = '{"job":"%s","event":"submitted","release":"%s","unit":"%s","at":"%s"}\\n'
    return f"printf '{fmt}' \"{jid_expr}\" {q(rid)} {q(unit)} \"{_now()}\" >> {q(path)}"


def job_line_cmd(env: str, timeout: int, jid_expr: str, path: str, out_dir: str) -> str:
    """Shell printing one line of ``Key=Value`` words for job ``jid_expr`` (module docstring):
    scontrol's, else sacct's, the record's or the batch output's final state (``Dsv4Source``),
    then the record's ``Dsv4Release`` and ``Dsv4Restarts`` of the unit. Read-only; bounded by
    ``timeout`` s per Slurm command."""
    j, t, rec = jid_expr, timeout, q(path)
    return (f"{{ _l=$( {{ {env}timeout {t} scontrol show job -o \"{j}\"; }} 2>&1 | head -n 1); "
            f"case \"$_l\" in *'Invalid job id'*) "
            f"_a=$( {{ {env}timeout {t} sacct -n -P -X -j \"{j}\" -o State,ExitCode; }} 2>/dev/null | head -n 1); "
            f"_r=$(grep -F \"\\\"job\\\":\\\"{j}\\\",\\\"event\\\":\\\"ended\\\"\" {rec} 2>/dev/null | tail -n 1 "
            f"| sed -n 's/.*\"slurm\":\"\\([^\"]*\\)\".*/\\1/p'); "
            f"_x=$(tail -n 5 {q(out_dir)}/job-\"{j}\".out 2>/dev/null "
            f"| sed -n 's/^dsv4ctl: srun exited \\([0-9][0-9]*\\)$/\\1/p' | tail -n 1); "
            f"if [ -n \"$_a\" ]; then _l=\"JobId={j} JobState=${{_a%%|*}} ExitCode=${{_a#*|}} Dsv4Source=sacct\"; "
            f"elif [ -n \"$_r\" ]; then _l=\"JobId={j} $_r Dsv4Source=record\"; "
            f"elif [ -n \"$_x\" ]; then _l=\"JobId={j} JobState=FAILED ExitCode=$_x:0 Reason=NonZeroExitCode Dsv4Source=output\"; fi;; "
            f"esac; printf '%s%s\\n' \"$_l\" \"$({restarts_awk(path)})\"; }}")


def restarts_awk(path: str) -> str:
    """Shell printing `` Dsv4Release=RID Dsv4Restarts=N`` from the record at ``path``: the
    release of the last ``submitted`` record and how many jobs of it were submitted after the
    first one of its latest run of submissions (a deploy or rollback onto it starts the count
    at 0; each ``start``/``restart`` after adds one). Nothing without a record."""
    prog = ('index($0, "\\"event\\":\\"submitted\\"") && match($0, /"release":"[^"]*"/) '
            '{ r = substr($0, RSTART + 11, RLENGTH - 12); if (r == cur) n++; else { cur = r; n = 0 } } '
            'END { if (cur != "") printf " Dsv4Release=%s Dsv4Restarts=%d", cur, n }')
    return f"awk {q(prog)} {q(path)} 2>/dev/null"


def ended_cmd(env: str, timeout: int, jids_expr: str, path: str, out_dir: str) -> str:
    """Shell appending the ``ended`` record of each job id in ``jids_expr`` (a shell word list,
    ``$ids``) that has none yet and whose state (:func:`job_line_cmd`) is final; a job Slurm
    still runs, or one it forgot with no trace, is left out."""
    fmt = '{"job":"%s","event":"ended","slurm":"%s","at":"%s"}\\n'
    states = "|".join(f"*JobState={s}*" for s in LIVE_STATES)
    line = job_line_cmd(env, timeout, "$_j", path, out_dir)
    return (f"for _j in {jids_expr}; do case \"$_j\" in ''|*[!0-9]*) continue;; esac; "
            f"grep -qF \"\\\"job\\\":\\\"$_j\\\",\\\"event\\\":\\\"ended\\\"\" {q(path)} 2>/dev/null && continue; "
            f"_s=$({line} | tr ' ' '\\n' | grep -E '^(JobState|ExitCode|Reason)=' | paste -sd' ' - | tr -d '\"\\\\'); "
            f"case \"$_s\" in ''|{states}) continue;; esac; "
            f"printf '{fmt}' \"$_j\" \"$_s\" \"{_now()}\" >> {q(path)} || true; done")


def job_view(rec: dict, job_id: str | None = None) -> dict:
    """A server group's Slurm job as ``status`` and ``diagnose`` show it, from the
    :func:`job_line_cmd` line parsed by :func:`dsv4ctl.hosts.slurm.parse_job` (``rec``; {} when
    nothing is known, then ``job_id`` from ``run/<unit>.job``): ``job`` id, ``state``, ``nodes``,
    ``elapsed`` (Slurm's RunTime), ``release`` (the job's comment's, else the record's),
    ``restarts`` (jobs of that release submitted after its deploy or rollback: each
    start/restart), ``exit_code`` and ``reason`` once it ended, and ``source``: ``slurm``, or
    ``sacct``/``record``/``output`` when Slurm forgot the job (MinJobAge) and its final state came
    from accounting, dsv4ctl's record or the job's batch output (None: no state known)."""
    from .slurm import release_of
    state = rec.get("JobState", "unknown to Slurm")
    ended = state not in ("PENDING", "RUNNING", "CONFIGURING", "unknown to Slurm")
    return {"job": rec.get("JobId") or job_id, "state": state,
            "nodes": rec.get("NodeList"), "elapsed": rec.get("RunTime"),
            "release": release_of(rec.get("Comment", "")) or rec.get("Dsv4Release"),
            "restarts": int(rec["Dsv4Restarts"]) if rec.get("Dsv4Restarts", "").isdigit() else 0,
            "exit_code": rec.get("ExitCode") if ended else None, "reason": rec.get("Reason") if ended else None,
            "source": rec.get("Dsv4Source", "slurm") if rec.get("JobState") else None}


def job_text(view: dict) -> str:
    """One line of a :func:`job_view`: ``slurm job 7 FAILED (exit 1:0, NonZeroExitCode; from
    record)``."""
    detail = [x for x in (f"exit {view['exit_code']}" if view.get("exit_code") else "",
                          view.get("reason") if view.get("reason") not in (None, "None") else "") if x]
    src = f"from {view['source']}" if view.get("source") not in (None, "slurm") else ""
    inner = ", ".join(detail) + ("; " if detail and src else "") + src
    return f"slurm job {view['job']} {view['state']}" + (f" ({inner})" if inner else "")


def records_cmd(root: str) -> str:
    """Read-only shell: every job record under deploy root ``root`` (``run/*.jobs.jsonl``)."""
    return f"cat {q(root)}/run/*.jobs.jsonl 2>/dev/null; true"


def release_jobs(records: list[dict], rid: str) -> list[dict]:
    """The jobs submitted for release ``rid`` in ``records`` (:func:`parse_records`), oldest
    first: ``unit``, ``job``, ``submitted_at`` and ``ended`` (the recorded final state,
    ``JobState=... ExitCode=... Reason=...``, or None while none is recorded: running, or
    ended with no stop or start since)."""
    ended = {r["job"]: r.get("slurm") for r in records if r.get("event") == "ended"}
    return [{"unit": r.get("unit"), "job": r["job"], "submitted_at": r.get("at"), "ended": ended.get(r["job"])}
            for r in records if r.get("event") == "submitted" and r.get("release") == rid]


def jobs_text(jobs: list[dict], last: int = 3) -> str:
    """The last ``last`` of :func:`release_jobs` in one line: ``decode 12 FAILED, decode 15
    (no end recorded)`` (``+N earlier`` in front when there are more)."""
    def one(j: dict) -> str:
        state = next((w.split("=", 1)[1] for w in (j.get("ended") or "").split() if w.startswith("JobState=")), None)
        return f"{j['unit']} {j['job']} " + (state or "(no end recorded)")
    more = f"+{len(jobs) - last} earlier, " if len(jobs) > last else ""
    return more + ", ".join(one(j) for j in jobs[-last:])


def parse_records(text: str) -> list[dict]:
    """The records of a ``jobs.jsonl`` text, oldest first (a line that is no JSON object, such
    as one cut by a full disk, is left out)."""
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "job" in rec:
            out.append(rec)
    return out
