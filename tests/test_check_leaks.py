"""dsv4ctl.check.classify: every leak shape is a class (issue 14 item 3), and clean traffic is not."""

from __future__ import annotations

import json
import random

import pytest

from dsv4ctl.check import classify as C
from dsv4ctl.check.workload import TOOL_RESULT, TOOLS

SPECS = C.tool_specs(TOOLS)
BAR = "\uff5c"
FW, DV = "\uff5c", "\u2016"          # U+FF5C ｜ (what DeepSeek emits), U+2016 ‖
EOS = f"<{FW}end\u2581of\u2581sentence{FW}>"


def verdict(content: str = "", reasoning: str = "", *, requires_tool: bool = False, tool_calls=(),
            finish_reason: str | None = "stop", **kw) -> C.Verdict:
    turn = C.TurnResult(content=content, reasoning=reasoning, tool_calls=list(tool_calls), finish_reason=finish_reason)
    return C.classify(turn, requires_tool=requires_tool, tools=SPECS, **kw)


def run_command(args) -> C.ToolCall:
    return C.ToolCall(0, "call_0", "run_command", args if isinstance(args, str) else json.dumps(args))


PROSE = (
    "I read src/scheduler/router.py and src/cache/prefix.py. The slow path is in handler 17: every request "
    "rebuilds the prefix key from the full message list, so a session of eight turns hashes the shared system "
    "prompt eight times and never hits the radix cache when the tool result changes by one line. The batch "
    "builder then waits for the longest prefill in the group, which is why latency grows with the number of "
    "open sessions rather than with the number of tokens. I would change three things. First, compute the "
    "prefix key once per session and extend it with each new message instead of starting over. Second, move "
    "the tool-result formatting out of the hot path; it allocates a new string per line. Third, add a metric "
    "for cache misses per request so the next regression shows up on the dashboard before users notice it. "
    "None of this touches the public API, and the existing tests in tests/test_router.py cover the key "
    "builder, so the change can land behind the current feature flag and be rolled back in one step.")
ZH = ("我检查了调度器和前缀缓存的代码。每个请求都会从完整的消息列表重新计算前缀键，所以同一个会话的八轮对话会把共享的系统提示"
      "重复哈希八次，工具结果只要改变一行就无法命中基数缓存。批处理构建器还会等待组内最长的预填充，因此延迟随打开的会话数增长，"
      "而不是随令牌数增长。建议每个会话只计算一次前缀键，并在新消息到来时增量扩展。")


def test_clean_prose_and_cjk_answers_are_ok():
    assert verdict(PROSE).ok and verdict(PROSE, reasoning=PROSE).ok
    assert verdict(ZH).ok and verdict("Summary: " + ZH).ok


# --- 1. DSML in content, every spelling ---------------------------------------------------------
@pytest.mark.parametrize("spelling", [
    f"<{FW}DSML{FW}tool_calls>",               # V4, U+FF5C (the incident)
    f"</{FW}DSML{FW}invoke>",
    f"<{DV}DSML{DV}tool_calls>",               # U+2016
    "<|DSML|tool_calls>",                      # ASCII bars (the cookbook's spelling)
    "<||DSML||invoke",                         # doubled ASCII bars
    f"<{FW}{FW}DSML{FW}{FW}tool_calls>",       # doubled wide bars
    f"<{FW}DSML|parameter",                    # mixed bars
    f"<{FW}DSML{FW} calls>",                   # V4.1 spaced tags
    f"<{FW}DSML{FW} invoke",
    f"<{FW}DSML{FW} parameter",
    f"<{FW}DSML{FW}function_calls>",           # V3.2 block name
    f"{FW}DSML{FW}invoke",                     # "<" lost
    f"{DV}DSML{DV}",
])
def test_dsml_in_content_names_the_spelling(spelling):
    v = verdict(f"Let me check the file.\n\n{spelling} name=\"read_file\">")
    assert (v.cls, v.flags) == (C.DSML_IN_CONTENT, (C.DSML_IN_CONTENT,))
    assert v.reason == f"DSML {spelling!r} in content"


def test_dsml_reason_is_the_first_spelling_and_eos_is_a_second_flag():
    block = f"\n\n<{FW}DSML{FW} calls>\n<{FW}DSML{FW} invoke name=\"x\">\n</{FW}DSML{FW} calls>{EOS}"
    v = verdict("ok" + block, requires_tool=True)
    assert v.flags == (C.DSML_IN_CONTENT, C.SPECIAL_TOKEN_LEAK, C.NO_TOOL_CALL)
    assert v.reason == f"DSML '<{FW}DSML{FW} calls>' in content"


