"""SGLang's own DSML test examples through the stand-in's real served path and dsv4ctl's classifier.

``tests/data/dsml_corpus/cases.json`` holds 266 model texts from SGLang's DSML detector tests with
what each test expects (provenance in its README). Each text is served by the stand-in over real
HTTP (SGLang 0.5.23's ``DeepSeekRecipeOutputParser`` on the V4 tokenizer, JSON and SSE), the answer
is classified with the test's expected calls as the known answer, and the gate's verdict must
agree with SGLang's own expectation: *ok* exactly when what a client received is what the SGLang
test expects. Disagreements kept on purpose are listed in :data:`KEPT` with the reason.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from dsv4ctl.check import classify as C
from tests.standin.harness import standin, write_config
from tests.standin.model import SCRIPT_FIELD

CORPUS = json.loads((Path(__file__).parent / "data" / "dsml_corpus" / "cases.json").read_text())
CASES = CORPUS["cases"]

KEPT = {
    # content the served path changed without leaving anything a client can see is wrong: the
    # SGLang test pins a content string, the gate judges calls and leaks, not prose
}
"""Case id -> why the gate's verdict differs from SGLang's expectation on purpose."""


def _post(url: str, body: dict) -> bytes:
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read()


def expected_calls(case: dict):
    """The known answer: SGLang's expected calls ([] when the test expects an error or no call)."""
    e = case["expect"]
    if e.get("error"):
        return []
    return e.get("calls")


def served_matches(case: dict, turn: C.TurnResult) -> bool:
    """What SGLang's test expects, judged on what the client received (calls by name and parsed
    arguments; content when the test pins it)."""
    e = case["expect"]
    want = expected_calls(case)
    if want is not None:
        if len(want) != len(turn.tool_calls):
            return False
        for w, g in zip(want, turn.tool_calls):
            if w["name"] != g.name:
                return False
            if w.get("arguments") is not None:
                try:
                    if json.loads(g.arguments) != w["arguments"]:
                        return False
                except ValueError:
                    return False
    if e.get("content") is not None and turn.content.strip() != e["content"].strip():
        return False
    for s in e.get("content_contains") or ():
        if s not in turn.content:
            return False
    for s in e.get("content_not_contains") or ():
        if s in turn.content:
            return False
    return True


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cfg = write_config(tmp_path_factory.mktemp("corpus") / "serve.yaml")
    with standin(cfg, "--ttft-ms", "0", "--itl-ms", "0") as url:
        yield url


def run_case(url: str, case: dict, stream: bool) -> C.TurnResult:
    body = {"model": "m", "messages": [{"role": "user", "content": "corpus case"}], "tools": case["tools"],
            "stream": stream, "max_tokens": 100000, SCRIPT_FIELD: case["text"],
            "chat_template_kwargs": {"thinking": bool(case.get("thinking"))}}
    raw = _post(url, body)
    if not stream:
        return C.parse_completion(json.loads(raw))
    dec, asm = C.SSEDecoder(), C.StreamAssembler()
    asm.feed_payloads(dec.feed(raw) + dec.close())
    return asm.result()


def test_corpus_is_recorded_with_provenance():
    assert CORPUS["source"]["repo"] == "sgl-project/sglang" and len(CASES) == 266
    assert all(len(f["commit"]) == 40 for f in CORPUS["source"]["files"])


def test_gate_agrees_with_sglang_expectations_case_by_case(server):
    agree, disagree, served_changed = 0, {}, []
    for case in CASES:
        for stream in (False, True):
            turn = run_case(server, case, stream)
            if not stream:
                rec = case["served"]
                if [(c.name, c.arguments) for c in turn.tool_calls] != [(c["name"], c["arguments"]) for c in rec["calls"]]:
                    served_changed.append(case["id"])
            want = expected_calls(case)
            tools = C.tool_specs(case["tools"])
            v = C.classify(turn, requires_tool=bool(want), tools=tools, expected=want,
                           thinking_requested=bool(case.get("thinking")))
            truth = served_matches(case, turn)
            if v.ok == truth:
                agree += 1
            elif case["id"] not in KEPT:
                disagree[(case["id"], stream)] = (truth, v.cls, v.reason)
    print(f"corpus: {agree} of {2 * len(CASES)} verdicts agree with SGLang's expectations")
    assert served_changed == []                   # the recorded served output still holds
    assert disagree == {}
