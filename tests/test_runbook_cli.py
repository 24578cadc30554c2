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


def test_the_evidence_a_run_was_started_with_is_kept_for_resume_and_reported(cli, tmp_path):
    """``--release``/``--evidence`` (what watch --on-alert passes) go into the run's state, a
    resumed run keeps them, the report names them; a release id that is no word is exit 2."""
    pb = tmp_path / "fit-check.yaml"
    pb.write_text(PLAYBOOK)
    run = tmp_path / "run"
    r = cli("runbook", "run", str(pb), "--report-dir", str(run), "--release", "r0123456789ab",
            "--evidence", "watch --on-alert corruption: one 100% of probes corrupted (release r0123456789ab, 12 probes)")
    assert r.code == 0, r.err
    inputs = {"release": "r0123456789ab",
              "evidence": "watch --on-alert corruption: one 100% of probes corrupted (release r0123456789ab, 12 probes)"}
    assert json.loads((run / "state.json").read_text())["inputs"] == inputs
    assert json.loads((run / "incident.json").read_text())["inputs"] == inputs
    assert "- release: r0123456789ab\n" in (run / "incident.md").read_text()
    r = cli("runbook", "run", str(pb), "--release", "r1; rm -rf /", "--dry-run")
    assert r.code == 2 and r.err.count("\n") == 1 and "--release 'r1; rm -rf /': a release id is one word" in r.err
    r = cli("runbook", "run", str(pb), "--evidence", "two\nlines", "--dry-run")
    assert r.code == 2 and "--evidence: one line of at most 2000 characters" in r.err


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


