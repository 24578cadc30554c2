"""Classifier edge cases found after the gate landed: spellings it missed, and legitimate answers it
flagged (identifiers in CJK prose, a quoted log with identical lines, a JSON array of identical
objects)."""

from __future__ import annotations

import pytest

from dsv4ctl.check import classify as C


def verdict(content: str = "", finish_reason: str = "stop") -> C.Verdict:
    return C.classify(C.TurnResult(content=content, finish_reason=finish_reason), requires_tool=False, tools={})


@pytest.mark.parametrize("text, spelling", [
    ('ok <｜dsml｜invoke name="x">', "<｜dsml｜invoke"),                      # lower case
    ("ok <｜DS\u200bML｜invoke", "<｜DS\u200bML｜invoke"),                    # zero-width space inside
    ("a \u2060<｜DSML｜tool_calls>", "<｜DSML｜tool_calls>"),
    ("<\u2223DSML\u2223tool_calls>", "<\u2223DSML\u2223tool_calls>"),        # U+2223 DIVIDES
    ("x <\uffe8DSML\uffe8invoke", "<\uffe8DSML\uffe8invoke"),                # U+FFE8 HALFWIDTH FORMS LIGHT VERTICAL
    ("<\u01c0DSML\u01c0parameter", "<\u01c0DSML\u01c0parameter"),            # U+01C0 LATIN LETTER DENTAL CLICK
    ("&lt;|DSML|invoke name=&quot;x&quot;&gt;", "&lt;|DSML|invoke"),        # HTML-escaped by a proxy
    ("&lt;/｜DSML｜tool_calls&gt;", "&lt;/｜DSML｜tool_calls"),
])
def test_missed_dsml_spellings_are_now_caught(text, spelling):
    v = verdict(text)
    assert v.cls == C.DSML_IN_CONTENT and repr(spelling) in v.reason


def test_ascii_bar_end_of_sentence_token_is_a_special_token_leak():
    v = verdict("The answer is 4.<|end_of_sentence|>")
    assert v.cls == C.SPECIAL_TOKEN_LEAK and "'<|end_of_sentence|>'" in v.reason


@pytest.mark.parametrize("text", ["a | dsml | table cell", "use `<｜dsml｜invoke>` to call a tool",
                                  "x &lt; y and y &gt; z", "fish | grep DSML | wc"])
def test_lookalikes_and_quotes_stay_clean(text):
    assert verdict(text).cls == C.OK


ZH_IDENTIFIERS = ("我们需要先检查配置文件，然后修改服务的启动参数。" * 3 +
                  "具体来说，请调用 get_user_profile、update_user_settings 和 delete_account_permanently 接口，"
                  "再运行 pytest tests/test_api.py::TestUserProfile::test_update_settings 验证。"
                  "最后检查 UserProfileSerializer 和 AccountPermissionValidator 是否一致。")


def test_identifiers_in_cjk_prose_are_not_a_language_switch():
    assert C.find_language_switch(ZH_IDENTIFIERS) is None
    assert verdict(ZH_IDENTIFIERS).cls == C.OK


def test_cjk_answer_switching_into_english_prose_is_still_caught():
    text = ZH_IDENTIFIERS + ("and then the model simply continues writing ordinary English sentences about "
                             "the weather and the traffic instead of answering in Chinese as it began")
    s = C.find_language_switch(text)
    assert s is not None and (s.base, s.to) == ("CJK", "Latin")


LOG_LINE = "2026-11-30 12:00:01 ERROR worker db connection refused host 10.0.0.5 port 5432 retrying in 5 seconds\n"
AFTER = ("\nAs you can see the worker never reached the database, so the fix is to open the port in the "
         "security group and restart the worker.")


def test_quoted_log_with_identical_lines_then_prose_is_not_a_loop():
    text = "Here is the log you asked for, copied from the server:\n\n" + LOG_LINE * 12 + AFTER
    assert C.find_loop(text) is None and verdict(text).cls == C.OK


def test_json_array_of_identical_objects_then_prose_is_not_a_loop():
    obj = '{"status": "ok", "retries": 0, "region": "eu-west-1", "healthy": true}'
    text = "Here is the fixture:\n\n[" + ", ".join([obj] * 15) + "]\n\n" + AFTER
    assert C.find_loop(text) is None


def test_the_same_repetition_reaching_the_end_is_a_loop():
    text = "Here is the log you asked for, copied from the server:\n\n" + LOG_LINE * 12
    loop = C.find_loop(text)
    assert loop is not None and loop.period == 22 and loop.span == 264
    assert verdict(text).cls == C.NGRAM_LOOP
    # a partial last copy and a short tail (at most one unit) still count
    assert C.find_loop(text + "2026-11-30 12:00:01 ERROR worker") is not None
    assert C.find_loop(text + "That is all.") is not None


def test_a_loop_followed_by_prose_counts_when_the_turn_hit_the_length_cap():
    text = "Here is the log you asked for, copied from the server:\n\n" + LOG_LINE * 12 + AFTER
    assert C.find_loop(text, at_end=False) is not None
    assert verdict(text, finish_reason="length").cls == C.NGRAM_LOOP


def test_repeated_fenced_blocks_must_reach_the_end_too():
    block = "```\nrm -rf build && make all && make install PREFIX=/opt/tool\n```\n"
    intro = "Run these commands, one per machine in the build farm, from the repository root:\n\n"
    assert C.find_loop(intro + block * 6) is not None
    assert C.find_loop(intro + block * 6 + AFTER * 2) is None
