"""`dsv4ctl diagnose` and the shipped runbooks live (issue 17): real sshd hosts (tests/sshd), the
stand-in server (tests/standin) started by dsv4ctl's own launcher from a release's launch.json,
with the stand-in's fault modes writing the synthetic fixture logs of tests/data/diagnose/ (crash,
OOM at start-up, stall, wedge). Runs use ``--yes``; assertions on the hosts' files and processes,
the audit log and the incident report. One runbook starts with the server down.

Where a shipped playbook waits minutes (watch windows, drain, stall timeouts) the test runs the
shipped file with only those numbers shortened (:func:`shortened`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from dsv4ctl.hosts.layout import Paths
from dsv4ctl.hosts.service import Launcher
from tests.conftest import REPO, run_cli
from tests.sshd.fixtures import sshd_cluster  # noqa: F401  (fixture)
from tests.standin.harness import free_port, kill_groups, wait_health

pytestmark = pytest.mark.sshd
DATA = REPO / "tests" / "data" / "diagnose"

SERVE = """\
model-path: deepseek-ai/DeepSeek-V4-Flash
served-model-name: deepseek-v4-flash
host: 0.0.0.0
port: {port}
tp-size: {tp}
{extra}reasoning-parser: deepseek-v4
tool-call-parser: deepseekv4
enable-metrics: true
"""
HICACHE = "enable-hierarchical-cache: true\nhicache-ratio: 2.0\nhicache-write-policy: write_through\nhicache-mem-layout: page_first\n"


def _get(url: str, timeout: float = 5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


def _chat(url: str, timeout: float = 5) -> None:
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}).encode(),
        headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=timeout).read()
    except OSError:
        pass


class Rig:
    """One deploy root on sshd host h0 with its groups started by dsv4ctl's launcher (pid file,
    log with start header and exit line). Either a hand-built release ``r1`` (configs,
    launch.json; :func:`launch` starts the groups), or (``deploy``) a real release made by
    ``dsv4ctl deploy`` (:meth:`deploy`): ``hicache --remote`` changes the running release, which
    must be one dsv4ctl deployed (issue 13). Each group's command template carries its fault flags."""

    def __init__(self, cluster, base: Path, groups: dict[str, dict], check: dict | None = None,
                 deploy: bool = False):
        self.h = cluster.hosts[0]
        self.base = base
        self.root = base / "root"
        self.rid = "r1"
        rel = self.root / "releases" / "r1"
        if not deploy:
            (rel / "configs").mkdir(parents=True)
            os.symlink("releases/r1", self.root / "current")
        local = base / "local"
        local.mkdir()
        spec, pgroups = {}, []
        self.urls, self.ports = {}, {}
        for i, (name, g) in enumerate(groups.items()):
            gpus = g.get("gpus", [i])
            port = free_port()
            self.ports[name], self.urls[name] = port, f"http://{self.h.address}:{port}"
            extra = (HICACHE if g.get("hicache") else "") + "".join(f"{k}: {v}\n" for k, v in g.get("serve", {}).items())
            text = SERVE.format(port=port, extra=extra, tp=len(gpus))
            if not deploy:
                (rel / "configs" / f"{name}.yaml").write_text(text)
            (local / f"{name}.yaml").write_text(text)
            cmd = ("{python} -m tests.standin.server --config {config} --host {address} --port {port} "
                   "--ttft-ms 2 --itl-ms 0 " + " ".join(g.get("flags", [])))
            spec[name] = {"role": g.get("role", "colocated"), "host": self.h.name, "port": port, "cmd": cmd,
                          "env": {"PYTHONPATH": str(REPO)}, "model": "deepseek-v4-flash"}
            pg = {"name": name, "role": g.get("role", "colocated"), "host": self.h.name,
                  "gpus": gpus, "tp": len(gpus), "port": port,
                  "serve_config": f"local/{name}.yaml",
                  "memory": {"free_gib_before_load": 177.0, "weights_gib_per_rank": 43.66}}
            if deploy:
                pg["launch"] = f"env PYTHONPATH={REPO} {cmd}"
            pgroups.append(pg)
        sglang = {"version": "0.5.23", "index_k_dtype": "bf16", "index_k_accounting": "exact"}
        if deploy:
            from tests.sshd.world import make_tree
            sglang.update(tree=str(make_tree(base / "sglang", files=4)), base_ref="v0.5.23", series=None)
        else:
            (rel / "launch.json").write_text(json.dumps(spec, indent=2))
        self.spec = spec
        prof = {"version": 1, "name": "live", "model": "deepseek-v4-flash", "sglang": sglang,
                "deploy": {"health_timeout_s": 60, "python": sys.executable, "service": "launcher"},
                "check": check or {"concurrency": 4, "max_corruption": 0.05, "turns": 2},
                "hosts": [cluster.host_yaml(self.h, self.root, ram_gib=2048)], "groups": pgroups}
        self.profile = base / "live.yaml"
        self.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
        self.paths = Paths(str(self.root))
        self.cluster = cluster
        self.extra_stop: list = []

    def deploy(self) -> None:
        """``dsv4ctl deploy``: the release (the groups' templates with their fault flags) pushed,
        switched, every group started and through the deploy's gate (/health, one 1-token chat)."""
        r = run_cli("deploy", str(self.profile), "--no-preflight", "--json", timeout=300)
        assert r.code == 0, r.out + r.err
        self.rid = self.deployed = r.json()["release"]
        self.spec = json.loads((self.root / "current" / "launch.json").read_text())

    def pid(self, name: str) -> int | None:
        pf = Path(self.paths.pidfile(name))
        return int(pf.read_text()) if pf.exists() and pf.read_text().strip() else None

    def alive(self, name: str) -> bool:
        pid = self.pid(name)
        if pid is None:
            return False
        try:
            st = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        return st != "Z"

    def log(self, name: str) -> str:
        p = Path(self.paths.logfile(name))
        return p.read_text() if p.exists() else ""

    def audit(self) -> list[dict]:
        p = self.root / "audit.jsonl"
        return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []

    def live_config(self, name: str) -> str:
        return (self.root / "current" / "configs" / f"{name}.yaml").read_text()

    def current(self) -> str:
        return Path(os.readlink(self.root / "current")).name

    def check_release_change(self, audit: list[dict]) -> None:
        """The fixture's deploy first; ``hicache off --remote`` made a new release from it (the
        deploy engine's record: action hicache-off, the new release, from, the changed groups)."""
        dep = next(a for a in audit if a["action"] == "deploy")
        off = next(a for a in audit if a["action"] == "hicache-off")
        assert (dep["result"], dep["release"], dep["preflight"]) == ("ok", self.deployed, "skipped")
        assert off["result"] == "ok" and off["from"] == self.deployed and off["groups"] == ["prefill"]
        assert off["release"] == self.current() != self.deployed

    def stop(self) -> None:
        kill_groups([p for p in (self.pid(n) for n in self.spec) if p])
        for fn in self.extra_stop:
            fn()


