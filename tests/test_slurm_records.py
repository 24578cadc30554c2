"""dsv4ctl's record of its Slurm jobs (dsv4ctl/hosts/slurmrecord.py) run by a real shell against
Slurm clients that answer as a controller does once it forgot a job (``scontrol``: "Invalid job
id", ``sacct``: accounting disabled, or with accounting): which source gives a forgotten job's
final state, how the restart count is taken, and which jobs get an ``ended`` line. The lab run is
tests/test_slurm_day2.py; these pin the fallbacks the lab cannot show in seconds."""

from __future__ import annotations

import subprocess

from dsv4ctl.hosts import slurmrecord as R
from dsv4ctl.hosts.slurm import parse_job


def _bin(tmp_path, scontrol: str, sacct: str):
    b = tmp_path / "bin"
    b.mkdir(exist_ok=True)
    for name, body in (("scontrol", scontrol), ("sacct", sacct)):
        (b / name).write_text("#!/bin/sh\n" + body + "\n")
        (b / name).chmod(0o755)
    return b


def _sh(cmd: str, path) -> str:
    import os
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True,
                       env={**os.environ, "PATH": f"{path}:{os.environ['PATH']}"})
    assert r.returncode == 0, r.stderr
    return r.stdout


FORGOT = 'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1'
NO_ACCT = 'echo "Slurm accounting storage is disabled" >&2; exit 1'


def test_a_forgotten_jobs_state_comes_from_the_record_then_the_output_and_restarts_count_the_releases_run(tmp_path):
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    (root / "logs" / "slurm").mkdir(parents=True)
    rec, out = R.records_path(str(root), "decode"), str(root / "logs" / "slurm")
    b = _bin(tmp_path, FORGOT, NO_ACCT)
    for jid, rid in (("11", "r1aaaaaa"), ("12", "r1aaaaaa"), ("13", "r2bbbbbb"), ("14", "r2bbbbbb"), ("15", "r2bbbbbb")):
        _sh(f"jid={jid}; " + R.submitted_cmd(rec, "$jid", rid, "decode"), b)
    (root / "logs" / "slurm" / "job-14.out").write_text("srun: error: h3: task 1: Killed\ndsv4ctl: srun exited 137\n")
    # 13: no trace anywhere (not recorded); 14: its batch output says how srun ended
    _sh("ids='13 14 14'; " + R.ended_cmd("", 5, "$ids", rec, out), b)
    ended = [r for r in R.parse_records((root / "run" / "decode.jobs.jsonl").read_text()) if r["event"] == "ended"]
    assert [(r["job"], r["slurm"]) for r in ended] == [("14", "JobState=FAILED ExitCode=137:0 Reason=NonZeroExitCode")]
    line = _sh("jid=14; " + R.job_line_cmd("", 5, "$jid", rec, out), b)
    job = parse_job(line)
    assert (job["JobState"], job["ExitCode"], job["Dsv4Source"], job["Dsv4Release"], job["Dsv4Restarts"]) == \
        ("FAILED", "137:0", "record", "r2bbbbbb", "2")
    assert parse_job(_sh("jid=13; " + R.job_line_cmd("", 5, "$jid", rec, out), b)) == {}
    # with accounting, sacct's answer comes first
    b = _bin(tmp_path, FORGOT, 'echo "TIMEOUT|0:0"')
    job = parse_job(_sh("jid=14; " + R.job_line_cmd("", 5, "$jid", rec, out), b))
    assert (job["JobState"], job["ExitCode"], job["Dsv4Source"]) == ("TIMEOUT", "0:0", "sacct")


def test_a_job_slurm_still_runs_gets_no_ended_line(tmp_path):
    rec = R.records_path(str(tmp_path), "g")
    (tmp_path / "run").mkdir()
    b = _bin(tmp_path, 'echo "JobId=7 JobState=RUNNING Reason=None ExitCode=0:0"', NO_ACCT)
    _sh("ids=7; " + R.ended_cmd("", 5, "$ids", rec, str(tmp_path)), b)
    assert not (tmp_path / "run" / "g.jobs.jsonl").exists()
    b = _bin(tmp_path, 'echo "JobId=7 JobState=CANCELLED Reason=None ExitCode=0:15"', NO_ACCT)
    _sh("ids=7; " + R.ended_cmd("", 5, "$ids", rec, str(tmp_path)), b)
    _sh("ids=7; " + R.ended_cmd("", 5, "$ids", rec, str(tmp_path)), b)     # once per job
    assert [r["slurm"] for r in R.parse_records((tmp_path / "run" / "g.jobs.jsonl").read_text())] == \
        ["JobState=CANCELLED Reason=None ExitCode=0:15"]


def test_the_process_listening_on_a_port_is_read_with_its_slurm_job_with_and_without_ss():
    """What the gate's proof of the answering job reads (dsv4ctl/deploy/slurmwait.py): the pid
    listening on the server's port and the SLURM_JOB_ID of its environment, from ``ss`` or, on a
    node without it, from /proc/net/tcp and the processes' sockets."""
    import os
    import sys

    from dsv4ctl.deploy.slurmwait import listeners_cmd, parse_listeners
    code = ("import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
            "print(s.getsockname()[1], flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "SLURM_JOB_ID": "4242"},
                         stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())
        assert parse_listeners(_sh(listeners_cmd(port), ""), "127.0.0.1") == {str(p.pid): "4242"}
        out = subprocess.run(["bash", "-c", 'command() { [ "$2" = ss ] && return 1; builtin command "$@"; }; '
                              + listeners_cmd(port)], capture_output=True, text=True).stdout
        assert parse_listeners(out, "127.0.0.1") == {str(p.pid): "4242"}
        assert parse_listeners(out.replace("@pid", "@x"), "10.0.0.9") == {str(p.pid): "-"}   # any address
        assert parse_listeners(_sh(listeners_cmd(port), ""), "10.0.0.9") == {}                # ss: its address
    finally:
        p.kill()
        p.wait()
