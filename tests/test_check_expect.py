"""Known-answer workloads (dsv4ctl.check.workload) and their comparison (dsv4ctl.check.expect): pure."""

from __future__ import annotations

import json
import re

import pytest

from dsv4ctl.check import classify as C
from dsv4ctl.check import expect as E
from dsv4ctl.check import workload as W
from dsv4ctl.check.workload import TOOL_NAMES, Session, sessions

SPECS = C.tool_specs(W.TOOLS)

# --- a tiny directive parser, written from the contract (not from workload.parse_directives) ---
_DIRECTIVE = re.compile(r"(?:Call|Also call) (\w+) with exactly these arguments: ")
_DEC = json.JSONDecoder()


def parse(text: str) -> list[dict]:
    out, pos = [], 0
    while (m := _DIRECTIVE.search(text, pos)) is not None:
        args, end = _DEC.raw_decode(text, m.end())
        assert text[end] == "."                              # each directive ends with "."
        out.append({"name": m.group(1), "arguments": args})
        pos = end
    return out


def all_tool_specs(n_sessions: int = 200, turns: int = 8) -> list[tuple[int, W.TurnSpec]]:
    return [(sid, s.spec(t)) for sid in range(n_sessions) for s in [Session(sid=sid, turns=turns, stream=False)]
            for t in range(turns - 1)]


def tc(name, args, index=0, cid=None) -> C.ToolCall:
    return C.ToolCall(index, cid, name, args if isinstance(args, str) else json.dumps(args))


# --- workload ---------------------------------------------------------------------------------
def test_mix_is_deterministic_per_session_id():
    a = [(s.spec(t).expected_calls, s.spec(t).tool_choice, s.spec(t).instruction)
         for s in sessions(40, 8) for t in range(8)]
    b = [(s.spec(t).expected_calls, s.spec(t).tool_choice, s.spec(t).instruction)
         for s in sessions(40, 8) for t in range(8)]
    assert a == b
    # a session's turns do not depend on the other sessions or on how many there are
    assert Session(sid=17, turns=8, stream=True).spec(3) == sessions(30, 8)[17].spec(3)
    # the probe share does not change which turns are known-answer, nor their answers
    s0, s1 = Session(sid=9, turns=8, stream=False, probe_share=0.0), Session(sid=9, turns=8, stream=False, probe_share=1.0)
    assert [s0.spec(t).expected_calls for t in range(8)] == [s1.spec(t).expected_calls for t in range(8)]
    assert {s0.spec(t).tool_choice for t in range(7)} == {"auto"}
    assert all(s1.spec(t).tool_choice != "auto" for t in range(7)) and s1.spec(7).tool_choice == "auto"
    # the free-form rotation of tools is what it was
    s = Session(sid=1, turns=3, stream=True)
    assert [s.spec(t).tool for t in range(3)] == [TOOL_NAMES[1], TOOL_NAMES[2], None]


def test_mix_shares_and_kinds():
    specs = [sp for _, sp in all_tool_specs()]
    assert len(specs) == 1400
    known = [sp for sp in specs if sp.known_answer]
    assert 0.45 <= len(known) / len(specs) <= 0.55                         # about half
    two = [sp for sp in known if len(sp.expected_calls) == 2]
    assert 0.2 <= len(two) / len(known) <= 0.4
    assert any(sp.expected_calls[0]["name"] == sp.expected_calls[1]["name"] for sp in two)
    probes = [sp for sp in specs if sp.tool_choice != "auto"]
    assert 0.07 <= len(probes) / len(specs) <= 0.13
    named = [sp for sp in probes if isinstance(sp.tool_choice, dict)]
    assert named and len(named) < len(probes)                              # both kinds occur
    for sp in named:
        assert sp.tool_choice == {"type": "function", "function": {"name": sp.tool}}
        assert all(e["name"] == sp.tool for e in sp.expected_calls or ())  # never named against a 2-tool answer
    # free-form turns keep the old instruction; the answer turn has no tool and tool_choice auto
    free = [sp for sp in specs if not sp.known_answer]
    assert all(sp.instruction == W.CALL_INSTRUCTION.format(name=sp.tool) for sp in free)
    last = Session(sid=3, turns=8, stream=False).spec(7)
    assert (last.tool, last.expected_calls, last.tool_choice) == (None, None, "auto")
    assert last.instruction == W.ANSWER_INSTRUCTION.format(words=150)
    # every scenario occurs, including the zero-argument tool's {}
    args = [json.dumps(e["arguments"], ensure_ascii=False) for sp in known for e in sp.expected_calls]
    for needle in ("<<'EOF'", "```python", '<div class=\\"x\\">', "a < b && c > d", "\\\\", '\\"slow\\"',
                   "start_line", "max_results", "naïve"):
        assert any(needle in a for a in args), needle
    assert any(e == {"name": "list_open_files", "arguments": {}} for sp in known for e in sp.expected_calls)


