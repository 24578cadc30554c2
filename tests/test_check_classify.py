"""dsv4ctl.check.classify and dsv4ctl.check.stats: pure cores, exhaustively."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4ctl.check import classify as C
from dsv4ctl.check import stats as S

BAR = "\uff5c"
DSML_BLOCK = (f"\n\n<{BAR}DSML{BAR}tool_calls>\n<{BAR}DSML{BAR}invoke name=\"get_weather\">\n"
              f"<{BAR}DSML{BAR}parameter name=\"city\" string=\"true\">San Francisco</{BAR}DSML{BAR}parameter>\n"
              f"</{BAR}DSML{BAR}invoke>\n</{BAR}DSML{BAR}tool_calls>")
TOOLS = C.tool_specs([
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "required": ["city"],
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                       "unit": {"type": "string", "enum": ["c", "f"]}}}}},
    {"type": "function", "function": {"name": "list_files", "parameters": {"type": "object", "properties": {}}}},
])


def call(args: str, name: str = "get_weather", index: int = 0) -> C.ToolCall:
    return C.ToolCall(index=index, id=f"call_{index}", name=name, arguments=args)


def verdict(**kw) -> C.Verdict:
    requires = kw.pop("requires_tool", True)
    return C.classify(C.TurnResult(**kw), requires_tool=requires, tools=TOOLS)


# --- classify: one test per class, plus precedence ------------------------------------------
def test_valid_tool_call_is_ok():
    v = verdict(tool_calls=[call('{"city": "San Francisco", "days": 3}')], finish_reason="tool_calls")
    assert (v.cls, v.flags, v.ok) == ("ok", (), True)


def test_valid_answer_turn_without_tool_is_ok():
    v = verdict(content="Here is the summary.", finish_reason="stop", requires_tool=False)
    assert v.ok


def test_dsml_markup_in_content_is_the_incident_class():
    # reference §5.4: raw markup leaks into content, no tool_calls, finish_reason stop
    v = verdict(content=DSML_BLOCK, finish_reason="stop")
    assert v.cls == C.DSML_IN_CONTENT
    assert v.flags == (C.DSML_IN_CONTENT, C.NO_TOOL_CALL)
    assert "DSML" in v.reason


def test_dsml_in_content_flags_even_when_no_tool_required():
    v = verdict(content="sure" + DSML_BLOCK, finish_reason="stop", requires_tool=False)
    assert v.flags == (C.DSML_IN_CONTENT,)


def test_ascii_bar_spelling_is_markup_unless_quoted():
    # issue 14: leaks with other bar characters are leaks; quoted markup is a note, not corruption
    v = verdict(content="<|DSML|tool_calls> is how the docs spell it", requires_tool=False)
    assert (v.cls, v.reason) == (C.DSML_IN_CONTENT, "DSML '<|DSML|tool_calls>' in content")
    v = verdict(content="`<|DSML|tool_calls>` is how the docs spell it", requires_tool=False)
    assert v.ok and v.notes == ("quoted DSML '<|DSML|tool_calls>' in a code span",)


def test_v31_tool_tokens_in_content_count_as_markup():
    # field report T1 synthetic input
    content = (f"<{BAR}tool\u2581calls\u2581begin{BAR}><{BAR}tool\u2581call\u2581begin{BAR}>function"
               f"<{BAR}tool\u2581sep{BAR}>get_weather\n```json\n{{\"city\":\"X\"}}\n```")
    v = verdict(content=content, finish_reason="stop")
    assert v.cls == C.DSML_IN_CONTENT


@pytest.mark.parametrize("tag", ["<think>", "</think>"])
def test_think_tags_in_content(tag):
    v = verdict(content=f"... the hook runs before render {tag} React was gebraten ...",
                requires_tool=False, finish_reason="stop")
    assert (v.cls, v.flags) == (C.THINK_IN_CONTENT, (C.THINK_IN_CONTENT,))


def test_think_tag_in_reasoning_content_is_fine():
    v = verdict(reasoning="<think>plan</think>", content="done", requires_tool=False)
    assert v.ok


def test_no_tool_call_where_required():
    v = verdict(content="I would call get_weather now.", finish_reason="stop")
    assert (v.cls, v.flags) == (C.NO_TOOL_CALL, (C.NO_TOOL_CALL,))
    assert "finish_reason stop" in v.reason


def test_length_mid_call_with_truncated_arguments():
    # reference §5.4: tool_calls present with truncated arguments, finish_reason length
    v = verdict(tool_calls=[call('{"city": "San Fr')], finish_reason="length")
    assert v.cls == C.LENGTH_MID_CALL
    assert v.flags == (C.LENGTH_MID_CALL, C.ARGS_NOT_JSON)


def test_length_without_tool_call_where_required():
    # field report T4: finish_reason length with zero tool calls
    v = verdict(content="## Fixed Config\n| Column | B\n" * 5, finish_reason="length")
    assert v.flags == (C.LENGTH_MID_CALL, C.NO_TOOL_CALL)


def test_length_on_answer_turn_is_not_mid_call():
    v = verdict(content="long prose", finish_reason="length", requires_tool=False)
    assert v.ok


def test_arguments_not_json():
    # reference §5.4: string="false" value that is not JSON
    v = verdict(tool_calls=[call('{"city": "San Francisco", "days": three days}')], finish_reason="tool_calls")
    assert (v.cls, v.flags) == (C.ARGS_NOT_JSON, (C.ARGS_NOT_JSON,))


def test_empty_arguments_string_is_not_json():
    assert verdict(tool_calls=[call("")]).cls == C.ARGS_NOT_JSON


def test_empty_object_for_tool_with_required_parameters():
    # reference §5.4: JSON-body invoke -> arguments "{}"
    v = verdict(tool_calls=[call("{}")], finish_reason="tool_calls")
    assert (v.cls, v.flags) == (C.EMPTY_ARGS, (C.EMPTY_ARGS,))
    assert "city" in v.reason


def test_empty_object_for_zero_argument_tool_is_ok():
    assert verdict(tool_calls=[call("{}", name="list_files")]).ok


@pytest.mark.parametrize("args,needle", [
    ('{"days": 3}', "'city' is a required property"),
    ('{"city": 7}', "city: 7 is not of type 'string'"),
    ('{"city": "X", "days": "3"}', "days: '3' is not of type 'integer'"),
    ('{"city": "X", "unit": "kelvin"}', "unit: 'kelvin' is not one of ['c', 'f']"),
])
def test_arguments_against_schema(args, needle):
    v = verdict(tool_calls=[call(args)])
    assert v.cls == C.ARGS_SCHEMA
    assert needle in v.reason


def test_arguments_not_an_object():
    v = verdict(tool_calls=[call("[1, 2]")])
    assert v.cls == C.ARGS_SCHEMA and "list" in v.reason


def test_undeclared_tool_name():
    v = verdict(tool_calls=[call('{"x": 1}', name="rm_rf")])
    assert v.cls == C.ARGS_SCHEMA and "not declared" in v.reason


def test_second_call_is_checked_too():
    v = verdict(tool_calls=[call('{"city": "A"}'), call("{}", index=1)])
    assert v.cls == C.EMPTY_ARGS and "call 1" in v.reason


def test_stuck_and_http_error_short_circuit():
    assert verdict(stalled=True, http_status=None, content=DSML_BLOCK).cls == C.STUCK
    v = verdict(http_status=503, content=DSML_BLOCK)
    assert (v.cls, v.flags, v.reason) == (C.HTTP_ERROR, (C.HTTP_ERROR,), "HTTP 503")
    v = verdict(http_status=None, error="connection reset")
    assert (v.cls, v.reason) == (C.HTTP_ERROR, "connection reset")


def test_every_class_has_a_description():
    assert set(C.DESCRIPTIONS) == set(C.CLASSES) | {C.OK}


# --- SSE decoding and stream assembly --------------------------------------------------------
def sse(chunks: list[dict], done: bool = True, eol: str = "\n") -> bytes:
    out = "".join(f"data: {json.dumps(c, ensure_ascii=False)}{eol}{eol}" for c in chunks)
    if done:
        out += f"data: [DONE]{eol}{eol}"
    return out.encode()


def chunk(delta: dict | None = None, finish: str | None = None, cid: str = "chatcmpl-1") -> dict:
    return {"id": cid, "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"reasoning_content": None, **(delta or {})},
                         "logprobs": None, "finish_reason": finish, "matched_stop": None}]}


STREAM_CALL = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"tool_calls": [{"id": "call_ab", "index": 0, "type": "function",
                           "function": {"name": "get_weather", "arguments": ""}}]}),
    *[chunk({"tool_calls": [{"index": 0, "type": "function", "function": {"arguments": p}}]})
      for p in ["{", '"city"', ": ", '"', "San Franci", 'sco"', "}"]],
    chunk({"tool_calls": [{"id": "call_cd", "index": 1, "type": "function",
                           "function": {"name": "list_files", "arguments": ""}}]}),
    chunk({"tool_calls": [{"index": 1, "type": "function", "function": {"arguments": "{}"}}]}),
    chunk({}, finish="tool_calls"),
]


def assemble(raw: bytes, splits: list[int] | None = None, require_done: bool = True) -> C.TurnResult:
    dec, asm = C.SSEDecoder(), C.StreamAssembler()
    cuts = sorted(set(splits or [])) + [len(raw)]
    prev = 0
    for c in cuts:
        asm.feed_payloads(dec.feed(raw[prev:c]))
        prev = c
    asm.feed_payloads(dec.close())
    return asm.result(require_done=require_done)


@pytest.mark.parametrize("payloads,error", [
    (['{"choices": []}', '{"choices": []}', "[DONE]"], None),
    (['{"choices": []}', "{oops"], "not JSON"),
    (['{"choices": []},{"choices": []}', '{"choices": []}'], "not JSON"),     # two values in one payload
    (['{"choices": [', "]}"], "not JSON"),                                     # one value over two payloads
    (['{"choices": []}', "[DONE]", '{"choices": []}'], None),                 # [DONE] not last: parsed alone
    (["1", "2"], "not a JSON object"),
])
def test_batched_payloads_are_as_strict_as_single_ones(payloads, error):
    asm = C.StreamAssembler()
    if error:
        with pytest.raises(C.ProtocolError, match=error):
            asm.feed_payloads(payloads)
    else:
        asm.feed_payloads(payloads)
        assert asm.done and asm.chunks == len(payloads) - 1


def test_stream_tool_calls_assembled_per_index():
    r = assemble(sse(STREAM_CALL))
    assert [(c.index, c.id, c.name, c.arguments) for c in r.tool_calls] == [
        (0, "call_ab", "get_weather", '{"city": "San Francisco"}'), (1, "call_cd", "list_files", "{}")]
    assert r.finish_reason == "tool_calls" and r.response_id == "chatcmpl-1"
    assert C.classify(r, requires_tool=True, tools=TOOLS).ok


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(sse(STREAM_CALL, eol="\r\n"))), max_size=12),
       st.sampled_from(["\n", "\r\n", "\r"]))
def test_any_byte_split_and_line_ending_gives_the_same_turn(splits, eol):
    raw = sse(STREAM_CALL, eol=eol)
    r = assemble(raw, [s for s in splits if s <= len(raw)])
    assert [(c.name, c.arguments) for c in r.tool_calls] == [
        ("get_weather", '{"city": "San Francisco"}'), ("list_files", "{}")]


def test_markup_split_across_sse_chunks_is_detected():
    pieces = [DSML_BLOCK[i:i + 3] for i in range(0, len(DSML_BLOCK), 3)]   # no chunk holds a whole tag
    assert not any(C.DSML_MARK in p for p in pieces)
    raw = sse([chunk({"role": "assistant", "content": ""})] + [chunk({"content": p}) for p in pieces]
              + [chunk({}, finish="stop")])
    r = assemble(raw, splits=list(range(0, len(raw), 7)))
    v = C.classify(r, requires_tool=True, tools=TOOLS)
    assert v.flags == (C.DSML_IN_CONTENT, C.NO_TOOL_CALL)


def test_utf8_bar_split_inside_a_multibyte_sequence():
    raw = sse([chunk({"content": DSML_BLOCK}), chunk({}, finish="stop")])
    i = raw.index(BAR.encode()) + 1          # cut inside the 3-byte U+FF5C
    assert assemble(raw, [i]).content == DSML_BLOCK


def test_sse_comments_multiline_data_and_missing_final_blank_line():
    dec = C.SSEDecoder()
    assert dec.feed(b": keep-alive\n\ndata: a\ndata: b\nevent: x\n\nda") == ["a\nb"]
    assert dec.feed(b"ta:no-space\n") == []
    assert dec.close() == ["no-space"]


def test_stream_without_done_is_a_protocol_error():
    with pytest.raises(C.ProtocolError, match=r"\[DONE\]"):
        assemble(sse(STREAM_CALL, done=False))


def test_stream_garbage_and_error_objects():
    asm = C.StreamAssembler()
    with pytest.raises(C.ProtocolError, match="not JSON"):
        asm.feed_payload("{oops")
    with pytest.raises(C.ProtocolError, match="boom"):
        asm.feed_payload(json.dumps({"error": {"message": "boom"}}))
    with pytest.raises(C.ProtocolError, match="index"):
        asm.feed_chunk(chunk({"tool_calls": [{"function": {"name": "x"}}]}))


def test_usage_chunk_and_other_choice_indices_ignored():
    asm = C.StreamAssembler()
    other = chunk({"content": "other choice"})
    other["choices"][0]["index"] = 1
    asm.feed_chunk(other)
    asm.feed_chunk({"id": "x", "choices": [], "usage": {"prompt_tokens": 5}})
    asm.feed_payload("[DONE]")
    r = asm.result()
    assert (r.content, r.usage) == ("", {"prompt_tokens": 5})


def test_parse_non_streaming_completion():
    body = {"id": "chatcmpl-9", "object": "chat.completion", "choices": [{
        "index": 0, "finish_reason": "tool_calls",
        "message": {"role": "assistant", "content": "", "reasoning_content": None, "tool_calls": [
            {"id": "call_x", "index": 0, "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5}}
    r = C.parse_completion(body)
    assert (r.tool_calls[0].name, r.tool_calls[0].arguments, r.finish_reason, r.response_id) == (
        "get_weather", '{"city": "Paris"}', "tool_calls", "chatcmpl-9")
    body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}
    assert json.loads(C.parse_completion(body).tool_calls[0].arguments) == {"city": "Paris"}
    with pytest.raises(C.ProtocolError, match="no choices"):
        C.parse_completion({"choices": []})
    with pytest.raises(C.ProtocolError, match="bad request"):
        C.parse_completion({"error": {"message": "bad request"}})


# --- stats ----------------------------------------------------------------------------------
@pytest.mark.parametrize("k,n,lo,hi", [
    # Newcombe (1998), Statistics in Medicine 17:857, Table II, method 3 (Wilson score)
    (81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718),
])
def test_wilson_matches_newcombe_table(k, n, lo, hi):
    a, b = S.wilson(k, n)
    assert (round(a, 4), round(b, 4)) == (lo, hi)


def test_wilson_edges_and_errors():
    assert S.wilson(0, 0) == (0.0, 1.0)
    assert S.wilson(5, 5)[1] == 1.0
    assert S.wilson(0, 10)[1] == pytest.approx(S.z_value() ** 2 / (10 + S.z_value() ** 2))
    assert S.z_value(0.95) == pytest.approx(1.959964, abs=1e-6)
    for bad in [(-1, 3), (4, 3), (0, -1)]:
        with pytest.raises(ValueError):
            S.wilson(*bad)
    with pytest.raises(ValueError):
        S.z_value(1.0)


def test_gate_needs_enough_turns_at_zero_failures():
    # 0 failures pass a 1 % gate only with n >= 381 (upper bound z²/(n+z²) <= 0.01)
    assert S.wilson(0, 380)[1] > 0.01 >= S.wilson(0, 381)[1]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2000), st.integers(1, 2000))
def test_wilson_contains_the_point_estimate(k, n):
    k = min(k, n)
    lo, hi = S.wilson(k, n)
    assert 0 <= lo <= k / n <= hi <= 1


@pytest.mark.parametrize("a,b,lo,hi", [
    # Newcombe (1998), Statistics in Medicine 17:873, Table II, method 10
    ((56, 70), (48, 80), 0.0524, 0.3339), ((9, 10), (3, 10), 0.1705, 0.8090),
])
def test_newcombe_difference_interval(a, b, lo, hi):
    d, x, y = S.newcombe_diff(*a, *b)
    assert d == pytest.approx(a[0] / a[1] - b[0] / b[1])
    assert (round(x, 4), round(y, 4)) == (lo, hi)
    with pytest.raises(ValueError):
        S.newcombe_diff(1, 0, 1, 1)


@pytest.mark.parametrize("t,p", [
    ((8, 10, 1, 6), 0.034965),       # SciPy docs example fisher_exact([[8, 2], [1, 5]])
    ((3, 4, 1, 4), 0.485714),        # Fisher's lady tasting tea
    ((0, 100, 0, 100), 1.0),
    ((72, 480, 0, 480), 0.0),
])
def test_fisher_exact(t, p):
    assert S.fisher_exact(*t) == pytest.approx(p, abs=1e-6)
    with pytest.raises(ValueError):
        S.fisher_exact(5, 4, 0, 1)


def test_percentile_linear():
    assert S.percentile([], 50) is None
    assert S.percentile([3, 1, 2], 50) == 2
    assert S.percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    assert S.percentile([5], 99) == 5
    with pytest.raises(ValueError):
        S.percentile([1], 101)


# --- size limits and JSON shapes (hostile servers) ---------------------------------------------
def test_sse_line_over_limit_is_a_protocol_error_without_keeping_it():
    d = C.SSEDecoder()
    assert d.feed(b"data: " + b"x" * (C.MAX_SSE_LINE - 6)) == []
    with pytest.raises(C.ProtocolError, match=f"SSE line longer than {C.MAX_SSE_LINE} bytes"):
        d.feed(b"xx")
    # many data lines of one event that together exceed the limit
    d = C.SSEDecoder()
    line = b"data: " + b"y" * 1000 + b"\n"
    with pytest.raises(C.ProtocolError, match="SSE event data longer than"):
        for _ in range(C.MAX_SSE_LINE // 1000 + 2):
            d.feed(line)
    with pytest.raises(C.ProtocolError, match="not UTF-8"):
        C.SSEDecoder().feed(b"data: \xff\xfe\n\n")


def test_assembled_content_over_limit_is_a_protocol_error():
    a = C.StreamAssembler()
    piece = "z" * (1 << 20)
    for _ in range(C.MAX_CONTENT >> 20):
        a.feed_chunk({"choices": [{"index": 0, "delta": {"content": piece}}]})
    with pytest.raises(C.ProtocolError, match=f"assembled response longer than {C.MAX_CONTENT} characters"):
        a.feed_chunk({"choices": [{"index": 0, "delta": {"reasoning_content": "z"}}]})
    a = C.StreamAssembler()
    with pytest.raises(C.ProtocolError, match="assembled response longer"):
        for i in range(C.MAX_CONTENT // 64 + 1):     # endless distinct tool-call indexes
            a.feed_chunk({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i}]}}]})


@pytest.mark.parametrize("chunk,msg", [
    ({"choices": [None]}, "choices[] is NoneType, not an object"),
    ({"choices": "x"}, "choices is str, not a list"),
    ({"choices": [], "usage": "lots"}, "usage is str, not an object"),
    ({"choices": [{"index": 0, "delta": {"content": ["a"]}}]}, "delta.content is list, not a string"),
    ({"choices": [{"index": 0, "delta": "hi"}]}, "delta is str, not an object"),
    ({"choices": [{"index": 0, "delta": {"tool_calls": [None]}}]}, "tool_calls[] is NoneType, not an object"),
    ({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": True}]}}]}, "without an integer index"),
    ({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": 5}}]}}]},
     "function.name is int, not a string"),
    ({"choices": [{"index": 0, "finish_reason": 7}]}, "finish_reason is int, not a string"),
    ({"id": [1], "choices": []}, "id is list, not a string"),
    # falsy values of the wrong type (feed_chunk's inlined checks must refuse them too)
    ({"choices": [{"index": 0, "delta": 0}]}, "delta is int, not an object"),
    ({"choices": [{"index": 0, "delta": []}]}, "delta is list, not an object"),
    ({"choices": [{"index": 0, "delta": {"content": 0}}]}, "delta.content is int, not a string"),
    ({"choices": [{"index": 0, "delta": {"reasoning_content": False}}]}, "delta.reasoning_content is bool, not a string"),
    ({"choices": [{"index": 0, "delta": {"content": "", "tool_calls": {}}}]}, "delta.tool_calls is dict, not a list"),
    ({"choices": [{"index": 0, "finish_reason": 0}]}, "finish_reason is int, not a string"),
    ({"choices": {}}, "choices is dict, not a list"),
])
def test_stream_chunks_of_the_wrong_shape_are_protocol_errors(chunk, msg):
    with pytest.raises(C.ProtocolError) as e:
        C.StreamAssembler().feed_chunk(chunk)
    assert str(e.value).endswith(msg)


@pytest.mark.parametrize("body,msg", [
    ({"choices": [None]}, "choices[0] is NoneType, not an object"),
    ({"choices": [{"message": "hi"}]}, "message is str, not an object"),
    ({"choices": [{"message": {"content": "ok"}}], "usage": "lots"}, "usage is str, not an object"),
    ({"choices": [{"message": {"content": ["a"]}}]}, "message.content is list, not a string"),
    ({"choices": [{"message": {"tool_calls": {"a": 1}}}]}, "message.tool_calls is dict, not a list"),
    ({"choices": [{"message": {"tool_calls": [{"function": {"name": 5}}]}}]}, "function.name is int, not a string"),
    ({"choices": [{"message": {}, "finish_reason": 7}]}, "finish_reason is int, not a string"),
])
def test_completions_of_the_wrong_shape_are_protocol_errors(body, msg):
    with pytest.raises(C.ProtocolError) as e:
        C.parse_completion(body)
    assert str(e.value) == msg


def test_completion_with_good_usage_keeps_it():
    r = C.parse_completion({"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}],
                            "usage": {"completion_tokens": 3}})
    assert (r.content, r.finish_reason, r.usage) == ("ok", "stop", {"completion_tokens": 3})


def test_too_many_content_chunks_is_a_protocol_error(monkeypatch):
    # each piece is a kept string and an inter-token gap: tiny pieces must not dodge MAX_CONTENT
    from dsv4ctl.check.classify import protocol
    assert C.MAX_PIECES == protocol.MAX_PIECES == 1 << 20
    monkeypatch.setattr(protocol, "MAX_PIECES", 5)     # the limit lives with the stream assembler
    a = C.StreamAssembler()
    for _ in range(5):
        a.feed_chunk({"choices": [{"index": 0, "delta": {"content": "ab"}}]})
    a.feed_chunk({"choices": [{"index": 0, "delta": {}}]})          # no piece: not counted
    with pytest.raises(C.ProtocolError, match="more than 5 content chunks in one response"):
        a.feed_chunk({"choices": [{"index": 0, "delta": {"content": "ab"}}]})


def test_pd_aborts_have_classes_of_their_own():
    """SGLang 0.5.23 PD aborts a request whose KV transfer or bootstrap failed with HTTP 500 and
    its own message (srt/disaggregation/decode.py, prefill.py): no answer to judge, but not a
    plain http_error either."""
    specs = TOOLS
    for msg, cls in [
        ("HTTP 500: {\"message\": \"Decode transfer failed for request rank=3 decode_req.req.rid='x' "
         "decode_req.req.bootstrap_room=7 with exception KVTransferError\"}", C.PD_TRANSFER),
        ("HTTP 500: Prefill transfer failed for request rank=0 req.rid='y'", C.PD_TRANSFER),
        ("HTTP 500: Decode handshake failed for request rank=1 decode_req.req.rid='z'", C.PD_BOOTSTRAP),
        ("HTTP 500: Prefill bootstrap failed for request rank=0", C.PD_BOOTSTRAP),
        ("HTTP 500: Internal Server Error", C.HTTP_ERROR),
        ("HTTP 503: the transfer failed", C.HTTP_ERROR),
    ]:
        v = C.classify(C.TurnResult(http_status=500, error=msg), requires_tool=True, tools=specs)
        assert (v.cls, v.flags, v.reason) == (cls, (cls,), msg), msg
    assert set(C.NO_ANSWER) == {C.HTTP_ERROR, C.PD_TRANSFER, C.PD_BOOTSTRAP, C.PD_ABORTED, C.STUCK}
    assert all(c in C.DESCRIPTIONS for c in C.CLASSES)


def test_language_drift_is_judged_against_the_prompts_script():
    """A short answer wholly in another language passes the mid-answer switch rule; with the
    prompt's script known it is drift. English identifiers in Chinese prose do not make it
    English, and an English answer that names identifiers or quotes Chinese is not drift."""
    zh = "负载均衡器把请求分给两台推理服务器，`kv_cache` 和 torch.cuda 的显存由各自的服务器管理。"
    assert C.find_language_switch(zh) is None                       # too short for the switch rule
    script, share = C.find_language_drift(zh, "Latin")
    assert script == "CJK" and share == 1.0                           # kv_cache / torch.cuda cut as identifiers
    v = C.classify(C.TurnResult(http_status=200, content=zh, finish_reason="stop"), requires_tool=False,
                   tools=TOOLS, expected_script="Latin")
    assert v.cls == C.LANGUAGE_DRIFT and v.reason.startswith("content is 100% CJK letters; the prompt asked for Latin")
    assert C.classify(C.TurnResult(http_status=200, content=zh, finish_reason="stop"), requires_tool=False,
                      tools=TOOLS).ok                                  # not judged without an expected script
    en = ("It spreads requests across both servers; `torch.cuda.mem_get_info` and kv_cache_dtype stay per server, "
          "and the log line \u201c负载均衡器已启动\u201d means it started.")
    assert C.find_language_drift(en, "Latin") is None
    assert C.find_language_drift("好的", "Latin") is None              # under 20 letters: no verdict
    assert C.find_language_drift("Балансировщик распределяет запросы между двумя серверами.", "Latin")[0] == "Cyrillic"


def test_language_drift_fast_path_gives_the_full_judgement():
    """Expecting Latin, a text without a letter of another script is cleared by one scan; on
    every kind of text the answer is that of the full count (``_drift``), with or without one."""
    from dsv4ctl.check.classify.language import _drift
    texts = ["The scheduler admits requests once enough pages are free. " * 8,
             "Le planificateur accepte les requêtes dès que les pages sont libres, déjà réservées. " * 4,
             "Straße, Ærø, naïve café: ÀÉÎÕÜ ŁŒŠŽ ḀṩỲ — “quoted” … " * 6,
             "x" * 30, "12345 6789 ___ ::: //", "",
             "負載均衡器把請求分給兩台推理服務器。" * 3, "Ελληνικά γράμματα για το φορτίο των διακομιστών. " * 2,
             "English prose with one word 请求 inside and more English prose around it here. " * 2,
             "שלום עולם, זהו טקסט בעברית לבדיקה ארוכה מספיק. " * 2, "नमस्ते दुनिया यह एक परीक्षण पाठ है " * 2]
    for t in texts:
        for expected in ("Latin", "CJK", "Cyrillic"):
            assert C.find_language_drift(t, expected) == _drift(t, expected), (t[:40], expected)
    assert C.find_language_drift(texts[6], "Latin")[0] == "CJK"
    assert C.find_language_drift(texts[1], "Latin") is None and C.find_language_drift(texts[1], "CJK")[0] == "Latin"
