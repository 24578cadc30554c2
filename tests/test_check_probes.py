"""The ``check smoke`` probes (tool_choice none / required / named, over-length prompt, prompt_tokens
cross-check): request bodies and judging as pure functions, with real values."""

from __future__ import annotations

import json

from dsv4ctl.check import classify as C
from dsv4ctl.check import smoke as S
from dsv4ctl.check import workload as W

SPECS = C.tool_specs(W.TOOLS)
URL = "http://127.0.0.1:8000"
DSML_BLOCK = ("\n\n<\uff5cDSML\uff5ctool_calls>\n<\uff5cDSML\uff5cinvoke name=\"read_file\">\n"
              "<\uff5cDSML\uff5cparameter name=\"path\" string=\"true\">dsv4ctl/check/smoke.py</\uff5cDSML\uff5cparameter>\n"
              "</\uff5cDSML\uff5cinvoke>\n</\uff5cDSML\uff5ctool_calls>")


def call(name, args, i=0) -> C.ToolCall:
    return C.ToolCall(i, f"call_{i}", name, args if isinstance(args, str) else json.dumps(args))


def answer(content="", calls=(), finish="stop", usage=None, status=200, error=None, stalled=False) -> C.TurnResult:
    return C.TurnResult(content=content, tool_calls=list(calls), finish_reason=finish, usage=usage,
                        http_status=status, error=error, stalled=stalled)


# --- bodies -----------------------------------------------------------------------------------
def test_tool_choice_bodies():
    none = S.tool_choice_body("none", "m", "r1")
    assert none["tool_choice"] == "none" and none["tools"] == W.TOOLS and none["rid"] == "r1" and not none["stream"]
    text = none["messages"][-1]["content"]
    # the instruction asks for a known-answer call anyway, in the directive format, with its facts first
    assert W.parse_directives(text) == S.NONE_PROBE_CALLS
    assert text.endswith('Call read_file with exactly these arguments: '
                         '{"path": "dsv4ctl/check/smoke.py", "start_line": 12, "end_line": 40}.')
    assert "dsv4ctl/check/smoke.py, lines 12-40" in text
    req = S.tool_choice_body("required", "m", "r2")
    assert req["tool_choice"] == "required" and req["messages"][-1]["content"].endswith("call the run_command tool.")
    named = S.tool_choice_body("named", "m", "r3")
    assert named["tool_choice"] == {"type": "function", "function": {"name": "search_code"}}
    assert named["messages"][-1]["content"].endswith("call the search_code tool.")
    assert all(b["messages"][0] == {"role": "system", "content": W.SYSTEM_PROMPT} for b in (none, req, named))


def test_over_length_body_is_sized_from_the_context_length():
    b = S.over_length_body("m", "r", 163840)
    text = b["messages"][0]["content"]
    assert len(text) == (163840 + 1024) * 4 + len(" Reply with OK.") == 659471
    assert text.startswith("we go to it and so do we, as we may. we go") and text.endswith(" Reply with OK.")
    assert max(len(w.strip(",.")) for w in S.FILLER.split()) <= 3        # at least 1 token per 4 characters
    assert "tools" not in b and b["max_tokens"] == 16 and not b["stream"]
    # the largest probed context: 1,048,576 tokens -> a 4 MiB (+ 4 KiB) prompt
    assert len(S.over_length_body("m", "r", 1 << 20)["messages"][0]["content"]) == 4 * (1 << 20) + 4096 + 15


def test_sent_bytes_counts_messages_and_tools():
    body = {"messages": [{"role": "user", "content": "héllo"}]}
    assert S.sent_bytes(body) == len('[{"role":"user","content":"héllo"}]'.encode()) == 36
    body["tools"] = [{"type": "function", "function": {"name": "f"}}]
    assert S.sent_bytes(body) == 36 + len('[{"type":"function","function":{"name":"f"}}]')
    chat = S.chat_body("m", "r")
    assert S.sent_bytes(chat) == 139 and chat["max_tokens"] == 64


# --- context length and the over-length line -------------------------------------------------
def test_context_length_sources():
    models = {"data": [{"id": "m", "max_model_len": 1048576}]}
    assert S.context_length([{"context_length": 163840}], models) == (163840, "server_info context_length")
    # PD: the largest worker context (a prompt over it is over every worker's)
    assert S.context_length([{"context_length": 131072}, {"context_length": 163840}], None)[0] == 163840
    for unset in (None, 0, -5, True, "163840", 1.5e5):
        assert S.context_length([{"context_length": unset}], models) == (1048576, "/v1/models max_model_len")
    n, why = S.context_length([{}], {"data": [{"id": "m"}]})
    assert n is None and why.startswith("no context length known")
    assert S.context_length([], "not json")[0] is None and S.context_length(["x"], {"data": []})[0] is None
    assert S.context_length([], {"data": [{"max_model_len": False}]})[0] is None


