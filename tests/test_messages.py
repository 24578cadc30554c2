"""``-m/--message`` on every command that changes hosts or a tree (issue 46.8): a walk of the
command tree, the runbook's reason handed to each host-changing step as its ``-m``."""

from __future__ import annotations

from dsv4ctl.runbook.actions import MESSAGE_MAX, with_message
from tests.conftest import run_cli
from tests.test_grammar import MUTATING, _opts, commands

#: Mutating commands that change local files or a local git tree only, and their own record.
LOCAL = {"facts": "--write edits the profile file (its diff is printed)",
         "patch export": "writes series files", "patch check": "builds a throw-away tree (--dry-run: fetch nothing)",
         "profile init": "writes a new profile",
         "profile import srt-slurm": "writes a new profile"}


def test_every_command_that_changes_hosts_takes_a_message():
    seen = set()
    for path, cmd in commands():
        opts = _opts(cmd)
        if path in LOCAL or not ({"--dry-run", "--yes"} & opts or path in MUTATING):
            continue
        seen.add(path)
        assert {"-m", "--message"} <= opts, f"{path}: no -m/--message"
    assert {"deploy", "rollback", "promote", "start", "stop", "restart", "exec", "lock acquire", "lock release",
            "config set", "hicache on", "hicache off", "runbook run", "patch apply", "patch revert"} <= seen, seen


def test_a_runbooks_reason_is_each_host_changing_steps_message():
    why = "watch --on-alert corruption: 12 probes"
    assert with_message(["restart", "p.yaml", "-g", "decode"], why) == ["restart", "p.yaml", "-g", "decode", "-m", why]
    assert with_message(["hicache", "off", "p.yaml", "--remote"], why)[-2:] == ["-m", why]
    assert with_message(["config", "set", "p.yaml", "k=v", "--remote"], why)[-2:] == ["-m", why]
    # a local edit takes no -m; nor do read-only commands; a reason is never given twice
    for argv in (["hicache", "off", "p.yaml"], ["check", "smoke", "http://x"], ["diagnose", "p.yaml"],
                 ["restart", "p.yaml", "-m", "own"]):
        assert with_message(argv, why) == argv
    assert with_message(["restart"], None) == ["restart"]
    assert with_message(["stop"], "x" * 2000)[-1] == "x" * MESSAGE_MAX


def test_runbook_run_takes_dash_m_and_refuses_what_m_refuses(tmp_path):
    pb = tmp_path / "pause.yaml"
    pb.write_text("name: pause\nsteps:\n  - id: p\n    action: wait\n    args: {seconds: 0}\n")
    run = tmp_path / "run"
    r = run_cli("runbook", "run", str(pb), "--report-dir", str(run), "-m", "drill: checking the runbook")
    assert r.code == 0, r.err
    assert (run / "state.json").read_text().count('"evidence": "drill: checking the runbook"') == 1
    r = run_cli("runbook", "run", str(pb), "--message", "bidi \u202e override", "--dry-run")
    assert r.code == 2 and "--evidence/-m must be one line of 1-500 printable characters" in r.err, r.err


def test_audit_says_what_a_serve_config_change_changed():
    from dsv4ctl.commands.day2 import _detail_text
    rec = {"action": "hicache-off", "result": "ok", "release": "r2", "from": "r1", "groups": ["prefill", "decode"],
           "message": "KV pressure test", "detail": ""}
    assert _detail_text(rec) == '"KV pressure test"; serve config of prefill, decode (from r1)'
    assert _detail_text({**rec, "message": None}) == "serve config of prefill, decode (from r1)"
    assert _detail_text({"action": "stop", "groups": ["decode"], "detail": "x"}) == "x"