@pytest.mark.parametrize("text", [
    "| DSML | yes | 3 |\n|---|---|---|\n| JSON | no | 1 |",     # a Markdown table cell
    "|DSML|x|", "DSML is DeepSeek's tool-call markup language.", "a | b || c <| d |>", "x <- y | z",
    "if a <|> b", "<div class=\"DSML\">", "the DSML | tool calls",
])
def test_dsml_lookalikes_are_not_markup(text):
    assert verdict(text).ok


# --- 2. DSML in reasoning_content ----------------------------------------------------------------
@pytest.mark.parametrize("spelling", [f"<{FW}DSML{FW}invoke", "<|DSML|tool_calls>", f"<{DV}DSML{DV} calls>",
                                      f"<{FW}tool\u2581calls\u2581begin{FW}>"])
def test_dsml_in_reasoning(spelling):
    v = verdict("Done.", reasoning=f"I should call read_file.\n\n{spelling} name=\"read_file\">")
    assert (v.cls, v.flags) == (C.DSML_IN_REASONING, (C.DSML_IN_REASONING,))
    assert repr(spelling) in v.reason and "reasoning_content" in v.reason


def test_reasoning_with_think_tags_or_quoted_dsml_is_fine():
    assert verdict("Done.", reasoning="<think>plan</think>").ok
    v = verdict("Done.", reasoning=f"The format is `<{FW}DSML{FW}invoke name=...>`, so ...")
    assert v.ok and v.notes == (f"quoted DSML '<{FW}DSML{FW}invoke' in a code span of reasoning_content",)


# --- 3. markup inside tool-call arguments ---------------------------------------------------------
@pytest.mark.parametrize("args,spelling,where", [
    ({"command": f"ls\n<{FW}DSML{FW}parameter name=\"x\">", "timeout_s": 5}, f"<{FW}DSML{FW}parameter", "command"),
    ({"command": "ls </think> -la", "timeout_s": 5}, "</think>", "command"),
    ({"command": f"ls{EOS}", "timeout_s": 5}, EOS, "command"),
    ({"command": "ls", "timeout_s": 5, "env": {"A": ["x", "<|im_end|>"]}}, "<|im_end|>", "env.A[1]"),
    ({"command": "ls", "timeout_s": 5, f"<{DV}DSML{DV}invoke": 1}, f"<{DV}DSML{DV}invoke", f"<{DV}DSML{DV}invoke (name)"),
])
def test_markup_in_argument_strings(args, spelling, where):
    v = verdict(tool_calls=[run_command(args)], requires_tool=True, finish_reason="tool_calls")
    assert v.cls == C.MARKUP_IN_ARGS
    assert v.reason == f"call 0 'run_command': {spelling!r} in argument {where}"


def test_markup_in_raw_arguments_that_are_not_json():
    raw = f'{{"command": "ls", "timeout_s": <{FW}DSML{FW}parameter name="timeout_s" string="false">5}}'
    v = verdict(tool_calls=[run_command(raw)], requires_tool=True)
    assert v.flags == (C.MARKUP_IN_ARGS, C.ARGS_NOT_JSON)
    assert v.reason == f"call 0 'run_command': '<{FW}DSML{FW}parameter' in the raw arguments"


@pytest.mark.parametrize("command", [
    "cat > index.html <<'EOF'\n<div class=\"x\"><b>hi</b></div>\nEOF",
    "printf '```python\\nprint(1)\\n```' > README.md",
    "grep -E 'a|b' src/*.py | sort | uniq -c",
    "echo '<|' && echo '|>'",
    "python - <<EOF\nx = {'think': 1}  # <thinking> is not a tag we know\nEOF",
])
def test_markup_like_arguments_are_ok(command):
    v = verdict(tool_calls=[run_command({"command": command, "timeout_s": 5})], requires_tool=True)
    assert v.ok, v.reason


def test_allowed_markup_exempts_exactly_the_expected_text():
    args = {"command": "printf '<think>x</think>' > t.txt", "timeout_s": 5}
    assert verdict(tool_calls=[run_command(args)], requires_tool=True).cls == C.MARKUP_IN_ARGS
    v = verdict(tool_calls=[run_command(args)], requires_tool=True, allowed_markup={"<think>", "</think>"})
    assert v.ok
    assert verdict(tool_calls=[run_command(args)], requires_tool=True, allowed_markup="<think>x</think>").ok
    args["command"] += f" && echo <{FW}DSML{FW}invoke"             # other markup is still a leak
    v = verdict(tool_calls=[run_command(args)], requires_tool=True, allowed_markup={"<think>", "</think>"})
    assert v.cls == C.MARKUP_IN_ARGS and "DSML" in v.reason


