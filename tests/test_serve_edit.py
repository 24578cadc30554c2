"""Round-trip edits keep every untouched byte: comments, key order, quoting, blank lines, CRLF."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4ctl.errors import InputError
from dsv4ctl.serve.edit import REMOVE, Change, apply_changes, render_value, unified_diff

TEXT = """\
---
# head comment
model-path:   deepseek-ai/DeepSeek-V4-Flash   # aligned comment
port: 30000


# a comment block before tp-size
tp-size: 4
cuda-graph-bs-decode: [1, 2,   4]
hicache-storage-backend-extra-config: {prefetch_threshold: 256,  x: 1}
served-model-name: 'deepseek-v4-flash'
blk:
- 1
- 2
# about the flag
enable-hierarchical-cache: true # tail
hicache-ratio:   # empty for now
# trailing comment
"""


def lines_kept(old: str, new: str, changed: set[int]) -> None:
    """Every line of ``old`` except the 0-based ``changed`` ones appears in ``new`` in order."""
    keep = [l for i, l in enumerate(old.splitlines(keepends=True)) if i not in changed]
    it = iter(new.splitlines(keepends=True))
    for l in keep:
        for m in it:
            if m == l:
                break
        else:
            raise AssertionError(f"line lost or changed: {l!r}")


def test_set_value_keeps_comment_column_and_everything_else():
    new = apply_changes(TEXT, [Change("port", 31000)], "x.yaml")
    assert new == TEXT.replace("port: 30000", "port: 31000")
    new = apply_changes(TEXT, [Change("model-path", "m")], "x.yaml")
    assert new.splitlines()[2].startswith("model-path:   m ") and new.splitlines()[2].endswith(" # aligned comment")
    assert new.index("# aligned comment") - new.index("model-path") == TEXT.index("# aligned comment") - TEXT.index("model-path")
    lines_kept(TEXT, new, {2})


def test_flag_and_empty_value_keep_their_comments():
    new = apply_changes(TEXT, [Change("enable-hierarchical-cache", False), Change("hicache-ratio", 2.5)], "x.yaml")
    assert "enable-hierarchical-cache: false # tail\n" in new
    assert "hicache-ratio: 2.5 # empty for now\n" in new
    lines_kept(TEXT, new, {15, 16})
    assert yaml.safe_load(new)["hicache-ratio"] == 2.5


def test_remove_keeps_following_comments_and_blank_lines():
    new = apply_changes(TEXT, [Change("port", REMOVE), Change("blk", REMOVE)], "x.yaml")
    assert "port:" not in new and "blk:" not in new and "- 1" not in new
    assert "\n\n\n# a comment block before tp-size\n" in new and "# about the flag\n" in new
    lines_kept(TEXT, new, {3, 11, 12, 13})


def test_insert_after_anchor_and_at_end():
    new = apply_changes(TEXT, [Change("hicache-write-policy", "write_back", after=("hicache-ratio",))], "x.yaml")
    assert "hicache-ratio:   # empty for now\nhicache-write-policy: write_back\n# trailing comment\n" in new
    new = apply_changes(TEXT, [Change("watchdog-timeout", 900)], "x.yaml")
    assert new.endswith("hicache-ratio:   # empty for now\nwatchdog-timeout: 900\n# trailing comment\n")


def test_block_list_replaced_by_flow_list():
    new = apply_changes(TEXT, [Change("blk", [3, 4])], "x.yaml")
    assert "blk: [3, 4]\n# about the flag" in new
    lines_kept(TEXT, new, {11, 12, 13})


def test_crlf_indent_and_no_trailing_newline():
    assert apply_changes("a: 1\r\nb: 2\r\n", [Change("b", 3), Change("c", "x")], "x") == "a: 1\r\nb: 3\r\nc: x\r\n"
    assert apply_changes("a: 1", [Change("c", 2)], "x") == "a: 1\nc: 2\n"
    assert apply_changes("", [Change("c", 2)], "x") == "c: 2\n"
    assert apply_changes("# only a comment\n", [Change("c", [1])], "x") == "# only a comment\nc: [1]\n"


def test_alias_spelling_is_edited_in_place():
    text = "enable-hicache: true  # alias\nport: 1\n"
    new = apply_changes(text, [Change("enable-hierarchical-cache", False,
                                      spellings=("enable-hierarchical-cache", "enable-hicache"))], "x")
    assert new == "enable-hicache: false  # alias\nport: 1\n"   # a toggle keeps the gap before the comment


@pytest.mark.parametrize("value,text", [(2.0, "2.0"), ("true", "'true'"), ("x: y", "'x: y'"), (None, "null"),
                                        ([1, "a"], "[1, a]"), ({"a": 1}, "{a: 1}"), (True, "true"), ("None", "None")])
def test_render_value(value, text):
    assert render_value(value) == text


def test_syntax_error_and_non_mapping():
    with pytest.raises(InputError, match=r"^x.yaml:2: YAML syntax error"):
        apply_changes("a: 1\nb: x: y\n", [Change("a", 2)], "x.yaml")
    with pytest.raises(InputError, match="must be a mapping"):
        apply_changes("- a\n- b\n", [Change("a", 2)], "x.yaml")


def test_unified_diff():
    d = unified_diff("a: 1\nb: 2\n", "a: 1\nb: 3\n", "p/x.yaml")
    assert d == "--- a/p/x.yaml\n+++ b/p/x.yaml\n@@ -1,2 +1,2 @@\n a: 1\n-b: 2\n+b: 3\n"
    assert unified_diff("a\n", "a\n", "x") == ""


KEYS = st.sampled_from(["port", "tp-size", "hicache-ratio", "new-a", "new-b", "blk", "model-path"])
VALS = st.one_of(st.integers(-5, 99999), st.floats(0, 10, allow_nan=False).map(lambda f: round(f, 3)),
                 st.sampled_from(["x", "write_back", "a b", "true", "#no", "q'uote"]), st.booleans(),
                 st.lists(st.integers(0, 9), max_size=3))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(KEYS, st.one_of(VALS, st.just(REMOVE))), min_size=1, max_size=5))
def test_property_result_parses_to_intended_mapping(ops):
    changes = [Change(k, v) for k, v in ops]
    new = apply_changes(TEXT, changes, "x.yaml")
    expected = yaml.safe_load(TEXT)
    for k, v in ops:
        if v is REMOVE:
            expected.pop(k, None)
        else:
            expected[k] = v
    assert yaml.safe_load(new) == expected
    # every comment line of the original survives
    for l in TEXT.splitlines():
        if l.startswith("#"):
            assert l in new.splitlines()


# --- secrets are masked in everything dsv4ctl prints ------------------------------------------

from dsv4ctl.serve.edit import is_secret_key, redact, scrub, secret_values  # noqa: E402


@pytest.mark.parametrize("name,secret", [
    ("api-key", True), ("admin-api-key", True), ("ssl-keyfile-password", True), ("hf_token", True),
    ("secret_key", True), ("access_key", True), ("aws-credentials", True), ("max-total-tokens", False),
    ("routing-key", False), ("ssl-keyfile", False), ("tokenizer-path", False), ("hicache-ratio", False),
])
def test_is_secret_key(name, secret):
    assert is_secret_key(name) is secret


def test_redact_masks_values_lines_blocks_and_inner_json():
    text = ('api-key: SUPERSECRET1\n"admin-api-key": "A D M" # c\r\nmax-total-tokens: 100\n'
            "hicache-storage-backend-extra-config: '{\"master\": \"m:1\", \"secret_key\": \"S3\", \"n\": 1}'\n"
            'x: "{\\"access_key\\": \\"ESC\\", \\"a\\": 1}"\nssl-keyfile-password: |\n  BLOCK1\n  BLOCK2\nport: 1')
    assert redact(text) == (
        'api-key: ***\n"admin-api-key": ***\r\nmax-total-tokens: 100\n'
        "hicache-storage-backend-extra-config: '{\"master\": \"m:1\", \"secret_key\": \"***\", \"n\": 1}'\n"
        'x: "{\\"access_key\\": \\"***\\", \\"a\\": 1}"\nssl-keyfile-password: |\n  ***\n  ***\nport: 1')


def test_unified_diff_masks_context_and_changed_lines():
    old = "api-key: OLDSECRET\nenable-hicache: true\n"
    new = "api-key: NEWSECRET\nenable-hicache: false\n"
    d = unified_diff(old, new, "p.yaml")
    assert "SECRET" not in d and "-api-key: ***\n-enable-hicache: true\n+api-key: ***\n" in d
    assert "OLDSECRET" in unified_diff(old, new, "p.yaml", mask=False)


def test_secret_values_and_scrub():
    data = {"api-key": "SUPERSECRET1", "port": 30000, "x": "abc",
            "hicache-storage-backend-extra-config": '{"secret_key": "S3KEY", "master": "m:1"}'}
    assert secret_values(data) == {"SUPERSECRET1", "S3KEY"}
    assert scrub("key SUPERSECRET1 and S3KEY; m:1", secret_values(data)) == "key *** and ***; m:1"


# --- off then on restores every form of the flag byte for byte -------------------------------

ROUND_TRIP = {
    "crlf": "# c\r\nport: 1\r\nenable-hierarchical-cache: true\r\nhicache-ratio: 2.0\r\n",
    "cr-only": "port: 1\renable-hicache: true\rhicache-ratio: 2.0\r",
    "no-final-newline": "port: 1\nhicache-ratio: 2.0\nenable-hierarchical-cache: true",
    "yes": "enable-hicache: yes\nhicache-ratio: 2.0\n",
    "True+comment": "enable-hicache: True   # on\nhicache-ratio: 2.0\n",
    "ON": "enable-hicache: ON\nhicache-ratio: 2.0\n",
    "anchor": "enable-hicache: &on true\nhicache-ratio: 2.0\n",
    "tag": "enable-hicache: !!bool true\nhicache-ratio: 2.0\n",
    "value-on-next-line": "enable-hicache:\n  true   # c\nhicache-ratio: 2.0\n",
    "double-quoted-key": "\"enable-hierarchical-cache\": true # keep\nhicache-ratio: 2.0\n",
    "single-quoted-key-crlf": "'enable-hicache':   true    # keep\r\nhicache-ratio: 2.0\r\n",
}
OFF = {"crlf": "enable-hierarchical-cache: false\r\n", "cr-only": "enable-hicache: false\r",
       "no-final-newline": "enable-hierarchical-cache: false", "yes": "enable-hicache: no\n",
       "True+comment": "enable-hicache: False   # on\n", "ON": "enable-hicache: OFF\n",
       "anchor": "enable-hicache: &on false\n", "tag": "enable-hicache: !!bool false\n",
       "value-on-next-line": "enable-hicache:\n  false   # c\n",
       "double-quoted-key": "\"enable-hierarchical-cache\": false # keep\n",
       "single-quoted-key-crlf": "'enable-hicache':   false    # keep\r\n"}


def _toggle(text: str, action: str) -> str:
    from dsv4ctl.serve.argtable import load_table
    from dsv4ctl.serve.hicache import Options, changes_for
    ch = changes_for(action, yaml.safe_load(text), Options(), load_table(), "x.yaml")
    return apply_changes(text, ch, "x.yaml") if ch else text


@pytest.mark.parametrize("name", sorted(ROUND_TRIP))
def test_off_then_on_is_byte_identical(name):
    text = ROUND_TRIP[name]
    off = _toggle(text, "off")
    assert OFF[name] in off
    assert yaml.safe_load(off)["hicache-ratio"] == 2.0 and not any(v is True for v in yaml.safe_load(off).values())
    assert _toggle(off, "on") == text


def test_alias_value_is_refused_not_rewritten():
    text = "x-flag: &t true\nenable-hicache: *t\nhicache-ratio: 2.0\n"
    with pytest.raises(InputError, match=r"x.yaml:2: enable-hicache is an alias \(\*t\); refusing to edit it"):
        _toggle(text, "off")