def launch(rig: Rig, name: str, wait: bool = True) -> None:
    from dsv4ctl.hosts.layout import render_launch
    s = rig.spec[name]
    rd = rig.paths.release(rig.rid)
    cmd = render_launch(s["cmd"], {"python": sys.executable, "release": rd, "tree": f"{rd}/tree",
                                   "config": f"{rd}/configs/{name}.yaml", "port": s["port"], "group": name,
                                   "root": str(rig.root), "address": rig.h.address, "router_args": ""})
    subprocess.run(["bash", "-c", Launcher().start_cmd(rig.paths, name, rig.rid, cmd, s["env"])], check=True)
    if wait:
        wait_health(rig.urls[name], timeout=60)


def wait_dead(rig: Rig, name: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while rig.alive(name):
        assert time.monotonic() < deadline, f"{name} still running"
        time.sleep(0.1)


def shortened(tmp: Path, name: str, changes: dict[str, dict]) -> Path:
    """The shipped playbook ``name`` with only the ``args`` of the steps in ``changes`` updated."""
    data = yaml.safe_load((REPO / "playbooks" / f"{name}.yaml").read_text())
    for st in data["steps"]:
        if st["id"] in changes:
            st.setdefault("args", {}).update(changes[st["id"]])
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def _runbook(pb: str | Path, rig: Rig, report: Path, timeout: float = 300):
    return run_cli("runbook", "run", str(pb), "--profile", str(rig.profile), "--yes", "--report-dir", str(report),
                   timeout=timeout)


class Scenario:
    """One live scenario: its rig, the groups started before it (``wait`` False: expected to die
    at start-up), ``trigger(rig)`` (faults after start) and ``act(rig, tmp) -> dict`` (the CLI run)."""

    def __init__(self, name, groups, act, trigger=None, check=None, no_wait=(), deploy=False):
        self.name, self.groups, self.act, self.trigger, self.check, self.no_wait = name, groups, act, trigger, check, no_wait
        self.deploy = deploy
        self.rig: Rig | None = None
        self.out: dict = {}
        self.error: BaseException | None = None
        self.took = 0.0


def _crash(rg: Rig, name: str) -> None:
    for _ in range(2):
        _chat(rg.urls[name], timeout=3)
    wait_dead(rg, name)


# --- the scenarios: diagnose names each failure mode; every shipped runbook, live -----------------

def _diag_trigger(rg):
    _crash(rg, "crash")
    wait_dead(rg, "oom")
    for g in ("stall", "wedge", "wedge"):
        threading.Thread(target=_chat, args=(rg.urls[g], 60), daemon=True).start()
    time.sleep(1.0)


def _diag_act(rg, tmp):
    t0 = time.monotonic()
    r, doc = _diagnose(rg)
    took = time.monotonic() - t0
    r2, doc2 = _diagnose(rg, "-g", "fine")
    h = run_cli("diagnose", str(rg.profile), "-g", "crash", "--window", "0")
    return dict(r=r, doc=doc, took=took, r2=r2, doc2=doc2, h=h)


def _toolcall_act(rg, tmp):
    rep = tmp / "rep"
    return dict(r=_runbook("toolcall-corruption", rg, rep), rep=rep)


def _hicache_act(rg, tmp):
    pb = shortened(tmp, "hicache-crash", {"watch": {"seconds": 20, "interval": 1}})
    rep = tmp / "rep"
    return dict(r=_runbook(pb, rg, rep), rep=rep)


def _stall_trigger(rg):
    for _ in range(31):
        threading.Thread(target=_chat, args=(rg.urls["decode"], 120), daemon=True).start()
    time.sleep(1.5)


def _stall_act(rg, tmp):
    old = rg.pid("decode")
    pb = shortened(tmp, "scheduler-stall", {"recheck": {"seconds": 3, "interval": 1}})
    rep = tmp / "rep"
    return dict(r=_runbook(pb, rg, rep), rep=rep, old=old)


def _wedge_act(rg, tmp):
    old = rg.pid("decode")
    pb = shortened(tmp, "transfer-wedge", {"measure": {"stall_timeout": 2, "url": rg.urls["decode"], "min_requests": 4},
                                           "drain": {"seconds": 0},
                                           "verify": {"stall_timeout": 2, "url": rg.urls["decode"], "min_requests": 4}})
    rep = tmp / "rep"
    return dict(r=_runbook(pb, rg, rep), rep=rep, old=old)


def _oom_act(rg, tmp):
    wait_dead(rg, "prefill")
    rep = tmp / "rep"
    return dict(r=_runbook("oom-at-startup", rg, rep), rep=rep)


def _sigterm_act(rg, tmp):
    pb = tmp / "slow.yaml"
    pb.write_text("name: slow\nsteps:\n  - id: first\n    action: note\n    args: {text: one}\n"
                  "  - id: look\n    action: watch\n    args: {seconds: 60, interval: 1, count: any}\n"
                  "  - id: last\n    action: note\n    args: {text: done}\n")
    rep = tmp / "rep"
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200")
    p = subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", "runbook", "run", str(pb), "--profile", str(rg.profile),
                          "--yes", "--report-dir", str(rep)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(rep.glob("diagnose-*.out")):
        assert time.monotonic() < deadline and p.poll() is None, "no diagnose child started"
        time.sleep(0.1)
    time.sleep(0.3)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=90)
    interrupted = json.loads((rep / "incident.json").read_text())
    children = subprocess.run(["pgrep", "-f", f"dsv4ctl.cli diagnose {rg.profile}"], capture_output=True, text=True).stdout
    run_id = out.splitlines()[0].split()[1].rstrip(":")
    pb.write_text(pb.read_text().replace("seconds: 60", "seconds: 1"))
    r = run_cli("runbook", "run", str(pb), "--profile", str(rg.profile), "--yes", "--report-dir", str(rep),
                "--resume", run_id, timeout=120)
    return dict(code=p.returncode, out=out, err=err, interrupted=interrupted, children=children, run_id=run_id,
                resumed=r, final=json.loads((rep / "incident.json").read_text()))


