"""deploy --promote / promote ID end to end: two real OpenSSH sshd hosts, real rsync, the deploy
launcher starting the SGLang DSV4 stand-in of tests/standin (corrupts ~15 % of tool calls at ≥40
in flight with HiCache on, none with it off), the real check smoke / check load over HTTP."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.sshd.promote_world import SHORT_CONTEXT, PromoteWorld

pytestmark = pytest.mark.sshd

#: The promotion gate of the ``world`` profile: concurrency 60 (the stand-in corrupts ~15 % of tool
#: calls at >= 40 in flight with HiCache on) and a 3 % bound: 125 turns to pass with 0 corrupted
#: (381 at 1 %; what is asserted is that the gate's size and bound reach check load, not the size).
GATE = {"concurrency": 60, "max_corruption": 0.03, "turns": 2, "stall_timeout_s": 20}


@pytest.fixture
def world(live_cluster, tmp_path):
    w = PromoteWorld(live_cluster, tmp_path, check=GATE, extra=SHORT_CONTEXT)
    yield w
    w.stop_services()


def cli(w: PromoteWorld, *args, timeout=300):
    return run_cli(*args, str(w.profile), env=w.env(), timeout=timeout)


def starts(w: PromoteWorld, host: str, group: str) -> list[str]:
    """Release ids the launcher started ``group`` from on ``host``, in order (its log headers)."""
    log = w.roots[host] / "logs" / f"{group}.log"
    return [ln.split(" release ")[1].split()[0] for ln in log.read_text().splitlines()
            if ln.startswith(f"=== dsv4ctl start {group} release ")] if log.exists() else []


def evidence(w: PromoteWorld, host_root, rid: str) -> list:
    d = host_root / "evidence" / rid
    return sorted(d.iterdir()) if d.exists() else []


def test_preflight_errors_stop_before_any_host(world):
    w = world
    cfg = w.cfgdir / "a.yaml"
    good = cfg.read_text()
    cfg.write_text(good + "enable-hierarchical-cachee: true\n")      # a typo: SGLang would refuse it
    r = cli(w, "deploy", "--promote")
    assert r.code == 2, r.err
    assert "preflight: config lint:" in r.err and "enable-hierarchical-cachee" in r.err
    assert not any(p.exists() for p in w.roots.values()) and not (w.cache / "releases").exists()
    cfg.write_text(good + "max-running-requests: 100000\n")         # lints, but the SWA pool cannot fit
    r = cli(w, "deploy", "--promote")
    assert r.code == 1, r.err
    assert "dsv4ctl: plan fails: preflight: " in r.err and "nothing touched" in r.err
    assert not any(p.exists() for p in w.roots.values()) and not (w.cache / "releases").exists()
    r = cli(w, "deploy", "--canary", "a")
    assert r.code == 2 and "--canary needs --promote" in r.err


def test_first_deploy_dry_run_every_host_is_the_canary_and_nothing_changes(world):
    w = world
    r = cli(w, "deploy", "--promote", "--dry-run")
    assert r.code == 0, r.err
    out = r.out
    assert out.startswith("dry run: deploy --promote r")
    # the promote world gives no measured memory: the preflight says its plan is on estimates
    assert "preflight: config lint ok (0 warning(s)), plan ok (a tight (indexer_logits), b tight (indexer_logits); " \
        "weights or free memory estimated for " \
        "a, b: measure them" in out, out
    assert "first deploy (no host runs a release): every host is the canary" in out
    assert f"h0: [canary] switch {w.roots['h0']}/current: (none) -> " in out
    assert f"h1: [canary] switch {w.roots['h1']}/current: (none) -> " in out and "[rest]" not in out
    assert "gate: concurrency 60, turns 2, 95 % Wilson upper bound of the corruption rate <= 0.03" in out
    assert "tests.standin.server" in cli(w, "deploy", "--promote", "--dry-run", "--verbose").out
    assert not any(p.exists() for p in w.roots.values()) and not (w.cache / "releases").exists()


def dry_run_after_deploy(w: PromoteWorld, good: str):
    """deploy --promote --dry-run on a deployed world: canary, checks, then the rest; no change."""
    before = {h: (w.currents()[h], (w.roots[h] / "state.json").read_text()) for h in w.roots}
    n_cache = len(list((w.cache / "releases").iterdir()))
    r = cli(w, "deploy", "--promote", "--dry-run")
    assert r.code == 0, r.err
    out = r.out
    i_canary = out.index(f"h0: [canary] switch {w.roots['h0']}/current: {good} -> ")
    url_a = f"http://{w.hosts[0].address}:{w.ports['a']}"
    i_smoke = out.index(f"[canary] dsv4ctl check smoke {url_a} --expect-version 0.5.23 --json")
    i_load = out.index(f"[canary] dsv4ctl check load {url_a} --json --no-progress --concurrency 60 "
                       f"--max-corruption 0.03 --turns 2")
    i_rest = out.index(f"h1: [rest] switch {w.roots['h1']}/current: {good} -> ")
    i_all = out.index(f"[rest] dsv4ctl check smoke --profile {w.profile} --json")
    assert i_canary < i_smoke < i_load < i_rest < i_all
    # a canary that is not the check entry (group a): checked directly at its URL with the profile's gate
    r = cli(w, "deploy", "--promote", "--dry-run", "--canary", "b", "--concurrency", "7")
    assert r.code == 0, r.err
    assert "h1: [canary] switch" in r.out and "h0: [rest] switch" in r.out
    assert (f"[canary] dsv4ctl check load http://{w.hosts[1].address}:{w.ports['b']} --json --no-progress "
            f"--concurrency 7 --max-corruption 0.03 --turns 2") in r.out
    assert {h: (w.currents()[h], (w.roots[h] / "state.json").read_text()) for h in w.roots} == before
    assert len(list((w.cache / "releases").iterdir())) == n_cache


def test_promotion_gate_rollback_then_good_release(world):
    w = world
    # 1. HiCache off: the gate passes at concurrency 60, the release is marked good
    r = cli(w, "deploy", "--promote", "--json")
    assert r.code == 0, r.err
    rep = r.json()
    good = rep["release"]
    assert w.currents() == {"h0": good, "h1": good}
    pr = rep["promotion"]
    assert pr["canary"] == ["h0", "h1"] and pr["rest"] == []          # first deploy: all hosts are the canary
    assert [(c["check"], c["passed"]) for c in pr["checks"]] == [("smoke", True), ("load", True)]
    load = json.loads((w.state_dir / "evidence" / good).glob("*/load.json").__next__().read_text())
    assert load["schema"] == "dsv4ctl.check.load/1" and load["pass"] is True
    lv = load["levels"][0]
    assert lv["concurrency"] == 60 and lv["turns"] >= 125 and lv["corrupted"] == 0     # the 3 % gate's size
    for h in ("h0", "h1"):
        st = w.state(h)["releases"][good]
        assert st["state"] == "good" and st["promoted_at"] and st["evidence"].startswith(f"evidence/{good}/")
        files = {p.name for p in evidence(w, w.roots[h], good)[0].iterdir()}
        assert {"smoke.json", "load.json", "summary.json"} <= files
        assert w.audit(h)[-1]["result"] == "ok" and w.audit(h)[-1]["promote"] is True
    assert starts(w, "h0", "a") == [good] and starts(w, "h1", "b") == [good]
    dry_run_after_deploy(w, good)

    # 2. HiCache on: the canary fails check load at concurrency 60 -> rolled back, evidence kept, exit 1
    w.hicache(True)
    r = cli(w, "deploy", "--promote")
    assert r.code == 1, r.err
    bad = next(x for x in (w.cache / "releases").iterdir() if x.name.startswith("r") and x.name != good).name
    assert f"deploy --promote of {bad}: check load failed: check load: http" in r.err and " c=" in r.err
    assert f"c=60" in r.err and f"rolled back h0 to {good}; h1 never switched" in r.err
    assert w.currents() == {"h0": good, "h1": good}
    assert starts(w, "h0", "a") == [good, bad, good]     # canary switched, then put back
    assert starts(w, "h1", "b") == [good]                # the rest never saw the bad release
    assert w.running_config("h0").endswith(f"releases/{good}/configs/a.yaml")
    edir = next((w.state_dir / "evidence" / bad).iterdir())
    load = json.loads((edir / "load.json").read_text())
    assert load["pass"] is False and load["levels"][0]["concurrency"] == 60
    assert load["levels"][0]["rate"] > 0.05                            # ~15 % at 60 in flight
    assert json.loads((edir / "smoke.json").read_text())["pass"] is True
    summary = json.loads((edir / "summary.json").read_text())
    assert summary["result"] == "rolled-back" and summary["failed"] == "check load"
    for h in ("h0", "h1"):
        st = w.state(h)["releases"][bad]
        assert st["state"] == "failed" and st["failed_check"] == "check load"
        hosted = evidence(w, w.roots[h], bad)[0]
        assert json.loads((hosted / "load.json").read_text()) == load
        a = w.audit(h)[-1]
        assert (a["action"], a["result"], a["release"], a["failed_check"]) == ("deploy", "rolled-back", bad, "check load")
    r = cli(w, "releases", "--json")
    rows = {x["id"]: x for x in r.json()["hosts"]["h1"]["releases"]}
    assert rows[good]["state"] == "active" and rows[good]["recorded_state"] == "good"
    assert rows[bad]["state"] == "failed" and rows[bad]["failed_check"] == "check load"
    assert rows[good]["promoted_at"] and rows[good]["evidence"].startswith(f"evidence/{good}/")
    r = cli(w, "releases", "--markdown")
    assert f"| h1 | {good} | active |" in r.out and r.out.split(f"| h1 | {good} |")[1].split("\n")[0].endswith("| promoted |")
    assert "| failed: check load (check load: http" in r.out.split(f"| h0 | {bad} |")[1].split("\n")[0]

    # 3. a plain deploy of the failed release is refused; forced in, then promoted by hand: the same
    #    gate fails, marked failed again
    r = cli(w, "deploy")
    assert r.code == 1 and f"release {bad} failed on h0 at " in r.err and "--force-failed" in r.err
    r = cli(w, "deploy", "--force-failed")
    assert r.code == 0, r.err
    assert w.currents() == {"h0": bad, "h1": bad}
    assert w.state("h0")["releases"][bad]["state"] == "active" and w.audit("h0")[-1]["forced_failed"] is True
    r = cli(w, "promote", bad)
    assert r.code == 1, r.err
    assert f"promote {bad}: check load failed: check load: http" in r.err
    assert all(w.state(h)["releases"][bad]["state"] == "failed" for h in ("h0", "h1"))
    assert w.audit("h0")[-1]["action"] == "promote" and w.audit("h0")[-1]["result"] == "failed"

    # 4. rollback's default is the newest good release: the promoted one
    r = cli(w, "rollback", "--dry-run")
    assert r.code == 0, r.err
    assert r.out.startswith(f"dry run: rollback to {good}")
    r = cli(w, "rollback")
    assert r.code == 0, r.err
    assert w.currents() == {"h0": good, "h1": good}

    # 5. promote by hand: only the active release, judged against its own serve configs;
    #    dry run runs nothing; a pass marks it good again
    r = cli(w, "promote", bad)
    assert r.code == 2 and f"promote {bad}: not the active release on h0 (active: {good})" in r.err
    r = cli(w, "promote", good)                     # the profile still has HiCache on
    assert r.code == 2 and f"promote {good}: the profile's serve config of group(s) a, b differs" in r.err
    w.hicache(False)
    n_ev = len(list((w.state_dir / "evidence" / good).iterdir()))
    r = cli(w, "promote", good, "--dry-run")
    assert r.code == 0, r.err
    assert f"dsv4ctl check load --profile {w.profile} --json --no-progress" in r.out
    assert len(list((w.state_dir / "evidence" / good).iterdir())) == n_ev
    r = cli(w, "promote", good, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["result"] == "good" and [c["passed"] for c in doc["checks"]] == [True, True]
    assert all(w.state(h)["releases"][good].get("promoted_by") for h in ("h0", "h1"))


@pytest.fixture(params=[None, pytest.param("sglang-router", marks=pytest.mark.gateway),
                        pytest.param("smg", marks=pytest.mark.gateway)])
def pd_world(live_cluster, tmp_path, request):
    """The PD world behind the stand-in router, then behind each REAL gateway (.venv-router)."""
    # a 5 % bound: 40 x 2 = 80 turns through the router (381 at 1 %); the size is not what is tested
    w = PromoteWorld(live_cluster, tmp_path, pd=True, check={"concurrency": 40, "max_corruption": 0.05, "turns": 2},
                     gateway=request.param, extra=SHORT_CONTEXT)
    yield w
    w.stop_services()


def test_pd_decode_canary_checked_through_the_router(pd_world):
    w = pd_world
    r = cli(w, "deploy", "--promote", "--json")
    assert r.code == 0, r.err
    first = r.json()["release"]
    assert w.currents() == {"h0": first, "h1": first, "h2": first}
    # a decode-only change: the decode group's host is the canary, checked through the router
    cfg = w.cfgdir / "decode.yaml"
    cfg.write_text(cfg.read_text() + "stream-interval: 2\n")
    r = cli(w, "deploy", "--promote", "--json")
    assert r.code == 0, r.err
    rep = r.json()
    new = rep["release"]
    pr = rep["promotion"]
    router = f"http://{w.hosts[2].address}:{w.ports['router']}"
    assert pr["canary"] == ["h1"] and pr["rest"] == ["h0", "h2"] and pr["check_target"] == router
    assert [(c["check"], c["target"], c["passed"]) for c in pr["checks"]] == [
        ("smoke", router, True), ("load", router, True), ("smoke-all", "profile", True)]
    edir = next((w.state_dir / "evidence" / new).iterdir())
    load = json.loads(edir.joinpath("load.json").read_text())
    assert load["levels"][0]["concurrency"] == 40 and load["levels"][0]["corrupted"] == 0
    smoke = json.loads(edir.joinpath("smoke.json").read_text())
    decode_url = f"http://{w.hosts[1].address}:{w.ports['decode']}"
    infos = [(x["target"], x["status"]) for x in smoke["checks"] if x["check"] == "server_info"]
    assert infos == [(decode_url, "pass")]                    # the canary's own facts, not the router's
    routers = [x for x in smoke["checks"] if x["check"] == "router"]
    if w.gateway:
        assert [x["status"] for x in routers] == ["pass"]
        assert routers[0]["detail"]["kind"] == ("sglang-router" if w.gateway == "sglang-router" else "gateway")
        assert load["levels"][0]["gateway"]["retries_exhausted"] == 0
        assert load["settings"]["gateway_metrics"] == f"http://{w.hosts[2].address}:{w.ports['prometheus']}/metrics"
    else:
        assert routers == [] and load["levels"][0]["gateway"] is None
    assert w.currents() == {"h0": new, "h1": new, "h2": new}
    assert all(w.state(h)["releases"][new]["state"] == "good" for h in w.roots)
    assert starts(w, "h1", "decode") == [first, new] and starts(w, "h0", "prefill") == [first, new]
    # HiCache on the decode group: the preflight lint refuses it (DSV106); nothing touched
    w.hicache(True, ("decode",))
    n = len(list((w.cache / "releases").iterdir()))
    r = cli(w, "deploy", "--promote")
    assert r.code == 2 and "preflight: config lint:" in r.err and "DSV106" in r.err
    assert len(list((w.cache / "releases").iterdir())) == n
    assert w.currents() == {"h0": new, "h1": new, "h2": new}
    assert starts(w, "h1", "decode") == [first, new]


#: The gate of the tests that start from a promoted release: few turns (their verdict is not what they test)
CHEAP = ("--concurrency", "20", "--min-requests", "40", "--max-corruption", "0.1")  # 0/40 passes at 10 % (Wilson upper bound 8.8 %)


@pytest.fixture(scope="module")
def _promoted(sshd_cluster, tmp_path_factory):
    """One world whose first release went through the promotion gate (``.good``), shared by the
    tests that start from a promoted release: deployed once, not per test."""
    for h in sshd_cluster.hosts:
        if not h.running:
            h.start()
    w = PromoteWorld(sshd_cluster, tmp_path_factory.mktemp("promoted"), check=GATE, extra=SHORT_CONTEXT)
    r = cli(w, "deploy", "--promote", "--json", *CHEAP)
    assert r.code == 0, r.err
    w.good = r.json()["release"]
    yield w
    w.stop_services()


@pytest.fixture
def promoted(_promoted, live_cluster):
    """The shared world as a fresh one after its first deploy --promote: the profile and serve
    configs it was deployed from, every host on the promoted release ``w.good`` (redeployed if a
    failed test left it elsewhere). ``w.before``: the releases of its cache, ``w.n_starts``: how
    many times the launcher started each group so far (a test asserts the starts after them)."""
    w = _promoted
    w.extra, w.launch_extra = dict(SHORT_CONTEXT), ""
    w.hicache(False)
    if w.currents() != {"h0": w.good, "h1": w.good}:
        assert cli(w, "deploy").code == 0
    w.before = releases(w)
    w.n_starts = {("h0", "a"): len(starts(w, "h0", "a")), ("h1", "b"): len(starts(w, "h1", "b"))}
    assert starts(w, "h0", "a")[-1] == w.good and starts(w, "h1", "b")[-1] == w.good
    yield w


def releases(w: PromoteWorld) -> set[str]:
    """Release ids in the world's local release cache."""
    return {x.name for x in (w.cache / "releases").iterdir() if x.name.startswith("r")}


