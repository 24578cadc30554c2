"""Releases on Slurm, the rest of issue 43's modes on one real lab (tests/slurm/lab.py: slurmctld
and three slurmd named h0..h2 at the sshd hosts' addresses; h3 is an sshd host without slurmd,
the login host): one-node prefill on h0, decode on h1, the router on h2 as over SSH.

* ``deploy.slurm.submit_host: h3``: the login host writes and submits every job's script and
  cancels the jobs; deploy, gate through the router, stop/start, rollback;
* replicas: every replica its own job (``GROUP@R``);
* rank 0 hung (the job RUNNING, ``/health`` never OK): the gate fails by its timeout and the
  previous release's job serves again;
* an interrupt while the submit step waits for the controller: exit 130, the old release back;
* ``--dry-run`` lists exactly the steps a Slurm deploy runs (submitting from this machine: a
  ``local: true`` host as the submit host)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from dsv4ctl.hosts.slurm import release_of
from tests.conftest import REPO, run_cli, worker_index
from tests.slurm.lab import SlurmLab, missing
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.sshd.world import World, http_status, wait_for
from tests.test_slurm_deploy import jobs

pytestmark = [pytest.mark.sshd, pytest.mark.skipif(missing() is not None, reason=missing() or "")]


@pytest.fixture(scope="module")
def lab(sshd_cluster, tmp_path_factory):
    lab = SlurmLab.start(tmp_path_factory.mktemp("slurm"), net=worker_index(),
                         nodes={h.name: h.address for h in sshd_cluster.hosts[:3]})
    yield lab
    lab.stop()


class ModesWorld(World):
    """World (prefill h0, decode h1, router h2) on ``lab``; ``submit``: the submit host;
    ``replicas``: decode's hosts when it has replicas."""

    lab: SlurmLab
    submit: str | None = None
    replicas: list[str] | None = None
    health_timeout: float | None = None

    def write(self) -> None:
        super().write()
        if self.submit == "ctl":
            self.roots["ctl"] = self.tmp / "roots" / "ctl"
        prof = yaml.safe_load(self.profile.read_text())
        prof["deploy"]["backend"] = "slurm"
        prof["deploy"]["slurm"] = {"partition": self.lab.partition, "conf": str(self.lab.conf), "time_limit": "60"}
        if self.submit:
            prof["deploy"]["slurm"]["submit_host"] = self.submit
        if self.submit == "ctl":          # this machine: a host with local: true
            prof["hosts"].append({"name": "ctl", "address": "127.0.0.1", "local": True, "root": str(self.roots["ctl"])})
        if self.health_timeout:
            prof["deploy"]["health_timeout_s"] = self.health_timeout
        if self.replicas:
            dec = next(g for g in prof["groups"] if g["name"] == "decode")
            del dec["host"]
            dec["replicas"] = list(self.replicas)
        self.profile.write_text(yaml.safe_dump(prof, sort_keys=False))


@pytest.fixture
def make(live_cluster, lab, tmp_path):
    made = []

    def make(**kw) -> ModesWorld:
        ModesWorld.lab = lab
        for k, v in {"submit": None, "replicas": None, "health_timeout": None, **kw}.items():
            setattr(ModesWorld, k, v)
        made.append(ModesWorld(live_cluster, tmp_path / f"w{len(made)}"))
        return made[-1]
    yield make
    lab.run("scancel", "--partition", lab.partition)
    for w in made:
        w.stop_services()
    time.sleep(0.5)


def deploy(w, *args, timeout=180):
    return run_cli("deploy", str(w.profile), "--tree", str(w.tree), "--base", "v0.5.23",
                   "--accept-new-host-keys", *args, env=w.env(), timeout=timeout)


def running(lab, group) -> list[tuple[str, str | None]]:
    return sorted((j["nodes"], release_of(j["comment"])) for j in jobs(lab, group) if j["state"] == "RUNNING")