def test_known_answers_are_valid_and_free_of_special_tokens():
    forbidden = ("\uff5c", "<think>", "</think>", "DSML", "<\uff5c", "\u2581")
    for sid, sp in all_tool_specs():
        for e in sp.expected_calls or ():
            assert SPECS[e["name"]].first_error(e["arguments"]) is None, (sid, e)
            assert not (SPECS[e["name"]].required and not e["arguments"])
        for f in forbidden:
            assert f not in sp.instruction, (sid, sp.index, f)


def test_directive_format_round_trips():
    seen = 0
    for sid, sp in all_tool_specs():
        if not sp.known_answer:
            assert parse(sp.instruction) == []
            continue
        seen += 1
        assert parse(sp.instruction) == sp.expected_calls, (sid, sp.index)
        assert W.parse_directives(sp.instruction) == sp.expected_calls
        # the exact sentences of the contract, each JSON on one line
        lines = sp.instruction.split("\n")
        directive_line = lines[-1]
        first, *rest = sp.expected_calls
        want = (f"Call {first['name']} with exactly these arguments: "
                + json.dumps(first["arguments"], ensure_ascii=False, separators=(", ", ": ")) + ".")
        assert want in directive_line
        for e in rest:
            assert (f" Also call {e['name']} with exactly these arguments: "
                    + json.dumps(e["arguments"], ensure_ascii=False, separators=(", ", ": ")) + ".") in directive_line
        assert directive_line.endswith(".")
        # the values come from the conversation: every string (and number) argument is stated before
        facts = "\n".join(lines[:-1])
        for e in sp.expected_calls:
            for v in e["arguments"].values():
                if isinstance(v, str):             # enum values (rust, go, bash) in any case
                    assert v in facts or v.lower() in facts.lower(), (sid, v)
                elif isinstance(v, int):
                    assert str(v) in facts, (sid, v)
    assert seen > 600
    # an exact rendering
    calls = [{"name": "read_file", "arguments": {"path": "tests/test_sched.py", "start_line": 40, "end_line": 58}},
             {"name": "run_command", "arguments": {"command": "cat <<'EOF'\na \"b\" \\ c\nEOF", "timeout_s": 5}}]
    assert W.known_instruction(calls, "The failing test is tests/test_sched.py, lines 40-58.") == (
        "The failing test is tests/test_sched.py, lines 40-58.\n"
        "Next, call the read_file tool and then the run_command tool, both in this turn. "
        'Call read_file with exactly these arguments: {"path": "tests/test_sched.py", "start_line": 40, "end_line": 58}. '
        'Also call run_command with exactly these arguments: {"command": "cat <<\'EOF\'\\na \\"b\\" \\\\ c\\nEOF", '
        '"timeout_s": 5}.')
    assert parse(W.known_instruction(calls)) == calls
    assert W.directives([{"name": "list_open_files", "arguments": {}}]) == \
        "Call list_open_files with exactly these arguments: {}."


