"""The stand-in SGLang server: its output goes through SGLang 0.5.23's real served path
(``DeepSeekRecipeOutputParser`` + deepseek-recipe on the V4 tokenizer), and its HTTP endpoints
over real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import random
import urllib.error
from pathlib import Path
import urllib.request

import pytest

from dsv4ctl.check import classify as C
from dsv4ctl.check.workload import TOOLS, Session
from tests.standin import model
from tests.standin.harness import REPO, standin, write_config
from tests.standin.served import Seg, served_path, sglang_parser_modules, sglang_src
from tests.standin.server import Diffuser, corruption_probability

SPECS = C.tool_specs(TOOLS)
B = model.DSML


def served(text_or_segs, *, parse: bool = True, thinking: bool = False):
    """Model text through SGLang 0.5.23's served path: (content, reasoning, [(name, arguments)])."""
    sp = served_path()
    segs = [Seg(text_or_segs)] if isinstance(text_or_segs, str) else text_or_segs
    d = sp.parser(thinking=thinking, parse_tool_calls=parse, separate_reasoning=True).finish(sp.ids(segs), {"type": "stop"})
    return d.content, d.reasoning, [(c.name, c.arguments) for c in sp.whole_tool_calls(d)]


def turn(content: str, calls) -> C.TurnResult:
    return C.TurnResult(content=content, finish_reason="tool_calls" if calls else "stop",
                        tool_calls=[C.ToolCall(i, "x", n, a) for i, (n, a) in enumerate(calls)])


# --- the served path is SGLang's own code on the DeepSeek-V4 tokenizer --------------------------
def test_served_path_runs_sglang_0523_parser_files_on_the_v4_tokenizer():
    out, ren = sglang_parser_modules()
    assert Path(out.__file__) == sglang_src() / "srt/parser/deepseek_recipe_output.py"
    assert "recognized by token ID" in out.__doc__ and out.DeepSeekRecipeOutputParser.__module__ == out.__name__
    tok = served_path().tokenizer
    flash = json.loads((REPO / "dsv4ctl/data/models/deepseek-v4-flash.json").read_text())
    assert tok.get_vocab_size() == flash["vocab_size"] == 129280
    assert [tok.token_to_id(t) for t in (B, "<think>", "</think>", model.EOS)] == [128825, 128821, 128822, 1]


def test_well_formed_block_becomes_tool_calls():
    content, reasoning, calls = served("Let me check.\n\n" + model.block_text(
        [("get_weather", {"city": "San Francisco", "days": 3, "q": 'say "hi"\nnow'})]))
    assert (content, reasoning) == ("Let me check.", "")
    assert calls == [("get_weather", '{"city": "San Francisco", "days": 3, "q": "say \\"hi\\"\\nnow"}')]
    assert json.loads(calls[0][1])["q"] == 'say "hi"\nnow'


def test_without_tool_parsing_markup_is_content():
    text = "Sure.\n\n" + model.block_text([("f", {"a": 1})])
    assert served(text, parse=False) == (text, "", [])


def test_markup_sampled_as_text_tokens_is_not_parsed():
    content, _, calls = served([Seg("Sure.\n\n"), Seg(model.block_text([("f", {"a": 1})]), plain=True)])
    assert calls == [] and content.endswith(model.BLOCK_CLOSE) and C.DSML_MARK in content


def test_sglang_served_path_mangles_what_the_detector_tests_expect():
    """The served path's known behaviour (reference: output-and-gateway §served path)."""
    two = model.block_text([("a", {"x": "1"})]) + "\n\n" + model.block_text([("b", {"y": "2"})])
    assert served(two)[2] == [("a", '{"x": "1"}')]                             # the second block is dropped
    cut = model.block_text([("w", {"t": f"x </{B}parameter y"})])
    assert served(cut)[2] == [("w", '{"t": "x "}')]                            # a string cut at a literal closer
    body = f'<{B}tool_calls>\n<{B}invoke name="w">\n{{"t": 1}}\n</{B}invoke>\n</{B}tool_calls>'
    assert served(body)[2] == [("w", "{}")]                                     # a JSON body becomes {}


@pytest.mark.parametrize("kind,expected", [
    (None, C.OK), ("markup_as_text", C.DSML_IN_CONTENT), ("think_leak", C.THINK_IN_CONTENT),
    ("bad_json_value", C.ARGS_NOT_JSON), ("json_body_invoke", C.EMPTY_ARGS),
])
def test_each_corruption_kind_maps_to_its_class(kind, expected):
    body = Session(sid=1, turns=3, stream=False).request("m", "r")         # run_command: command, timeout_s required
    out = model.write(body, random.Random(0), kind)
    content, _, calls = served(out.segs)
    assert C.classify(turn(content, calls), requires_tool=True, tools=SPECS).cls == expected


