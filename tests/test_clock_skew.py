"""A host whose clock is off: ``diagnose --since`` and ``audit --since`` take the cutoff in each
host's time (the offset measured in the round trip that collects the data), and warn in one line
naming the host and the offset. Pure functions first, then a real sshd host whose ``date`` runs
40 minutes (diagnose) or 3 hours (audit) behind this machine (a ``date`` wrapper first on the
PATH its sshd gives every command)."""

from __future__ import annotations

import json
import os
import re
import time
from datetime import datetime, timedelta, timezone

import pytest
import yaml

from dsv4ctl.diagnose.collect import since_filter
from dsv4ctl.hosts.clock import (ClockReading, clocked, host_cutoff, host_cutoff_iso, host_stamps, read_offset,
                                 skew_text, skew_warning)
from dsv4ctl.hosts.day2 import merge_audit
from tests.conftest import run_cli
from tests.sshd.harness import free_port

UTC = timezone.utc


def test_the_offset_is_the_hosts_midpoint_against_the_round_trips():
    # sent at 1000.0, answered at 1002.0; the host ran the command from its 3400.5 to 3401.5
    r = read_offset("@dsv4ctl-clock 3400.5\nsome error\n@dsv4ctl-clock 3401.500000000\n", 1000.0, 1002.0)
    assert r == ClockReading(offset_s=2400.0, uncertainty_s=0.5)
    assert r.applied == 2400.0
    # one reading (the command exited early): against the midpoint, the whole round trip uncertain
    assert read_offset("@dsv4ctl-clock 998.25\n", 1000.0, 1002.0) == ClockReading(-2.75, 1.0)
    # a date without %N prints it literally: whole seconds
    assert host_stamps("@dsv4ctl-clock 1700000000.%N\n@dsv4ctl-clock 1700000001.N") == [1700000000.0, 1700000001.0]
    assert read_offset("no clock here", 1.0, 2.0) is None
    # within the measurement's error or a second: no offset applied
    assert ClockReading(0.8, 0.1).applied == 0.0 and ClockReading(-3.0, 5.0).applied == 0.0
    assert ClockReading(-2400.2, 0.3).applied == -2400.2
    assert clocked("cat x").startswith('echo "@dsv4ctl-clock $(date +%s.%N)" >&2\ncat x\nrc=$?;')


def test_a_cutoff_in_this_machines_time_is_moved_to_the_hosts():
    since = datetime(2026, 12, 1, 16, 0, tzinfo=UTC)
    assert host_cutoff(since, -2400.0) == datetime(2026, 12, 1, 15, 20, tzinfo=UTC)
    assert host_cutoff_iso("2026-12-01T16:00:00Z", -3 * 3600 - 0.4) == "2026-12-01T13:00:00Z"
    assert host_cutoff_iso("2026-12-01T00:10:00Z", -1200) == "2026-11-30T23:50:00Z"
    assert host_cutoff_iso("2026-12-01T00:10:00", 60) == "2026-12-01T00:11:00Z"
    assert host_cutoff_iso("", 60) == "" and host_cutoff_iso("2026-13-01T00:00:00Z", 60) == "2026-13-01T00:00:00Z"
    # diagnose: a host 40 min behind logged a CUDA OOM 5 minutes ago (its stamp: 45 min ago by
    # this machine); --since 30m keeps it only in the host's time
    log = ("[2026-12-01 15:14:00 TP0] Prefill batch.\n"
           "[2026-12-01 15:15:00 TP0] Scheduler hit an exception: torch.OutOfMemoryError: CUDA out of memory.\n")
    now = datetime(2026, 12, 1, 16, 0, tzinfo=UTC)
    assert since_filter(log, now - timedelta(minutes=30)) == ""
    assert since_filter(log, host_cutoff(now - timedelta(minutes=30), -2400.0)).splitlines() == log.splitlines()


def test_audit_since_and_order_in_each_hosts_time():
    behind = [{"ts": "2026-12-01T12:50:00Z", "action": "deploy"}, {"ts": "2026-12-01T09:00:00Z", "action": "old"}]
    ok = [{"ts": "2026-12-01T15:30:00Z", "action": "rollback"}]
    per_host = {"h0": behind, "h1": ok}
    # the host 3 h behind wrote "12:50" at 15:50 by this machine: after h1's 15:30, and after --since 15:00
    assert [r["action"] for r in merge_audit(per_host, "2026-12-01T15:00:00Z", offsets={"h0": -10800.0})] == \
        ["rollback", "deploy"]
    assert [r["action"] for r in merge_audit(per_host, "2026-12-01T15:00:00Z")] == ["rollback"]   # as before
    assert [r["action"] for r in merge_audit(per_host, offsets={"h0": -10800.0})] == ["old", "rollback", "deploy"]
    assert [r["action"] for r in merge_audit(per_host, "2026-12-01T15:00:00Z", host="h0",
                                             offsets={"h0": -10800.0})] == ["deploy"]


