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


def test_resume_with_a_corrupt_state_is_an_input_error(cli, tmp_path):
    pb = tmp_path / "fit-check.yaml"
    pb.write_text(PLAYBOOK)
    for content in ("{not json", "[1, 2]", '{"playbook": "fit-check"}', '{"playbook": "fit-check", "run_id": "x", "timeline": [{"nope": 1}]}'):
        (tmp_path / "run").mkdir(exist_ok=True)
        (tmp_path / "run" / "state.json").write_text(content)
        r = cli("runbook", "run", str(pb), "--resume", "x", "--report-dir", str(tmp_path / "run"))
        assert r.code == 2, (content, r.err)
        assert r.err.count("\n") == 1 and "Traceback" not in r.err


def test_unusable_report_dir_is_an_input_error(cli, tmp_path):
    pb = tmp_path / "fit-check.yaml"
    pb.write_text(PLAYBOOK)
    (tmp_path / "afile").write_text("x")
    r = cli("runbook", "run", str(pb), "--report-dir", str(tmp_path / "afile" / "run"))
    assert r.code == 2 and "not writable" in r.err and r.err.count("\n") == 1


def test_dry_run_of_an_invalid_playbook_creates_no_folder(cli, tmp_path):
    pb = tmp_path / "bad.yaml"
    pb.write_text("name: bad\nsteps:\n  - id: a\n    action: note\n    args: " + "{a: " * 12 + "1" + "}" * 12 + "\n")
    state = tmp_path / "state"
    r = cli("runbook", "run", str(pb), "--dry-run", env={"DSV4CTL_STATE_DIR": str(state)})
    assert r.code == 2 and "nested deeper" in r.err
    assert not state.exists()
    pb.write_text("name: bad\nsteps:\n  - id: a\n    action: note\n    repeat: {max: 2, until: later.ok == true}\n")
    r = cli("runbook", "run", str(pb), "--dry-run", env={"DSV4CTL_STATE_DIR": str(state)})
    assert r.code == 2 and "repeat.until" in r.err
    pb.write_text("name: ok\nsteps:\n  - id: a\n    action: note\n")
    r = cli("runbook", "run", str(pb), "--dry-run", env={"DSV4CTL_STATE_DIR": str(state)})
    assert r.code == 0 and "record a note:" in r.out and not state.exists()
