"""A runbook's ``service.restart`` on Slurm (issue 42 item 2), on a real Slurm lab whose nodes are
the sshd hosts: a one-node server cannot restart inside its job (the server is the job's one
``srun`` step, the batch script ends with it), so its restart is the job cancelled and the active
release's batch script submitted again (``dsv4ctl/deploy/service.py restarts_in_place``); the
step's dry run says so. Before, the step tried the launcher's pid file on the node and failed
with exit 3 ("not running under dsv4ctl here").

One lab for the module, one world (prefill on h0, decode on h1, the router on h2: one-node
servers) deployed once."""

from __future__ import annotations

import pytest
import yaml

from dsv4ctl.hosts.slurm import release_of
from tests.conftest import run_cli
from tests.slurm.lab import SlurmLab, missing
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.sshd.world import World
from tests.test_slurm_deploy import deploy, jobs, on_slurm, slurm_lab  # noqa: F401  (slurm_lab: this module's lab)

pytestmark = [pytest.mark.sshd, pytest.mark.skipif(missing() is not None, reason=missing() or "")]

BOOK = {"name": "restart-decode", "description": "restart the decode server",
        "steps": [{"id": "restart", "action": "service.restart", "args": {"groups": ["decode"]}}]}


class OneNodeSlurmWorld(World):
    """tests/sshd World (one-node prefill and decode servers, a router) on ``lab``'s partition."""

    lab: SlurmLab | None = None

    def write(self) -> None:
        super().write()
        on_slurm(self.profile, self.lab)


def test_service_restart_of_a_one_node_slurm_server_resubmits_its_job(live_cluster, slurm_lab, tmp_path):
    OneNodeSlurmWorld.lab = slurm_lab
    w = OneNodeSlurmWorld(live_cluster, tmp_path, nhosts=3)
    book = tmp_path / "restart.yaml"
    book.write_text(yaml.safe_dump(BOOK, sort_keys=False))
    try:
        r = deploy(w)
        assert r.code == 0, r.err
        rid, h1 = w.current(w.hosts[1].name), w.hosts[1].name
        [before] = jobs(slurm_lab, "decode")
        dry = run_cli("runbook", "run", str(book), str(w.profile), "--dry-run", env=w.env())
        assert dry.code == 0, dry.err
        assert (f"{h1}: restart decode: cancel its Slurm job, submit the active release's batch script again "
                "(a new job), wait for node 0's /health, audit") in dry.out, dry.out
        assert "in place" not in dry.out and [j["job"] for j in jobs(slurm_lab, "decode")] == [before["job"]]
        r = run_cli("runbook", "run", str(book), str(w.profile), "--yes", env=w.env(), timeout=240)
        assert r.code == 0, r.out[-2000:] + r.err[-2000:]
        [after] = jobs(slurm_lab, "decode")
        assert after["job"] != before["job"] and after["state"] in ("RUNNING", "CONFIGURING"), (before, after)
        assert release_of(after["comment"]) == rid == release_of(before["comment"])
        last = [a for a in w.audit(h1) if a.get("action", "").startswith("service-")][-1]
        assert (last["action"], last["result"], last.get("group")) == ("service-restart", "ok", "decode"), last
        [pre] = jobs(slurm_lab, "prefill")            # the other server's job is not touched
        assert release_of(pre["comment"]) == rid
    finally:
        slurm_lab.run("scancel", "--partition", slurm_lab.partition)
        w.stop_services()