def test_the_warning_names_the_host_and_the_offset():
    assert skew_warning("b200-1", -2400.4) == ("warning: b200-1: its clock is 40 min 0 s behind this machine's "
                                               "(-2400 s); --since is taken in b200-1's time")
    assert skew_text(3 * 3600 + 59) == "3 h 0 min ahead of" and skew_text(-75) == "75 s behind"
    assert skew_warning("h", 59.9) is None and skew_warning("h", None) is None
    assert skew_warning("h", -61).startswith("warning: h: its clock is 61 s behind")


# -- a real sshd host whose clock runs behind --------------------------------------------------


@pytest.fixture
def skewed_host(tmp_path):
    """One sshd host whose commands see ``date`` shifted by the seconds in ``skew`` (a file)."""
    from tests.sshd import harness
    why = harness.available()
    if why:
        pytest.skip(why)
    c = harness.start_cluster(tmp_path / "sshd", n=1)
    h = c.hosts[0]
    fake, skew = tmp_path / "fakebin", tmp_path / "skew"
    fake.mkdir()
    real = "/usr/bin/date" if os.path.exists("/usr/bin/date") else "/bin/date"
    (fake / "date").write_text(
        "#!/bin/sh\n"
        f"now=$({real} +%s.%N); s=$(cat {skew} 2>/dev/null || echo 0)\n"
        f"exec {real} -d \"@$(echo \"$now $s\" | awk '{{printf \"%.9f\", $1 + $2}}')\" \"$@\"\n")
    os.chmod(fake / "date", 0o755)
    skew.write_text("0\n")
    h.kill()
    h.config.write_text(h.config.read_text().replace(
        "SetEnv SHLVL=1", f"SetEnv SHLVL=1 PATH={fake}:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"))
    h.start()
    try:
        yield c, h, skew
    finally:
        c.stop()


def _profile(tmp_path, c, h) -> tuple:
    root = tmp_path / "root"
    (root / "logs").mkdir(parents=True)
    cfg = tmp_path / "profile"
    cfg.mkdir()
    port = free_port(h.address)
    (cfg / "serve.yaml").write_text(yaml.safe_dump({"model-path": "deepseek-ai/DeepSeek-V4-Flash", "host": "0.0.0.0",
                                                   "port": port, "tp-size": 1}))
    prof = {"version": 1, "name": "skew", "model": "deepseek-v4-flash",
            "sglang": {"version": "0.5.23", "series": None},
            "deploy": {"root": "/nonexistent", "service": "launcher"},
            "hosts": [c.host_yaml(h, root)],
            "groups": [{"name": "serve", "role": "colocated", "host": h.name, "gpus": [0], "tp": 1,
                        "serve_config": "serve.yaml",
                        "memory": {"free_gib_before_load": 177.0, "weights_gib_per_rank": 40.0}}]}
    (cfg / "skew.yaml").write_text(yaml.safe_dump(prof, sort_keys=False))
    return cfg / "skew.yaml", root


def _host_time(seconds_ago: float, skew: float) -> datetime:
    return datetime.fromtimestamp(time.time() - seconds_ago + skew, UTC)


@pytest.mark.sshd
def test_diagnose_since_on_a_host_40_minutes_behind(skewed_host, tmp_path):
    c, h, skew_file = skewed_host
    skew_file.write_text("-2400\n")
    profile, root = _profile(tmp_path, c, h)
    start, oom = _host_time(600, -2400), _host_time(300, -2400)      # 10 and 5 minutes ago, in the host's time
    (root / "logs" / "serve.log").write_text(
        f"=== dsv4ctl start serve release r0123456789ab at {start:%Y-%m-%dT%H:%M:%SZ}\n"
        f"[{oom:%Y-%m-%d %H:%M:%S} TP0] Prefill batch. #new-seq: 1, #new-token: 4096\n"
        f"[{oom:%Y-%m-%d %H:%M:%S} TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        "    logits = deep_gemm.fp8_paged_mqa_logits(q_fp8, kv_cache_fp8, weights)\n"
        f"[{oom:%Y-%m-%d %H:%M:%S} TP0] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.42 GiB.\n")
    r = run_cli("diagnose", str(profile), "--since", "30m", "--window", "0", "--json", timeout=120)
    assert "Traceback" not in r.err and r.code == 1, r.err
    warn = [ln for ln in r.err.splitlines() if ln.startswith("warning:")]
    assert len(warn) == 1 and re.fullmatch(rf"warning: {h.name}: its clock is (40 min 0|39 min 59|40 min 1) s behind "
                                           rf"this machine's \((-240[01]|-2399) s\); --since is taken in {h.name}'s time",
                                           warn[0]), warn
    doc = r.json()
    assert abs(doc["hosts"][h.name]["clock_offset_s"] + 2400) < 5
    g = doc["groups"]["serve"]
    assert g["log_lines"] == 5                          # the start, the OOM and its context, in the host's time
    assert g["findings"][0]["rule"] == "cuda_oom" and "indexer kernel" in g["findings"][0]["cause"]
    # a clock that agrees: no warning, no offset applied (the same lines are 45 min old now)
    skew_file.write_text("0\n")
    r = run_cli("diagnose", str(profile), "--since", "30m", "--window", "0", "--json", timeout=120)
    assert "warning:" not in r.err and abs(r.json()["hosts"][h.name]["clock_offset_s"]) < 5
    assert r.json()["groups"]["serve"]["log_lines"] == 0