def test_clean_answers_are_varied_prose():
    text = model.prose(random.Random(3), 400)
    words = text.split()
    assert len(words) == 400
    grams = [tuple(words[i:i + 8]) for i in range(len(words) - 7)]
    assert len(set(grams)) == len(grams)                                       # no repeated 8-gram


def test_corruption_curve_and_diffuser():
    assert [corruption_probability(n, True) for n in (1, 8, 24, 40, 60, 70, 75, 80, 200)] == pytest.approx(
        [0, 0, 0.075, 0.15, 0.15, 0.15, 0.165, 0.18, 0.18])
    assert corruption_probability(60, False) == 0
    assert corruption_probability(60, True, scale=2.0) == pytest.approx(0.30)
    assert corruption_probability(200, True, scale=10.0) == 1.0
    d = Diffuser()
    assert sum(d.draw(0.15) for _ in range(1000)) in (150, 151)
    assert not any(Diffuser().draw(0.0) for _ in range(100))


# --- HTTP -----------------------------------------------------------------------------------
def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def post(url: str, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cfg = write_config(tmp_path_factory.mktemp("standin") / "serve.yaml", enable_hierarchical_cache=True,
                       hicache_ratio=2.0, disaggregation_mode="prefill")
    with standin(cfg, "--ttft-ms", "1", "--itl-ms", "0") as url:
        yield url


def test_endpoints(server):
    assert get(server + "/health") == (200, b"")
    code, body = get(server + "/v1/models")
    assert code == 200 and json.loads(body)["data"][0]["id"] == "deepseek-v4-flash"
    assert get(server + "/v1/models/nope")[0] == 404
    info = json.loads(get(server + "/server_info")[1])
    assert (info["version"], info["tool_call_parser"], info["reasoning_parser"], info["enable_hierarchical_cache"],
            info["hicache_ratio"], info["disaggregation_mode"], info["tp_size"]) == (
        "0.5.23", "deepseekv4", "deepseek-v4", True, 2.0, "prefill", 4)
    code, text = get(server + "/metrics")
    assert code == 200 and b"sglang:num_running_reqs{" in text and b"_created" not in text
    assert post(server + "/v1/chat/completions", {"messages": []})[0] == 400


def test_non_streaming_and_streaming_turns_are_valid_and_agree(server):
    s = Session(sid=1, turns=3, stream=False)
    code, body = post(server + "/v1/chat/completions", s.request("deepseek-v4-flash", "rid-1"))
    r = C.parse_completion(json.loads(body))
    assert code == 200 and r.response_id == "rid-1" and r.finish_reason == "tool_calls"
    assert C.classify(r, requires_tool=True, tools=SPECS).ok
    assert json.loads(r.tool_calls[0].arguments)["timeout_s"] == 7
    req = s.request("deepseek-v4-flash", "rid-2")
    req["stream"] = True
    code, raw = post(server + "/v1/chat/completions", req)
    dec, asm = C.SSEDecoder(), C.StreamAssembler()
    for p in dec.feed(raw) + dec.close():
        asm.feed_payload(p)
    rs = asm.result()
    assert asm.chunks > 5 and rs.finish_reason == "tool_calls"
    assert [(c.name, c.arguments) for c in rs.tool_calls] == [(c.name, c.arguments) for c in r.tool_calls]
    assert json.loads(body)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_no_tool_call_parser_means_markup_in_content(tmp_path):
    cfg = write_config(tmp_path / "serve.yaml", tool_call_parser=None, enable_metrics=False)
    with standin(cfg, "--ttft-ms", "0", "--itl-ms", "0") as url:
        code, body = post(url + "/v1/chat/completions", Session(sid=0, turns=2, stream=False).request("m", "r"))
        v = C.classify(C.parse_completion(json.loads(body)), requires_tool=True, tools=SPECS)
        assert (code, v.cls) == (200, C.DSML_IN_CONTENT)
        assert get(url + "/metrics")[0] == 404


def test_bad_config_exits_2(tmp_path):
    import subprocess
    import sys
    bad = tmp_path / "bad.yaml"
    bad.write_text("tool_call_parser: deepseekv4\n")
    p = subprocess.run([sys.executable, "-m", "tests.standin.server", "--config", str(bad)],
                       cwd=str(__import__("tests.standin.harness", fromlist=["REPO"]).REPO), capture_output=True, text=True)
    assert p.returncode == 2 and "use dashes" in p.stderr
