"""The Slurm batch-script builder and the scontrol/sbatch parsers (dsv4ctl/hosts/slurm.py), with
data: the exact lines that make the job's fate the server's, input refusals, and the dist-init
port the script computes equal to the Python one (bash run here, no cluster)."""

from __future__ import annotations

import subprocess

import pytest

from dsv4ctl.errors import InputError
from dsv4ctl.hosts.slurm import (DIST_INIT_STRIDE, JobSpec, batch_script, dist_init_port, dist_init_port_expr,
                                 node_args, parse_job, parse_sbatch)


def spec(**kw) -> JobSpec:
    base = dict(profile="pro", group="decode", release="0f1e2d3c4b5a", nodes=2,
                command='python -m sglang.launch_server --config decode.yaml ' + node_args(2),
                log_dir="/shared/rel/logs/decode", workdir="/shared/rel", partition="gpu",
                time_limit="2-00:00:00", nodelist="n[1-2]", avoid_ports=(30000, 8998))
    base.update(kw)
    return JobSpec(**base)


def test_the_script_ends_with_the_servers_status_and_kills_on_a_bad_exit():
    text = batch_script(spec())
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    for want in ("#SBATCH --job-name=dsv4ctl:pro:decode", "#SBATCH --comment=dsv4ctl:release=0f1e2d3c4b5a:group=decode",
                 "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --exclusive",
                 "#SBATCH --partition=gpu", "#SBATCH --time=2-00:00:00", "#SBATCH --nodelist=n[1-2]",
                 "#SBATCH --output=/shared/rel/logs/decode/job-%j.out", "#SBATCH --no-requeue"):
        assert want in lines, want
    srun = [x for x in lines if x.startswith("srun ")]
    assert srun == ['srun --kill-on-bad-exit=1 --nodes=2 --ntasks-per-node=1 '
                    '--output=/shared/rel/logs/decode/node%n-%j.out bash -c "$NODE_CMD"']
    assert lines[-3:] == ["rc=$?", 'echo "dsv4ctl: srun exited $rc"', "exit $rc"]
    assert "wait" not in lines and not any(x.rstrip().endswith("&") for x in lines)
    assert '[ "$rc" = 0 ] && rc=75' in lines          # a server that returns on its own fails the job


def test_account_reservation_and_env_are_rendered_quoted():
    text = batch_script(spec(account="ml", reservation="maint", env=(("NCCL_DEBUG", "WARN x"),)))
    assert "#SBATCH --account=ml" in text and "#SBATCH --reservation=maint" in text
    assert "export NCCL_DEBUG='WARN x'" in text


@pytest.mark.parametrize("kw, msg", [
    (dict(nodes=0), "nodes must be >= 1"),
    (dict(partition="gpu; rm -rf /"), "is not a Slurm name"),
    (dict(release="not-hex!"), "is not a release id"),
    (dict(time_limit="forever"), "is not Slurm's --time"),
    (dict(nodelist="n1 n2"), "is not a Slurm hostlist"),
    (dict(env=(("BAD NAME", "1"),)), "is not a shell variable name"),
    (dict(log_dir="logs"), "must be an absolute path"),
    (dict(command="echo\nDSV4_NODE\nrm -rf /"), "may not contain a line"),
])
def test_bad_specs_are_refused(kw, msg):
    with pytest.raises(InputError, match=msg):
        batch_script(spec(**kw))