def test_known_answer_conversation_continues_with_the_expected_calls():
    sid = next(sid for sid in range(100) if Session(sid=sid, turns=3, stream=False).spec(0).known_answer
               and len(Session(sid=sid, turns=3, stream=False).spec(0).expected_calls) == 2)
    s = Session(sid=sid, turns=3, stream=False)
    sp = s.spec(0)
    b0 = s.request("m", "r0")
    assert b0["messages"][-1]["content"].endswith(W.directives(sp.expected_calls))
    assert b0["tool_choice"] == sp.tool_choice
    first = list(b0["messages"])
    # the server delivered something else (one call, other arguments): the turn was judged ok by the
    # caller anyway (before known-answer classes existed); the conversation carries the known answer
    s.advance(C.TurnResult(content="", tool_calls=[tc(sp.tool, {"x": 1}, cid="call_srv")]), True)
    b1 = s.request("m", "r1")
    assert b1["messages"][:len(first)] == first
    asst = b1["messages"][len(first)]
    assert [c["id"] for c in asst["tool_calls"]] == ["call_srv", f"call_{sid}_0_1"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in asst["tool_calls"]] == \
        [(e["name"], e["arguments"]) for e in sp.expected_calls]
    tools = b1["messages"][len(first) + 1:]
    assert [m["tool_call_id"] for m in tools] == ["call_srv", f"call_{sid}_0_1"]
    assert tools[-1]["content"].endswith(s.spec(1).instruction)
    # a failed turn restarts with only the current turn's instruction (no stale directives)
    s.advance(None, False)
    assert len(s.messages) == 2 and s.messages[-1]["content"].endswith("(retry 1) " + s.spec(2).instruction)
    assert parse(s.messages[-1]["content"]) == []                   # turn 2 is the answer turn


def test_restart_on_a_known_turn_states_its_facts_again():
    sid = next(sid for sid in range(100) if Session(sid=sid, turns=4, stream=False).spec(1).known_answer)
    s = Session(sid=sid, turns=4, stream=False)
    s.advance(None, False)
    text = s.messages[-1]["content"]
    assert parse(text) == s.spec(1).expected_calls and "(retry 1)" in text


def test_shares_are_validated():
    with pytest.raises(ValueError):
        Session(sid=0, turns=2, stream=False, known_share=1.5)
    with pytest.raises(ValueError):
        sessions(2, 2, probe_share=-0.1)
    assert not any(s.spec(t).known_answer for s in sessions(20, 4, known_share=0.0) for t in range(4))
    assert all(s.spec(t).known_answer for s in sessions(20, 4, known_share=1.0) for t in range(3))


# --- expect.compare_calls ---------------------------------------------------------------------
READ = {"name": "read_file", "arguments": {"path": "tests/test_sched.py", "start_line": 40, "end_line": 58}}
LIST = {"name": "list_open_files", "arguments": {}}


def test_compare_exact_match_and_key_order():
    assert E.compare_calls([READ], [tc("read_file", '{"end_line": 58, "start_line": 40, "path": "tests/test_sched.py"}')]) == {}
    assert E.compare_calls([READ, LIST], [tc("read_file", READ["arguments"]), tc("list_open_files", "{}", 1)]) == {}
    assert E.compare_calls([LIST], [tc("list_open_files", "{}")]) == {}
    assert E.compare_calls([], []) == {}


def test_compare_wrong_tool():
    r = E.compare_calls([READ], [tc("search_code", {"query": "x", "lang": "go"})])
    assert r == {E.WRONG_TOOL: "call 0: 'search_code', expected 'read_file'"}
    # swapped order is wrong (the contract says in order)
    r = E.compare_calls([READ, LIST], [tc("list_open_files", "{}"), tc("read_file", READ["arguments"], 1)])
    assert r == {E.WRONG_TOOL: "call 0: 'list_open_files', expected 'read_file'"}
    assert E.compare_calls([LIST], [tc(None, "{}")]) == {E.WRONG_TOOL: "call 0: None, expected 'list_open_files'"}