def _bad_release_act(_rg, tmp):
    """A promoted (good) release A, then B with HiCache on deployed without the gate; the shipped
    bad-release runbook rolls every host back to A and verifies with smoke and load checks."""
    from tests.sshd.promote_world import PromoteWorld
    w = PromoteWorld(_rg.cluster, tmp / "world", check={"concurrency": 4, "max_corruption": 0.2, "turns": 1,
                                                         "stall_timeout_s": 20})
    _rg.extra_stop.append(w.stop_services)
    a = run_cli("deploy", str(w.profile), "--promote", "--json", env=w.env(), timeout=300)
    assert a.code == 0, a.err
    ra = a.json()["release"]
    w.hicache(True)
    b = run_cli("deploy", str(w.profile), "--json", env=w.env(), timeout=300)
    assert b.code == 0, b.err
    rb = b.json()["release"]
    # the operator reverts the config change locally; the hosts still run B (smoke compares the
    # running servers with the profile's serve configs, so they must say what A runs)
    w.hicache(False)
    rep = tmp / "rep"
    r = run_cli("runbook", "run", "bad-release", "--profile", str(w.profile), "--yes", "--report-dir", str(rep),
                env=w.env(), timeout=300)
    return dict(r=r, rep=rep, w=w, a=ra, b=rb)