# --- 4. special tokens in content -----------------------------------------------------------------
@pytest.mark.parametrize("token", [
    EOS, f"<{FW}begin\u2581of\u2581sentence{FW}>", f"<{FW}User{FW}>", f"<{FW}Assistant{FW}>",
    "<|im_start|>", "<|im_end|>", "<|EOT|>", "<|endoftext|>", "<tool_calls>", "</tool_calls>", "<tool_call>",
    f"<{FW}place\u2581holder\u2581no\u25817{FW}>", "<|end\u2581of\u2581sentence|>", f"<{DV}User{DV}>",
])
def test_special_token_leak(token):
    v = verdict(f"The fix is in router.py.{token}")
    assert (v.cls, v.reason) == (C.SPECIAL_TOKEN_LEAK, f"special token {token!r} in content")


def test_v31_tool_tokens_stay_tool_call_markup():
    v = verdict(f"<{FW}tool\u2581calls\u2581begin{FW}><{FW}tool\u2581call\u2581begin{FW}>function"
                f"<{FW}tool\u2581sep{FW}>read_file\n```json\n{{}}\n```<{FW}tool\u2581call\u2581end{FW}>")
    assert v.cls == C.DSML_IN_CONTENT and v.reason.startswith("V3.1 tool token '<")


@pytest.mark.parametrize("text", ["Use <b>bold</b> and <br/>.", "a <| b", "x <tool> y", "<|user|> is ASCII",
                                  "List<String> x = new ArrayList<>();", "if (a < b && c > d) {}",
                                  "`<|im_start|>` is ChatML's", f"use `{EOS}` as the stop string"])
def test_special_token_lookalikes_and_quoted_tokens_are_ok(text):
    assert verdict(text).ok


# --- 5. empty answer at the length limit ------------------------------------------------------------
@pytest.mark.parametrize("content", ["", "  \n\n "])
def test_empty_length(content):
    v = verdict(content, reasoning=PROSE, finish_reason="length")
    assert v.cls == C.EMPTY_LENGTH and "empty content" in v.reason and "thinks until the cap" in v.reason


def test_empty_length_only_on_answer_turns_without_calls():
    assert verdict("Here is a partial summary", finish_reason="length").ok
    assert verdict("", finish_reason="stop").ok
    v = verdict("", finish_reason="length", requires_tool=True)
    assert v.flags == (C.LENGTH_MID_CALL, C.NO_TOOL_CALL)
    v = verdict("", finish_reason="length", tool_calls=[run_command('{"command": "ls", "timeout_s": 5}')])
    assert v.flags == (C.LENGTH_MID_CALL,)


# --- 6. loops ---------------------------------------------------------------------------------------
STANDIN_CLEAN = " ".join(["the", "scheduler", "request", "prefix", "cache", "handler", "route", "batch", "tokens",
                          "latency"][i % 10] for i in range(150)) + "."


def test_the_standin_cyclic_answer_is_a_loop():
    # tests/standin/dsml.py answer_tokens(150) today: a 10-word unit repeated 15 times
    v = verdict(STANDIN_CLEAN)
    assert v.cls == C.NGRAM_LOOP
    assert v.reason == ("content: a 10-word unit repeated over 150 of 150 words: "
                        "'the scheduler request prefix cache handler route batch tokens latency'")


def standin_replacement(words: int, seed: int = 0) -> str:
    """What the stand-in may produce instead (see the report): sentences that carry a counter."""
    sentences = ["the scheduler routes request {n} through the prefix cache",
                 "handler {n} batches its tokens before the decode step",
                 "the latency of batch {n} depends on the cache hit rate"]
    out: list[str] = []
    n = 0
    while len(out) < words:
        out += sentences[n % 3].format(n=n + 1).split()
        n += 1
    return " ".join(out[:words]) + "."


@pytest.mark.parametrize("words", [20, 60, 150, 1000])
def test_a_counter_or_random_words_is_not_a_loop(words):
    assert verdict(standin_replacement(words)).ok
    vocab = STANDIN_CLEAN.rstrip(".").split()[:10]
    rng = random.Random(words)
    assert verdict(" ".join(rng.choice(vocab) for _ in range(words)) + ".").ok


