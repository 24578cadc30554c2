"""The stand-in SGLang server: its DSML parser (against the reference §5.4 table) and its HTTP
endpoints over real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from dsv4ctl.check import classify as C
from dsv4ctl.check.workload import TOOLS, Session
from tests.standin import dsml
from tests.standin.dsml import BAR, Tok
from tests.standin.harness import standin, write_config
from tests.standin.server import Diffuser, corruption_probability

WEATHER = {"type": "object", "required": ["city"],
           "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
SPECS = C.tool_specs(TOOLS)


def block(*invokes: list[Tok], close: bool = True) -> list[Tok]:
    toks = [Tok("Let me check."), Tok("\n\n"), Tok(dsml.BLOCK_OPEN, True), Tok("\n")]
    for inv in invokes:
        toks += inv
    return toks + ([Tok(dsml.BLOCK_CLOSE, True)] if close else [])


def invoke(name: str, *params: tuple[str, bool, str], body: str | None = None) -> list[Tok]:
    toks = [Tok(dsml.invoke_open(name), True), Tok("\n")]
    for p, is_str, v in params:
        toks += [Tok(dsml.param_open(p, is_str), True), *dsml.text_tokens(v, 2), Tok(dsml.PARAM_CLOSE, True)]
    if body:
        toks += dsml.text_tokens(body)
    return toks + [Tok(dsml.INVOKE_CLOSE, True), Tok("\n")]


# --- the parser against reference §5.4 ------------------------------------------------------
def test_well_formed_block():
    content, calls = dsml.parse_all(block(invoke("get_weather", ("city", True, "San Francisco"), ("days", False, "3"))), True)
    assert content == "Let me check."                      # trailing \n\n before the block removed
    assert calls == [{"index": 0, "name": "get_weather", "arguments": '{"city": "San Francisco", "days": 3}'}]


def test_string_values_are_json_escaped():
    _, calls = dsml.parse_all(block(invoke("f", ("q", True, 'say "hi"\nnow'))), True)
    assert json.loads(calls[0]["arguments"]) == {"q": 'say "hi"\nnow'}


def test_non_json_value_gives_unparseable_arguments():
    _, calls = dsml.parse_all(block(invoke("get_weather", ("city", True, "San Francisco"), ("days", False, "three days"))), True)
    assert calls[0]["arguments"] == '{"city": "San Francisco", "days": three days}'


def test_json_body_invoke_loses_arguments_and_self_closing_is_empty():
    _, calls = dsml.parse_all(block(invoke("get_weather", body='{"city":"Paris"}'),
                                    [Tok(dsml.invoke_open("list_open_files", True), True)]), True)
    assert [(c["index"], c["name"], c["arguments"]) for c in calls] == [(0, "get_weather", "{}"), (1, "list_open_files", "{}")]


def test_missing_closer_still_parsed_and_text_after_block_dropped():
    _, calls = dsml.parse_all(block(invoke("f", ("a", False, "1")), close=False), True)
    assert calls[0]["arguments"] == '{"a": 1}'
    content, _ = dsml.parse_all(block(invoke("f", ("a", False, "1"))) + [Tok("after")], True)
    assert content == "Let me check."


def test_without_tool_parsing_markup_is_content():
    toks = block(invoke("f", ("a", False, "1")))
    content, calls = dsml.parse_all(toks, False)
    assert calls == [] and content == "".join(t.text for t in toks) and f"<{BAR}DSML{BAR}tool_calls>" in content


def test_markup_written_as_text_tokens_leaks_split_into_pieces():
    toks = dsml.call_tokens("read_file", WEATHER, "markup_as_text")
    assert not any(t.special for t in toks) and not any(C.DSML_MARK in t.text for t in toks)
    content, calls = dsml.parse_all(toks, True)
    assert calls == [] and C.DSML_MARK in content


@pytest.mark.parametrize("kind,expected", [
    (None, C.OK), ("markup_as_text", C.DSML_IN_CONTENT), ("think_leak", C.THINK_IN_CONTENT),
    ("bad_json_value", C.ARGS_NOT_JSON), ("json_body_invoke", C.EMPTY_ARGS),
])
def test_each_corruption_kind_maps_to_its_class(kind, expected):
    params = TOOLS[1]["function"]["parameters"]           # run_command: command, timeout_s required
    content, calls = dsml.parse_all(dsml.call_tokens("run_command", params, kind), True)
    turn = C.TurnResult(content=content, finish_reason="tool_calls" if calls else "stop",
                        tool_calls=[C.ToolCall(c["index"], "x", c["name"], c["arguments"]) for c in calls])
    assert C.classify(turn, requires_tool=True, tools=SPECS).cls == expected


def test_truncated_kind_is_cut_inside_a_parameter():
    content, calls = dsml.parse_all(dsml.call_tokens("run_command", TOOLS[1]["function"]["parameters"], "truncated"), True)
    assert calls and calls[0]["arguments"].startswith('{"command": "src/') and not calls[0]["arguments"].endswith("}")


def test_answer_kinds():
    assert C.DSML_MARK in dsml.parse_all(dsml.answer_tokens(20, "markup_as_text"), True)[0]
    assert "</think>" in dsml.parse_all(dsml.answer_tokens(20, "think_leak"), True)[0]
    assert len(dsml.parse_all(dsml.answer_tokens(20), True)[0].split()) == 20


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
