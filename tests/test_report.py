"""``dsv4ctl report`` and the report builders, on real documents: tests/data/report/ holds the
output of ``dsv4ctl plan --json`` (default profile; and ``-g decode --set
mem_fraction_static=0.95``, which does not fit), ``check load --json`` against the stand-in
server (a sweep 1..80 and a ``--compare`` HiCache on vs off), ``check smoke --json``, a runbook
run folder (incident.json with its evidence files) and ``plan --from-log --json``."""

from __future__ import annotations

import csv
import io
import json
import re
import xml.etree.ElementTree as ET

import pytest

from dsv4ctl.check.stats import newcombe_diff, wilson
from dsv4ctl.report import kind_of
from dsv4ctl.report import charts as CH
from dsv4ctl.report.csvout import TurnsCsvWriter, load_levels_csv, plan_csv, turns_csv
from dsv4ctl.report.inputs import evidence_names, load_input, load_inputs
from dsv4ctl.report.memory import plan_bars
from dsv4ctl.report.page import build_html
from dsv4ctl.report.svg import nice_ticks
from dsv4ctl.report.terminal import load_spark_lines, plan_bar_lines, sparkline
from tests.conftest import REPO, run_cli

DATA = REPO / "tests" / "data" / "report"
NS = "{http://www.w3.org/2000/svg}"