def new_release(w: PromoteWorld) -> str:
    """The one release built since the ``promoted`` fixture handed the world over."""
    (rid,) = releases(w) - w.before
    return rid


def starts_since(w: PromoteWorld, host: str, group: str) -> list[str]:
    """:func:`starts` of ``group`` on ``host`` since the ``promoted`` fixture handed the world over."""
    return starts(w, host, group)[w.n_starts[(host, group)]:]


def test_rest_failing_its_health_gate_rolls_the_canary_back_too(promoted):
    w = promoted
    good = w.good                  # promoted by deploy --promote (CHEAP) of this profile
    # group b (h1, not the canary) gets a launch command that dies: the canary passes its checks,
    # the rest fails its health gate -> both hosts back on the good release
    import yaml
    prof = yaml.safe_load(w.profile.read_text())
    prof["groups"][1]["launch"] = "sh -c 'echo RuntimeError: CUDA out of memory >&2; exit 1'"
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
    r = cli(w, "deploy", "--promote", *CHEAP)
    assert r.code == 1, r.err
    bad = new_release(w)
    assert f"deploy --promote of {bad}: health gate of the rest failed: host h1 group b:" in r.err
    assert "CUDA out of memory" in r.err
    assert f"rolled back h0, h1 to {good}" in r.err
    assert w.currents() == {"h0": good, "h1": good}
    assert starts_since(w, "h0", "a") == [bad, good] and starts_since(w, "h1", "b") == [bad, good]
    edir = next((w.state_dir / "evidence" / bad).iterdir())
    assert [c["passed"] for c in json.loads((edir / "summary.json").read_text())["checks"]] == [True, True]
    for h in ("h0", "h1"):
        assert w.state(h)["releases"][bad]["state"] == "failed"
        assert w.state(h)["releases"][bad]["failed_check"] == "health gate of the rest"


