"""`dsv4ctl runbook run` end to end with the built-in local actions (note, wait, plan)."""

import json

PLAYBOOK = """\
name: fit-check
description: plan, and record a note only when a group does not fit
steps:
  - id: plan_now
    action: plan
    args: {set: {mem_fraction_static: 0.95}, groups: [decode]}
  - id: record
    action: note
    when: plan_now.fits == false
    args: {text: decode does not fit at 0.95}
  - id: pause
    action: wait
    args: {seconds: 0}
"""


def test_run_writes_report_and_follows_conditions(cli, tmp_path):
    pb = tmp_path / "fit-check.yaml"
    pb.write_text(PLAYBOOK)
    r = cli("runbook", "run", str(pb), "--report-dir", str(tmp_path / "run"))
    assert r.code == 0, r.err
    doc = json.loads((tmp_path / "run" / "incident.json").read_text())
    assert doc["schema"] == "dsv4ctl.incident/1" and doc["completed"] is True
    assert [e["status"] for e in doc["timeline"]] == ["ran", "ran", "ran"]
    assert doc["results"]["plan_now"]["fits"] is False
    assert doc["results"]["plan_now"]["groups"]["decode"]["full_max_total_num_tokens"] == 18668032
    md = (tmp_path / "run" / "incident.md").read_text()
    assert "| plan_now | plan | ran |" in md.replace("  ", " ") or "plan_now" in md


def test_dry_run_changes_nothing(cli, tmp_path):
    pb = tmp_path / "fit-check.yaml"
    pb.write_text(PLAYBOOK)
    r = cli("runbook", "run", str(pb), "--dry-run", "--report-dir", str(tmp_path / "run"))
    assert r.code == 0, r.err
    assert "only if plan_now.fits == false" in r.out
    assert not (tmp_path / "run" / "state.json").exists()
    assert not (tmp_path / "run" / "incident.json").exists()


def test_bad_playbook_is_a_one_line_input_error(cli, tmp_path):
    pb = tmp_path / "bad.yaml"
    pb.write_text("name: bad\nsteps:\n  - id: x\n    action: shell\n    args: {cmd: rm -rf /}\n")
    r = cli("runbook", "run", str(pb))
    assert r.code == 2
    assert r.err.strip().count("\n") == 0 and "unknown action 'shell'" in r.err
