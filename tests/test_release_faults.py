"""Issue 13 fault suite: SIGINT, SIGTERM and SIGHUP at each phase of deploy, rollback and
``hicache --remote`` on real sshd hosts with the launcher and the stand-in, the signal sent to the
dsv4ctl process alone (as a supervisor's SIGTERM is: its children must be stopped by dsv4ctl).
After every interrupted run the invariants are checked:

* exit 130 and one ``dsv4ctl: error: interrupted`` line;
* every host on one complete release that ``dsv4ctl verify`` finds intact; no lock, no
  ``.incoming-*`` folder left;
* each host's audit log ends with the command's ``interrupted`` record;
* the local state matches what the command reported: the run log (``runs.jsonl``) has the run
  with exit code 130, and the profile's serve config is untouched by an interrupted hicache;
* no orphan process: exactly one stand-in per group (the pid file's) and no rsync, ssh or
  dsv4ctl process of this run left;
* every group serves again (an interrupted run waits, bounded, for the restored release).

Sampling (CI time): by default each (command, phase) runs once, the signal alternating
SIGINT/SIGTERM/SIGHUP along the list — 9 interrupted runs on 3 worlds, ~2-3 min on the 2-core CI
VM, each signal at every command. ``DSV4CTL_FAULTS=all`` runs all three at every phase (27 runs). The deploy faults of
``tests/test_deploy_faults.py`` (sshd killed mid-transfer, full disk, lock/switch boundaries)
and the SIGTERM during ``check load`` of ``tests/test_promote.py`` complete the picture."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.sshd.world import World, http_status, wait_for

pytestmark = pytest.mark.sshd

PHASES = {
    "deploy": ["push", "switch", "gate"],
    "rollback": ["verify", "switch", "gate"],
    "hicache": ["push", "switch", "gate"],
}
# SIGHUP: the terminal or the SSH session to the control machine closed
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# prefill takes 4 s to load: the gate phase is wide enough to land a signal in, also on a loaded
# machine where the switch step itself eats into the start-up. Both the fixture and _fix_profile
# (which runs before every later deploy) must use it: with 2 s left in _fix_profile, a fresh-clone
# run's rollback finished its gate before the SIGHUP 0.3 s after the gate began (exit 0).
PREFILL_STARTUP_S = "4"
NEEDLE = {"push": "step h0: push", "verify": "step h0: verify", "switch": "step h0: switch",
          "gate": "step h0: wait for GET"}


def cases(command: str) -> list[tuple[str, int]]:
    order = [(c, ph) for c in PHASES for ph in PHASES[c]]
    if os.environ.get("DSV4CTL_FAULTS") == "all":
        return [(ph, s) for c, ph in order if c == command for s in SIGNALS]
    return [(ph, SIGNALS[i % 3]) for i, (c, ph) in enumerate(order) if c == command]


@pytest.fixture
def world(live_cluster, tmp_path):
    w = World(live_cluster, tmp_path, keep=20)
    prof = yaml.safe_load(w.profile.read_text())
    for h in prof["hosts"]:
        h["ram_gib"] = 2048
    prof["groups"][0]["env"] = {"STANDIN_STARTUP_S": PREFILL_STARTUP_S}
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
    yield w
    w.stop_services()


def env(w: World) -> dict:
    return dict(os.environ, **{**w.env(), "DSV4CTL_STATE_DIR": str(w.tmp / "state")}, COLUMNS="200", NO_COLOR="1")


def run(w: World, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsv4ctl.cli", *args], cwd=REPO, env=env(w), capture_output=True,
                          text=True, timeout=300)


def interrupted(w: World, argv: list[str], phase: str, sig: int) -> tuple[str, float]:
    """Start ``dsv4ctl ARGV -v``, send ``sig`` to it (not its group) once the phase's step line is
    printed; return its stderr and the seconds from the signal to its exit."""
    p = subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", *argv], cwd=REPO, env=env(w), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines = []
    try:
        while True:
            line = p.stderr.readline()
            assert line, f"{argv} ended before phase {phase}: " + "".join(lines)
            lines.append(line)
            if NEEDLE[phase] in line:
                break
        seen = ""
        if phase == "gate":
            time.sleep(0.3)
        p.send_signal(sig)
        t0 = time.monotonic()
        if phase == "gate":
            # what the gate saw when the signal went: a restarted prefill still loading answers
            # 503 (or nothing); 200 means the gate could end before the signal was handled
            url = f"http://{w.hosts[0].address}:{w.ports['prefill']}/health"
            seen = f"prefill /health {http_status(url, 1)} just after the signal; "
        _, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, (phase, sig, seen + "".join(lines) + err)
    return "".join(lines) + err, time.monotonic() - t0


def orphans(w: World) -> list[str]:
    """Processes of this world other than the one server per group its pid file names."""
    servers = {int((r / "run" / f).read_text()) for r in w.roots.values() if (r / "run").is_dir()
               for f in os.listdir(r / "run") if f.endswith(".pid")}
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            pgid = os.getpgid(int(d.name))
        except (OSError, ProcessLookupError):
            continue
        if str(w.tmp) not in cmd or "sshd" in cmd.split(" ")[0]:
            continue
        if pgid in servers and ("standin_sglang" in cmd or cmd.startswith("sh -c")):
            continue
        if "standin_sglang" in cmd or "rsync" in cmd or "dsv4ctl.cli" in cmd or cmd.startswith("ssh "):
            out.append(f"{d.name}: {cmd[:160]}")
    return out


def check_invariants(w: World, err: str, release: str, action: str, sig: int, phase: str) -> None:
    why = f"{action} {phase} {signal.Signals(sig).name}: {err[-3000:]}"
    assert err.strip().splitlines()[-1] == "dsv4ctl: error: interrupted", why
    assert w.currents() == {h: release for h in w.roots}, why
    for h in w.roots:
        w.assert_complete(h)
        assert not (w.roots[h] / ".lock").exists(), why
        assert not any(x.name.startswith(".incoming") for x in (w.roots[h] / "releases").iterdir()), why
        rec = w.audit(h)[-1]
        assert (rec["action"], rec["result"]) == (action, "interrupted"), (h, rec, why)
    v = run(w, "verify", str(w.profile), "--json")
    assert v.returncode == 0 and json.loads(v.stdout)["ok"], v.stdout + v.stderr
    assert wait_for(lambda: not orphans(w), timeout=10), (orphans(w), why)
    for g, host in (("prefill", w.hosts[0]), ("decode", w.hosts[1]), ("router", w.hosts[2])):
        assert wait_for(lambda: http_status(f"http://{host.address}:{w.ports[g]}/health") == 200, timeout=30), (g, why)


def runlog(w: World) -> list[dict]:
    f = w.tmp / "state" / "runs.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []


def deploy_ok(w: World, *extra) -> str:
    r = run(w, "deploy", str(w.profile), "--json", "--no-preflight", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["release"]


def test_signals_during_deploy(world):
    w = world
    a = deploy_ok(w)
    for i, (phase, sig) in enumerate(cases("deploy")):
        w.extra["decode"] = {"chunked-prefill-size": 4096 + 64 * i}      # a new release each time
        w.extra["prefill"] = {"chunked-prefill-size": 4096 + 64 * i}
        w.write()
        _fix_profile(w)
        err, secs = interrupted(w, ["deploy", str(w.profile), "-v", "--no-preflight"], phase, sig)
        check_invariants(w, err, a, "deploy", sig, phase)
        rec = runlog(w)[-1]
        assert rec["command"].startswith("deploy") and rec["exit_code"] == 130 and rec["error"] == "interrupted"
        if phase == "gate":
            assert "waiting up to" in err and "restored release healthy" in err, err
            assert "restored release healthy" in w.audit("h0")[-1]["detail"]


def test_signals_during_rollback(world):
    w = world
    a = deploy_ok(w)
    w.extra["decode"] = {"chunked-prefill-size": 4096}
    w.extra["prefill"] = {"chunked-prefill-size": 4096}
    w.write()
    _fix_profile(w)
    b = deploy_ok(w)
    for phase, sig in cases("rollback"):
        err, secs = interrupted(w, ["rollback", str(w.profile), "--to", a, "-v"], phase, sig)
        check_invariants(w, err, b, "rollback", sig, phase)
        rec = runlog(w)[-1]
        assert rec["command"] == f"rollback --to {a}" and rec["exit_code"] == 130


def test_signals_during_hicache_remote(world):
    w = world
    a = deploy_ok(w)
    local = (w.cfgdir / "prefill.yaml").read_bytes()
    for i, (phase, sig) in enumerate(cases("hicache")):
        err, secs = interrupted(w, ["hicache", "on", str(w.profile), "-g", "prefill", "--remote",
                                    "--ratio", str(2.0 + i / 4), "-v"], phase, sig)
        check_invariants(w, err, a, "hicache-on", sig, phase)
        assert (w.cfgdir / "prefill.yaml").read_bytes() == local       # the local copy follows only a success
    # an interrupt is not a verdict: the last interrupted change (its gate phase) runs again as typed
    assert phase == "gate"
    r = run(w, "hicache", "on", str(w.profile), "-g", "prefill", "--remote", "--ratio", str(2.0 + i / 4), "--json")
    assert r.returncode == 0, r.stderr
    rid = json.loads(r.stdout)["release"]
    assert all(w.state(h)["releases"][rid]["state"] == "active" for h in w.roots)
    assert all("interrupted_at" in w.state(h)["releases"][rid] for h in w.roots)


def _fix_profile(w: World) -> None:
    """World.write() rewrites the profile: put back the test's host RAM and prefill env."""
    prof = yaml.safe_load(w.profile.read_text())
    for h in prof["hosts"]:
        h["ram_gib"] = 2048
    prof["groups"][0]["env"] = {"STANDIN_STARTUP_S": PREFILL_STARTUP_S}
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
