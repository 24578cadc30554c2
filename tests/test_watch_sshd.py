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