def test_loops():
    v = verdict(PROSE + " " + "I will check the cache again. " * 40, finish_reason="length")
    assert v.cls == C.NGRAM_LOOP and "a 6-word unit" in v.reason
    assert verdict("the " * 80).reason.startswith("content: a 1-word unit repeated over 80 of 80 words")
    v = verdict("Done.", reasoning="Wait, let me re-check the prefix key. " * 30)
    assert v.cls == C.NGRAM_LOOP and v.reason.startswith("reasoning_content: a 8-word unit")
    v = verdict("缓存命中率下降了，" * 20)                                     # CJK: one character, one word
    assert v.cls == C.NGRAM_LOOP and "a 8-word unit" in v.reason
    v = verdict(PROSE + "\n\n```python\n" + "    x = compute(x)\n" * 60)  # a loop never closes its fence
    assert v.cls == C.NGRAM_LOOP


def test_loop_thresholds():
    unit = "alpha beta gamma delta epsilon zeta eta theta iota kappa"          # 10 words

    def fresh(n: int) -> str:
        return " ".join(f"w{i}" for i in range(n))
    assert verdict(fresh(90) + " " + " ".join([unit] * 4)).cls == C.NGRAM_LOOP   # 40 of 130 words: 31 %
    assert verdict(fresh(100) + " " + " ".join([unit] * 4)).ok                  # 40 of 140 words: 29 %
    assert verdict(fresh(30) + " " + " ".join([unit] * 3)).ok                   # 3 copies
    assert verdict(fresh(30) + " " + " ".join([unit] * 3) + " alpha beta gamma").ok
    assert verdict(" ".join([unit] * 5)).ok                                     # 50 words: too short
    assert verdict(" ".join([unit] * 6)).cls == C.NGRAM_LOOP                    # 60 words
    long = fresh(3000) + " " + " ".join([unit] * 40)                            # 400 words, 12 %
    assert verdict(long).cls == C.NGRAM_LOOP and verdict(long[:-len(unit) - 1]).ok


LISTING = "\n".join(f"def handler_{i}(request):\n    if request is None:\n        return None\n"
                    f"    return route(request, {i})\n" for i in range(40))
JS = "\n".join(f"function f{i}(x) {{\n  if (x) {{\n    return g(x, {i});\n  }}\n}}\n}}\n}}" for i in range(40))
TABLE = "| file | status | note |\n|---|---|---|\n" + "\n".join(
    f"| src/mod_{i}.py | ok | unchanged since the last release |" for i in range(40))


@pytest.mark.parametrize("text", [PROSE, LISTING, JS, TABLE, TOOL_RESULT.format(name="read_file") * 3,
                                  "```python\n" + "    x = compute(x)\n" * 60 + "```\n" + PROSE, ZH,
                                  "\n".join(f"{i}. check the prefix cache of handler {i}" for i in range(1, 60))])
def test_listings_tables_and_prose_are_not_loops(text):
    assert C.find_loop(text) is None


# --- 7. language switch -------------------------------------------------------------------------------
def test_english_then_cjk_or_cyrillic():
    v = verdict(PROSE[:300] + " 然后我们需要检查调度器中的前缀缓存命中率以及批处理的延迟情况。")
    assert v.cls == C.LANGUAGE_SWITCH
    assert v.reason.startswith("content switches from Latin to CJK after ")
    v = verdict(PROSE[:300] + " Затем нужно проверить кэш префиксов и задержку пакетов.")
    assert v.cls == C.LANGUAGE_SWITCH and "from Latin to Cyrillic" in v.reason
    # English terms inside the switched stretch do not end it
    v = verdict(PROSE[:300] + " 然后检查 HiCache 的配置，再重启 SGLang 服务器并观察前缀缓存的命中率。")
    assert v.cls == C.LANGUAGE_SWITCH


def test_cjk_then_english():
    v = verdict(ZH + " Then restart the server and compare the cache hit rate before and after the change.")
    assert v.cls == C.LANGUAGE_SWITCH and "from CJK to Latin" in v.reason


