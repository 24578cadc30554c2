"""The runbook engine's rules: conditions, confirmation, dry-run, resume, repeat caps."""

import pytest

from dsv4ctl.errors import InputError
from dsv4ctl.runbook.engine import (Action, RunState, evaluate, execute, load_playbook_data,
                                    parse_condition)


class Recorder:
    """Records which actions ran and returns scripted results (the engine's unit under test
    is the sequencing, not the actions)."""

    def __init__(self, scripted):
        self.scripted = {k: list(v) for k, v in scripted.items()}
        self.calls = []

    def actions(self):
        def make(name, mutating):
            def run(ctx, args):
                self.calls.append((name, args))
                seq = self.scripted.get(name)
                if seq:
                    r = seq.pop(0)
                    if isinstance(r, BaseException):
                        raise r
                    return r
                return {"ok": True}
            return Action(name, mutating, run, lambda ctx, args: [f"{name} {args}"])
        return {"measure": make("measure", False), "mitigate": make("mitigate", True),
                "note": make("note", False)}


PB = {
    "name": "toy",
    "steps": [
        {"id": "m1", "action": "measure", "args": {"c": 60}},
        {"id": "fix", "action": "mitigate", "when": "m1.upper > 0.01"},
        {"id": "m2", "action": "measure", "when": "fix.ran == true"},
        {"id": "rec", "action": "note"},
    ],
}


def test_condition_language():
    res = {"m": {"upper": 0.05, "ok": False, "name": "x"}}
    assert evaluate(parse_condition("m.upper > 0.01"), res)
    assert not evaluate(parse_condition("m.upper <= 0.01"), res)
    assert evaluate(parse_condition("m.ok == false and m.name == 'x'"), res)
    assert evaluate(parse_condition("m.upper < 0 or m.ok == false"), res)
    assert evaluate(parse_condition("z.ran == false"), res)        # never ran
    assert not evaluate(parse_condition("m.missing > 1"), res)
    for bad in ("__import__('os')", "m.upper >", "m > 1", "m.upper ~ 1", "m.upper > 1; x"):
        with pytest.raises(InputError):
            parse_condition(bad)


def test_mitigation_runs_only_over_the_gate():
    # a measurement over the gate is data (ok: the check ran), not a failed step
    r = Recorder({"measure": [{"ok": True, "passed": False, "upper": 0.18},
                              {"ok": True, "passed": True, "upper": 0.004}]})
    acts = r.actions()
    st = execute(load_playbook_data(PB, "toy.yaml", acts), acts, None, RunState("toy", "r1"))
    assert [c[0] for c in r.calls] == ["measure", "mitigate", "measure", "note"]
    assert st.failed_step is None
    assert (st.results["m1"]["upper"], st.results["m2"]["upper"]) == (0.18, 0.004)


def test_a_step_that_cannot_run_stops_the_run():
    r = Recorder({"measure": [{"ok": False, "error": "connection refused"}]})
    acts = r.actions()
    st = execute(load_playbook_data(PB, "toy.yaml", acts), acts, None, RunState("toy", "r1"))
    assert st.failed_step == "m1" and [c[0] for c in r.calls] == ["measure"]


def test_failed_step_stops_and_resume_continues_there():
    pb = dict(PB, steps=[dict(PB["steps"][0], continue_on_failure=True), *PB["steps"][1:]])
    r = Recorder({"measure": [{"ok": False, "upper": 0.2}, {"ok": True, "upper": 0.0}],
                  "mitigate": [RuntimeError("ssh: connection refused"), {"ok": True}]})
    acts = r.actions()
    book = load_playbook_data(pb, "toy.yaml", acts)
    st = execute(book, acts, None, RunState("toy", "r1"))
    assert st.failed_step == "fix" and st.done == ["m1"]
    assert "connection refused" in st.results["fix"]["error"]
    st = execute(book, acts, None, RunState.from_dict(st.to_dict()))      # resume
    assert st.failed_step is None and st.done == ["m1", "fix", "m2", "rec"]
    assert [c[0] for c in r.calls] == ["measure", "mitigate", "mitigate", "measure", "note"]


def test_skip_when_under_gate_and_dry_run_runs_nothing():
    r = Recorder({"measure": [{"ok": True, "upper": 0.004}]})
    acts = r.actions()
    book = load_playbook_data(PB, "toy.yaml", acts)
    st = execute(book, acts, None, RunState("toy", "r1"))
    assert [e.status for e in st.timeline] == ["ran", "skipped", "skipped", "ran"]
    r2 = Recorder({})
    acts2 = r2.actions()
    st = execute(load_playbook_data(PB, "toy.yaml", acts2), acts2, None, RunState("toy", "r2"), dry_run=True)
    assert r2.calls == [] and [e.status for e in st.timeline] == ["dry-run"] * 4
    assert st.timeline[1].lines[0] == "only if m1.upper > 0.01"