def test_over_length_skips():
    assert S.over_length_skip(1 << 20, "s", URL) is None                      # 4 MiB: sent
    ln = S.over_length_skip((1 << 20) + 1, "/v1/models max_model_len", URL)
    assert (ln["check"], ln["status"]) == ("over_length", "skip")
    assert ln["reason"] == ("context length 1048577 tokens (/v1/models max_model_len) is over 1048576: "
                            "the prompt would be over 4 MiB")
    ln = S.over_length_skip(None, "no context length known (x)", URL)
    assert (ln["status"], ln["reason"]) == ("skip", "no context length known (x)")


def test_judge_over_length():
    chars = (163840 + 1024) * 4 + 15
    ok = S.judge_over_length(answer(status=400, error="HTTP 400: The input (212000 tokens) is longer than the "
                                                     "model's context length (163840 tokens)."),
                             URL, 163840, "server_info context_length", chars)
    assert ok["status"] == "pass" and ok["reason"] == (
        "HTTP 400 for a prompt of about 164867 tokens over the context length 163840 (server_info context_length)")
    assert ok["detail"]["error"].startswith("HTTP 400: The input")
    # PD: the prefill abort answered by decode with HTTP 200, garbage and prompt_tokens 1
    bad = S.judge_over_length(answer("\u00e8\u00e8 garbage", usage={"prompt_tokens": 1}, finish="length"),
                              URL, 163840, "server_info context_length", chars)
    assert bad["status"] == "fail" and bad["reason"] == (
        "HTTP 200 for a prompt of about 164867 tokens over the context length 163840 (server_info context_length), "
        "expected a 4xx (prompt_tokens 1, finish_reason 'length')")
    assert bad["detail"]["content_excerpt"] == "\u00e8\u00e8 garbage"
    r = S.judge_over_length(answer(status=503, error="HTTP 503: busy"), URL, 100, "s", 4496)
    assert (r["status"], r["reason"]) == ("fail", "HTTP 503 for a prompt of about 1124 tokens over the context "
                                                  "length 100 (s), expected a 4xx: HTTP 503: busy")
    r = S.judge_over_length(answer(status=None, error="no complete answer within 60 s", stalled=True), URL, 100, "s", 4496)
    assert r["status"] == "fail" and r["reason"].endswith(": no complete answer within 60 s")
    assert S.judge_over_length(answer(status=413, error="HTTP 413"), URL, 100, "s", 4496)["status"] == "pass"


# --- tool_choice lines ------------------------------------------------------------------------
def test_judge_tool_choice_none():
    ln = S.judge_tool_choice_none(answer("I would read dsv4ctl/check/smoke.py lines 12-40 first."), URL, SPECS)
    assert ln["status"] == "pass" and ln["reason"] == (
        "no tool_calls, 54 chars of content without markup, finish_reason stop")
    # the #35736 leak: the model called anyway, DSML is not parsed with tool_choice none
    ln = S.judge_tool_choice_none(answer("Reading it." + DSML_BLOCK), URL, SPECS)
    assert ln["status"] == "fail" and ln["reason"] == (
        "dsml_in_content: DSML '<\uff5cDSML\uff5ctool_calls>' in content (tool_choice none: DSML is not parsed, sglang #35736)")
    assert ln["detail"]["content_excerpt"].startswith("Reading it.\n\n<\uff5cDSML")
    ln = S.judge_tool_choice_none(answer("ok </think> done"), URL, SPECS)
    assert ln["reason"].startswith("think_in_content: '</think>' in content")
    ln = S.judge_tool_choice_none(answer(calls=[call("read_file", {"path": "a"})], finish="tool_calls"), URL, SPECS)
    assert ln["status"] == "fail" and ln["reason"] == \
        '1 tool call(s) with tool_choice none: read_file({"path": "a"})'
    ln = S.judge_tool_choice_none(answer(status=400, error="HTTP 400: tool_choice none unsupported"), URL, SPECS)
    assert ln["status"] == "fail" and ln["reason"] == "http_error: HTTP 400: tool_choice none unsupported"


def test_judge_tool_choice_required():
    good = answer(calls=[call("run_command", {"command": "ls -la", "timeout_s": 30})], finish="tool_calls")
    ln = S.judge_tool_choice_required(good, URL, SPECS)
    assert ln["status"] == "pass" and ln["reason"] == '1 call(s): run_command({"command": "ls -la", "timeout_s": 30})'
    ln = S.judge_tool_choice_required(answer("I would run ls."), URL, SPECS)
    assert (ln["status"], ln["reason"]) == ("fail", "no_tool_call: no tool_calls (finish_reason stop)")
    ln = S.judge_tool_choice_required(answer(calls=[call("run_command", {"command": "ls", "timeout_s": "30"})]), URL, SPECS)
    assert ln["status"] == "fail" and ln["reason"].startswith("args_schema: call 0 'run_command': timeout_s: '30' is not")
    ln = S.judge_tool_choice_required(answer(calls=[call("run_command", '{"command": "ls", "timeout_s": 3')],
                                             finish="length"), URL, SPECS)
    assert ln["reason"] == "length_mid_call: finish_reason length with 1 tool call(s)"