SCENARIOS = [
    Scenario("diagnose", {
        "crash": {"hicache": True, "flags": ["--crash-after", "1", "--fault-log", str(DATA / "nan_sampling.log")]},
        "oom": {"flags": ["--crash-after", "0", "--fault-log", str(DATA / "oom_pool_build.log")]},
        "stall": {"flags": ["--stall-after", "0", "--fault-log", str(DATA / "watchdog_eviction_deadlock.log")]},
        "wedge": {"flags": ["--stuck-rate", "1.0"]},
        "fine": {}}, _diag_act, _diag_trigger, no_wait=("oom",)),
    # hicache off --remote changes the running release: a real deploy. Its gate sends one chat
    # (chat 1), so --crash-after 1 fires at the trigger's first chat, and again in a process the
    # runbook starts from the release (the flags are in its launch.json) once it gets traffic
    Scenario("toolcall", {"prefill": {"hicache": True, "flags": ["--crash-after", "1", "--fault-needs-hicache",
                                                                 "--fault-log", str(DATA / "nan_sampling.log")]}},
             _toolcall_act, lambda rg: _crash(rg, "prefill"), deploy=True),
    Scenario("hicache", {"prefill": {"hicache": True, "flags": ["--crash-after", "1", "--fault-needs-hicache", "--fault-log",
                                                                str(DATA / "illegal_memory_access.log")]}},
             _hicache_act, lambda rg: _crash(rg, "prefill"), deploy=True),
    Scenario("stall", {"decode": {"flags": ["--stall-after", "30", "--fault-log", str(DATA / "watchdog_full_pool.log")]}},
             _stall_act, _stall_trigger),
    # PD roles in the profile; the stand-ins answer the check directly (no gateway in between)
    Scenario("wedge", {"prefill": {"role": "prefill"}, "decode": {"role": "decode", "flags": ["--stuck-rate", "1.0"]}},
             _wedge_act, check={"concurrency": 2, "max_corruption": 0.2, "turns": 1}),
    Scenario("oom", {"prefill": {"flags": ["--crash-after", "0", "--fault-log", str(DATA / "oom_graph_capture.log")]}},
             _oom_act, no_wait=("prefill",)),
    Scenario("sigterm", {"prefill": {}}, _sigterm_act),
    Scenario("bad_release", {}, _bad_release_act),
]