def test_declined_confirmation_stops_before_mutating():
    r = Recorder({"measure": [{"ok": True, "upper": 0.5}]})
    acts = r.actions()
    st = execute(load_playbook_data(PB, "toy.yaml", acts), acts, None, RunState("toy", "r1"),
                 confirm=lambda step, lines: False)
    assert [c[0] for c in r.calls] == ["measure"]
    assert st.timeline[-1].status == "declined" and "fix" not in st.done


def test_repeat_until_is_capped():
    pb = {"name": "rep", "steps": [{"id": "m", "action": "measure",
                                    "repeat": {"max": 3, "until": "m.upper < 0.01"}}]}
    r = Recorder({"measure": [{"ok": True, "upper": 0.2}] * 5})
    acts = r.actions()
    st = execute(load_playbook_data(pb, "rep.yaml", acts), acts, None, RunState("rep", "r"))
    assert len(r.calls) == 3 and st.results["m"]["attempts"] == 3


@pytest.mark.parametrize("bad,msg", [
    ({"name": "x", "steps": [{"id": "a", "action": "shell"}]}, "unknown action 'shell'"),
    ({"name": "x", "steps": [{"id": "a", "action": "note", "when": "b.ok == true"}]}, "not an earlier step"),
    ({"name": "x", "steps": [{"id": "a", "action": "note"}, {"id": "a", "action": "note"}]}, "duplicate"),
    ({"name": "x", "steps": [{"id": "a", "action": "note", "run": "rm -rf /"}]}, "Additional properties"),
    ({"name": "x", "steps": []}, "should be non-empty"),
])
def test_playbook_validation(bad, msg):
    with pytest.raises(InputError, match=msg):
        load_playbook_data(bad, "x.yaml", Recorder({}).actions())


def test_interrupt_mid_step_is_recorded_saved_and_resumable():
    rec = Recorder({"measure": [{"ok": True, "upper": 0.5}], "mitigate": [KeyboardInterrupt()]})
    acts = rec.actions()
    pb = load_playbook_data(PB, "pb", acts)
    saved = []
    state = RunState("toy", "r1")
    with pytest.raises(KeyboardInterrupt):
        execute(pb, acts, None, state, save=lambda s: saved.append(s.to_dict()))
    assert state.failed_step == "fix" and state.timeline[-1].status == "interrupted"
    assert saved[-1]["failed_step"] == "fix" and "fix" not in saved[-1]["done"]
    # resume re-runs the interrupted step
    rec.scripted["mitigate"] = [{"ok": True}]
    execute(pb, acts, None, state)
    assert state.failed_step is None and [c[0] for c in rec.calls].count("mitigate") == 2


def test_dry_run_marks_a_step_whose_describe_fails():
    def boom(ctx, args):
        raise RuntimeError("cannot connect to 127.0.0.1:22")
    acts = {"measure": Action("measure", False, lambda c, a: {"ok": True}, boom),
            "note": Action("note", False, lambda c, a: {"ok": True}, lambda c, a: ["a note"])}
    pb = load_playbook_data({"name": "d", "steps": [{"id": "m", "action": "measure"}, {"id": "n", "action": "note"}]},
                            "pb", acts)
    st = execute(pb, acts, None, RunState("d", "r"), dry_run=True)
    assert [e.status for e in st.timeline] == ["dry-run-error", "dry-run"]
    assert st.timeline[0].lines == ["would stop: RuntimeError: cannot connect to 127.0.0.1:22"]


def test_yaml11_boolean_id_hint():
    with pytest.raises(InputError, match=r'steps\[0\]\.id: read as the boolean False .*quote it'):
        load_playbook_data({"name": "x", "steps": [{"id": False, "action": "note"}]}, "pb", Recorder({}).actions())