@pytest.mark.sshd
def test_audit_since_on_a_host_3_hours_behind(skewed_host, tmp_path):
    c, h, skew_file = skewed_host
    skew_file.write_text("-10800\n")
    profile, root = _profile(tmp_path, c, h)
    old, recent = _host_time(2 * 3600, -10800), _host_time(600, -10800)    # 2 h and 10 min ago
    (root / "audit.jsonl").write_text(
        json.dumps({"ts": f"{old:%Y-%m-%dT%H:%M:%SZ}", "who": "a@b", "host": h.name, "action": "deploy", "result": "ok"})
        + "\n" + json.dumps({"ts": f"{recent:%Y-%m-%dT%H:%M:%SZ}", "who": "a@b", "host": h.name, "action": "rollback",
                             "result": "ok"}) + "\n")
    since = datetime.fromtimestamp(time.time() - 3600, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")     # an hour ago
    r = run_cli("audit", str(profile), "--since", since, "--json", timeout=120)
    assert r.code == 0, r.err
    assert len(r.err.strip().splitlines()) == 1
    assert re.fullmatch(rf"warning: {h.name}: its clock is (3 h 0|2 h 59) min behind this machine's "
                        rf"\((-10800|-10799|-10801) s\); --since is taken in {h.name}'s time", r.err.strip()), r.err
    doc = r.json()
    assert abs(doc["clock_offsets_s"][h.name] + 10800) < 5
    assert [x["action"] for x in doc["records"]] == ["rollback"]
    # the table: the host's own times, the same record
    r = run_cli("audit", str(profile), "--since", since, timeout=120)
    assert r.code == 0 and "rollback" in r.out and "| deploy" not in r.out.replace("  ", " ")


def test_a_clock_that_prints_nonsense_is_reported_never_applied():
    """Review of issue 32: a ``date`` printing a 300-digit number, infinity or year 5138 gave
    OverflowError tracebacks (diagnose, audit) or silently dropped every audit record."""
    from datetime import datetime, timezone

    from dsv4ctl.hosts import clock as c
    for digits in ("9" * 300, "9" * 400, "100000000000"):
        r = c.read_offset(f"{c.CLOCK_MARK} {digits}\n", 1_000.0, 1_001.0)
        assert r is not None and r.applied == 0.0
        assert not c.usable(r.offset_s)
        since = datetime(2026, 12, 1, tzinfo=timezone.utc)
        assert c.host_cutoff(since, r.offset_s) == since
        assert c.host_cutoff_iso("2026-12-01T00:00:00Z", r.offset_s) == "2026-12-01T00:00:00Z"
        w = c.skew_warning("h1", r.offset_s)
        assert w.startswith("warning: h1: its clock reads no usable time") and w.endswith("this machine's time for h1")
    assert c.usable(-2400.0) and c.read_offset(f"{c.CLOCK_MARK} 100\n", 2_500.0, 2_500.0).applied == -2400.0


def test_since_is_one_rule_for_audit_and_diagnose():
    """``audit --since 1h`` was refused while ``diagnose --since 30m`` worked: one parser now."""
    from dsv4ctl.commands.day2 import _since
    from dsv4ctl.errors import InputError
    from dsv4ctl.commands.options import since as parse_since
    now = datetime(2026, 12, 4, 12, 0, 0, tzinfo=timezone.utc)
    assert parse_since("90m", now) == datetime(2026, 12, 4, 10, 30, tzinfo=timezone.utc)
    assert parse_since("2026-12-01", now) == datetime(2026, 12, 1, tzinfo=timezone.utc)
    assert parse_since("2026-12-01T16", now) == datetime(2026, 12, 1, 16, tzinfo=timezone.utc)
    assert _since("2026-12-01T16:00:00Z") == "2026-12-01T16:00:00Z" and _since("2026-12-01") == "2026-12-01T00:00:00Z"
    assert _since("0999-01-01") == "0999-01-01T00:00:00Z"          # sorts before every audit time
    for bad in ("yesterday", "400d", "-1h", "0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00"):
        with pytest.raises(InputError, match="--since"):
            parse_since(bad, now)
    r = run_cli("audit", "--since", "nonsense", "dsv4-flash-8xb200-pd")
    assert r.code == 2 and r.err.strip() == ("dsv4ctl: error: --since 'nonsense': expected a duration (15m, 2h) or "
                                             "an ISO time (2026-12-01T21:00:00Z)")
