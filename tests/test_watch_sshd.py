"""``dsv4ctl watch`` on real OpenSSH sshd hosts after real deploys: the release label follows
deploys and rollbacks, and ``--on-alert bad-release --auto`` rolls a corrupting release back —
but not while an operator holds the deploy lock — and leaves an audit record on every host.

World: tests/sshd/promote_world.py (two hosts, colocated groups ``a`` and ``b`` served by the
stand-in through SGLang's real DeepSeek-V4 output path, started by the deploy launcher)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest
import yaml

from tests.conftest import REPO, run_cli
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.sshd.harness import free_port
from tests.sshd.promote_world import PromoteWorld
from tests.sshd.world import wait_for


def _cli(w: PromoteWorld, *args, timeout=300):
    return run_cli(*args, env=w.env(), timeout=timeout)


def _corrupting(w: PromoteWorld, on: bool) -> None:
    """Every chat answer of the next deployed release carries DSML as text (the stand-in's
    ``--fault markup_as_text``): a release that corrupts every tool call."""
    prof = yaml.safe_load(w.profile.read_text())
    server = prof["deploy"]["launch"]["server"].replace(" --fault markup_as_text", "")
    prof["deploy"]["launch"]["server"] = server + (" --fault markup_as_text" if on else "")
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))


def _events(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.sshd
def test_release_label_follows_deploy_rollback_and_auto_mitigation(live_cluster, tmp_path):
    w = PromoteWorld(live_cluster, tmp_path, check={"concurrency": 4, "max_corruption": 0.01, "turns": 2,
                                                    "stall_timeout_s": 20})
    watcher = None
    try:
        r = _cli(w, "deploy", str(w.profile), "--promote", "--json")
        assert r.code == 0, r.err
        good = r.json()["release"]
        r = _cli(w, "watch", str(w.profile), "--once", "--json")
        assert r.code == 0, r.err
        doc = r.json()
        assert [(t["name"], t["release"], t["state"], t["probe"]["class"]) for t in doc["targets"]] == [
            ("a", good, "good", "ok"), ("b", good, "good", "ok")]

        # a corrupting release: deployed (its health gate passes), not promoted
        _corrupting(w, True)
        r = _cli(w, "deploy", str(w.profile), "--json")
        assert r.code == 0, r.err
        bad = r.json()["release"]
        assert bad != good
        r = _cli(w, "watch", str(w.profile), "--once", "--json")
        assert r.code == 1 and "gate failed: 2 of 2 probes not ok: a dsml_in_content; b dsml_in_content" in r.err
        assert {(t["release"], t["state"]) for t in r.json()["targets"]} == {(bad, "active")}

        # an operator holds the lock: watch sees the burn but does not act
        r = _cli(w, "lock", "acquire", str(w.profile), "-m", "maintenance window")
        assert r.code == 0, r.err
        log = tmp_path / "watch.jsonl"
        addr = w.hosts[0].address
        mport = free_port(addr)
        env = dict(os.environ, **w.env(), NO_COLOR="1")
        watcher = subprocess.Popen(
            [sys.executable, "-m", "dsv4ctl", "watch", str(w.profile), "--interval", "1s", "--scrape-every", "2s",
             "--release-every", "5s", "--alert-window", "24s", "--listen", f"{addr}:{mport}", "--log", str(log),
             "--on-alert", "bad-release", "--auto"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        assert wait_for(lambda: any(e["event"] == "alert_action" and e["outcome"] == "skipped_lock"
                                    for e in _events(log)), timeout=90), _events(log)[-5:]
        assert not any(e["event"] == "alert_action" and e["outcome"] == "started" for e in _events(log))
        assert all(w.current(h) == bad for h in w.roots)

        # the lock is released: the runbook runs (rollback to the last good release), watch follows it
        r = _cli(w, "lock", "release", str(w.profile))
        assert r.code == 0, r.err
        assert wait_for(lambda: any(e["event"] == "alert_action" and e["outcome"] in ("completed", "failed")
                                    for e in _events(log)), timeout=240), _events(log)[-5:]
        done = next(e for e in _events(log) if e["event"] == "alert_action" and e["outcome"] in ("completed", "failed"))
        assert done["outcome"] == "completed" and done["exit"] == 0 and done["mode"] == "auto", done
        # while the lock was held (up to a release read, 5 s, after its release) it was said once
        assert sum(1 for e in _events(log) if e.get("outcome") == "skipped_lock") == 1
        assert all(w.current(h) == good for h in w.roots)
        # the release rolled away from is marked failed with the evidence (a plain deploy refuses it)
        for h in w.roots:
            rec = w.state(h)["releases"][bad]
            assert rec["state"] == "failed" and rec["failed_check"] == "runbook bad-release", rec
            assert rec["failure"].startswith("watch --on-alert corruption: ") and \
                f"a 100% of probes corrupted (release {bad}, " in rec["failure"], rec["failure"]
            assert [x["action"] for x in w.audit(h)][-4:] == ["mark-failed", "rollback", "runbook-bad-release",
                                                              "watch-on-alert"]
        assert wait_for(lambda: {(e["target"], e["release"]) for e in _events(log) if e["event"] == "release"} >=
                        {("a", good), ("b", good)} and _release_series(addr, mport) ==
                        {("a", good, "good"), ("b", good, "good")}, timeout=60), _release_series(addr, mport)
        for h in w.roots:
            rec = [x for x in w.audit(h) if x["action"] == "watch-on-alert"]
            assert len(rec) == 1 and rec[0]["result"] == "ok" and rec[0]["runbook"] == "bad-release"
            assert "corruption: ran runbook bad-release" in rec[0]["detail"]
        # after the rollback the probes are clean again
        m = _metrics(addr, mport)
        ok_before = m.get(("a", good), 0)
        assert wait_for(lambda: _metrics(addr, mport).get(("a", good), 0) >= ok_before + 2, timeout=60)
        watcher.send_signal(signal.SIGTERM)
        _, err = watcher.communicate(timeout=30)
        assert watcher.returncode == 0, err
        assert sum(1 for e in _events(log) if e["event"] == "alert_action" and e["outcome"] == "started") == 1
    finally:
        if watcher is not None and watcher.poll() is None:
            os.killpg(watcher.pid, signal.SIGKILL)
            watcher.wait()
        w.stop_services()


@pytest.mark.sshd
def test_a_fix_deployed_over_a_corrupting_release_is_never_rolled_back_and_no_good_release_changes_nothing(
        live_cluster, tmp_path, monkeypatch):
    """Issue 41. A (healthy, never promoted), then B (corrupting): ``bad-release`` finds no release
    marked good and stops (exit 1), changing nothing on any host. Then the exact race: watch has
    counted B's corrupted probes (real probes) and last read B with the lock free; the operator
    deploys the fix C; the evaluation right after must not act (the read under the deploy lock
    sees C), where the old watch ran bad-release and its rollback put every host back on B."""
    import asyncio

    from dsv4ctl.check.driver import make_client
    from dsv4ctl.profile.deployment import load_deployment
    from dsv4ctl.watch.run import Watcher, WatchOptions, event_line
    w = PromoteWorld(live_cluster, tmp_path, check={"concurrency": 4, "max_corruption": 0.01, "turns": 1,
                                                    "stall_timeout_s": 20})
    try:
        r = _cli(w, "deploy", str(w.profile), "--json")
        assert r.code == 0, r.err
        a = r.json()["release"]
        _corrupting(w, True)
        r = _cli(w, "deploy", str(w.profile), "--json")
        assert r.code == 0, r.err
        b = r.json()["release"]
        before = {h: (w.state(h), w.audit(h)) for h in w.roots}
        r = _cli(w, "runbook", "run", "bad-release", "-p", str(w.profile), "--yes", "--release", b,
                 "--report-dir", str(tmp_path / "rep"))
        assert r.code == 1, r.out + r.err
        assert r.err.startswith(f"dsv4ctl: failed: runbook bad-release stopped at mark: no release built before the "
                                f"active {b} is marked good (passed its promotion gate"), r.err
        assert f"{b} stays active and is not marked" in r.err and r.err.count("\n") == 1
        assert w.currents() == {h: b for h in w.roots}
        assert {h: (w.state(h), w.audit(h)) for h in w.roots} == before        # no state, no audit line
        assert a != b

        for k, v in w.env().items():
            monkeypatch.setenv(k, v)
        events: list = []
        watcher = Watcher(load_deployment(w.profile), WatchOptions(
            alert_window=120, on_alert={"corruption": "bad-release"}, auto=True, profile_arg=str(w.profile),
            emit=events.append))

        async def count_b() -> None:
            watcher.read_releases()
            http = make_client(4, 20)
            try:
                for _ in range(10):
                    await asyncio.gather(*(watcher.probe(http, t) for t in watcher.targets if t.probe))
            finally:
                await http.close()
        asyncio.run(count_b())
        assert watcher.locks == {h: None for h in w.roots}
        assert "release b, 10 probes" in watcher.conditions()["corruption"].replace(b, "b")

        _corrupting(w, False)
        w.extra = {"log-level": "info"}
        w.hicache(False)
        r = _cli(w, "deploy", str(w.profile), "--json")
        assert r.code == 0, r.err
        c = r.json()["release"]
        assert c not in (a, b)

        async def evaluate() -> None:
            await watcher.evaluate()
            await asyncio.gather(*watcher._action_tasks)
        asyncio.run(evaluate())
        acts = [e for e in events if e["event"] == "alert_action"]
        assert [e["outcome"] for e in acts] == ["skipped_stale"], acts
        assert acts[0]["detail"] == (f"the evidence is about release {b}; the hosts run "
                                     + ", ".join(f"{h}: {c}" for h in sorted(w.roots)) + " now")
        assert event_line(acts[0]).startswith(f"watch: on-alert corruption: runbook bad-release skipped_stale: ")
        assert event_line(acts[0]).endswith(f"; {acts[0]['detail']}")
        assert w.currents() == {h: c for h in w.roots}
        assert all(w.state(h)["releases"][c]["state"] == "active" for h in w.roots)
        assert {watcher.release[t.name][0] for t in watcher.targets} == {c}     # the labels follow the read
        assert "corruption" not in watcher.conditions()
    finally:
        w.stop_services()


def _scrape(addr: str, port: int) -> list:
    from prometheus_client.parser import text_string_to_metric_families
    try:
        with urllib.request.urlopen(f"http://{addr}:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return []
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def _release_series(addr: str, port: int) -> set:
    return {(s.labels["target"], s.labels["release"], s.labels["state"]) for s in _scrape(addr, port)
            if s.name == "dsv4ctl_watch_release"}


def _metrics(addr: str, port: int) -> dict:
    """Judged probes per (target, release)."""
    return {(s.labels["target"], s.labels["release"]): s.value for s in _scrape(addr, port)
            if s.name == "dsv4ctl_watch_probes_total"}
