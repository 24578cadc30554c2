"""Pure parts of diagnose collection: the one host command's output split back, process facts
from the service wrapper's log lines, --since, and the runbook's summary of a diagnosis."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from dsv4ctl.commands.options import since as parse_since
from dsv4ctl.diagnose.collect import MARK, host_command, parse_host, process_facts, since_filter
from dsv4ctl.errors import InputError
from dsv4ctl.runbook.actions import summarize_diagnosis



def test_host_command_is_one_read_only_round_with_markers():
    from dsv4ctl.hosts.layout import Paths
    from dsv4ctl.hosts.service import Launcher
    cmd = host_command("/srv/d", {g: Launcher().process_cmd(Paths("/srv/d"), g) for g in ("prefill", "decode")},
                       lines=50)
    assert cmd.count(MARK) == 4 and "tail -n 50 /srv/d/logs/prefill.log" in cmd and "nvidia-smi --query-gpu" in cmd
    for word in ("rm ", "mv ", "kill -TERM", "kill -KILL", "> /", "systemctl restart"):
        assert word not in cmd


def test_parse_host_splits_status_logs_and_gpus():
    text = "\n".join([
        f"{MARK} status", "@current", "releases/r7", "@alive prefill no", "@audit", '{"action": "deploy"}',
        f"{MARK} log prefill", "42", "=== dsv4ctl start prefill release r7 at 2026-12-01T10:00:00Z",
        "[2026-12-01 10:00:05 TP0] boom", "=== dsv4ctl: prefill exited with status 137",
        f"{MARK} gpus", "@error nvidia-smi not found", ""])
    ev = parse_host("h1", "/srv/d", text)
    assert ev.status.alive == {"prefill": False} and ev.status.facts.current == "r7"
    assert ev.status.last_audit == {"action": "deploy"}
    size, log = ev.logs["prefill"]
    assert size == 42 and log.splitlines()[1] == "[2026-12-01 10:00:05 TP0] boom"
    assert ev.gpus is None and ev.gpu_error == "nvidia-smi not found"
    assert process_facts("prefill", log) == (137, 1)


def test_parse_host_reads_gpus_with_the_shared_parser():
    csv = ("index, uuid, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], utilization.gpu [%], "
           "power.draw [W], power.limit [W]\n0, GPU-a, NVIDIA H200, 143771 MiB, 120000 MiB, 23771 MiB, 100 %, 690.5 W, 700.00 W")
    ev = parse_host("h1", "/r", f"{MARK} status\n@audit\n{MARK} gpus\n@gpus\n{csv}\n@apps\n")
    assert ev.gpus[0]["util_pct"] == 100.0 and ev.gpus[0]["power_w"] == 690.5 and ev.gpus[0]["used_mib"] == 120000


def test_process_facts_resets_at_each_start():
    log = ("=== dsv4ctl: g exited with status 1\n=== dsv4ctl restart g (hicache) at 2026-12-01T10:00:00Z\n"
           "=== dsv4ctl: other exited with status 9\n")
    assert process_facts("g", log) == (None, 1)


def test_since():
    now = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)
    assert parse_since("15m", now) == datetime(2026, 12, 1, 11, 45, tzinfo=timezone.utc)
    assert parse_since("2026-12-01T10:00:00Z", now) == datetime(2026, 12, 1, 10, tzinfo=timezone.utc)
    for bad in ("xx", "-5m", "5000d"):
        with pytest.raises(InputError):
            parse_since(bad, now)
    log = "[2026-12-01 09:00:00 TP0] old\n  trace\n[2026-12-01 11:50:00 TP0] new\n  more\n"
    assert since_filter(log, parse_since("15m", now)) == "[2026-12-01 11:50:00 TP0] new\n  more\n"
    assert since_filter("no stamps\n", now) == "no stamps\n"
    assert since_filter(log, datetime(2027, 1, 1, tzinfo=timezone.utc)) == ""


def test_summarize_diagnosis_for_conditions():
    f = lambda rule, rb, sev="crash", g="prefill": {"rule": rule, "runbook": rb, "cause": rule, "severity": sev,  # noqa: E731
                                                   "group": g, "evidence": [f"e-{rule}"]}
    doc = {"ok": False, "groups": {"prefill": {"alive": False, "health": "cannot connect"}},
           "findings": [f("nan_sampling", "hicache-crash"), f("dead_rank", "hicache-crash")]}
    s = summarize_diagnosis(doc)
    assert (s["healthy"], s["rule"], s["runbook"], s["hicache_crash"], s["crash"], s["stall"], s["down"]) == \
        (False, "nan_sampling", "hicache-crash", True, True, False, True)
    assert s["rules"] == ["dead_rank", "nan_sampling"] and s["evidence"] == ["e-nan_sampling", "e-dead_rank"]
    ok = summarize_diagnosis({"ok": True, "groups": {"p": {"alive": True, "health": "ok"}},
                              "findings": [f("healthy", None, "ok")]})
    assert (ok["healthy"], ok["rule"], ok["runbook"], ok["down"]) == (True, "healthy", None, False)


def test_since_filter_skips_stamps_that_are_no_date():
    log = "[2026-13-45 99:99:99] garbage\n[2026-12-01 10:00:00] real\nafter\n"
    assert since_filter(log, datetime(2026, 11, 1, tzinfo=timezone.utc)) == "[2026-12-01 10:00:00] real\nafter\n"
    assert since_filter("[2026-13-45 99:99:99] only garbage\n", datetime(2026, 11, 1, tzinfo=timezone.utc)) \
        == "[2026-13-45 99:99:99] only garbage\n"


def test_current_process_is_what_diagnose_judges_by_default():
    """Issue 28: diagnose without --since reported the crash of an earlier process after a
    recovery. By default it judges the log after the group's last start header."""
    from dsv4ctl.diagnose.collect import current_process, process_facts
    log = ("=== dsv4ctl start decode release r1 at 2026-12-01T10:00:00Z\n"
           "torch.OutOfMemoryError: CUDA out of memory\n"
           "=== dsv4ctl: decode exited with status 1\n"
           "=== dsv4ctl start prefill release r1 at 2026-12-01T10:01:00Z\n"
           "=== dsv4ctl start decode release r2 at 2026-12-01T10:05:00Z\n"
           "[2026-12-01 10:05:30] The server is fired up and ready to roll!\n")
    cur = current_process(log, "decode")
    assert cur.startswith("=== dsv4ctl start decode release r2") and "OutOfMemoryError" not in cur
    assert process_facts("decode", log) == (None, 2)
    assert current_process("no header\n", "decode") == "no header\n"
    assert current_process(log, "router") == log