def test_a_login_host_submits_cancels_and_rolls_back_every_job(make, lab):
    w = make(submit="h3")
    assert deploy(w).code == 0
    a = w.current("h0")
    w.extra["decode"] = {"watchdog-timeout": 901}
    w.write()
    r = deploy(w)
    assert r.code == 0, r.err + r.out
    b = w.current("h0")
    assert a != b and set(w.currents().values()) == {b}
    for g, node in (("prefill", "h0"), ("decode", "h1")):
        assert running(lab, g) == [(node, b)]
        [job] = jobs(lab, g)
        # the script sbatch read is the login host's copy; the nodes keep none
        assert lab.job(job["job"])["Command"] == str(w.roots["h3"] / "run" / f"{g}-{b}.sbatch")
        assert (w.roots["h3"] / "run" / f"{g}.job").read_text().strip() == job["job"]
        assert not list((w.roots[node] / "run").glob("*.sbatch")) and not (w.roots[node] / "run" / f"{g}.job").exists()
        assert f"=== dsv4ctl start {g} release {b}" in (w.roots[node] / "logs" / f"{g}.log").read_text()
    assert "=== dsv4ctl: decode release" in (w.roots["h3"] / "logs" / "decode.log").read_text()
    assert http_status(f"http://{w.hosts[2].address}:{w.ports['router']}/health") == 200
    st = run_cli("status", str(w.profile), "--json", env=w.env())
    assert st.code == 0, st.err + st.out
    assert [st.json()["hosts"][h]["groups"][g]["state"] for h, g in (("h0", "prefill"), ("h1", "decode"))] == \
        ["running", "running"] and st.json()["hosts"]["h3"]["groups"] == {}
    # each server's job as the submit host recorded it, shown at its node 0
    slurm = st.json()["hosts"]["h1"]["groups"]["decode"]["slurm"]
    assert (slurm["job"], slurm["state"], slurm["nodes"], slurm["release"]) == \
        (jobs(lab, "decode")[0]["job"], "RUNNING", "h1", b), slurm
    d = run_cli("diagnose", str(w.profile), env=w.env())
    assert d.code == 0 and "h1/decode: [ok] healthy" in d.out, d.out + d.err
    r = run_cli("stop", str(w.profile), "-g", "decode", env=w.env())
    assert r.code == 0, r.err
    assert jobs(lab, "decode") == [] and running(lab, "prefill") == [("h0", b)]
    r = run_cli("start", str(w.profile), "-g", "decode", env=w.env())
    assert r.code == 0, r.err
    assert running(lab, "decode") == [("h1", b)]
    r = run_cli("rollback", str(w.profile), env=w.env(), timeout=180)
    assert r.code == 0, r.err + r.out
    assert set(w.currents().values()) == {a}
    # the rollback restarts the group whose serve config differs (prefill's job keeps running)
    assert running(lab, "decode") == [("h1", a)] and running(lab, "prefill") == [("h0", b)]


def test_each_replica_is_its_own_job(make, lab):
    w = make(replicas=["h1", "h2"])
    r = deploy(w)
    assert r.code == 0, r.err + r.out
    rid = w.current("h1")
    assert running(lab, "decode") == [("h1", rid)]
    assert running(lab, "decode@1") == [("h2", rid)]
    assert (w.roots["h2"] / "run" / f"decode@1-{rid}.sbatch").exists() and (w.roots["h2"] / "run" / "decode.job").read_text().strip() == jobs(lab, "decode@1")[0]["job"]
    r = run_cli("status", str(w.profile), "--json", env=w.env())
    assert r.code == 0, r.err + r.out
    rows = {h: r.json()["hosts"][h]["groups"]["decode"] for h in ("h1", "h2")}
    assert {h: (row["state"], row["slurm"]["nodes"]) for h, row in rows.items()} == \
        {"h1": ("running", "h1"), "h2": ("running", "h2")}, rows
    r = run_cli("stop", str(w.profile), "-g", "decode", env=w.env())
    assert r.code == 0, r.err
    assert jobs(lab, "decode") == [] and jobs(lab, "decode@1") == []
    r = run_cli("start", str(w.profile), "-g", "decode", env=w.env())
    assert r.code == 0, r.err
    assert running(lab, "decode") == [("h1", rid)] and running(lab, "decode@1") == [("h2", rid)]
    # each replica's job records on its node 0: the release and one restart (the start) apiece
    r = run_cli("status", str(w.profile), "--json", env=w.env())
    rows = {h: r.json()["hosts"][h]["groups"]["decode"]["slurm"] for h in ("h1", "h2")}
    assert {h: (row["release"], row["restarts"]) for h, row in rows.items()} == {"h1": (rid, 1), "h2": (rid, 1)}, rows


def test_rank_0_hung_fails_the_gate_by_its_timeout_and_the_old_job_serves(make, lab):
    w = make(health_timeout=6)
    assert deploy(w).code == 0
    good = w.current("h0")
    w.extra["decode"] = {"standin-startup-s": 600}     # the job runs, /health answers 503 for 10 minutes
    w.write()
    t0 = time.monotonic()
    r = deploy(w, "--no-preflight")
    assert r.code == 1, r.err + r.out
    assert time.monotonic() - t0 < 90
    assert f"rolled back to {good} on all hosts" in r.err, r.err
    assert "Slurm: job" not in r.err                      # no verdict of Slurm's: the job kept running
    assert "host h1 group decode: not healthy after the health timeout of 6 s" in r.err, r.err
    assert set(w.currents().values()) == {good}
    assert running(lab, "decode") == [("h1", good)] and running(lab, "prefill") == [("h0", good)]


SIGNALS = ([signal.SIGINT, signal.SIGTERM, signal.SIGHUP] if os.environ.get("DSV4CTL_SLURM_SIGNALS") == "all"
           else [signal.SIGHUP])       # the three take one path (deploy's interrupt handling); docs/testing.md