def test_list_and_show_json(cli):
    r = cli("runbook", "list", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["schema"] == "dsv4ctl.runbooks/1"
    rows = {x["name"]: x for x in json.loads(r.out)["runbooks"]}
    assert set(rows) >= {"toolcall-corruption", "hicache-crash", "scheduler-stall", "transfer-wedge"}
    assert rows["transfer-wedge"]["pd_only"] is True and rows["toolcall-corruption"]["pd_only"] is False
    s = cli("runbook", "show", "toolcall-corruption", "--json")
    doc = json.loads(s.out)
    assert doc["schema"] == "dsv4ctl.runbook/1" and doc["name"] == "toolcall-corruption"
    steps = {x["id"]: x for x in doc["steps"]}
    assert steps["measure"]["continue_on_failure"] is True and steps["diag"]["when"] == "measure.ok == false"
    assert "groups" not in steps["hicache_off"]["args"]      # no hard-coded prefill: colocated works


def test_yaml11_boolean_step_id_gets_a_quote_hint(cli, tmp_path):
    pb = tmp_path / "b.yaml"
    pb.write_text("name: b\nsteps:\n  - id: off\n    action: note\n")
    r = cli("runbook", "show", str(pb))
    assert r.code == 2 and "Traceback" not in r.err
    assert 'steps[0].id: read as the boolean False' in r.err and 'quote it, e.g. id: "off"' in r.err


def test_pd_only_runbook_refuses_a_colocated_profile(cli, tmp_path):
    import yaml
    from tests.conftest import REPO
    prof = yaml.safe_load((REPO / "profiles" / "dsv4-flash-8xb200-pd.yaml").read_text())
    src = REPO / "profiles"
    pre = next(g for g in prof["groups"] if g["role"] == "prefill")
    pre["role"] = "colocated"
    pre["serve_config"] = str((src / pre["serve_config"]).resolve())
    prof["groups"] = [pre]
    p = tmp_path / "colo.yaml"
    p.write_text(yaml.safe_dump(prof, sort_keys=False))
    r = cli("runbook", "run", "transfer-wedge", "--profile", str(p), "--dry-run")
    assert r.code == 2, r.out + r.err
    assert "runbook transfer-wedge is for PD profiles" in r.err


def test_an_unknown_runbook_name_lists_the_shipped_ones():
    from tests.conftest import run_cli
    r = run_cli("runbook", "show", "nosuch")
    assert r.code == 2 and r.err.count("\n") == 1
    assert r.err.startswith("dsv4ctl: error: nosuch: no such runbook (shipped: bad-release, hicache-crash, oom-at-startup, "
                            "scheduler-stall, toolcall-corruption, transfer-wedge; or give a playbook file)"), r.err


TUNE = """\
name: tune
steps:
  - id: change
    action: config.set
    args: {groups: [decode], set: {chunked-prefill-size: 4096}}
  - id: after
    action: note
    args: {text: changed}
"""


def test_a_step_to_confirm_without_a_terminal_stops_with_a_resumable_run(cli, tmp_path):
    """No terminal and no --yes: the run stops before the first step that changes things, its
    state saved, and the run id it printed resumes there with --yes (it used to name a run id
    whose --resume said 'no run state')."""
    import re
    assert cli("profile", "init", str(tmp_path / "p.yaml")).code == 0
    decode = tmp_path / "p" / "decode.yaml"
    before = decode.read_text()
    (tmp_path / "tune.yaml").write_text(TUNE)
    env = {"DSV4CTL_STATE_DIR": str(tmp_path / "state")}
    r = cli("runbook", "run", str(tmp_path / "tune.yaml"), "-p", str(tmp_path / "p.yaml"), env=env, input="")
    assert r.code == 2, r.err
    run_id = re.fullmatch(r"run (\S+): tune on p; state and report in (.+)", r.out.splitlines()[0])[1]
    assert r.err == (f"dsv4ctl: error: step change (config.set) changes things; confirm interactively or pass "
                     f"--yes (nothing of it ran; resume with dsv4ctl runbook run {tmp_path / 'tune.yaml'} "
                     f"{tmp_path / 'p.yaml'} --resume {run_id} --yes)\n")
    run_dir = tmp_path / "state" / "runs" / run_id
    state = json.loads((run_dir / "state.json").read_text())
    assert state["run_id"] == run_id and state["done"] == [] and state["failed_step"] is None
    assert [(e["step"], e["status"]) for e in state["timeline"]] == [("change", "declined")]
    assert json.loads((run_dir / "incident.json").read_text())["completed"] is False
    assert decode.read_text() == before
    # the printed id resumes at that step
    r = cli("runbook", "run", str(tmp_path / "tune.yaml"), "-p", str(tmp_path / "p.yaml"), "--resume", run_id,
            "--yes", env=env, input="")
    assert r.code == 0, r.err
    state = json.loads((run_dir / "state.json").read_text())
    assert state["done"] == ["change", "after"]
    assert [(e["step"], e["status"]) for e in state["timeline"]] == [("change", "declined"), ("change", "ran"),
                                                                     ("after", "ran")]
    assert "chunked-prefill-size: 4096" in decode.read_text()


def test_verbose_shows_each_step_and_quiet_only_the_run(cli, tmp_path):
    """Issue 31: -v/-q on every command that prints progress; both together exit 2."""
    pb = tmp_path / "fit-check.yaml"
    pb.write_text(PLAYBOOK)
    r = cli("runbook", "run", str(pb), "--report-dir", str(tmp_path / "v"), "-v")
    assert r.code == 0, r.err
    assert r.out.count("step plan_now (plan): ran") == 1 and "step record (note): ran" in r.out and "step pause (wait): ran" in r.out
    quiet = cli("runbook", "run", str(pb), "--report-dir", str(tmp_path / "q"), "-q")
    normal = cli("runbook", "run", str(pb), "--report-dir", str(tmp_path / "n"))
    assert quiet.code == normal.code == 0
    assert [ln for ln in quiet.out.splitlines() if ln.startswith("run ")] == quiet.out.splitlines()
    assert len(quiet.out.splitlines()) == 2 < len(normal.out.splitlines())
    r = cli("runbook", "run", str(pb), "-v", "-q")
    assert r.code == 2 and r.err == "dsv4ctl: error: -v/--verbose and -q/--quiet cannot be used together (pick one)\n"