@pytest.fixture(scope="module")
def live(sshd_cluster, tmp_path_factory):
    """Every scenario set up, its servers started at once, then all scenarios run in parallel
    threads (each against its own deploy root): the module's wall time is the longest scenario."""
    t0 = time.monotonic()
    for sc in SCENARIOS:
        sc.tmp = tmp_path_factory.mktemp(sc.name)
        sc.rig = Rig(sshd_cluster, sc.tmp, sc.groups, sc.check, deploy=sc.deploy)
        if not sc.deploy:
            for g in sc.groups:
                launch(sc.rig, g, wait=False)

    def one(sc):
        t = time.monotonic()
        try:
            if sc.deploy:
                sc.rig.deploy()
            for g in sc.groups:
                if g not in sc.no_wait:
                    wait_health(sc.rig.urls[g], timeout=120)
            if sc.trigger:
                sc.trigger(sc.rig)
            sc.out = sc.act(sc.rig, sc.tmp)
        except BaseException as e:  # noqa: BLE001 - reported by the scenario's test
            sc.error = e
        sc.took = time.monotonic() - t

    threads = [threading.Thread(target=one, args=(sc,)) for sc in SCENARIOS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    res = {sc.name: sc for sc in SCENARIOS}
    res["_wall"] = time.monotonic() - t0
    print("live scenarios: " + ", ".join(f"{sc.name} {sc.took:.0f}s" for sc in SCENARIOS) + f"; wall {res['_wall']:.0f}s")
    yield res
    for sc in SCENARIOS:
        sc.rig.stop()


def _scenario(live, name):
    sc = live[name]
    if sc.error:
        raise sc.error
    return sc.rig, sc.out


def _diagnose(rig: Rig, *extra: str):
    r = run_cli("diagnose", str(rig.profile), "--json", "--window", "1", *extra, timeout=120)
    assert "Traceback" not in r.err, r.err
    assert r.out.strip(), r.err
    return r, json.loads(r.out)


def _results(out):
    r = out["r"]
    assert (out["rep"] / "incident.json").exists(), r.out + r.err
    return json.loads((out["rep"] / "incident.json").read_text())


def test_diagnose_live_crash_oom_stall_wedge_healthy(live):
    rg, o = _scenario(live, "diagnose")
    r, doc = o["r"], o["doc"]
    assert r.code == 1 and doc["schema"] == "dsv4ctl.diagnose/1" and doc["ok"] is False
    assert o["took"] < 60
    g = doc["groups"]
    top = {n: g[n]["findings"][0] for n in g}
    # crash: NaN sampling on every rank, process dead with its exit status, HiCache on
    assert (top["crash"]["rule"], top["crash"]["runbook"]) == ("nan_sampling", "hicache-crash")
    assert top["crash"]["detail"]["ranks"] == ["0", "1", "2", "3"]
    assert g["crash"]["alive"] is False and g["crash"]["exit_status"] == 1 and g["crash"]["hicache"] is True
    assert "probability tensor contains" in top["crash"]["evidence"][0]
    assert top["crash"]["evidence"][0].startswith(f"{rg.h.name}:{rg.root}/logs/crash.log:")
    assert "cannot connect" in g["crash"]["health"]
    # OOM at start-up: pool build, 12.50 GiB
    assert (top["oom"]["rule"], top["oom"]["detail"]["where"], top["oom"]["detail"]["tried"]) == ("cuda_oom", "pool build", "12.50 GiB")
    assert top["oom"]["runbook"] == "oom-at-startup" and g["oom"]["alive"] is False
    # stall: watchdog line with the pool snapshot -> eviction deadlock; /health 503
    assert top["stall"]["rule"] == "watchdog_stall" and top["stall"]["cause"].startswith("eviction deadlock")
    assert g["stall"]["alive"] is True and g["stall"]["health"] == "GET /health: HTTP 503"
    # wedge: the transfer queue frozen over the window with no tokens (metrics)
    assert top["wedge"]["rule"] == "transfer_wedge" and top["wedge"]["detail"]["transfer_queue"] == 2
    assert g["wedge"]["metrics_delta"]["sglang:num_decode_transfer_queue_reqs"] == 2
    assert g["wedge"]["metrics_delta"]["sglang:generation_tokens_total"] == 0
    # healthy
    assert [f["rule"] for f in g["fine"]["findings"]] == ["healthy"] and g["fine"]["health"] == "ok"
    assert set(doc["runbooks"]) == {"hicache-crash", "oom-at-startup", "scheduler-stall", "transfer-wedge"}
    # -g limits the groups; a healthy group alone exits 0
    assert o["r2"].code == 0 and list(o["doc2"]["groups"]) == ["fine"] and o["doc2"]["ok"] is True
    h = o["h"]
    assert h.code == 1 and "NaN/inf in sampling" in h.out and "-> dsv4ctl runbook run hicache-crash" in h.out
    assert "diagnose: crash: NaN/inf in sampling" in h.err


def test_toolcall_corruption_with_the_server_down(live):
    """The HiCache crash took the server down: measure cannot reach it, diagnose names the NaN
    crash with HiCache on, the group is started from its release, HiCache off (live file, restart,
    /health), measured again: clean."""
    rg, o = _scenario(live, "toolcall")
    doc = _results(o)
    assert o["r"].code == 0, o["r"].out + o["r"].err
    assert o["r"].out.startswith(f"run {doc['run_id']}: toolcall-corruption on live")
    res = doc["results"]
    assert res["measure"]["ok"] is False and res["measure"]["reachable"] is False
    assert res["diag"]["rule"] == "nan_sampling" and res["diag"]["hicache_crash"] is True
    assert res["start"]["started"] == ["prefill"]
    assert res["hicache_off"]["ok"] is True
    assert res["remeasure"]["passed"] is True and res["remeasure"]["corruption_rate"] == 0
    assert res["record_mitigated"]["ran"] is True and res["record_other_cause"]["ran"] is False
    assert doc["completed"] is True
    assert "enable-hierarchical-cache: false" in rg.live_config("prefill") and rg.alive("prefill")
    assert _get(rg.urls["prefill"] + "/server_info")["enable_hierarchical_cache"] is False
    audit = rg.audit()
    assert [a["action"] for a in audit] == ["deploy", "mark-failed", "service-start", "hicache-off",
                                            "runbook-toolcall-corruption"]
    rg.check_release_change(audit)
    # the crash diagnose saw marks the release that ran failed, with its evidence (issue 28): a
    # plain deploy of it is refused from now on
    assert res["diag"]["marked_failed"] == {"h0": rg.deployed}
    rec = json.loads((rg.root / "state.json").read_text())["releases"][rg.deployed]
    assert rec["state"] == "failed" and rec["failed_check"].startswith("runbook diagnose (nan_sampling"), rec
    assert rec["evidence"] and any("NaN" in e or "nan" in e.lower() for e in rec["evidence"]), rec
    assert audit[1]["release"] == rg.deployed and audit[1]["detail"].startswith("runbook diagnose (nan_sampling")
    assert audit[-1]["result"] == "completed" and audit[-1]["run_id"] == doc["run_id"]
    md = (o["rep"] / "incident.md").read_text()
    assert "| diag" in md and "nan_sampling" in md


def test_hicache_crash_repeats_then_hicache_off(live):
    """Prefill crashed with HiCache on (illegal memory access). The runbook puts the crashed group
    (only it) on a release with kv-canary: log, which starts it; smoke traffic crashes it again,
    now with SGLang's KV canary violation line first; the watch counts it; HiCache off (a second
    release, from the canary one) and the group serves."""
    rg, o = _scenario(live, "hicache")
    doc = _results(o)
    assert o["r"].code == 0, o["r"].out + o["r"].err
    res = doc["results"]
    assert res["diag"]["rule"] == "illegal_memory_access" and res["diag"]["runbook"] == "hicache-crash"
    assert res["diag"]["hicache_crash_groups"] == ["prefill"]
    assert res["canary"]["changed"] == ["prefill"] and res["canary"]["restarted"] is True
    assert res["restart"] == {"ran": False, "ok": True}          # the canary release started it
    assert res["watch"]["repeats"] == 1 and res["watch"]["canary_polls"] == 1
    assert {"illegal_memory_access", "kv_canary"} <= set(res["watch"]["rules"])
    assert res["start_again"]["started"] == ["prefill"] and res["hicache_off"]["ok"] is True
    assert res["verify"]["passed"] is True and res["record_off"]["ran"] is True
    live_cfg = rg.live_config("prefill")
    assert "enable-hierarchical-cache: false" in live_cfg and "kv-canary: log" in live_cfg and rg.alive("prefill")
    audit = rg.audit()
    # the crash marks the release that ran failed, and the canary release, which crashed again, too
    assert [a["action"] for a in audit] == ["deploy", "mark-failed", "config-set", "mark-failed", "service-start",
                                            "hicache-off", "runbook-hicache-crash"], [a["action"] for a in audit]
    canary = audit[2]
    assert (canary["result"], canary["from"], canary["groups"]) == ("ok", rg.deployed, ["prefill"])
    assert (audit[1]["release"], audit[3]["release"]) == (rg.deployed, canary["release"])
    assert res["watch"]["marked_failed"] == {"h0": canary["release"]}
    states = json.loads((rg.root / "state.json").read_text())["releases"]
    assert states[rg.deployed]["state"] == states[canary["release"]]["state"] == "failed"
    assert states[rg.current()]["state"] != "failed"
    off = audit[5]
    assert off["from"] == canary["release"] and off["release"] == rg.current() not in (rg.deployed, canary["release"])
    log = rg.log("prefill")
    assert log.count("illegal memory access") == 2 and log.count("kv_canary violation: launch_tag=SWEEP_K_SWA") == 1
    md = (o["rep"] / "incident.md").read_text()
    assert "| canary | config.set | ran |" in md and "canary_polls=1" in md


def test_scheduler_stall_restart_clears_it(live):
    rg, o = _scenario(live, "stall")
    doc = _results(o)
    assert o["r"].code == 0, o["r"].out + o["r"].err
    res = doc["results"]
    assert res["diag"]["rule"] == "watchdog_stall" and res["diag"]["cause"].startswith("full KV pool")
    assert res["restart"]["ok"] is True and res["restart"]["started"] == []
    assert res["smoke"]["passed"] is True and res["recheck"]["repeats"] == 0
    assert res["rollback"]["ran"] is False and res["record_fixed"]["ran"] is True
    assert rg.pid("decode") != o["old"] and rg.alive("decode")
    assert [a["action"] for a in rg.audit()] == ["mark-failed", "service-restart", "runbook-scheduler-stall"]
    assert res["diag"]["marked_failed"] and rg.audit()[0]["detail"].startswith("runbook diagnose (watchdog_stall")
    assert "=== dsv4ctl restart decode" in rg.log("decode")
    # the measured numbers are shown before the mitigation is confirmed
    assert "diag: ok=True, healthy=False, rule=watchdog_stall" in o["r"].out


def test_transfer_wedge_pd_restarts_decode(live):
    rg, o = _scenario(live, "wedge")
    doc = _results(o)
    # the stand-in wedges again after the restart: every step ran, but the final verification
    # failed: exit 1, not "completed"
    assert o["r"].code == 1, o["r"].out + o["r"].err
    assert "runbook transfer-wedge completed, but its final verification failed: step verify (check.load)" in o["r"].err
    res = doc["results"]
    assert doc["verification"] == {"step": "verify", "action": "check.load", "passed": False}
    assert res["measure"]["stuck"] > 0 and res["drain"]["ran"] is True
    assert res["restart_decode"]["ok"] is True and rg.pid("decode") != o["old"] and rg.alive("decode")
    assert res["record_persisting"]["ran"] is True
    audit = rg.audit()
    assert [a["action"] for a in audit] == ["service-restart", "runbook-transfer-wedge"] and audit[0]["group"] == "decode"
    assert audit[1]["result"] == "verification-failed"


def test_oom_at_startup_diagnoses_where_then_plans(live):
    rg, o = _scenario(live, "oom")
    doc = _results(o)
    res = doc["results"]
    assert res["diag"]["rule"] == "cuda_oom" and "graph capture" in res["diag"]["cause"], res
    assert res["plan_now"]["ran"] is True
    if res["plan_now"]["fits"]:
        assert o["r"].code == 0 and res["record_fit"]["ran"] is True, res
    # nothing on the host changed but the record of the release that could not start
    assert [a["action"] for a in rg.audit()] == ["mark-failed", "runbook-oom-at-startup"]
    assert rg.audit()[0]["detail"].startswith("runbook diagnose (cuda_oom")


def test_sigterm_mid_run_writes_report_stops_child_and_resumes(live):
    rg, o = _scenario(live, "sigterm")
    assert o["code"] == 130, o["out"] + o["err"]
    assert "Traceback" not in o["err"] and f"--resume {o['run_id']}" in o["err"] and "resume with dsv4ctl runbook run " in o["err"]
    doc = o["interrupted"]
    assert doc["run_id"] == o["run_id"] and doc["failed_step"] == "look"
    assert [e["status"] for e in doc["timeline"]] == ["ran", "interrupted"]
    assert o["children"].strip() == ""                        # no dsv4ctl child left running
    r = o["resumed"]
    assert r.code == 0, r.out + r.err
    assert o["final"]["completed"] is True and o["final"]["results"]["last"]["ran"] is True
    assert [e["step"] for e in o["final"]["timeline"]][-2:] == ["look", "last"]


def test_bad_release_rolls_back_to_the_last_good_release(live):
    _, o = _scenario(live, "bad_release")
    w = o["w"]
    doc = _results(o)
    assert o["r"].code == 0, o["r"].out + o["r"].err
    res = doc["results"]
    assert res["rollback"]["ok"] is True and res["rollback"]["release"] == o["a"]
    assert res["smoke"]["passed"] is True and res["load"]["passed"] is True
    assert res["record_ok"]["ran"] is True and res["diag"]["ran"] is False and res["record_bad"]["ran"] is False
    assert w.currents() == {h: o["a"] for h in w.roots} and o["a"] != o["b"]
    for h in w.roots:
        acts = [a["action"] for a in w.audit(h)]
        assert acts[-3:] == ["mark-failed", "rollback", "runbook-bad-release"], acts
        assert w.state(h)["releases"][o["a"]]["state"] == "good"
        # the release rolled away from is marked failed, with the evidence (here: the operator's run)
        b = w.state(h)["releases"][o["b"]]
        assert (b["state"], b["failed_check"], b["failure"]) == ("failed", "runbook bad-release",
                                                                 "the operator ran the runbook"), b
    assert res["mark"]["rollback_to"] == o["a"] and res["mark"]["release"] == o["b"]


def test_live_scenarios_wall_time(live):
    # all scenarios run at once; the longest one bounds the module (servers restart several times)
    assert live["_wall"] < 240