def test_judge_tool_choice_named():
    q = {"query": "def handler_3", "lang": "python"}
    ln = S.judge_tool_choice_named(answer(calls=[call("search_code", q)]), URL, SPECS, "search_code")
    assert ln["status"] == "pass" and ln["reason"].startswith("1 call(s) of search_code: search_code(")
    ln = S.judge_tool_choice_named(answer(calls=[call("read_file", {"path": "a"})]), URL, SPECS, "search_code")
    assert (ln["status"], ln["reason"]) == ("fail", "wrong_tool: call 0: 'read_file', but tool_choice names 'search_code'")
    ln = S.judge_tool_choice_named(answer(calls=[call("search_code", q), call("list_open_files", {}, 1)]),
                                   URL, SPECS, "search_code")
    assert ln["reason"] == "wrong_tool: call 1: 'list_open_files', but tool_choice names 'search_code'"
    ln = S.judge_tool_choice_named(answer(calls=[call("search_code", {})]), URL, SPECS, "search_code")
    assert ln["reason"] == "empty_args: call 0 'search_code': {} but requires query, lang"
    ln = S.judge_tool_choice_named(answer(""), URL, SPECS, "search_code")
    assert ln["reason"].startswith("no_tool_call:")


# --- prompt_tokens cross-check ----------------------------------------------------------------
def test_judge_prompt_tokens():
    chat = answer("ok", usage={"prompt_tokens": 35})
    tool = answer(calls=[call("read_file", {"path": "a"})], usage={"prompt_tokens": 591})
    ln = S.judge_prompt_tokens([("chat", 139, chat), ("tool_call", 3468, tool)], URL)
    assert ln["status"] == "pass" and ln["reason"] == (
        "2 probe(s) within 1 token per 16 bytes .. 1 per byte sent (chat 35/139, tool_call 591/3468)")
    assert ln["detail"]["probes"] == [{"probe": "chat", "prompt_tokens": 35, "bytes": 139},
                                      {"probe": "tool_call", "prompt_tokens": 591, "bytes": 3468}]
    # the bounds are inclusive: 1 token per 16 bytes, 1 token per byte
    assert S.judge_prompt_tokens([("chat", 160, answer(usage={"prompt_tokens": 10}))], URL)["status"] == "pass"
    assert S.judge_prompt_tokens([("chat", 160, answer(usage={"prompt_tokens": 160}))], URL)["status"] == "pass"
    # PD garbage: prompt_tokens 1 for a 3 KB prompt
    ln = S.judge_prompt_tokens([("chat", 139, chat), ("tool_call", 3468, answer(usage={"prompt_tokens": 1}))], URL)
    assert ln["status"] == "fail" and ln["reason"] == (
        "tool_call: prompt_tokens 1 for 3468 bytes sent, under 1 token per 16 bytes (the prompt was not what was sent)")
    ln = S.judge_prompt_tokens([("chat", 139, answer(usage={"prompt_tokens": 9}))], URL)       # 9 x 16 = 144 >= 139
    assert ln["status"] == "pass"
    ln = S.judge_prompt_tokens([("chat", 139, answer(usage={"prompt_tokens": 8}))], URL)       # 8 x 16 = 128 < 139
    assert ln["status"] == "fail"
    ln = S.judge_prompt_tokens([("chat", 139, answer(usage={"prompt_tokens": 140}))], URL)
    assert ln["reason"] == "chat: prompt_tokens 140 for 139 bytes sent, over 1 token per byte"
    for usage, why in ((None, "chat: no usage.prompt_tokens"), ({"completion_tokens": 3}, "chat: no usage.prompt_tokens"),
                       ({"prompt_tokens": "35"}, "chat: no usage.prompt_tokens ('35')"),
                       ({"prompt_tokens": True}, "chat: no usage.prompt_tokens (True)")):
        ln = S.judge_prompt_tokens([("chat", 139, answer(usage=usage))], URL)
        assert (ln["status"], ln["reason"]) == ("fail", why), usage
    # probes without an answer are left to their own lines
    ln = S.judge_prompt_tokens([("chat", 139, answer(status=500, error="HTTP 500: x")),
                                ("tool_call", 3468, answer(status=None, stalled=True, error="stuck")),
                                ("tool_call_stream", 3468, answer(usage={"prompt_tokens": 600}))], URL)
    assert ln["status"] == "pass" and ln["reason"].startswith("1 probe(s)")
    ln = S.judge_prompt_tokens([("chat", 139, answer(status=500, error="HTTP 500: x"))], URL)
    assert (ln["status"], ln["reason"]) == ("skip", "no completion probe was answered")


