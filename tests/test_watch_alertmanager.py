"""The shipped Alertmanager example (docs/alertmanager/alertmanager.yml and receiver.py) against a
real Prometheus (2.42) and a real Alertmanager (0.25, Debian ``prometheus-alertmanager``;
scripts/test.sh installs both): a real ``dsv4ctl watch`` serves /metrics, Prometheus scrapes it
every second and evaluates the shipped rules compressed 60x (``render_rules(scale=1/60)``:
``DSV4WatchDown``'s ``for: 2m`` is 2 s). ``kill -9`` of watch (the incident: the target showed
down and nothing fired) fires ``DSV4WatchDown``; Alertmanager routes it (severity page) to the
``dsv4ctl-page`` receiver, whose webhook is the example receiver on a loopback address, and the
receiver's record carries the alert's ``runbook_url``. Watch started again resolves it, and the
resolved notification arrives too. The shipped configuration is used as written, but for its
webhook URLs (the receiver's test address) and its group intervals (1 s instead of 30 s / 5 m)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from dsv4ctl.watch.rules import render_rules, runbook_url
from tests.conftest import REPO, loopback
from tests.promserver import Alertmanager, Prometheus, alertmanager_binary, poll, prometheus_binary
from tests.standin.harness import free_port
from tests.test_watch import _profile

SHIPPED = REPO / "docs" / "alertmanager" / "alertmanager.yml"
RECEIVER = REPO / "docs" / "alertmanager" / "receiver.py"
FIRE_BOUND = 30.0
"""Seconds from ``kill -9`` to the receiver's firing record: a failed scrape (1 s), ``for: 2s``, an
evaluation (1 s), Prometheus' send, Alertmanager's group_wait (1 s) and the webhook: ~5 s; the rest
is for a busy 2-core machine."""


def _records(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def _watch(p: Path, listen: str, err) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dsv4ctl", "watch", str(p), "--no-releases", "--interval", "1s", "--scrape-every",
         "1s", "--stall-timeout", "2s", "--listen", listen, "-q"],
        cwd=REPO, env=dict(os.environ, NO_COLOR="1"), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=err, start_new_session=True)


def _kill(proc) -> None:
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _am_config(receiver_url: str) -> dict:
    """The shipped configuration with the test's webhook URL and 1 s group intervals."""
    doc = yaml.safe_load(SHIPPED.read_text())
    doc["route"].update({"group_wait": "1s", "group_interval": "1s"})
    for r in doc["receivers"]:
        for w in r.get("webhook_configs", []):
            assert w["url"] == "http://127.0.0.1:9478/alerts" and w["send_resolved"] is True
            w["url"] = receiver_url
    return doc