def test_sigterm_during_check_load_puts_the_canary_back(promoted):
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO
    w = promoted
    good = w.good
    w.hicache(True)
    proc = subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", "deploy", "--promote", "--turns", "400",
                             "--concurrency", "4", str(w.profile)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, **w.env()))
    err = ""
    deadline = time.monotonic() + 120
    while "check load: dsv4ctl check load" not in err and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        err += line
    time.sleep(1.0)                                   # the load is running against the canary
    proc.send_signal(signal.SIGTERM)
    out, rest = proc.communicate(timeout=120)
    err += rest
    assert proc.returncode == 130, err
    assert "dsv4ctl: error: interrupted" in err
    assert w.currents() == {"h0": good, "h1": good}
    bad = new_release(w)
    assert starts(w, "h0", "a")[-1] == good and starts_since(w, "h1", "b") == []
    rec = w.state("h0")["releases"][bad]       # an interrupt is not a verdict: not failed, never good
    assert rec["state"] not in ("failed", "good") and rec["interrupted_during"] == "promotion", rec
    assert w.audit("h0")[-1]["result"] == "interrupted"
    assert not (w.roots["h0"] / ".lock").exists()
    # the check child did not outlive the run
    child = f"check load http://{w.hosts[0].address}:{w.ports['a']} --json"
    assert f"dsv4ctl {child}" in err
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert child not in ps