def test_args_take_earlier_results_by_reference():
    """``"@step.field"`` in args: resolved when the step runs (confirmation lines included),
    shown unresolved in a dry run, None when the step did not run; refused at load when the step
    is not an earlier one."""
    pb = {"name": "ref", "steps": [
        {"id": "m1", "action": "measure"},
        {"id": "fix", "action": "mitigate", "args": {"groups": "@m1.groups", "n": 3, "text": "@ not a ref"}},
        {"id": "skip", "action": "measure", "when": "m1.ok == false"},
        {"id": "rec", "action": "note", "args": {"what": "@skip.groups", "deep": "@m1.sub.x"}},
    ]}
    r = Recorder({"measure": [{"ok": True, "groups": ["prefill"], "sub": {"x": 7}}]})
    acts = r.actions()
    seen = []
    st = execute(load_playbook_data(pb, "ref.yaml", acts), acts, None, RunState("ref", "r1"),
                 confirm=lambda step, lines: seen.append(lines) or True)
    assert r.calls == [("measure", {}), ("mitigate", {"groups": ["prefill"], "n": 3, "text": "@ not a ref"}),
                       ("note", {"what": None, "deep": 7})]
    assert seen == [["mitigate {'groups': ['prefill'], 'n': 3, 'text': '@ not a ref'}"]]
    assert st.done == ["m1", "fix", "skip", "rec"]
    r2 = Recorder({})
    acts2 = r2.actions()
    st = execute(load_playbook_data(pb, "ref.yaml", acts2), acts2, None, RunState("ref", "r2"), dry_run=True)
    assert st.timeline[1].lines == ["mitigate {'groups': '@m1.groups', 'n': 3, 'text': '@ not a ref'}"]
    bad = {"name": "bad", "steps": [{"id": "a", "action": "note", "args": {"g": "@b.groups"}},
                                    {"id": "b", "action": "measure"}]}
    with pytest.raises(InputError) as e:
        load_playbook_data(bad, "bad.yaml", acts)
    assert str(e.value) == "bad.yaml: steps[0].args: refers to 'b', which is not an earlier step"


def test_references_nested_or_to_a_missing_field_are_refused():
    acts = Recorder({"measure": [{"ok": True, "groups": ["prefill"]}]}).actions()
    nested = {"name": "n", "steps": [{"id": "m", "action": "measure"},
                                     {"id": "f", "action": "mitigate", "args": {"set": {"x": "@m.groups"}}}]}
    with pytest.raises(InputError) as e:
        load_playbook_data(nested, "n.yaml", acts)
    assert str(e.value).startswith("n.yaml: steps[1].args: @m.groups: a reference is only taken as a whole top-level")
    typo = {"name": "t", "steps": [{"id": "m", "action": "measure"},
                                   {"id": "f", "action": "mitigate", "args": {"groups": "@m.grups"}}]}
    r = Recorder({"measure": [{"ok": True, "groups": ["prefill"]}]})
    acts = r.actions()
    st = execute(load_playbook_data(typo, "t.yaml", acts), acts, None, RunState("t", "r"))
    assert [c[0] for c in r.calls] == ["measure"] and st.failed_step == "f"
    assert st.results["f"]["error"] == "args.groups: @m.grups: step m's result has no grups (it has: attempts, groups, ok, ran)"


VERIFIED = {
    "name": "stall",
    "steps": [
        {"id": "fix", "action": "mitigate"},
        {"id": "smoke", "action": "measure", "verifies": True, "continue_on_failure": True},
        {"id": "back", "action": "mitigate", "when": "smoke.passed == false"},
        {"id": "verify", "action": "measure", "verifies": True, "when": "back.ran == true"},
        {"id": "rec", "action": "note"},
    ],
}


@pytest.mark.parametrize("smoke,verify,stopped,expect", [
    ({"ok": True, "passed": True}, None, None, {"step": "smoke", "action": "measure", "passed": True}),
    ({"ok": True, "passed": False}, {"ok": True, "passed": True}, None,
     {"step": "verify", "action": "measure", "passed": True}),
    # the scheduler-stall story: the rollback's smoke fails too, yet every step "completed"
    ({"ok": True, "passed": False}, {"ok": True, "passed": False}, None,
     {"step": "verify", "action": "measure", "passed": False}),
    # a verify step that could not run stops the run there; the last verification that ran failed
    ({"ok": True, "passed": False}, {"ok": False}, "verify", {"step": "smoke", "action": "measure", "passed": False}),
])
def test_the_last_verifying_step_that_ran_decides(smoke, verify, stopped, expect):
    from dsv4ctl.runbook.engine import final_verification
    pb = load_playbook_data(VERIFIED, "t", Recorder({}).actions())
    r = Recorder({"measure": [smoke] + ([verify] if verify else [])})
    st = execute(pb, r.actions(), None, RunState("stall", "r1"), confirm=lambda s, ln: True, save=lambda s: None)
    assert st.failed_step == stopped
    assert final_verification(pb, st) == expect


def test_verifies_must_be_a_boolean():
    bad = {**VERIFIED, "steps": [{"id": "s", "action": "measure", "verifies": "yes"}]}
    with pytest.raises(InputError, match="steps.0.verifies: 'yes' is not of type 'boolean'"):
        load_playbook_data(bad, "t", Recorder({}).actions())