def test_pool_limit_is_the_smallest_reported():
    assert S.pool_limit([{"max_req_input_len": 9000}, {"max_req_input_len": 7000}, {}, "x", {"max_req_input_len": True}]) == 7000
    assert S.pool_limit([{}, {"max_req_input_len": 0}]) is None


def test_over_pool_tokens_aim_inside_the_band():
    t, skip = S.over_pool_tokens(16378, 65536, URL)
    assert skip is None and t == 38887
    assert 16378 < t * (1 - S.BAND_SLACK) and t * (1 + S.BAND_SLACK) < 65536
    _, skip = S.over_pool_tokens(None, 65536, URL)
    assert skip["status"] == "skip" and "max_req_input_len" in skip["reason"]
    _, skip = S.over_pool_tokens(65529, 65536, URL)
    assert "holds a full-context request" in skip["reason"]
    _, skip = S.over_pool_tokens(60000, 65536, URL)         # 60000/0.9 > 65536/1.1
    assert skip["reason"] == "the band 60000..65536 tokens is too narrow for a prompt sized to ±10%"
    _, skip = S.over_pool_tokens(16378, None, URL)
    assert skip["reason"] == "no context length known"


def test_over_pool_body_size_is_calibrated_on_the_dsv4_tokenizer():
    body = S.over_pool_body("m", "r", 10000)
    assert len(body["messages"][0]["content"]) == 28500 + len(" Reply with OK.")


def test_judge_over_pool():
    ok = S.judge_over_pool(C.TurnResult(http_status=400, error="HTTP 400: Input length"), URL, 16378, 65536, 38887)
    assert ok["status"] == "pass" and ok["detail"]["prompt_tokens_sent"] == 38887
    bad = S.judge_over_pool(C.TurnResult(http_status=200, content="\x00,,,,", usage={"prompt_tokens": 1}),
                            URL, 16378, 65536, 38887)
    assert bad["status"] == "fail" and "HTTP 200 for a prompt of about 38887 tokens" in bad["reason"]
    assert "prompt_tokens 1; sglang#30233" in bad["reason"]
    none = S.judge_over_pool(C.TurnResult(http_status=None, error="reset"), URL, 1, 2, 3)
    assert none["status"] == "fail" and none["reason"].startswith("no answer for")


def _tc(calls, **kw):
    return C.TurnResult(http_status=200, finish_reason="tool_calls",
                        tool_calls=[C.ToolCall(index=i, id=f"c{i}", name=n, arguments=a) for i, (n, a) in enumerate(calls)],
                        **kw)


def test_judge_replay():
    a = _tc([("read_file", '{"path": "a.py", "start_line": 3}')])
    same = _tc([("read_file", '{"start_line": 3, "path": "a.py"}')],          # key order does not matter
               usage={"prompt_tokens": 900, "prompt_tokens_details": {"cached_tokens": 896}})
    ok = S.judge_replay(a, same, a, URL, None, rid="r1")
    assert ok["status"] == "pass" and ok["reason"] == ("the same 1 call(s) computed, from the cache (896 cached "
                                                       "tokens) and after /flush_cache")
    assert ok["detail"]["cached_tokens"] == 896 and ok["detail"]["rid"] == "r1"
    other = _tc([("read_file", '{"path": "a.py", "start_line": 4}')],
                usage={"prompt_tokens_details": {"cached_tokens": 896}})
    bad = S.judge_replay(a, other, a, URL, None)
    assert bad["status"] == "fail" and bad["reason"].startswith(
        "the cached replay (896 cached tokens) differs from the first computation: read_file(")
    assert '"start_line": 4' in bad["reason"] and '"start_line": 3' in bad["reason"]
    late = S.judge_replay(a, a, other, URL, None)
    assert late["status"] == "fail" and late["reason"].startswith("the replay after /flush_cache differs")
    noflush = S.judge_replay(a, a, None, URL, "http://w/flush_cache: HTTP 400 Flush cache failed")
    assert noflush["status"] == "pass" and noflush["reason"].endswith("; not after a flush: http://w/flush_cache: "
                                                                      "HTTP 400 Flush cache failed")
    err = S.judge_replay(a, C.TurnResult(http_status=500, error="HTTP 500: boom"), None, URL, "x")
    assert err["status"] == "fail" and "differs from the first computation: HTTP 500: boom" in err["reason"]
    assert S.judge_replay(C.TurnResult(http_status=200, content="no"), a, a, URL, None)["status"] == "skip"