@pytest.mark.parametrize("text", [
    ZH, PROSE, PROSE + " (缓存)",
    PROSE + " The Chinese term is “前缀缓存命中率以及批处理的延迟情况和调度器”, as the logs say.",
    PROSE + " The log says `错误：前缀缓存命中率以及批处理的延迟情况和调度器` here.",
    PROSE + "\n```\n# 注释：前缀缓存命中率以及批处理的延迟情况和调度器\n```\n",
    PROSE + " See https://zh.wikipedia.org/wiki/前缀缓存命中率以及批处理的延迟情况和调度器 for details.",
    "Le planificateur réécrit la clé de préfixe à chaque requête ; il faut la calculer une seule fois par "
    "session, puis l'étendre avec chaque nouveau message. Ça évite de hacher l'invite système huit fois.",
    "调度器使用 SGLang 的 HiCache 和 prefix cache hit rate 指标，" + ZH,
    "The latency is λ = 3 μs, the angle α ≈ β, and Δt is small. " + PROSE,
    "English 中文 English 中文 mixed from the start: 调度器缓存命中率以及批处理的延迟情况和前缀键",
])
def test_no_language_switch(text):
    assert C.find_language_switch(text) is None


# --- 8. reasoning merged into content -----------------------------------------------------------------
def test_reasoning_in_content():
    v = verdict("The user wants a summary. I read the router... Summary: change the key.", thinking_requested=True)
    assert v.cls == C.REASONING_IN_CONTENT and "no reasoning parser" in v.reason
    assert verdict("Summary.", reasoning="plan", thinking_requested=True).ok
    assert verdict("Summary.").ok
    assert verdict("", tool_calls=[run_command('{"command": "ls", "timeout_s": 5}')], requires_tool=True,
                   thinking_requested=True).ok


# --- 9. quoted markup is a note, unquoted markup is a leak --------------------------------------------
@pytest.mark.parametrize("text,note", [
    (f"Example: `<{FW}DSML{FW}invoke name=\"x\">`", f"quoted DSML '<{FW}DSML{FW}invoke' in a code span"),
    ("Literal `<think>`", "quoted think tag '<think>' in a code span"),
    (f"The block looks like this:\n\n```xml\n<{FW}DSML{FW}tool_calls>\n<{FW}DSML{FW}invoke name=\"x\"/>\n"
     f"</{FW}DSML{FW}tool_calls>\n```\n\nThat is all.", f"quoted DSML '<{FW}DSML{FW}tool_calls>' in a fenced code block"),
    (f"~~~\n{EOS}\n~~~", f"quoted special token {EOS!r} in a fenced code block"),
    (f"Use ``<{FW}DSML{FW}invoke `name` ``.", f"quoted DSML '<{FW}DSML{FW}invoke' in a code span"),
    ("```` ```\n</think>\n``` ````", "quoted think tag '</think>' in a code span"),
])
def test_quoted_markup_is_a_note(text, note):
    v = verdict(text)
    assert (v.cls, v.notes) == (C.OK, (note,))


@pytest.mark.parametrize("text,cls", [
    (f"Example: <{FW}DSML{FW}invoke name=\"x\">", C.DSML_IN_CONTENT),
    ("Literal <think>", C.THINK_IN_CONTENT),
    (f"`quoted` then <{FW}DSML{FW}invoke and `more`", C.DSML_IN_CONTENT),   # between two spans
    (f"It`s broken <{FW}DSML{FW}invoke", C.DSML_IN_CONTENT),                 # unmatched backtick
    (f"a `b\n\n<{FW}DSML{FW}invoke` c", C.DSML_IN_CONTENT),                 # a span does not cross a blank line
    (f"```\n<{FW}DSML{FW}invoke name=\"x\">", C.DSML_IN_CONTENT),           # an unclosed fence quotes nothing
    (f"```\n``` <{FW}DSML{FW}invoke", C.DSML_IN_CONTENT),                   # after a closed fence
    (f"`<think>` and then </think>", C.THINK_IN_CONTENT),
])
def test_unquoted_markup_is_still_a_leak(text, cls):
    assert verdict(text).cls == cls


def test_code_ranges():
    t = "a `x` b ``y ` z`` c\n```py\nq\n```\nd `e"
    assert [(t[s:e], w) for s, e, w in C.code_ranges(t)] == [
        ("`x`", C.CODE_SPAN), ("``y ` z``", C.CODE_SPAN), ("```py\nq\n```", C.FENCED_BLOCK)]