@pytest.mark.parametrize("sig", SIGNALS)
def test_an_interrupt_during_the_submit_step_puts_the_old_release_back(make, lab, sig):
    """The controller stops answering while the login host's switch step cancels the old jobs
    (the step waits for the queue, its sbatch after that); the signal comes then; the
    controller answers again 2 s later: the step ends (an interrupt lets a switch finish), then
    exit 130, every host on the old release, its jobs running, the new release's job
    (submitted after the signal) cancelled."""
    w = make(submit="h3")
    assert deploy(w).code == 0
    good = w.current("h0")
    [old] = jobs(lab, "prefill")          # the submit host cancels decode's job, then prefill's, then submits
    w.extra["decode"] = {"watchdog-timeout": 903}
    w.write()
    p = subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", "deploy", str(w.profile), "--tree", str(w.tree),
                          "--base", "v0.5.23", "--no-preflight"], cwd=REPO, env={**os.environ, **w.env(), "NO_COLOR": "1"},
                         text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ctld = next(x for x in lab.procs if "slurmctld" in x.args[0])
    stopped = False
    try:
        assert wait_for(lambda: lab.job(old["job"]).get("JobState") not in ("RUNNING", None), timeout=120, step=0.01)
        os.killpg(ctld.pid, signal.SIGSTOP)       # the step's wait for the queue, then its sbatch, need it
        stopped = True
        time.sleep(0.5)
        t_sig = time.time()
        p.send_signal(sig)
        time.sleep(2)
        os.killpg(ctld.pid, signal.SIGCONT)
        stopped = False
        _, err = p.communicate(timeout=180)
    finally:
        if stopped:
            os.killpg(ctld.pid, signal.SIGCONT)
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert set(w.currents().values()) == {good}
    for g, node in (("prefill", "h0"), ("decode", "h1")):
        assert wait_for(lambda: running(lab, g) == [(node, good)], timeout=30), (g, jobs(lab, g), err)
    log = (w.roots["h3"] / "logs" / "decode.log").read_text()
    new_rid = next(x for x in os.listdir(w.roots["h3"] / "releases") if x.startswith("r") and x != good)
    new_jobs = [ln.split(" slurm job ")[1].split()[0] for ln in log.splitlines() if f"release {new_rid} submitted" in ln]
    assert len(new_jobs) == 1, (os.listdir(w.roots["h3"] / "releases"), log, err)
    new_job = new_jobs[0]
    rec = lab.job(new_job)
    assert rec["JobState"] == "CANCELLED", rec
    submitted = time.mktime(time.strptime(rec["SubmitTime"], "%Y-%m-%dT%H:%M:%S"))
    assert submitted >= int(t_sig) + 1, (rec["SubmitTime"], t_sig)      # submitted after the signal came
    assert not any((w.roots[h] / ".lock").exists() for h in w.roots)


def test_a_slurm_deploys_dry_run_lists_the_steps_it_runs(make, lab, monkeypatch):
    from dsv4ctl.deploy import engine
    from dsv4ctl.deploy.site import Options
    from dsv4ctl.profile.deployment import load_deployment
    from dsv4ctl.remote.ssh import SSHTransport
    from dsv4ctl.remote.transport import LocalTransport
    from tests.test_steps_equal import _token, check_equal
    w = make(submit="ctl")
    for k, v in w.env().items():
        monkeypatch.setenv(k, v)
    opts = lambda **kw: Options(cache=w.cache, accept_new_host_keys=True, **kw)   # noqa: E731
    dry = engine.deploy(load_deployment(w.profile), opts(dry_run=True))
    assert jobs(lab, "decode") == []

    class Rec:
        raw: dict = {}

    def recorded(orig):
        def run(t, cmd, **kw):
            Rec.raw.setdefault(t.name, []).append(cmd)
            return orig(t, cmd, **kw)
        return run
    for cls in (SSHTransport, LocalTransport):
        monkeypatch.setattr(cls, "run", recorded(cls.run))
    planned, executed = [], []
    rep = engine.deploy(load_deployment(w.profile), opts(steps=planned.append, trace=executed.append))
    assert rep["result"] == "ok" and rep["release"] == dry["release"]
    check_equal(dry, planned[0], executed, Rec, _token(planned[0]))
    switch = {s.host: s.summary for s in executed if s.phase == "switch"}
    assert "start decode, prefill (slurm)" in switch["ctl"], switch        # this machine submits
    assert (w.roots["ctl"] / "run" / f"decode-{rep['release']}.sbatch").exists()
    assert running(lab, "decode") == [("h1", rep["release"])]


def test_a_submit_host_that_is_no_host_or_a_promotion_is_exit_2(make):
    w = make(submit="login9")
    r = run_cli("deploy", str(w.profile), "--tree", str(w.tree), "--dry-run", env=w.env())
    assert r.code == 2, r.err
    assert f"{w.profile}:" in r.err and "submit_host 'login9' is no host of hosts: (hosts: h0, h1, h2, h3)" in r.err, r.err
    assert len(r.err.strip().splitlines()) == 1
    # a promotion would switch every job from the submit host at once, not the canary's first
    w = make(submit="h3")
    r = run_cli("deploy", str(w.profile), "--tree", str(w.tree), "--promote", "--dry-run", env=w.env())
    assert r.code == 2 and "deploy --promote: not with deploy.slurm.submit_host (h3) yet" in r.err, r.err