def test_compare_missing_and_extra_calls():
    assert E.compare_calls([READ, LIST], [tc("read_file", READ["arguments"])]) == {
        E.MISSING_CALL: "1 call(s), expected 2 (missing list_open_files)"}
    assert E.compare_calls([READ], []) == {E.MISSING_CALL: "0 call(s), expected 1 (missing read_file)"}
    assert E.compare_calls([LIST], [tc("list_open_files", "{}"), tc("list_open_files", "{}", 1)]) == {
        E.EXTRA_CALL: "2 call(s), expected 1 (extra 'list_open_files')"}
    # several classes at once, each with the reason of its first occurrence
    r = E.compare_calls([READ], [tc("read_file", {**READ["arguments"], "end_line": 59}), tc("run_command", "{}", 1)])
    assert r == {E.WRONG_ARGS: "call 0 'read_file': key 'end_line': got 59, expected 58",
                 E.EXTRA_CALL: "2 call(s), expected 1 (extra 'run_command')"}


def test_compare_wrong_args():
    a = READ["arguments"]
    cases = [
        ({**a, "start_line": 41}, "key 'start_line': got 41, expected 40"),
        ({k: v for k, v in a.items() if k != "end_line"}, "key 'end_line' missing (expected 58)"),
        ({**a, "shell": "bash"}, "unexpected key 'shell' = \"bash\""),
        ({**a, "start_line": 40.0}, "key 'start_line': got 40.0, expected 40"),        # types are exact
        ({**a, "start_line": "40"}, "key 'start_line': got \"40\", expected 40"),
        ({**a, "path": "tests/test_sched.py "}, "key 'path': got \"tests/test_sched.py \", expected \"tests/test_sched.py\""),
        ({**a, "path": None}, "key 'path': got null, expected \"tests/test_sched.py\""),
    ]
    for got, why in cases:
        assert E.compare_calls([READ], [tc("read_file", got)]) == {E.WRONG_ARGS: "call 0 'read_file': " + why}, got
    # bool is not an integer, nested values compare exactly, long values are cut in the reason
    e = {"name": "x", "arguments": {"flag": 1, "deep": {"a": [1, {"b": True}]}}}
    assert E.compare_calls([e], [tc("x", {"flag": True, "deep": {"a": [1, {"b": True}]}})]) == {
        E.WRONG_ARGS: "call 0 'x': key 'flag': got true, expected 1"}
    assert E.compare_calls([e], [tc("x", {"flag": 1, "deep": {"a": [1, {"b": 1}]}})]) == {
        E.WRONG_ARGS: "call 0 'x': key 'deep': got {\"a\":[1,{\"b\":1}]}, expected {\"a\":[1,{\"b\":true}]}"}
    cmd = "cat <<'EOF'\n" + "x" * 200 + "\nEOF"
    r = E.compare_calls([{"name": "run_command", "arguments": {"command": cmd, "timeout_s": 5}}],
                        [tc("run_command", {"command": cmd.replace("EOF", "EOT"), "timeout_s": 5})])
    why = r[E.WRONG_ARGS]
    assert why.startswith("call 0 'run_command': key 'command': got \"cat <<'EOT'\\n" + "x" * 10)
    assert why.count("...") == 2 and len(why) < 200
    # a string with quotes, backslashes and newlines delivered byte-exact is a match
    assert E.compare_calls([{"name": "run_command", "arguments": {"command": W.REPRO_PY, "timeout_s": 5}}],
                           [tc("run_command", json.dumps({"command": W.REPRO_PY, "timeout_s": 5}))]) == {}


def test_arguments_that_are_not_a_json_object_are_left_to_the_classifier():
    for bad in ('{"path": "a"', "", "   ", "[1]", '"x"', "nan-ish"):
        assert E.compare_calls([READ], [tc("read_file", bad)]) == {}, bad
    v = C.classify(C.TurnResult(tool_calls=[tc("read_file", '{"path": "a"')]), requires_tool=True, tools=SPECS)
    assert v.cls == C.ARGS_NOT_JSON
    # ...but the count of calls is still judged
    assert E.compare_calls([READ, LIST], [tc("read_file", "{")]) == {
        E.MISSING_CALL: "1 call(s), expected 2 (missing list_open_files)"}