# --- 10. precedence and descriptions --------------------------------------------------------------
def test_class_order_and_descriptions():
    assert C.CLASSES[:5] == C.NO_ANSWER == (C.HTTP_ERROR, C.PD_TRANSFER, C.PD_BOOTSTRAP, C.PD_ABORTED, C.STUCK)
    leaks = (C.DSML_IN_CONTENT, C.DSML_IN_REASONING, C.SPECIAL_TOKEN_LEAK, C.THINK_IN_CONTENT,
             C.REASONING_IN_CONTENT, C.MARKUP_IN_ARGS, C.MARKUP_CUT)
    degenerate = (C.NGRAM_LOOP, C.EMPTY_LENGTH, C.LANGUAGE_SWITCH, C.LANGUAGE_DRIFT, C.LANGUAGE_MIX)
    shape = (C.LENGTH_MID_CALL, C.NO_TOOL_CALL, C.ARGS_NOT_JSON, C.EMPTY_ARGS, C.ARGS_CUT, C.ARGS_SCHEMA)
    known = (C.WRONG_TOOL, C.MISSING_CALL, C.EXTRA_CALL, C.WRONG_ARGS)
    assert C.CLASSES == C.NO_ANSWER + leaks + degenerate + shape + known
    assert set(C.DESCRIPTIONS) == set(C.CLASSES) | {C.OK} and all(C.DESCRIPTIONS.values())
    assert C.Verdict("ok", (), "ok").notes == ()                        # the old constructor still works


def test_a_loop_that_runs_into_the_cap_is_a_loop_first():
    v = verdict("I will check the cache again. " * 40, requires_tool=True, finish_reason="length")
    assert v.flags == (C.NGRAM_LOOP, C.LENGTH_MID_CALL, C.NO_TOOL_CALL)


