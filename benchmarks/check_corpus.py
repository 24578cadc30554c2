"""Benchmark: per-class precision and recall of the gate's classifier on SGLang's own DSML corpus.

``tests/data/dsml_corpus/cases.json`` holds 266 model texts from SGLang's DeepSeek DSML detector
tests with what each test expects. Each text is served by the stand-in through SGLang 0.5.23's real
output path (``DeepSeekRecipeOutputParser`` on the V4 tokenizer; JSON and SSE, so two verdicts per
case), as ``tests/test_check_corpus.py`` does; ``--recorded`` judges the served outputs recorded in
the corpus instead (the test pins that they still hold) and needs no server. A verdict is *corrupt*
when what the client received is not what SGLang's test expects (``served_matches``), and the
corruption's kind is the corpus's ``disagreement`` label (arguments cut, second block dropped, …).

Printed, for two ways of judging a turn:

* ``known answer``: with the expected calls, as ``check load`` / ``check smoke`` judge their
  known-answer turns;
* ``shape only``: without them, as free-form turns are judged;

per gate class its precision (flagged verdicts of that class that are really corrupt) and the kinds
it caught, per corruption kind its recall (share flagged, by any class), and overall precision and
recall. Cases the corpus test keeps on purpose (``KEPT``) count as what they are (a flagged schema
violation SGLang accepts is a false positive here, labelled "kept on purpose"). Last, the legitimate answers (what SGLang's tests
expect a correct server to deliver) judged both ways: false positives per class. Usage::

    .venv/bin/python benchmarks/check_corpus.py [--recorded]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dsv4ctl.check import classify as C  # noqa: E402
from dsv4ctl.check import expect as E  # noqa: E402
from tests import test_check_corpus as T  # noqa: E402


def recorded_turn(case: dict) -> C.TurnResult:
    """The served output recorded in the corpus, as a client receives it."""
    s = case["served"]
    calls = [C.ToolCall(i, f"call_{i}", c["name"], c["arguments"]) for i, c in enumerate(s["calls"])]
    return C.TurnResult(content=s["content"] or "", reasoning=s["reasoning"] or "", tool_calls=calls,
                        finish_reason="tool_calls" if calls else "stop")


def turns(recorded: bool):
    """(case, stream, turn) for every case: served by the stand-in, or from the record."""
    if recorded:
        for case in T.CASES:
            yield case, False, recorded_turn(case)
        return
    from tests.standin.harness import standin, write_config
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        with standin(write_config(Path(d) / "serve.yaml"), "--ttft-ms", "0", "--itl-ms", "0") as url:
            for case in T.CASES:
                for stream in (False, True):
                    yield case, stream, T.run_case(url, case, stream)


def pct(a: int, b: int) -> str:
    return f"{100 * a / b:5.1f} % ({a}/{b})" if b else "    -"


def report(title: str, rows: list[tuple[dict, bool, C.Verdict]]) -> None:
    """Per-class precision, per-kind recall and the totals of ``rows`` (case, truth ok, verdict)."""
    print(f"\n== {title}: {len(rows)} verdicts, {sum(v.ok == t for _, t, v in rows)} agree with SGLang's expectations")
    by_cls: dict[str, list[bool]] = collections.defaultdict(list)
    caught: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    kinds: dict[str, list[bool]] = collections.defaultdict(list)
    for case, truth, v in rows:
        if not v.ok:
            by_cls[v.cls].append(not truth)
            if not truth:
                caught[v.cls][case.get("disagreement") or "other"] += 1
            else:
                caught[v.cls]["FALSE POSITIVE, " + ("kept on purpose" if case["id"] in T.KEPT else "NOT KEPT")] += 1
        if not truth:
            kinds[case.get("disagreement") or "content or calls differ from the test"].append(not v.ok)
    print(f"{'class':<18} {'precision':>20}   caught")
    order = C.CLASSES + tuple(c for c in E.CLASSES if c not in C.CLASSES)
    for c in order:
        if c in by_cls:
            hits = by_cls[c]
            what = ", ".join(f"{k} {n}" for k, n in caught[c].most_common())
            print(f"{c:<18} {pct(sum(hits), len(hits)):>20}   {what}")
    print(f"{'corruption kind':<60} {'recall':>20}")
    for k, xs in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
        print(f"{k[:60]:<60} {pct(sum(xs), len(xs)):>20}")
    flagged = [t for _, t, v in rows if not v.ok]
    corrupt = [v for _, t, v in rows if not t]
    print(f"overall: precision {pct(sum(not t for t in flagged), len(flagged))}, "
          f"recall {pct(sum(not v.ok for v in corrupt), len(corrupt))}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recorded", action="store_true", help="judge the recorded served outputs (no stand-in)")
    a = ap.parse_args()
    t0 = time.perf_counter()
    known, shape = [], []
    for case, _stream, turn in turns(a.recorded):
        want = T.expected_calls(case)
        tools = C.tool_specs(case["tools"])
        truth = T.served_matches(case, turn)
        think = bool(case.get("thinking"))
        known.append((case, truth, E.judge(turn, requires_tool=bool(want), tools=tools, expected=want,
                                           thinking_requested=think)))
        shape.append((case, truth, E.judge(turn, requires_tool=bool(want), tools=tools, thinking_requested=think)))
    print(f"SGLang DSML corpus: {len(T.CASES)} cases, "
          f"{'recorded served outputs' if a.recorded else 'served by the stand-in (JSON and SSE)'}, "
          f"{time.perf_counter() - t0:.1f} s")
    report("known answer", known)
    report("shape only", shape)
    for mode in ("known answer", "shape only"):
        legit = collections.Counter()
        n = 0
        for case in T.CASES:
            turn = T.legitimate_turn(case)
            if turn is None:
                continue
            n += 1
            want = case["expect"]["calls"]
            v = E.judge(turn, requires_tool=bool(want), tools=C.tool_specs(case["tools"]),
                        expected=want if mode == "known answer" else None,
                        thinking_requested=bool(case.get("thinking")))
            if not v.ok:
                why = ("schema violation" if not T.conforms(case) else
                       "malformed block passed through as text" if any(w in case["test"] for w in T.PASSTHROUGH) else
                       "conforming")
                legit[(v.cls, why)] += 1
        print(f"\n== legitimate answers (what SGLang's tests expect), {mode}: {n} judged, "
              f"{n - sum(legit.values())} ok")
        for (c, why), k in sorted(legit.items()):
            print(f"  flagged {c:<16} {k:>3}  ({why})")
        conforming = sum(k for (c, why), k in legit.items() if why == "conforming")
        print(f"  conforming answers flagged: {conforming}")

if __name__ == "__main__":
    main()
