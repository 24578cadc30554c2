"""``tight`` is actionable (issue 44.4): what the rank is short of, by how much (a number in the
JSON), fixes that re-plan to ``fits`` as printed; ``runbook oom-at-startup`` reads the same verdict
and never calls a tight plan fitting. The corpus-wide re-plan of every tight fix is in
tests/test_recipes.py (``assert_not_failing``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import yaml

from dsv4ctl.resources import SCHEMAS_DIR
from dsv4ctl.runbook.engine import evaluate, parse_condition
from tests.conftest import REPO, run_cli

PRINTED = re.compile(r"\(re-planned: (\w+), headroom (-?[\d.]+) GiB\)$")
SETS = [(r"set mem-fraction-static: ([\d.]+) ", "mem_fraction_static"),
        (r"set chunked-prefill-size: (\d+) ", "chunked_prefill_size"),
        (r"set cuda-graph-max-bs-decode: (\d+) ", "cuda_graph_max_bs")]


def _plan(*sets: str, code: int = 0) -> dict:
    r = run_cli("plan", "--json", *[x for s in sets for x in ("--set", s)])
    assert r.code == code, r.err
    return {g["name"]: g for g in r.json()["groups"]}


def _applied(fix: str) -> str:
    for pattern, key in SETS:
        m = re.match(pattern, fix.removeprefix("or "))
        if m:
            return f"{key}={m[1]}"
    raise AssertionError(f"a fix this test cannot apply: {fix}")


def test_a_tight_group_says_its_shortfall_and_fixes_that_plan_fits():
    """The shipped default profile: prefill is tight on SGLang's estimate + indexer logits (6.139 GiB
    short of 18.834), decode on the 10 GiB reserve (1.853 short of 11.0): the JSON carries the
    numbers, the warning says them, and every fix, applied with --set, plans fits at the printed
    headroom (before issue 44.4: no shortfall, no fix)."""
    groups = _plan()
    pre, dec = groups["prefill"]["verdict"], groups["decode"]["verdict"]
    assert (pre["level"], pre["deciding"], pre["shortfall_gib"]) == ("tight", "indexer_logits", 6.139)
    assert (dec["level"], dec["deciding"], dec["shortfall_gib"]) == ("tight", "activation_floor", 1.853)
    assert dec["short_of"] == "SGLang's activation reserve (10.0 GiB, memory_hook.py) + 1 GiB margin = 11.0 GiB of headroom"
    assert dec["message"].endswith("by 1.853 GiB: see the fixes") and f"tight: {dec['message']}" in groups["decode"]["warnings"]
    for name, g in groups.items():
        assert g["fixes"] and g["errors"] == [], name
        for fix in g["fixes"]:
            printed = PRINTED.search(fix)
            assert printed and printed[1] == "fits", fix
            again = _plan(_applied(fix))[name]
            assert again["verdict"]["level"] == "fits" and again["fixes"] == [], (fix, again["verdict"])
            assert min(r["headroom_gib"] for r in again["ranks"]) == float(printed[2]), fix
    assert groups["decode"]["fixes"][0].startswith("set mem-fraction-static: 0.875 (from 0.885)")
    schema = json.loads((SCHEMAS_DIR / "plan.schema.json").read_text())
    jsonschema.validate(json.loads(run_cli("plan", "--json").out), schema)


def test_the_mem_fraction_fix_is_the_closest_value_that_fits():
    """The printed value plans fits and the next 0.001 towards the current one does not (a scan:
    the closest, not any)."""
    groups = _plan()
    fix = groups["decode"]["fixes"][0]
    m = float(re.match(r"set mem-fraction-static: ([\d.]+)", fix)[1])
    assert _plan(f"mem_fraction_static={m}")["decode"]["verdict"]["level"] == "fits"
    assert _plan(f"mem_fraction_static={round(m + 0.001, 3)}")["decode"]["verdict"]["level"] == "tight"


def test_a_graph_fix_on_a_dp_attention_decode_re_plans_as_printed():
    """Decode at 0.865 with 4-way DP attention and a 512-batch decode graph: SGLang's estimate counts
    2 + 3 x 4 (+1.5 x 4 above 300) MB per batch (14.0 GiB), 1.876 GiB short (1.844 before issue 44.3
    added the decode forward's indexer logits, 0.031 GiB); a 256-batch graph is a printed fix that
    plans fits (the 10 GiB reserve floor then binds)."""
    sets = ["mem_fraction_static=0.865", "dp_size=4", "enable_dp_attention=true", "cuda_graph_max_bs=512"]
    g = _plan(*sets)["decode"]
    assert g["verdict"]["level"] == "tight" and g["verdict"]["shortfall_gib"] > 0, g["verdict"]
    graph = [f for f in g["fixes"] if "cuda-graph-max-bs-decode" in f]
    assert g["verdict"]["shortfall_gib"] == 1.876
    assert {r["decode_logits_gib"] for r in g["ranks"]} == {0.031}
    assert graph == ["or set cuda-graph-max-bs-decode: 256 (from 512) in the serve config (re-planned: fits, headroom "
                     "13.156 GiB)"], g["fixes"]
    again = _plan(*sets, _applied(graph[0]))["decode"]
    assert again["verdict"]["level"] == "fits"
    assert min(r["headroom_gib"] for r in again["ranks"]) == float(PRINTED.search(graph[0])[2])


def test_oom_at_startup_reads_the_same_verdict_and_never_says_fits_for_tight(tmp_path):
    """The runbook's plan step on the default profile (tight): ``fits`` is false, ``level`` tight,
    the summary names the shortfall and the fix; the shipped oom-at-startup's conditions then skip
    "the plan fits every rank" and record the summary (before: fits was true for tight)."""
    pb = tmp_path / "p.yaml"
    pb.write_text("name: plan-only\ndescription: x\nsteps:\n  - id: plan_now\n    action: plan\n"
                  "  - id: record_tight\n    action: note\n    when: plan_now.level == \"tight\"\n"
                  "    args: {text: \"@plan_now.summary\"}\n")
    r = run_cli("runbook", "run", str(pb), "--report-dir", str(tmp_path / "run"))
    assert r.code == 0, r.err
    res = json.loads((tmp_path / "run" / "incident.json").read_text())["results"]
    plan_now = res["plan_now"]
    assert (plan_now["fits"], plan_now["level"], plan_now["planned_ok"]) == (False, "tight", True)
    assert plan_now["groups"]["decode"]["shortfall_gib"] == 1.853
    assert res["record_tight"]["text"] == plan_now["summary"]
    assert plan_now["summary"].startswith("prefill tight (indexer_logits, short by 6.139 GiB); fix: set mem-fraction-static")
    assert "decode tight (activation_floor, short by 1.853 GiB); fix: set mem-fraction-static: 0.875" in plan_now["summary"]
    book = yaml.safe_load((REPO / "playbooks" / "oom-at-startup.yaml").read_text())
    ran = {s["id"]: evaluate(parse_condition(s["when"]), {"plan_now": plan_now}) for s in book["steps"] if s.get("when")
           and s["when"].startswith("plan_now.")}
    assert ran == {"record_fit": False, "record_tight": True, "apply_series": False}
    note = next(s for s in book["steps"] if s["id"] == "record_tight")
    assert note["args"] == {"text": "@plan_now.summary"}