# --- streaming: the leak cut at every byte offset ------------------------------------------------------
def test_a_reasoning_leak_split_at_every_byte_offset():
    leak = f"Plan: call read_file.\n\n<{DV}DSML{DV} invoke name=\"read_file\">"
    pieces = [leak[i:i + 3] for i in range(0, len(leak), 3)]
    chunks = ([{"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
              + [{"id": "c", "choices": [{"index": 0, "delta": {"reasoning_content": p}}]} for p in pieces]
              + [{"id": "c", "choices": [{"index": 0, "delta": {"content": "Done."}, "finish_reason": "stop"}]}])
    raw = "".join(f"data: {json.dumps(c, ensure_ascii=False)}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"

    def judge(parts: list[bytes]) -> C.Verdict:
        dec, asm = C.SSEDecoder(), C.StreamAssembler()
        for p in parts:
            asm.feed_payloads(dec.feed(p))
        asm.feed_payloads(dec.close())
        return C.classify(asm.result(), requires_tool=False, tools=SPECS)

    expected = f"DSML '<{DV}DSML{DV} invoke' in reasoning_content"
    for k in range(len(raw) + 1):
        v = judge([raw[:k], raw[k:]])
        assert (v.cls, v.reason) == (C.DSML_IN_REASONING, expected), k
    v = judge([raw[i:i + 1] for i in range(len(raw))])
    assert (v.cls, v.reason) == (C.DSML_IN_REASONING, expected)


# --- found by the adversarial review -----------------------------------------------------------
def test_arguments_nested_too_deep_are_not_json_not_a_traceback():
    v = C.classify(C.TurnResult(tool_calls=[C.ToolCall(0, "c", "read_file", "[" * 100000)]), requires_tool=True,
                   tools=C.tool_specs(TOOLS))
    assert v.cls == C.ARGS_NOT_JSON


def test_duplicate_keys_in_arguments_are_flagged():
    v = C.classify(C.TurnResult(tool_calls=[C.ToolCall(0, "c", "read_file", '{"path": "/etc/shadow", "path": "a.py"}')]),
                   requires_tool=True, tools=C.tool_specs(TOOLS))
    assert v.cls == C.ARGS_NOT_JSON and "duplicate key 'path'" in v.reason


def test_a_stray_backtick_does_not_quote_a_leaked_block():
    leak = f"<{BAR}DSML{BAR}tool_calls>\n<{BAR}DSML{BAR}invoke name=\"run_command\">\n</{BAR}DSML{BAR}invoke>\n</{BAR}DSML{BAR}tool_calls>"
    v = C.classify(C.TurnResult(content="I'll remove the stray ` first.\n" + leak + "\nThen I'll run `pytest`.",
                                finish_reason="stop"), requires_tool=False, tools={})
    assert v.cls == C.DSML_IN_CONTENT


def test_a_loop_of_identical_fenced_blocks_is_a_loop():
    block = "```python\nif request.prefix_len > 0:\n    cache.evict(request.prefix_len)\n    return schedule(request)\n```\n"
    v = C.classify(C.TurnResult(content="Apply:\n" + block * 40, finish_reason="length"), requires_tool=False, tools={})
    assert v.cls == C.NGRAM_LOOP
    two = "Apply:\n" + block + "and then\n" + block.replace("evict", "drop")
    assert C.classify(C.TurnResult(content=two, finish_reason="stop"), requires_tool=False, tools={}).ok


def test_printable_neutralises_terminal_escapes():
    from dsv4ctl.render import printable
    assert printable("a\x1b[2J\x1b]0;PWNED\x07b\tc\nd\x9b") == "a\\x1b[2J\\x1b]0;PWNED\\x07b\tc\nd\\u009b"


# --- quoted markup cut out of prose (SGLang's served path cuts at a quoted DSML or think token) ---------
@pytest.mark.parametrize("content,finish,calls", [
    ("Example:\n```xml", "tool_calls", 1),           # a quoted example executed: the fence is left open
    ("Example:\n~~~xml\n", "tool_calls", 1),
    ("Example: `", "tool_calls", 1),
    ("Example: '", "stop", 0),                       # '<｜DSML｜toolcalls>' cut out of the prose
    ("Example: \u201c", "stop", 0),
    ("Literal `<think>` and `` in an explanation.", "stop", 0),   # `</think>` dropped: an empty span
])
def test_quoted_markup_cut_out_of_content_is_markup_cut(content, finish, calls):
    tcs = [C.ToolCall(0, "c", "read_file", '{"path": "a.py"}')] * calls
    v = verdict(content, tool_calls=tcs, finish_reason=finish, requires_tool=bool(calls))
    assert v.cls == C.MARKUP_CUT and v.flags == (C.MARKUP_CUT,), v


@pytest.mark.parametrize("content", [
    "The answer is 'yes'", "Run `ls` then `pwd`", "He said \u201chi\u201d", "the users' files",
    "```py\nprint(1)\n```", "Use ``a ` b`` here.", "Example: \"x\"", "Ends with a colon:",
    "a``b", "See ``code`` and more.", "Type `` ` `` for a backtick.", "```\ncode\n```",
])
def test_prose_that_closes_its_quotes_is_not_cut(content):
    v = verdict(content)
    assert v.ok, v


def test_an_open_quote_at_the_length_cap_is_not_cut():
    assert verdict("Example:\n```xml", finish_reason="length").ok
    assert C.find_markup_cut("Example: '", at_end=False) is None


@pytest.mark.parametrize("content", [
    f"Example: '<{FW}DSML{FW}toolcalls>'",
    f"Example: \u201c<{FW}DSML{FW}toolcalls>\u201d",
    f"The closer is \"</{FW}DSML{FW}parameter>\" and the opener \u00ab<{FW}DSML{FW}invoke name=\"x\">\u00bb.",
    f"Example: `<{FW}DSML{FW}tool_calls>\n<{FW}DSML{FW}invoke name=\"get_weather\">\n</{FW}DSML{FW}invoke>\n</{FW}DSML{FW}tool_calls>`",
])
def test_one_tag_in_ordinary_quotes_or_a_block_in_backticks_is_a_quote(content):
    v = verdict(content)
    assert v.ok and v.notes and "quoted DSML" in v.notes[0], v


@pytest.mark.parametrize("content", [
    f"It's <{FW}DSML{FW}tool_calls>\n<{FW}DSML{FW}invoke name=\"x\">\n</{FW}DSML{FW}invoke>\n</{FW}DSML{FW}tool_calls> isn't it",
    f"'<{FW}DSML{FW}tool_calls>\n<{FW}DSML{FW}invoke name=\"x\">'",                        # quotes over two tags
    f"Run `ls`\n<{FW}DSML{FW}invoke name=\"x\">\n</{FW}DSML{FW}invoke> then `pwd`",           # spans around a leak
    f"'<{FW}DSML{FW}invoke name=\"x\">",                                                     # no closing quote
])
def test_quotes_that_do_not_hug_one_tag_do_not_hide_a_leak(content):
    assert verdict(content).cls == C.DSML_IN_CONTENT


def test_markup_in_well_formed_arguments_is_legitimate_when_the_calls_match_the_known_answer():
    from dsv4ctl.check import expect as E
    args = {"command": f"cat <<'EOF'\n</{FW}DSML{FW}parameter |\nEOF", "timeout_s": 5}
    turn = C.TurnResult(tool_calls=[run_command(args)], finish_reason="tool_calls")
    assert E.judge(turn, requires_tool=True, tools=SPECS, expected=[{"name": "run_command", "arguments": args}]).ok
    assert E.judge(turn, requires_tool=True, tools=SPECS, expected=[{"name": "run_command", "arguments": None}]).ok
    assert E.judge(turn, requires_tool=True, tools=SPECS).cls == C.MARKUP_IN_ARGS        # free-form: a leak
    other = E.judge(turn, requires_tool=True, tools=SPECS,
                    expected=[{"name": "run_command", "arguments": {"command": "ls", "timeout_s": 5}}])
    assert other.flags == (C.MARKUP_IN_ARGS, C.WRONG_ARGS)                              # not the answer: both
    dup = C.TurnResult(tool_calls=[run_command('{"command": "ls", "command": "pwd", "timeout_s": 5}')])
    assert E.judge(dup, requires_tool=True, tools=SPECS,
                   expected=[{"name": "run_command", "arguments": None}]).cls == C.ARGS_NOT_JSON


def test_empty_arguments_follow_the_schema():
    none_required = C.tool_specs([{"type": "function", "function": {"name": "list_open_files",
                                                                    "parameters": {"type": "object", "properties": {}}}}])
    call = C.ToolCall(0, "c", "list_open_files", "{}")
    assert C.classify(C.TurnResult(tool_calls=[call]), requires_tool=True, tools=none_required).ok
    req = C.ToolCall(0, "c", "run_command", "{}")
    assert verdict(tool_calls=[req], requires_tool=True).cls == C.EMPTY_ARGS


# --- a string argument cut at a literal DSML closer (SGLang's served path ends the string there) --------
@pytest.mark.parametrize("command,why", [
    ("cat <<'EOF'\n", "here-document <<EOF never closed"),
    ("cat <<EOF > notes.md\n# Notes\n", "here-document <<EOF never closed"),
    ("cat <<-EOF\n\t", "here-document <<EOF never closed"),
    ("cat <<'A' <<'B'\nx\nA\n", "here-document <<B never closed"),
    ('python3 -c \'print("', "ends in an open quote"),
    ("Example: `", "ends in an open quote"),
    ("```xml\n", "ends in an open fence '```xml'"),
])
def test_a_string_argument_cut_off_is_args_cut(command, why):
    v = verdict(tool_calls=[run_command({"command": command, "timeout_s": 5})], requires_tool=True,
                finish_reason="tool_calls")
    assert v.cls == C.ARGS_CUT and why in v.reason, v


@pytest.mark.parametrize("command", [
    "cat <<'EOF' > a.py\nprint(1)\nEOF\npython3 a.py", "cat <<-EOF\n\tx\n\tEOF", "echo 'a' \"b\"",
    "grep -rn '<div class=\"x\">' templates/", "x = 1 << SHIFT", "cout << value << endl;", "'", "\"",
    "sed -e 's/a/b/'", "printf '%s\\n' \"$x\"", "cat <<< \"$x\"", "```py\nprint(1)\n```",
])
def test_complete_strings_are_not_cut(command):
    v = verdict(tool_calls=[run_command({"command": command, "timeout_s": 5})], requires_tool=True,
                finish_reason="tool_calls")
    assert v.ok, v


def test_a_cut_string_is_the_class_when_later_parameters_are_lost_and_not_at_the_length_cap():
    v = verdict(tool_calls=[run_command({"command": "cat <<'EOF'\n"})], requires_tool=True, finish_reason="tool_calls")
    assert v.flags == (C.ARGS_CUT, C.ARGS_SCHEMA)
    v = verdict(tool_calls=[run_command({"command": "cat <<'EOF'\n", "timeout_s": 5})], requires_tool=True,
                finish_reason="length")
    assert v.flags == (C.LENGTH_MID_CALL,)


def test_a_cut_looking_string_is_legitimate_when_the_calls_match_the_known_answer():
    from dsv4ctl.check import expect as E
    args = {"command": "cat <<'EOF'\n", "timeout_s": 5}
    turn = C.TurnResult(tool_calls=[run_command(args)], finish_reason="tool_calls")
    assert E.judge(turn, requires_tool=True, tools=SPECS, expected=[{"name": "run_command", "arguments": args}]).ok
    full = {"command": "cat <<'EOF'\nx\nEOF", "timeout_s": 5}
    v = E.judge(turn, requires_tool=True, tools=SPECS, expected=[{"name": "run_command", "arguments": full}])
    assert v.flags == (C.ARGS_CUT, C.WRONG_ARGS)


def test_a_nested_fence_left_open_by_a_markdown_listing_is_not_cut():
    readme = "Put this in README.md:\n```markdown\n# Tool\n```python\nprint(1)\n```\n```"
    assert verdict(readme).ok
    assert verdict("Example:\n```").cls == C.MARKUP_CUT              # the only fence, left open