def test_sigint_during_promote_by_hand_checks_audits_and_leaves_no_child(world):
    """Issue 13: ``promote ID`` interrupted during its checks (SIGINT to dsv4ctl alone): exit 130,
    the check child stopped, the release not marked, an ``interrupted`` audit record on every
    host, no lock left."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO
    w = world
    r = cli(w, "deploy", "--json")
    assert r.code == 0, r.err
    rid = r.json()["release"]
    proc = subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", "promote", rid, str(w.profile), "--turns", "400",
                             "--concurrency", "4"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, **w.env()))
    err = ""
    deadline = time.monotonic() + 120
    while "check load: dsv4ctl check load" not in err and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        err += line
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, rest = proc.communicate(timeout=120)
    err += rest
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "dsv4ctl: error: interrupted"
    for h in ("h0", "h1"):
        assert w.state(h)["releases"][rid]["state"] == "active"
        rec = w.audit(h)[-1]
        assert (rec["action"], rec["result"]) == ("promote", "interrupted"), rec
        assert not (w.roots[h] / ".lock").exists()
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert not [ln for ln in ps.splitlines() if str(w.profile) in ln]     # neither dsv4ctl nor its check child


def test_a_check_that_cannot_run_is_no_verdict_the_release_is_not_marked_failed(promoted):
    """The check child hits a client-side limit (too few file descriptors for the gate's
    concurrency: exit 2): the canary is put back, the release is NOT marked failed, exit 2."""
    import os
    import subprocess
    import sys
    from tests.conftest import REPO
    w = promoted
    args = CHEAP
    good = w.good
    cfg = w.cfgdir / "a.yaml"
    cfg.write_text(cfg.read_text() + "# a new release\n")
    # 80 descriptors: enough for the deploy, not for check load at 20 sessions (~94 needed)
    p = subprocess.run(["prlimit", "--nofile=80:80", sys.executable, "-m", "dsv4ctl.cli", "deploy", "--promote",
                        *args, str(w.profile)], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, NO_COLOR="1", COLUMNS="200", **w.env()))
    assert p.returncode == 2, p.stderr
    new = new_release(w)
    err = p.stderr.strip().splitlines()[-1]
    assert err.startswith(f"dsv4ctl: error: deploy --promote of {new}: check load could not run: ")
    assert "open files" in err and f"rolled back h0 to {good}" in err and "not marked failed" in err
    assert w.currents() == {"h0": good, "h1": good}
    for h in ("h0", "h1"):
        assert w.state(h)["releases"][new].get("state") != "failed"
        assert w.audit(h)[-1]["result"] == "check-not-run"
    summary = json.loads((next((w.state_dir / "evidence" / new).iterdir()) / "summary.json").read_text())
    assert summary["result"] == "not-run" and [c["exit_code"] for c in summary["checks"]] == [0, 2]


def test_promote_by_hand_with_a_refused_api_key_is_no_verdict(world):
    """The servers take an API key (their serve configs' api-key); promote by hand with another
    key in DSV4CTL_API_KEY: check smoke exits 2 (the server refuses the key: the client's
    problem), so the release is not marked failed and promote exits 2, as deploy --promote does
    with a check that cannot run. Before: smoke scored the 401s (exit 1), the release was marked
    failed."""
    w = world
    for g in w.groups:
        cfg = w.cfgdir / f"{g}.yaml"
        cfg.write_text(cfg.read_text() + "api-key: right-key-1234\n")
    r = cli(w, "deploy")
    assert r.code == 0, r.err
    rid = w.current("h0")
    r = run_cli("promote", rid, str(w.profile), env={**w.env(), "DSV4CTL_API_KEY": "wrong-key-9876"}, timeout=300)
    assert r.code == 2, r.err
    err = r.err.strip().splitlines()[-1]
    assert err.startswith(f"dsv4ctl: error: promote {rid}: check smoke could not run: check smoke: ")
    assert "refuses the API key (HTTP 401 for GET /v1/models)" in err and "not marked failed (no verdict)" in err
    assert "wrong-key-9876" not in r.out + r.err and "right-key-1234" not in r.out + r.err
    for h in ("h0", "h1"):
        assert w.state(h)["releases"][rid].get("state") != "failed"
        assert w.audit(h)[-1]["result"] == "check-not-run"


def _patch(tree, name: str, out):
    """A patch against the world's tree changing ``python/sglang/srt/NAME`` (another patch series)."""
    from tests.sshd.world import git
    f = tree / "python" / "sglang" / "srt" / name
    old = f.read_text()
    f.write_text(old + "y = 2\n")
    out.write_text(git(tree, "diff"))
    f.write_text(old)
    return out


FEW = ("--min-requests", "40")       # the load gate's turns: few (its verdict is not what this test is about)


def test_upgrade_gate_compares_only_upgrades_and_refuses_a_regression(live_cluster, tmp_path):
    # the A/B is kept small by check.compare.pairs (the default is sized: 1,984 pairs)
    w = PromoteWorld(live_cluster, tmp_path, check={"concurrency": 10, "max_corruption": 0.5, "turns": 2,
                                                    "stall_timeout_s": 20, "compare": {"pairs": 100}})
    w.extra = {"context-length": 16384}       # short over-length probes: a quick check smoke
    w.hicache(False)
    try:
        r = cli(w, "deploy", "--promote", *FEW, "--json")           # first deploy: nothing runs yet, no A/B
        assert r.code == 0, r.err
        first = r.json()["release"]
        assert r.json()["promotion"]["upgrade"] == {"running": None, "changes": [], "compare": False}

        # a serve-config change on the same SGLang, series and environment: promoted without an A/B
        w.extra = {"context-length": 16384, "enable-cache-report": True}
        w.hicache(False)
        r = cli(w, "deploy", "--promote", *FEW, "--json")
        assert r.code == 0, r.err
        same = r.json()["release"]
        assert same != first and r.json()["promotion"]["upgrade"]["changes"] == []
        assert [c["check"] for c in r.json()["promotion"]["checks"]] == ["smoke", "load", "smoke-all"]

        # an upgrade (another patch series) that serves as well as the running release: compared, promoted
        p1 = _patch(w.tree, "mod001.py", tmp_path / "0001-one.patch")
        r = cli(w, "deploy", "--promote", *FEW, "--patch", str(p1), "--dry-run")
        assert r.code == 0, r.err
        assert "check load --compare" in r.out and "upgrade (patch series (0 -> 1 patch(es)))" in r.out
        assert "100 pairs (check.compare.pairs)" in r.out and "--concurrency 10 --turns 11 --min-requests 0" in r.out
        r = cli(w, "deploy", "--promote", *FEW, "--patch", str(p1), "--json")
        assert r.code == 0, r.err
        equal = r.json()["release"]
        pr = r.json()["promotion"]
        assert pr["upgrade"] == {"running": same, "changes": ["patch series (0 -> 1 patch(es))"], "compare": True}
        cmp_check = next(c for c in pr["checks"] if c["check"] == "compare")
        assert cmp_check["passed"] and cmp_check["reason"].startswith("no regression: corrupted: new 0.00 % vs running 0.00 %")
        doc = json.loads(next((w.state_dir / "evidence" / equal).glob("*/compare.json")).read_text())
        paired = doc["comparisons"][0]["paired"]
        assert 100 <= paired["pairs"] <= 110 and paired["b_only"] == paired["a_only"] == 0 and not paired["regression"]
        assert w.currents() == {"h0": equal, "h1": equal}

        # an upgrade whose release corrupts a quarter of the load turns (smoke and the load gate at
        # 0.5 still pass): the A/B refuses it, the canary goes back, the release is marked failed
        p2 = _patch(w.tree, "mod002.py", tmp_path / "0001-two.patch")
        w.launch_extra = " --fault wrong_args --fault-rate 0.25"
        w.hicache(False)
        r = cli(w, "deploy", "--promote", *FEW, "--patch", str(p2), "--no-compare", "--dry-run")
        assert r.code == 0 and "check load --compare" not in r.out and "check load http" in r.out, r.out
        assert f"upgrade (patch series (1 -> 1 patch(es))): paired A/B against {equal} skipped (--no-compare)" in r.out
        r = cli(w, "deploy", "--promote", *FEW, "--patch", str(p2))
        assert r.code == 1, r.err
        bad = next(x.name for x in (w.cache / "releases").iterdir()
                   if x.name.startswith("r") and x.name not in (first, same, equal))
        assert f"deploy --promote of {bad}: check compare failed: regression against the running release" in r.err
        assert "McNemar exact one-sided p = " in r.err and "95 % CI +" in r.err
        assert "wrong_args: " in r.err or "dsml_in_content: " in r.err
        assert f"rolled back h0 to {equal}; h1 never switched" in r.err
        assert w.currents() == {"h0": equal, "h1": equal}
        assert w.state("h0")["releases"][bad]["state"] == "failed"
        assert w.state("h0")["releases"][bad]["failed_check"] == "check compare"
        doc = json.loads(next((w.state_dir / "evidence" / bad).glob("*/compare.json")).read_text())
        paired = doc["comparisons"][0]["paired"]
        assert paired["regression"] and paired["a_only"] == 0 and paired["b_only"] >= 20   # a quarter of >= 100
    finally:
        w.stop_services()


def test_upgrade_gate_in_sequence_through_the_router_on_pd(live_cluster, tmp_path):
    # PD: neither the decode canary nor the prefill answers a chat alone, so the A/B runs the same
    # workload through the router before the canary switch (arm A, the running release) and after
    w = PromoteWorld(live_cluster, tmp_path, pd=True, check={"concurrency": 10, "max_corruption": 0.5, "turns": 2,
                                                             "compare": {"pairs": 60}}, extra=SHORT_CONTEXT)
    try:
        r = cli(w, "deploy", "--promote", *FEW, "--json")
        assert r.code == 0, r.err
        first = r.json()["release"]
        p1 = _patch(w.tree, "mod001.py", tmp_path / "0001-one.patch")
        router = f"http://{w.hosts[2].address}:{w.ports['router']}"
        r = cli(w, "deploy", "--promote", *FEW, "--patch", str(p1), "--dry-run")
        assert r.code == 0, r.err
        lines = r.out.splitlines()
        arm_a = next(i for i, x in enumerate(lines) if "[before] dsv4ctl check load " + router in x)
        switch = next(i for i, x in enumerate(lines) if "[canary] switch" in x)
        arm_b = next(i for i, x in enumerate(lines) if "--records compare-b.jsonl; arm B on" in x)
        assert arm_a < switch < arm_b and f"arm A of the paired A/B on {first} before the canary switch" in lines[arm_a]
        r = cli(w, "deploy", "--promote", *FEW, "--patch", str(p1), "--json")
        assert r.code == 0, r.err
        new = r.json()["release"]
        pr = r.json()["promotion"]
        assert [(c["check"], c["passed"]) for c in pr["checks"]] == [
            ("compare-a", True), ("smoke", True), ("load", True), ("compare", True), ("smoke-all", True)]
        doc = json.loads(next((w.state_dir / "evidence" / new).glob("*/compare.json")).read_text())
        paired = doc["comparisons"][0]["paired"]
        assert doc["sequential"] and 60 <= paired["pairs"] <= 70 and paired["a_only"] == paired["b_only"] == 0
        assert w.currents() == {"h0": new, "h1": new, "h2": new}
    finally:
        w.stop_services()