def test_shipped_alertmanager_config_is_valid():
    amtool = shutil.which("amtool") or str(Path(alertmanager_binary()).with_name("amtool"))
    r = subprocess.run([amtool, "check-config", str(SHIPPED)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "SUCCESS" in r.stdout + r.stderr, r.stdout + r.stderr
    doc = yaml.safe_load(SHIPPED.read_text())
    assert doc["route"]["routes"] == [{"matchers": ['severity="page"'], "receiver": "dsv4ctl-page"}]
    assert sorted(r["name"] for r in doc["receivers"]) == ["dsv4ctl-page", "dsv4ctl-ticket"]


def test_watch_down_reaches_the_webhook_receiver_through_alertmanager(tmp_path):
    prometheus_binary()
    alertmanager_binary()
    t0 = time.monotonic()
    addr = loopback(48)
    mport, pport, aport, rport = free_port(), free_port(), free_port(), free_port()
    # watch probes a server that is not there (its probes fail): what matters here is its /metrics
    p = _profile(tmp_path, """\
        - {name: one, role: colocated, host: local, gpus: [0, 1, 2, 3, 4, 5, 6, 7], tp: 8, serve_config: c.yaml}
        """, port=free_port(), address=addr)
    out = tmp_path / "alerts.jsonl"
    errs = open(tmp_path / "stderr.log", "w")
    receiver = watch = am = prom = None
    try:
        receiver = subprocess.Popen([sys.executable, str(RECEIVER), "--listen", f"{addr}:{rport}", "--out", str(out)],
                                    stdin=subprocess.DEVNULL, stdout=open(tmp_path / "receiver.out", "w"), stderr=errs,
                                    start_new_session=True)
        watch = _watch(p, f"{addr}:{mport}", errs)
        am = Alertmanager(tmp_path / "am", addr, aport, _am_config(f"http://{addr}:{rport}/alerts")).start()
        prom = Prometheus(tmp_path / "prom", addr, pport, [f"{addr}:{mport}"],
                          {"rules.yml": render_rules(scale=1 / 60, min_window=5)},
                          alertmanagers=(f"{addr}:{aport}",)).start()
        poll(lambda: urllib.request.urlopen(f"http://{addr}:{rport}/health", timeout=1).status == 200
             if receiver.poll() is None else (_ for _ in ()).throw(AssertionError("receiver exited")), 30,
             "the receiver")
        # a body that is not Alertmanager's webhook document: 400, nothing recorded
        bad = urllib.request.Request(f"http://{addr}:{rport}/alerts", data=b'{"version": "3"}', method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(bad, timeout=5)
        assert e.value.code == 400 and not out.exists()
        poll(lambda: prom.value('up{job="dsv4ctl-watch"}') == 1.0, 30, "watch scraped")
        # watch up: DSV4WatchDown is not even pending, and no DSV4Watch* notification arrived
        assert not [a for a in prom.alerts() if a["labels"]["alertname"].startswith("DSV4WatchDown")]
        assert not [r for r in _records(out) if r["alertname"] == "DSV4WatchDown"]

        # --- watch dies: the alert fires and reaches the receiver, runbook_url and all ---
        _kill(watch)
        t_kill = time.monotonic()
        down = poll(lambda: [r for r in _records(out) if r["alertname"] == "DSV4WatchDown" and r["status"] == "firing"],
                    FIRE_BOUND, "DSV4WatchDown at the receiver")
        fire_s = time.monotonic() - t_kill
        r = down[0]
        assert r["receiver"] == "dsv4ctl-page" and r["severity"] == "page"
        assert r["labels"] == {"alertname": "DSV4WatchDown", "severity": "page", "job": "dsv4ctl-watch",
                               "instance": f"{addr}:{mport}"}
        assert r["summary"] == f"dsv4ctl watch {addr}:{mport} is down"
        assert r["runbook_url"] == runbook_url("DSV4WatchDown") == \
            "https://github.com/dsv4ctl/dsv4ctl/blob/main/docs/alerts.md#dsv4watchdown"
        assert f"runbook_url: {r['runbook_url']}" in (tmp_path / "receiver.out").read_text()
        # every alert that reached the receiver (the failing probes page too) links its runbook section
        assert all(x["runbook_url"] == runbook_url(x["alertname"]) for x in _records(out)), _records(out)

        # --- watch runs again: the alert resolves and the resolved notification arrives ---
        watch = _watch(p, f"{addr}:{mport}", errs)
        t_back = time.monotonic()
        poll(lambda: [r for r in _records(out) if r["alertname"] == "DSV4WatchDown" and r["status"] == "resolved"],
             FIRE_BOUND, "DSV4WatchDown resolved at the receiver")
        resolve_s = time.monotonic() - t_back
        print(f"\nalertmanager: fired at the receiver {fire_s:.1f} s after kill -9, resolved {resolve_s:.1f} s after "
              f"the restart, {time.monotonic() - t0:.1f} s in all")
    finally:
        for proc in (prom, am):
            if proc is not None:
                proc.stop()
        _kill(watch)
        if receiver is not None and receiver.poll() is None:
            receiver.terminate()
            receiver.wait(timeout=10)
        errs.close()


def _receiver_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("am_receiver", RECEIVER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_receiver_records_and_refusals(tmp_path, capsys):
    rx = _receiver_module()
    doc = {"version": "4", "receiver": "dsv4ctl-ticket", "status": "firing", "alerts": [
        {"status": "firing", "labels": {"alertname": "DSV4KVPoolNearFull", "severity": "ticket", "target": "g1"},
         "annotations": {"summary": "KV pool of g1 nearly full", "runbook_url": runbook_url("DSV4KVPoolNearFull")},
         "startsAt": "2026-12-07T10:00:00Z", "endsAt": "0001-01-01T00:00:00Z", "fingerprint": "ab12"}]}
    (r,) = rx.alert_records(doc, "2026-12-07T10:00:01Z")
    assert (r["alertname"], r["severity"], r["receiver"], r["runbook"], r["runbook_url"]) == (
        "DSV4KVPoolNearFull", "ticket", "dsv4ctl-ticket", None,
        "https://github.com/dsv4ctl/dsv4ctl/blob/main/docs/alerts.md#dsv4kvpoolnearfull")
    assert rx.alert_line(r) == ("firing DSV4KVPoolNearFull ticket target=g1: KV pool of g1 nearly full\n"
                                "  runbook_url: https://github.com/dsv4ctl/dsv4ctl/blob/main/docs/alerts.md#dsv4kvpoolnearfull")
    for bad in ({"version": "3", "alerts": []}, {"version": "4"}, [], {"version": "4", "alerts": [{"status": "x"}]}):
        with pytest.raises(ValueError):
            rx.alert_records(bad, "now")
    assert rx.main(["--listen", "nowhere"]) == 2
    assert "--listen 'nowhere': expected HOST:PORT" in capsys.readouterr().err