@pytest.mark.parametrize("job", [1, 17, 3999, 4000, 123456])
def test_the_scripts_dist_init_port_is_the_python_one(job):
    s = spec(avoid_ports=(30000, 20008 + DIST_INIT_STRIDE * 5))
    script = "\n".join(dist_init_port_expr(s)) + "\necho $DSV4_DIST_INIT_PORT\n"
    out = subprocess.run(["bash", "-c", script], env={"SLURM_JOB_ID": str(job), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout.strip()
    assert int(out) == dist_init_port(s.release, job, s.avoid_ports)


def test_the_port_differs_between_releases_and_jobs_and_avoids_the_servers_ports():
    a, b = dist_init_port("0f1e2d3c4b5a", 10), dist_init_port("aaaaaaaaaaaa", 10)
    assert a != b and dist_init_port("0f1e2d3c4b5a", 11) != a
    blocked = dist_init_port("0f1e2d3c4b5a", 10, avoid=(a + 3,))
    assert blocked != a and not blocked <= a + 3 < blocked + DIST_INIT_STRIDE


def test_one_node_has_no_node_args():
    assert node_args(1) == ""
    assert node_args(3) == '--nnodes 3 --node-rank "$DSV4_NODE_RANK" --dist-init-addr "$DSV4_DIST_INIT_ADDR"'


def test_parse_job_keeps_values_with_blanks_and_forgets_unknown_jobs():
    line = ("JobId=42 JobName=dsv4ctl:pro:decode UserId=root(0) JobState=PENDING Reason=ReqNodeNotAvail,_UnavailableNodes:n2 "
            "Dependency=(null) Comment=dsv4ctl:release=0f1e:group=decode NodeList=(null) ExitCode=0:0")
    rec = parse_job(line)
    assert rec["JobId"] == "42" and rec["JobState"] == "PENDING"
    assert rec["Reason"] == "ReqNodeNotAvail,_UnavailableNodes:n2"
    assert rec["Comment"] == "dsv4ctl:release=0f1e:group=decode"
    assert parse_job("slurm_load_jobs error: Invalid job id specified") == {}
    assert parse_job("") == {}
    assert parse_job("JobId=7 Command=/x/run a b StdOut=/x/o")["Command"] == "/x/run a b"


def test_parse_sbatch():
    assert parse_sbatch("123\n") == "123"
    assert parse_sbatch("77;lab\n") == "77"
    with pytest.raises(InputError, match="no job id"):
        parse_sbatch("sbatch: error: Batch job submission failed: Invalid partition name specified")


def test_squeue_lines_and_the_release_a_comment_names():
    from dsv4ctl.hosts.slurm import parse_squeue, release_of
    rows = parse_squeue("12|RUNNING|None|dsv4ctl:release=0f1e2d3c4b5a:group=decode|n[1-2]\n\ngarbage\n"
                        "13|PENDING|Resources|dsv4ctl:release=aaaaaaaaaaaa:group=decode|\n")
    assert [r["job"] for r in rows] == ["12", "13"]
    assert rows[1] == {"job": "13", "state": "PENDING", "reason": "Resources",
                       "comment": "dsv4ctl:release=aaaaaaaaaaaa:group=decode", "nodes": ""}
    assert release_of(rows[0]["comment"]) == "0f1e2d3c4b5a"
    assert release_of("someone else's job") is None and release_of("") is None


@pytest.mark.parametrize("rec, nodes, phase, ok, words", [
    ({"JobId": "5", "JobState": "PENDING", "Reason": "Resources"}, {}, "pending", True, "pending (Resources)"),
    ({"JobId": "5", "JobState": "PENDING", "Reason": "ReqNodeNotAvail"},
     {"n2": {"NodeName": "n2", "State": "IDLE+DRAIN", "Reason": "bad ECC"}}, "pending", False,
     "cannot start: node n2 IDLE+DRAIN (bad ECC)"),
    ({"JobId": "5", "JobState": "RUNNING", "NodeList": "n[1-2]"}, {}, "running", True, "running on n[1-2]"),
    ({"JobId": "5", "JobState": "FAILED", "ExitCode": "137:0", "Reason": "NonZeroExitCode"}, {}, "ended", False,
     "failed (FAILED, exit 137:0"),
    ({"JobId": "5", "JobState": "TIMEOUT", "ExitCode": "0:15", "Reason": "TimeLimit"}, {}, "ended", False,
     "reached its time limit"),
    ({"JobId": "5", "JobState": "NODE_FAIL", "ExitCode": "0:0", "Reason": "NodeDown"}, {}, "ended", False, "lost a node"),
    ({}, {}, "ended", False, "no longer knows the job"),
])
def test_job_verdicts(rec, nodes, phase, ok, words):
    from dsv4ctl.hosts.slurm import job_verdict
    v = job_verdict(rec, nodes)
    assert (v.phase, v.ok) == (phase, ok) and words in v.message, v


def test_parse_nodes():
    from dsv4ctl.hosts.slurm import parse_nodes
    text = ("NodeName=n1 Arch=x86_64 CoresPerSocket=1 NodeAddr=127.0.1.201 NodeHostName=vm State=IDLE ThreadsPerCore=1\n"
            "NodeName=n2 NodeAddr=127.0.1.202 State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@2026-12-07T16:00:00]\n")
    nodes = parse_nodes(text)
    assert nodes["n1"]["NodeAddr"] == "127.0.1.201" and nodes["n1"]["State"] == "IDLE"
    assert nodes["n2"]["Reason"] == "Not responding [slurm@2026-12-07T16:00:00]"
