"""Releases on Slurm, the start wait and day 2 (issue 43, Deliver 3 and 4), on a real Slurm lab
whose nodes are the four sshd hosts (tests/test_slurm_deploy.py's world) and whose slurmctld
forgets a finished job 2 s after it ends (``MinJobAge=2``, no accounting: as on the sites the
issue measured, only faster): a job that stays PENDING past ``deploy.slurm.start_timeout_s``,
job records that outlive Slurm's memory, status's job columns and restart count, and a gate that
refuses a server that is not the new job's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import yaml

from dsv4ctl.hosts.slurm import release_of
from tests.conftest import REPO, run_cli, worker_index
from tests.slurm.lab import SlurmLab, missing
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.sshd.world import http_status, wait_for
from tests.test_slurm_deploy import deploy, jobs, world  # noqa: F401  (world: on this module's lab)

pytestmark = [pytest.mark.sshd, pytest.mark.skipif(missing() is not None, reason=missing() or "")]


@pytest.fixture(scope="module")
def slurm_lab(sshd_cluster, tmp_path_factory):
    lab = SlurmLab.start(tmp_path_factory.mktemp("slurm"), net=worker_index(),
                         nodes={h.name: h.address for h in sshd_cluster.hosts}, min_job_age=2)
    yield lab
    lab.stop()


def records(w, host: str, unit: str) -> list[dict]:
    p = w.roots[host] / "run" / f"{unit}.jobs.jsonl"
    return [json.loads(ln) for ln in p.read_text().splitlines()] if p.exists() else []


def kill_rank(rank: int, port: int) -> None:
    """SIGKILL the stand-in of node ``rank`` of the server on ``port``."""
    for pid in subprocess.run(["pgrep", "-f", "standin_sglang.*--node-rank"], capture_output=True, text=True).stdout.split():
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            if b"--node-rank" in cmd and cmd[cmd.index(b"--node-rank") + 1] == str(rank).encode() \
                    and str(port).encode() in b" ".join(cmd):
                os.kill(int(pid), signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError):
            pass


def set_slurm(w, **kv) -> None:
    prof = yaml.safe_load(w.profile.read_text())
    prof["deploy"]["slurm"].update(kv)
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))


def test_a_job_pending_past_the_start_timeout_is_cancelled_and_the_previous_release_resubmitted(world):
    w, lab = world, world.lab
    assert deploy(w).code == 0
    good = w.current("h0")
    [old] = jobs(lab, "decode")
    # another job waits for decode's nodes: once the deploy cancels decode's job it takes them
    blocker = lab.run("sbatch", "--parsable", "-N2", "--nodelist=h2,h3", "--exclusive", "--output=/dev/null",
                      "--wrap", "sleep 600").stdout.strip()
    assert blocker.isdigit()
    w.extra["decode"] = {"watchdog-timeout": 901}
    w.write()
    set_slurm(w, start_timeout_s=3)
    dry = deploy(w, "--dry-run")             # the gate step says what the run waits for and proves
    assert dry.code == 0 and "wait for the Slurm job of decode to leave PENDING (at most 3 s), then GET " in dry.out, dry.out
    assert "; the process answering is that job's" in dry.out
    r = run_cli("deploy", str(w.profile), "--tree", str(w.tree), "--base", "v0.5.23", "--no-preflight",
                env={**w.env(), "DSV4CTL_PROGRESS_S": "1"}, timeout=180)
    assert r.code == 1, r.err + r.out
    # progress while it pends: the job, Slurm's reason and its place in the partition's queue
    subs = [x["job"] for x in records(w, "h2", "decode") if x["event"] == "submitted" and x["release"] != good]
    assert subs, (r.err, list((w.roots["h2"] / "run").iterdir()))
    new = subs[0]
    assert "slurm: waiting for 1 job(s) to start" in r.err
    assert f"decode job {new} pending (Resources), position 1 of 1 pending in partition gpu" in r.err, r.err
    assert f"host h2 group decode: Slurm: job {new} still PENDING after 3 s (reason Resources" in r.err, r.err
    assert f"rolled back to {good} on all hosts" in r.err
    assert set(w.currents().values()) == {good}
    # the pending job was cancelled (recorded with its final state), the previous release's
    # stored script submitted again; it runs once the other job gives the nodes back
    ended = {x["job"]: x["slurm"] for x in records(w, "h2", "decode") if x["event"] == "ended"}
    assert ended[new].startswith("JobState=CANCELLED") and ended[old["job"]].startswith("JobState=CANCELLED"), ended
    [again] = jobs(lab, "decode")
    assert release_of(again["comment"]) == good and again["job"] not in (old["job"], new)
    lab.run("scancel", blocker)
    assert wait_for(lambda: [j["state"] for j in jobs(lab, "decode")] == ["RUNNING"], timeout=30)


def test_status_shows_each_jobs_release_restarts_and_recorded_end_and_the_gate_refuses_a_leftover(world):
    w, lab = world, world.lab
    assert deploy(w).code == 0
    rid = w.current("h0")
    assert run_cli("restart", str(w.profile), "-g", "decode", env=w.env()).code == 0
    r = run_cli("status", str(w.profile), "--json", env=w.env())
    assert r.code == 0, r.err
    hosts = r.json()["hosts"]
    [dj] = jobs(lab, "decode")
    dec, pre = hosts["h2"]["groups"]["decode"]["slurm"], hosts["h0"]["groups"]["prefill"]["slurm"]
    assert (dec["job"], dec["state"], dec["nodes"], dec["release"], dec["restarts"]) == \
        (dj["job"], "RUNNING", "h[2-3]", rid, 1), dec
    assert (pre["release"], pre["restarts"], pre["source"]) == (rid, 0, "slurm") and pre["elapsed"], pre
    table = run_cli("status", str(w.profile), env=w.env())
    assert f"slurm job {dj['job']} RUNNING on h[2-3]" in table.out and "1 restart(s)" in table.out, table.out
    # a rank killed: the job ends FAILED; the next start records its final state, stop records
    # the cancelled one's; Slurm forgets both (MinJobAge), status still shows how each ended
    kill_rank(1, w.ports["decode"])
    assert wait_for(lambda: lab.job(dj["job"]).get("JobState") == "FAILED", timeout=30)
    assert run_cli("start", str(w.profile), "-g", "decode", env=w.env()).code == 0
    [nj] = jobs(lab, "decode")
    assert run_cli("stop", str(w.profile), "-g", "decode", env=w.env()).code == 0
    assert wait_for(lambda: lab.job(dj["job"]) == {} and lab.job(nj["job"]) == {}, timeout=60), "slurmctld did not forget"
    ended = {x["job"]: x["slurm"] for x in records(w, "h2", "decode") if x["event"] == "ended"}
    assert ended[dj["job"]].startswith("JobState=FAILED") and "Reason=NonZeroExitCode" in ended[dj["job"]], ended
    assert ended[nj["job"]].startswith("JobState=CANCELLED"), ended
    r = run_cli("status", str(w.profile), "--json", env=w.env())
    dec = r.json()["hosts"]["h2"]["groups"]["decode"]["slurm"]
    assert (dec["job"], dec["state"], dec["source"], dec["release"]) == (nj["job"], "CANCELLED", "record", rid), dec
    assert dec["exit_code"] == "0:15" and dec["restarts"] == 2, dec
    # diagnose reads the same line: the forgotten job's end is evidence, the JSON has the job
    d = run_cli("diagnose", str(w.profile), "--json", env=w.env())
    assert d.json()["groups"]["decode"]["slurm"] == dec, d.out
    d = run_cli("diagnose", str(w.profile), env=w.env())
    assert f"h2: slurm job {nj['job']} CANCELLED (exit 0:15; from record)" in d.out, d.out
    # releases lists each release's jobs with their recorded ends
    rel = run_cli("releases", str(w.profile), "--json", env=w.env()).json()
    [row] = [x for x in rel["hosts"]["h2"]["releases"] if x["id"] == rid]
    ends = {j["job"]: j["ended"] for j in row["slurm_jobs"] if j["unit"] == "decode"}
    assert ends[dj["job"]].startswith("JobState=FAILED") and ends[nj["job"]].startswith("JobState=CANCELLED"), ends
    table = run_cli("releases", str(w.profile), env=w.env()).out
    assert f"decode {dj['job']} FAILED, decode {nj['job']} CANCELLED" in table.replace("\n", " "), table
    # decode stopped: a leftover server (no Slurm job) answers on its port; start's gate refuses it
    addr, port = w.hosts[2].address, w.ports["decode"]
    leftover = subprocess.Popen([sys.executable, "-m", "tests.sshd.standin_sglang", "--host", addr, "--port", str(port)],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert wait_for(lambda: http_status(f"http://{addr}:{port}/health") == 200, timeout=20)
        r = run_cli("start", str(w.profile), "-g", "decode", env=w.env(), timeout=180)
        assert r.code == 1, r.err + r.out
        assert f"the server answering on {addr}:{port} is pid {leftover.pid} (no Slurm job), not Slurm job" in r.err, r.err
    finally:
        os.killpg(leftover.pid, signal.SIGKILL)
        leftover.wait()
