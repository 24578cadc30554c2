"""Releases on a Slurm cluster's shared filesystem (issue 43: "where releases live"): every node's
deploy root is one folder (here: one folder of this machine that the four sshd hosts h0..h3 all
see, as the nodes of a cluster see one NFS/Lustre path) and the profile says
``deploy.slurm.shared_root: true``. One lock, one push, one ``current`` switch, one close (state
and audit) at the root's owner (the submit host: h0); each node's own files get per-node names
(``logs/<node>/<group>.log``), the batch output is per job and node (``logs/slurm``). Deploy, gate,
rollback, status, logs per node, verify once; the dry run lists the steps the run takes.

One Slurm lab for the module (test_slurm_deploy's fixture: slurmctld + a slurmd per sshd host)."""

from __future__ import annotations

import json
import os
import signal

import pytest
import yaml

from dsv4ctl.hosts.slurm import release_of
from tests.conftest import run_cli
from tests.slurm.lab import SlurmLab, missing
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.test_multinode_deploy import TwoNodeWorld
from tests.test_slurm_deploy import jobs, lab_world, slurm_lab  # noqa: F401  (slurm_lab: this module's lab)

pytestmark = [pytest.mark.sshd, pytest.mark.skipif(missing() is not None, reason=missing() or "")]


class SharedWorld(TwoNodeWorld):
    """prefill over h0+h1, decode over h2+h3 (one Slurm job each), the router on h0; every
    host's ``root`` is ``shared`` and the profile says ``deploy.slurm.shared_root: true``."""

    lab: SlurmLab | None = None

    def write(self) -> None:
        super().write()
        self.shared = self.tmp / "shared-root"
        self.roots = {h: self.shared for h in self.roots}
        prof = yaml.safe_load(self.profile.read_text())
        prof["deploy"]["backend"] = "slurm"
        prof["deploy"]["slurm"] = {"partition": self.lab.partition, "conf": str(self.lab.conf), "time_limit": "60",
                                   "shared_root": True}
        for h in prof["hosts"]:
            h["root"] = str(self.shared)
        self.profile.write_text(yaml.safe_dump(prof, sort_keys=False))

    def log(self, host: str, group: str) -> str:
        p = self.shared / "logs" / host / f"{group}.log"
        return p.read_text() if p.exists() else ""

    def stop_services(self) -> None:
        """Kill what the launcher started (the router), by each node's pid file (``run/<node>/``)."""
        for pf in (self.shared / "run").glob("*/*.pid"):
            try:
                os.killpg(int(pf.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError, PermissionError):
                pass


@pytest.fixture
def world(live_cluster, slurm_lab, tmp_path):
    yield from lab_world(SharedWorld, live_cluster, slurm_lab, tmp_path)


def cli(w, *args, timeout=180):
    return run_cli(*args, env=w.env(), timeout=timeout)


def deploy(w, *args):
    return cli(w, "deploy", str(w.profile), "--tree", str(w.tree), "--base", "v0.5.23", "--accept-new-host-keys",
               "--no-preflight", *args)


def phases(steps: list[dict]) -> list[tuple[str, str]]:
    return [(s["phase"], s["host"]) for s in steps]


def test_a_shared_root_is_locked_pushed_switched_and_closed_once(world):
    w, lab = world, world.lab
    dry = deploy(w, "--dry-run", "--json")
    assert dry.code == 0, dry.err
    planned = json.loads(dry.out)["steps"]
    # one lock, one push, one switch (the submit host's: it submits both groups' jobs), one close
    assert phases(planned) == [("lock", "h0"), ("push", "h0"), ("switch", "h0"), ("gate", "h0"), ("gate", "h2"),
                               ("gate", "h0"), ("close", "h0")], planned
    lock = next(s for s in planned if s["phase"] == "lock")
    assert "(the shared root of h0, h1, h2, h3)" in lock["summary"], lock
    r = deploy(w, "--json")
    assert r.code == 0, r.err + r.out
    run = json.loads(r.out)
    # the run takes exactly the steps its dry run listed (phase, host, what), in order per phase
    assert [(s["phase"], s["host"], s["summary"]) for s in run["steps"] if s["phase"] != "gate"] == \
        [(s["phase"], s["host"], s["summary"]) for s in planned if s["phase"] != "gate"]
    rid = w.current("h0")
    assert rid == run["release"] and not (w.shared / ".lock").exists()
    for g, nodes in (("prefill", "h[0-1]"), ("decode", "h[2-3]")):
        [job] = jobs(lab, g)
        assert (job["state"], release_of(job["comment"]), job["nodes"]) == ("RUNNING", rid, nodes)
        assert (w.shared / "run" / f"{g}-{rid}.sbatch").is_file()
    # each node's server wrote its own log in the shared root: nobody writes another's file
    assert "joined node 0" in w.log("h1", "prefill") and "joined node 0" in w.log("h3", "decode")
    for h in ("h0", "h1", "h2", "h3"):
        g = "prefill" if h in ("h0", "h1") else "decode"
        heads = [ln for ln in w.log(h, g).splitlines() if ln.startswith("=== dsv4ctl start")]
        assert len(heads) == 1 and f"node {h})" in heads[0], (h, heads)
    assert not (w.shared / "logs" / "prefill.log").exists()
    assert "submitted as slurm job" in w.log("h0", "decode")       # the submit host's own lines: its file
    audit = [json.loads(ln) for ln in (w.shared / "audit.jsonl").read_text().splitlines()]
    assert [(a["action"], a["host"], a["result"]) for a in audit] == [("deploy", "h0", "ok")]
    assert json.loads((w.shared / "state.json").read_text())["releases"][rid]["state"] == "active"

    # status: every node's group with the job of its server; logs: one node's own file
    st = cli(w, "status", str(w.profile), "--json")
    assert st.code == 0, st.err + st.out
    doc = json.loads(st.out)
    assert doc["hosts"]["h2"]["groups"]["decode"]["slurm"]["job"] == jobs(lab, "decode")[0]["job"], doc["hosts"]["h2"]
    lg = cli(w, "logs", "prefill", str(w.profile), "--host", "h1")
    assert lg.code == 0 and "joined node 0" in lg.out and "node h1)" in lg.out, lg.out + lg.err
    lg = cli(w, "logs", "decode", str(w.profile))
    assert lg.code == 0, lg.err
    assert {ln.split()[0] for ln in lg.out.splitlines() if "=== dsv4ctl start decode" in ln} >= {"h2:", "h3:"}, lg.out
    d = cli(w, "diagnose", str(w.profile))
    assert d.code == 0 and "h2/decode: [ok] healthy" in d.out and "h0/prefill: [ok] healthy" in d.out, d.out + d.err
    au = cli(w, "audit", str(w.profile), "--json")
    assert au.code == 0 and [r["action"] for r in json.loads(au.out)["records"]] == ["deploy"], au.out + au.err
    # verify: the release is checked once, at the owner, and said to be shared
    v = cli(w, "verify", str(w.profile), "--json")
    assert v.code == 0, v.err + v.out
    vd = json.loads(v.out)
    assert list(vd["hosts"]) == ["h0"] and vd["hosts"]["h0"]["shared_by"] == ["h0", "h1", "h2", "h3"]
    assert vd["hosts"]["h0"]["releases"][rid]["ok"]

    # restart: the owner cancels and resubmits the job; one close, one audit line
    r = cli(w, "restart", str(w.profile), "-g", "decode")
    assert r.code == 0, r.err + r.out
    [again] = jobs(lab, "decode")
    assert again["job"] != doc["hosts"]["h2"]["groups"]["decode"]["slurm"]["job"] and again["state"] == "RUNNING"

    # a runbook restarts the router (a launcher process on the owner) in place: its own pid file
    pidfile = w.shared / "run" / "h0" / "router.pid"
    before = pidfile.read_text().strip()
    book = w.tmp / "restart-router.yaml"
    book.write_text(yaml.safe_dump({"name": "restart-router", "description": "restart the router", "steps": [
        {"id": "restart", "action": "service.restart", "args": {"groups": ["router"]}}]}, sort_keys=False))
    r = cli(w, "runbook", "run", str(book), str(w.profile), "--yes")
    assert r.code == 0, r.out + r.err
    assert pidfile.read_text().strip() != before

    # a second release, then rollback: one switch back, the previous release's jobs resubmitted
    w.extra["decode"] = {"watchdog-timeout": 901}
    w.write()
    r = deploy(w)
    assert r.code == 0, r.err + r.out
    second = w.current("h0")
    assert second != rid
    r = cli(w, "rollback", str(w.profile), "--dry-run", "--json")
    assert r.code == 0, r.err + r.out
    assert [p for p in phases(json.loads(r.out)["steps"]) if p[0] != "gate"] == \
        [("lock", "h0"), ("verify", "h0"), ("switch", "h0"), ("close", "h0")], r.out
    r = cli(w, "rollback", str(w.profile))
    assert r.code == 0, r.err + r.out
    assert w.current("h0") == rid
    [job] = jobs(lab, "decode")
    assert release_of(job["comment"]) == rid and job["state"] == "RUNNING"
    # the active release deployed again: every node's job is read as running, none is resubmitted
    w.extra["decode"] = {}
    w.write()
    r = deploy(w)
    assert r.code == 0 and w.current("h0") == rid, r.err + r.out
    assert jobs(lab, "decode") == [job]
    audit = [json.loads(ln) for ln in (w.shared / "audit.jsonl").read_text().splitlines()]
    assert [(a["action"], a["host"]) for a in audit] == [
        ("deploy", "h0"), ("restart", "h0"), ("service-restart", "h0"), ("runbook-restart-router", "h0"),
        ("deploy", "h0"), ("rollback", "h0"), ("deploy", "h0")], audit
    assert audit[-1]["detail"] == "already active", audit[-1]


def test_shared_root_refusals_are_exit_2_with_the_line(world):
    w = world
    prof = yaml.safe_load(w.profile.read_text())
    prof["hosts"][3]["root"] = str(w.tmp / "elsewhere")
    p = w.cfgdir / "split.yaml"
    p.write_text(yaml.safe_dump(prof, sort_keys=False))
    r = cli(w, "deploy", str(p), "--dry-run")
    assert r.code == 2 and "deploy.slurm.shared_root: host h3's deploy root" in r.err and "Traceback" not in r.err, r.err
    prof = yaml.safe_load(w.profile.read_text())
    next(g for g in prof["groups"] if g["name"] == "router")["host"] = "h2"
    p.write_text(yaml.safe_dump(prof, sort_keys=False))
    r = cli(w, "deploy", str(p), "--dry-run")
    assert r.code == 2 and "router group router runs on h2, which shares the root of h0" in r.err, r.err
    prof = yaml.safe_load(w.profile.read_text())
    prof["deploy"]["backend"] = "ssh"
    p.write_text(yaml.safe_dump(prof, sort_keys=False))
    r = cli(w, "deploy", str(p), "--dry-run")
    assert r.code == 2 and "deploy.slurm.shared_root needs deploy.backend: slurm" in r.err, r.err
    r = cli(w, "deploy", str(w.profile), "--tree", str(w.tree), "--base", "v0.5.23", "--promote", "--dry-run")
    assert r.code == 2 and "deploy --promote: not with deploy.slurm.shared_root yet" in r.err, r.err