def test_check_turn_named_tool_choice_and_merge():
    named = {"type": "function", "function": {"name": "read_file"}}
    assert E.named_tool(named) == "read_file" and E.named_tool("required") is None and E.named_tool(None) is None
    # free-form turn with a named choice: any other tool is wrong_tool
    assert E.check_turn(None, named, [tc("read_file", {"path": "a"})]) == {}
    assert E.check_turn(None, named, [tc("read_file", {"path": "a"}), tc("search_code", {}, 1)]) == {
        E.WRONG_TOOL: "call 1: 'search_code', but tool_choice names 'read_file'"}
    assert E.check_turn(None, "required", [tc("search_code", {})]) == {}
    assert E.check_turn([READ], "auto", [tc("read_file", {"path": "b"})]) == {
        E.WRONG_ARGS: "call 0 'read_file': key 'path': got \"b\", expected \"tests/test_sched.py\""}
    # merge into a classifier verdict: the classifier's classes come first
    ok = C.Verdict(C.OK, (), "ok")
    v = E.merge_verdict(ok, {E.WRONG_ARGS: "w", E.EXTRA_CALL: "x"})
    assert (v.cls, v.flags, v.reason) == (E.EXTRA_CALL, (E.EXTRA_CALL, E.WRONG_ARGS), "x")
    schema = C.Verdict(C.ARGS_SCHEMA, (C.ARGS_SCHEMA,), "s")
    v = E.merge_verdict(schema, {E.WRONG_ARGS: "w"})
    assert (v.cls, v.flags, v.reason) == (C.ARGS_SCHEMA, (C.ARGS_SCHEMA, E.WRONG_ARGS), "s")
    http = C.Verdict(C.HTTP_ERROR, (C.HTTP_ERROR,), "HTTP 500")
    assert E.merge_verdict(http, {E.MISSING_CALL: "m"}) is http
    assert E.merge_verdict(ok, {}) is ok
    assert set(E.DESCRIPTIONS) == set(E.CLASSES) and C.CLASSES[-len(E.CLASSES):] == E.CLASSES   # the tail of the order


def test_known_answer_turns_end_to_end_with_a_faithful_model():
    """A fake model that follows the directives exactly: every known-answer turn compares clean and
    classifies ok; a model that rounds a line number gets wrong_args."""
    for sid in range(30):
        s = Session(sid=sid, turns=6, stream=False)
        while not s.done:
            sp = s.spec()
            body = s.request("m", "r")
            text = body["messages"][-1]["content"]
            calls = [tc(c["name"], json.dumps(c["arguments"], ensure_ascii=False), i, f"c{i}")
                     for i, c in enumerate(parse(text))] if sp.known_answer else \
                ([tc(sp.tool, {"path": "x", "command": "ls", "timeout_s": 1, "query": "q", "lang": "go"}
                     if sp.tool != "list_open_files" else {})] if sp.requires_tool else [])
            res = C.TurnResult(content="" if sp.requires_tool else "done", tool_calls=calls,
                               finish_reason="tool_calls" if calls else "stop")
            if sp.known_answer:
                assert E.check_turn(sp.expected_calls, sp.tool_choice, res.tool_calls) == {}
                assert C.classify(res, requires_tool=True, tools=SPECS).ok
            s.advance(res, True)
        assert s.restarts == 0
    sp = next(sp for _, sp in all_tool_specs() if sp.known_answer and "start_line" in sp.expected_calls[0]["arguments"])
    args = dict(sp.expected_calls[0]["arguments"], start_line=sp.expected_calls[0]["arguments"]["start_line"] + 1)
    r = E.check_turn(sp.expected_calls[:1], "auto", [tc("read_file", args)])
    assert list(r) == [E.WRONG_ARGS] and "start_line" in r[E.WRONG_ARGS]