def doc(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def svg_tree(text: str) -> ET.Element:
    """Parse an SVG string (it must be well-formed XML)."""
    return ET.fromstring(text)


def rects(tree: ET.Element) -> list[tuple[dict, str]]:
    """(attributes, tooltip) of every rect with a tooltip."""
    out = []
    for r in tree.iter(NS + "rect"):
        t = r.find(NS + "title")
        if t is not None:
            out.append((r.attrib, t.text))
    return out


def texts(tree: ET.Element) -> list[str]:
    return [t.text for t in tree.iter(NS + "text")]


# -- kinds and inputs -------------------------------------------------------------------------

def test_every_fixture_kind_is_told_by_its_schema():
    kinds = {f: kind_of(doc(f)) for f in ("plan.json", "plan-nofit.json", "load-sweep.json", "load-compare.json",
                                          "smoke.json", "incident/incident.json", "plan-log.json")}
    assert kinds == {"plan.json": "plan", "plan-nofit.json": "plan", "load-sweep.json": "load",
                     "load-compare.json": "load", "smoke.json": "smoke", "incident/incident.json": "incident",
                     "plan-log.json": "plan-log"}
    for bad, msg in (([1], "not a dsv4ctl JSON document"), ({"a": 1}, "no 'schema' field"),
                     ({"schema": "dsv4ctl.plan/9"}, "schema 'dsv4ctl.plan/9' is not one dsv4ctl report draws")):
        with pytest.raises(ValueError, match=re.escape(msg)):
            kind_of(bad)


def test_incident_evidence_is_read_from_its_run_folder():
    inc = doc("incident/incident.json")
    assert evidence_names(inc) == ["plan.json", "check-smoke.out", "check-load-1.out"]
    inp = load_input(str(DATA / "incident"))          # the run folder works too
    assert [(n, k) for n, _, k in inp.evidence] == [("plan.json", "plan"), ("check-smoke.out", "smoke"),
                                                    ("check-load-1.out", "load")]
    # a name with a folder part is never followed out of the run folder
    assert evidence_names({"timeline": [{"status": "ran", "action": "check.load",
                                         "result": {"evidence": "../../etc/passwd"}}]}) == []


# -- plan: the memory bar ---------------------------------------------------------------------

def test_plan_bar_segments_fill_the_gpu_and_show_the_over_budget_index_k():
    d = doc("plan.json")
    bars = plan_bars(d)
    assert [b.title for b in bars] == ["prefill ranks 0-3", "decode ranks 0-3"]
    pre = bars[0]
    g, r = d["groups"][0], d["groups"][0]["ranks"][0]
    assert pre.gpu_gib == round(183359 / 1024, 3)
    assert pre.total_gib == pytest.approx(pre.gpu_gib, abs=0.005)        # segments fill the GPU
    assert pre.value("index_k_over") == r["index_k"]["overcommit_gib"] == 9.903
    assert pre.value("index_k_budget") == r["index_k"]["budget_gib"] == 10.542
    assert pre.value("weights") == g["memory_inputs"]["weights_gib_per_rank"]
    # SGLang keeps 13 GiB for activations (prefill); the bf16 buffer leaves 12.088: 0.912 short
    assert (pre.reserve_gib, pre.headroom_gib, pre.reserve_short_gib) == (13.0, 12.088, 0.912)
    assert pre.value("headroom_reserved") == 12.088 and pre.value("headroom_free") == 0
    assert (pre.requests, pre.context_length) == (15, 1048576)


def test_plan_that_does_not_fit_runs_past_the_gpu():
    b = plan_bars(doc("plan-nofit.json"))[0]
    assert b.headroom_gib == -2.987
    assert b.total_gib - b.gpu_gib == pytest.approx(2.987, abs=0.005)
    assert b.value("headroom_reserved") == 0 and b.reserve_short_gib == b.reserve_gib == 10.0
    lines = plan_bar_lines(doc("plan-nofit.json"), stream=io.StringIO())
    bar = lines[1]
    assert bar.index("|") < bar.rindex("!")         # index-K over budget spills past the GPU line
    assert "over the GPU by 2.987 GiB" in lines[2]


def test_plan_svg_draws_segments_in_proportion():
    d = doc("plan.json")
    tree = svg_tree(CH.plan_memory_svg(d))
    widths = {tip.split(": ", 1)[1].rsplit(" ", 2)[0]: float(a["width"]) for a, tip in rects(tree)
              if tip.startswith("prefill ranks 0-3:")}
    assert widths["index-K over budget"] / widths["weights"] == pytest.approx(9.903 / 43.66, rel=0.01)
    assert widths["SWA latent"] / widths["weights"] == pytest.approx(38.27 / 43.66, rel=0.01)
    over = [a for a, tip in rects(tree) if "index-K over budget" in tip]
    assert over and all(a["fill"] == "url(#over)" for a in over)            # hatched warning colour
    t = texts(tree)
    assert "15 requests @ 1,048,576 tokens" in t and "16 requests @ 1,048,576 tokens" in t
    assert "+9.90 GiB over budget" in t
    assert any("0.912 GiB short" in x for x in t)
    assert CH.plan_memory_svg({"groups": []}) == ""


def test_plan_terminal_bar_plain_and_coloured(monkeypatch):
    d = doc("plan.json")
    plain = plan_bar_lines(d, width=60, stream=io.StringIO())
    bar = plain[1]
    assert bar.startswith("prefill ranks 0-3 ·WWWWWWWWWWWWWW")
    body = bar.split(" ", 3)[3]
    assert body.index("|") == 60                    # the GPU's memory is the full width
    assert 3 <= body.count("!") <= 4                # 9.903 GiB at 2.98 GiB per character
    assert "\x1b[" not in "\n".join(plain)
    assert "! index-K over budget" in plain[-1]

    class Tty(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.delenv("NO_COLOR", raising=False)
    coloured = "\n".join(plan_bar_lines(d, stream=Tty()))
    assert "\x1b[38;2;214;39;40m█" in coloured      # #d62728, index-K over budget


# -- load -------------------------------------------------------------------------------------

def test_load_rate_chart_carries_wilson_intervals_and_the_gate():
    d = doc("load-sweep.json")
    tree = svg_tree(CH.load_rate_svg(d))
    tips = [t.text for t in tree.iter(NS + "title")][1:]
    assert len(tips) == 5                            # one point per level
    lo, hi = wilson(72, 480)
    assert f"c=60: 72/480 = 15.00 %, 95 % Wilson {lo * 100:.2f} % .. {hi * 100:.2f} %" in tips[3]
    t = texts(tree)
    assert ["0/381", "21/381", "56/381", "72/480", "113/640"] == [x for x in t if re.fullmatch(r"\d+/\d+", x or "")]
    assert "gate 1.00 %" in t
    gate = [ln.attrib for ln in tree.iter(NS + "line") if ln.attrib.get("stroke-dasharray") == "7 5"]
    assert len(gate) == 1
    # y of the gate line sits at 1 % of the axis: axis 0..25 % over 260 px from y=64
    assert float(gate[0]["y1"]) == pytest.approx(64 + 260 - 260 * 1 / 25, abs=0.01)


def test_compare_chart_both_arms_and_the_difference():
    d = doc("load-compare.json")
    rate = svg_tree(CH.load_rate_svg(d))
    legend = [x.text for x in rate.iter(NS + "text") if x.get("class") == "legend"]
    a, b = d["settings"]["urls"]
    assert legend[:2] == [f"A: {a}", f"B: {b}"]
    diff = svg_tree(CH.load_diff_svg(d))
    tips = [t.text for t in diff.iter(NS + "title")][1:]
    dd, dlo, dhi = newcombe_diff(72, 480, 0, 480)
    assert tips[1] == f"c=60: {dd * 100:+.2f} pp [{dlo * 100:+.2f}, {dhi * 100:+.2f}], p=2.38e-23"
    assert CH.load_diff_svg(doc("load-sweep.json")) == ""


def test_class_chart_stacks_the_counts():
    d = doc("load-sweep.json")
    tree = svg_tree(CH.load_classes_svg(d))
    at80 = [(a, tip) for a, tip in rects(tree) if " c=80: " in tip]
    lv80 = d["levels"][4]
    want = {k: v["count"] for k, v in lv80["classes"].items() if v["count"]}
    assert {tip.rsplit(" ", 2)[1]: int(tip.rsplit(" ", 1)[1]) for _, tip in at80} == want
    h = {tip.rsplit(" ", 2)[1]: float(a["height"]) for a, tip in at80}
    assert h["dsml_in_content"] / h["think_in_content"] == pytest.approx(77 / 9, rel=0.02)
    assert sum(want.values()) == lv80["corrupted"] == 113


def test_latency_chart_has_each_percentile():
    d = doc("load-compare.json")
    tree = svg_tree(CH.load_latency_svg(d))
    tips = [t.text for t in tree.iter(NS + "title")][1:]
    assert len(tips) == 3 * 3 * 2 * 2                 # metrics x percentiles x urls x levels
    lv = d["levels"][2]
    assert f"{lv['url']} c=60 time to first token p99: {lv['ttft_s']['p99'] * 1000:.1f} ms" in tips


def test_sparkline():
    assert sparkline([0.0, 0.055118, 0.146982, 0.15, 0.176563]) == "▁▄▇▇█"
    assert sparkline([0.0, None]) == "▁·"
    lines = load_spark_lines(doc("load-compare.json"), stream=io.StringIO())
    assert len(lines) == 2 and "▁█" in lines[0] and "▁▁" in lines[1] and "0.00 15.00 %" in lines[0]


# -- smoke, incident, plan vs log --------------------------------------------------------------

def test_smoke_incident_and_plan_log_charts():
    sm = svg_tree(CH.smoke_svg(doc("smoke.json")))
    assert len(rects(sm)) == 11 and all(a["fill"] == "#dff0d8" for a, _ in rects(sm))
    inc = doc("incident/incident.json")
    tl = svg_tree(CH.incident_svg(inc))
    bars = rects(tl)
    assert [tip.split(":")[0] for _, tip in bars] == ["plan", "smoke", "measure", "mitigate", "clean"]
    assert [a["fill"] for _, a in [(0, b[0]) for b in bars]] == ["#2ca02c"] * 4 + ["#bbbbbb"]
    m = bars[2][0]
    # the 8.3 s check load is the longest bar, drawn in proportion to its duration
    e = inc["timeline"][2]
    assert float(m["width"]) == pytest.approx((960 - 30 - 250) * (e["ended"] - e["started"]) / 12, rel=0.01)
    pl = svg_tree(CH.plan_log_svg(doc("plan-log.json")))
    logged = [(a, tip) for a, tip in rects(pl) if " logged " in tip]
    assert len(logged) == 4 * 5 and all(a["fill"] == "#d62728" for a, _ in logged)   # every pool differs
    assert "TP0 full logged 16,924,928 (+1,424,128)" in [tip for _, tip in logged]


# -- the page ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def page() -> str:
    names = ["plan.json", "load-sweep.json", "load-compare.json", "smoke.json", "incident", "plan-log.json"]
    return build_html(load_inputs([str(DATA / n) for n in names]), generated="2026-12-01T21:00:00Z", version="0.1.0")


def test_page_is_self_contained_and_states_inputs_versions_time(page):
    assert "<script" not in page and "<link" not in page and " src=" not in page and "@import" not in page
    assert re.findall(r"url\((?!#)", page) == []                # only in-page patterns
    assert "2026-12-01T21:00:00Z (UTC)" in page and "<td>dsv4ctl</td><td>0.1.0</td>" in page
    assert "<td>SGLang</td><td>0.5.23</td>" in page
    for n in ("plan.json", "load-sweep.json", "load-compare.json", "smoke.json", "plan-log.json"):
        assert f"tests/data/report/{n}</td>" in page
    # charts: plan 1, sweep 3, compare 4, smoke 1, incident 1 + evidence (plan 1, smoke 1, load 3), log 1
    assert page.count('class="chart"') == 16
    for svg in re.findall(r"<svg .*?</svg>", page):
        svg_tree(svg)                                           # each well-formed


def test_tables_carry_the_chart_numbers(page):
    # plan: the over-budget and short-of-reserve numbers; load: Wilson bounds; log: diffs
    assert "<td>index-K over budget</td><td class=\"n\">9.903</td><td class=\"n\">10.262</td>" in page
    assert "<td>reserve the headroom lacks</td><td class=\"n\">0.912</td>" in page
    assert "12.08 % – 18.47 %" in page and "+1,424,128" in page


# -- CSV --------------------------------------------------------------------------------------

def test_plan_csv_one_row_per_rank_segments_fill_the_gpu():
    rows = list(csv.DictReader(io.StringIO(plan_csv(doc("plan.json")))))
    assert [(r["group"], r["rank"], r["gpu"]) for r in rows] == \
        [("prefill", str(i), str(i)) for i in range(4)] + [("decode", str(i), str(i + 4)) for i in range(4)]
    segs = [k for k in rows[0] if k.endswith("_gib") and k not in ("gpu_gib", "activation_reserve_sglang_gib",
                                                                      "allocated_gib", "headroom_gib",
                                                                      "index_k_overcommit_gib")]
    assert len(segs) == 12
    for r in rows:
        assert sum(float(r[k]) for k in segs) == pytest.approx(float(r["gpu_gib"]), abs=0.005)
    assert rows[0]["index_k_over_gib"] == "9.903" and rows[4]["full_max_total_num_tokens"] == "16924928"


def test_load_levels_csv_matches_the_wilson_bounds():
    d = doc("load-sweep.json")
    rows = list(csv.DictReader(io.StringIO(load_levels_csv(d))))
    assert [r["concurrency"] for r in rows] == ["1", "20", "40", "60", "80"]
    for r in rows:
        k, n = int(r["corrupted"]), int(r["turns"])
        assert (float(r["wilson95_low"]), float(r["wilson95_high"])) == tuple(round(x, 6) for x in wilson(k, n))
        assert sum(int(v) for c, v in r.items() if c.startswith("class_")) == k
    assert rows[1]["pass"] == "false" and rows[0]["pass"] == "true"


def test_turns_csv_writer_keeps_the_records_file_and_writes_rows():
    lines = (DATA / "load-turns.jsonl").read_text().splitlines(keepends=True)
    out, also = io.StringIO(), io.StringIO()
    w = TurnsCsvWriter(out, also=also)
    for ln in lines:
        w.write(ln)
    assert also.getvalue() == "".join(lines)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    recs = [json.loads(x) for x in lines]
    assert len(rows) == len(recs) == 40
    assert [r["rid"] for r in rows] == [x["rid"] for x in recs]
    assert rows[0]["class"] == "ok" and rows[0]["stream"] == "true"
    assert out.getvalue() == turns_csv(recs)


def test_nice_ticks():
    assert nice_ticks(179.06, 8) == [0, 25, 50, 75, 100, 125, 150, 175, 200]
    assert nice_ticks(0.2) == [0, 0.05, 0.1, 0.15, 0.2]
    assert nice_ticks(0) == [0.0, 1.0]


# -- the CLI ----------------------------------------------------------------------------------

def test_cli_report_writes_one_file_and_bad_input_is_one_line(tmp_path, capsys):
    out = tmp_path / "r.html"
    r = run_cli("report", str(DATA / "plan.json"), str(DATA / "load-compare.json"), str(DATA / "incident"),
                str(DATA / "plan-log.json"), str(DATA / "smoke.json"), "-o", str(out))
    assert r.code == 0, r.err
    assert f"wrote {out}" in r.out and "13 chart(s) from 5 input(s)" in r.out
    html = out.read_text()
    assert html.startswith("<!DOCTYPE html>") and html.count('class="chart"') == 13
    notjson = tmp_path / "x.json"
    notjson.write_text("{nope")
    other = tmp_path / "o.json"
    other.write_text('{"schema": "aiperf/1"}')
    cases = [((str(notjson),), f"{notjson}:1: not JSON"), ((str(other),), "schema 'aiperf/1' is not one"),
             ((str(tmp_path / "missing.json"),), "No such file or directory"),
             ((str(tmp_path),), "not a regular file (a folder)"),
             ((str(DATA / "plan.json"), "-o", str(tmp_path / "no" / "r.html")), "--output")]
    from dsv4ctl.cli import main
    for args, msg in cases:         # in this process: the same entry point, without a start-up each
        code = main(["report", *args])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("dsv4ctl: error: ") and msg in err, (args, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_plan_bar_and_csv(capsys, monkeypatch):
    from dsv4ctl.cli import main
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert "prefill ranks 0-3 ·WWWW" in out and "0.305 GiB short of SGLang's 13 GiB activation reserve" in out
    assert out.index("max requests @ context") < out.index("GPU memory per rank") < out.index("prefill: tp4")  # under the table
    assert main(["plan", "--csv", "-g", "decode"]) == 0
    assert len(list(csv.DictReader(io.StringIO(capsys.readouterr().out)))) == 4
    assert main(["plan", "--csv", "--json"]) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_cli_check_load_csv_turns_csv_and_sparkline(tmp_path):
    """The real check load against the stand-in server (HiCache off: no corruption)."""
    from tests.standin.harness import standin, write_config
    cfg = write_config(tmp_path / "serve.yaml")
    small = ("-c", "1,4", "--turns", "2", "--min-requests", "8", "--answer-words", "10", "--max-corruption", "0.5",
             "--no-progress", "--no-metrics")
    with standin(cfg, "--ttft-ms", "1", "--itl-ms", "0") as url:
        rec, tcsv = tmp_path / "turns.jsonl", tmp_path / "turns.csv"
        r = run_cli("check", "load", url, *small, "--csv", "--records", str(rec), "--turns-csv", str(tcsv))
        assert r.code == 0, r.err
        levels = list(csv.DictReader(io.StringIO(r.out)))
        assert [(x["concurrency"], x["turns"], x["corrupted"], x["pass"]) for x in levels] == \
            [("1", "8", "0", "true"), ("4", "8", "0", "true")]
        recs = [json.loads(x) for x in rec.read_text().splitlines()]
        turns = list(csv.DictReader(io.StringIO(tcsv.read_text())))
        assert len(turns) == len(recs) == 16 and [t["rid"] for t in turns] == [x["rid"] for x in recs]


def test_check_load_prints_the_sparkline(capsys, monkeypatch):
    from dsv4ctl.commands.check import _print_load
    monkeypatch.setenv("NO_COLOR", "1")
    _print_load(doc("load-sweep.json"), False, False)
    out = capsys.readouterr().out
    assert "corruption per level ▁▄▇▇█  c=1,20,40,60,80: 0.00 5.51 14.70 15.00 17.66 %" in out


def test_runbook_run_writes_incident_html_with_the_charts_of_its_steps(tmp_path):
    pb = tmp_path / "fit.yaml"
    pb.write_text("name: fit\nsteps:\n  - id: plan_now\n    action: plan\n"
                  "  - id: say\n    action: note\n    when: plan_now.fits == true\n    args: {text: fits}\n")
    run = tmp_path / "run"
    r = run_cli("runbook", "run", str(pb), "--report-dir", str(run))
    assert r.code == 0, r.err
    html = (run / "incident.html").read_text()
    assert "<title>dsv4ctl incident report: run</title>" in html
    assert "Runbook timeline: fit" in html and "GPU memory per rank" in html      # timeline + the plan it ran
    assert html.count('class="chart"') == 2
    assert "[incident.html](incident.html)" in (run / "incident.md").read_text()


def test_a_crash_and_levels_not_run_are_written_on_the_chart():
    d = doc("load-sweep.json")
    d["levels"][3]["crashed"] = True
    d["levels"] = d["levels"][:4]
    d["not_run"] = [80]
    t = texts(svg_tree(CH.load_rate_svg(d)))
    assert "crashed" in t and "not run" in t and "113/640" not in t


def test_groups_without_ranks_draw_no_bar_but_keep_their_errors():
    d = doc("plan.json")
    d["groups"][1]["ranks"] = []
    d["groups"][1]["errors"] = ["decode: the weights do not fit"]
    assert [b.title for b in plan_bars(d)] == ["prefill ranks 0-3"]
    d["groups"][0]["ranks"] = []
    html = build_html([load_input(str(DATA / "plan.json"))], generated="t", version="v")   # renders
    assert "GPU memory per rank" in html
    from dsv4ctl.report.page import plan_section
    sec = plan_section(d)
    assert "<svg" not in sec and "decode: the weights do not fit" in sec
    assert plan_csv(d).count("\n") == 1 and plan_bar_lines(d) == []


def test_a_document_of_a_known_schema_with_wrong_fields_is_one_line(tmp_path, capsys):
    from dsv4ctl.cli import main
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "dsv4ctl.check.load/1", "levels": [{"url": 1}]}))
    assert main(["report", str(bad), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert err == f"dsv4ctl: error: {bad}: not a well-formed dsv4ctl.check.load/1 document (field 'concurrency')\n"
    # text a server sent (escape sequences, markup) is written out, and the SVG stays well-formed
    sm = doc("smoke.json")
    sm["checks"][0]["reason"] = "\x1b]0;pwned\x07<b>&"
    svg = CH.smoke_svg(sm)
    svg_tree(svg)
    assert "\\x1b]0;pwned\\x07&lt;b&gt;&amp;" in svg


def test_a_real_crash_without_any_rated_turn():
    """check load against a dead port: the level crashed, its rate is null, 40 never ran."""
    d = doc("load-crash.json")
    assert d["levels"][0]["rate"] is None and d["not_run"] == [40]
    t = texts(svg_tree(CH.load_rate_svg(d)))
    assert "crashed" in t and "not run" in t and "100" not in t         # the axis is not stretched to 100 %
    assert load_spark_lines(d, stream=io.StringIO()) == ["corruption per level ×·  c=3,40: - - %"]
    html = build_html([load_input(str(DATA / "load-crash.json"))], generated="t", version="v")
    assert html.count('class="chart"') == 3
    assert list(csv.DictReader(io.StringIO(load_levels_csv(d))))[0]["rate"] == ""


def test_hostile_inputs_and_outputs_are_one_line_exit_2(tmp_path):
    import os
    plan = json.loads((DATA / "plan.json").read_text())
    huge = dict(plan, groups=[dict(plan["groups"][0], gpu_memory_mib=10 ** 400)] + plan["groups"][1:])
    (tmp_path / "huge.json").write_text(json.dumps(huge))
    (tmp_path / "nan.json").write_text((DATA / "plan.json").read_text().replace('"headroom_gib": ', '"headroom_gib": NaN, "x": ', 1))
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "in.json").write_text((DATA / "plan.json").read_text())
    cases = [(["huge.json"], "a value the report cannot draw (OverflowError"),
             (["nan.json"], "nan.json: not JSON (NaN is not a number a dsv4ctl document holds)"),
             (["deep.json"], "deep.json: nested too deeply"),
             (["fifo"], "fifo: not a regular file"),
             (["in.json", "-o", "."], "--output '.': not a file name"),
             (["in.json", "-o", "in.json"], "--output in.json: is one of the inputs; it would be overwritten")]
    for args, said in cases:
        r = run_cli("report", *args, cwd=tmp_path, timeout=60)
        assert r.code == 2 and said in r.err and r.err.count("\n") == 1, (args, r.err)
    assert json.loads((tmp_path / "in.json").read_text())["schema"].startswith("dsv4ctl.plan/")


def test_report_reads_standard_input_once(tmp_path):
    """``plan --json | dsv4ctl report -`` (issue 31: ``report -`` was "No such file or directory")."""
    from tests.conftest import run_cli
    plan = run_cli("plan", "--json")
    assert plan.code == 0
    r = run_cli("report", "-", "-o", str(tmp_path / "r.html"), input=plan.out)
    assert r.code == 0, r.err
    html = (tmp_path / "r.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "<svg" in html
    out = run_cli("report", "-", "-o", "-", input=plan.out)
    assert out.code == 0 and out.out.startswith("<!DOCTYPE html>") and out.out.count("<svg") == html.count("<svg")
    r = run_cli("report", "-", input="{}")
    assert r.code == 2 and r.err == "dsv4ctl: error: -: no 'schema' field: not a dsv4ctl JSON document\n"
    r = run_cli("report", "-", "-", input=plan.out)
    assert r.code == 2 and r.err == "dsv4ctl: error: report: '-' (standard input) can be given once\n"


def test_the_report_says_what_the_plan_says():
    """Issue 31: the HTML report said "fits" for a plan whose groups were both tight."""
    from dsv4ctl.report.page import plan_words
    g = lambda n, lv, d: {"name": n, "verdict": {"level": lv, "deciding": d}}  # noqa: E731
    assert plan_words({"ok": True, "groups": [g("prefill", "tight", "indexer_logits"), g("decode", "tight", "margin")]}) == \
        "tight: prefill indexer_logits, decode margin"
    assert plan_words({"ok": True, "groups": [g("prefill", "fits", "activation"), g("decode", "tight", "margin")]}) == \
        "tight: decode margin"
    assert plan_words({"ok": False, "groups": [g("prefill", "fails", "pools"), g("decode", "tight", "margin")]}) == \
        "FAILS: prefill pools"
    assert plan_words({"ok": True, "groups": [g("prefill", "fits", "activation")]}) == "fits"
