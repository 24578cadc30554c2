"""Pure cores of dsv4ctl.patches: series format, facts, identity, hunk analysis, patch matching."""

from __future__ import annotations

import pytest

from dsv4ctl.errors import InputError
from dsv4ctl.patches.diffparse import failing_hunks, parse_files, subject, touched_files
from dsv4ctl.patches.series import (format_entry, index_k_facts, parse_base, parse_series,
                                    series_identity)
from dsv4ctl.patches.tree import Commit, match_series
from tests.patchoracle.trees import SERIES

GOOD = """\
# header comment
base sglang==0.5.23

0001-a.patch  index_k_dtype=bf16 index_k_accounting=exact when=SGLANG_DSV4_INDEX_K_DTYPE=bf16  # why a
0002-b.patch   # only a comment
0003-c.diff log_line=DSV4_POOL_PLAN
"""


def test_parse_series_entries_facts_comments():
    s = parse_series(GOOD, path="series")
    assert (s.package, s.version, s.base) == ("sglang", "0.5.23", "sglang==0.5.23")
    assert [e.name for e in s.entries] == ["0001-a.patch", "0002-b.patch", "0003-c.diff"]
    a = s.entries[0]
    assert a.facts == {"index_k_dtype": "bf16", "index_k_accounting": "exact",
                       "when": "SGLANG_DSV4_INDEX_K_DTYPE=bf16"}
    assert a.comment == "why a" and a.line == 4
    assert a.when == ("SGLANG_DSV4_INDEX_K_DTYPE", "bf16")
    assert s.entries[1].facts == {} and s.entries[1].comment == "only a comment"
    assert s.entries[2].when is None


def test_base_from_directory_name_when_no_base_line():
    s = parse_series("0001-a.patch\n", dirname="sglang-0.5.24")
    assert s.base == "sglang==0.5.24"


@pytest.mark.parametrize("text,msg", [
    ("0001-a.txt\n", "series:1: '0001-a.txt' is not a patch file name"),
    ("0001-a.patch\n0001-a.patch\n", "series:2: 0001-a.patch is listed twice"),
    ("0001-a.patch index_k_dtype\n", "series:1: fact 'index_k_dtype': expected key=value"),
    ("0001-a.patch index_k_dtype=fp16\n", "series:1: index_k_dtype=fp16: expected one of fp8, bf16, fp4"),
    ("0001-a.patch index_k_accounting=budget\n", "series:1: index_k_accounting=budget: expected one of fp8, exact"),
    ("0001-a.patch when=bf16\n", "series:1: when=bf16: expected when=ENV_NAME=VALUE"),
    ("0001-a.patch a=1 a=2\n", "series:1: fact 'a' given twice"),
    ("0001-a.patch\nbase sglang==0.5.23\n", "series:2: 'base' must come once, before the first patch"),
    ("base sglang\n", "series:1: expected PACKAGE==VERSION"),
    ("0001-a.patch\n", "no 'base PACKAGE==VERSION' line and the directory name 'x'"),
    ("../0001-a.patch\n", "is not a patch file name"),
])
def test_parse_series_errors_name_line(text, msg):
    with pytest.raises(InputError) as e:
        parse_series(text, path="series", dirname="x")
    assert msg in str(e.value)


def test_parse_base():
    assert parse_base("sglang==0.5.23") == ("sglang", "0.5.23")
    with pytest.raises(InputError, match="--base: expected PACKAGE==VERSION"):
        parse_base("sglang>=0.5", "--base")


def test_format_entry_round_trips():
    line = format_entry("0004-x.patch", {"index_k_dtype": "bf16", "when": "A_B=1"}, "from abc: x")
    assert line == "0004-x.patch  index_k_dtype=bf16 when=A_B=1  # from abc: x"
    e = parse_series(line, dirname="sglang-0.5.23").entries[0]
    assert (e.name, e.facts, e.comment) == ("0004-x.patch", {"index_k_dtype": "bf16", "when": "A_B=1"}, "from abc: x")
    assert format_entry("0005-y.patch", {}) == "0005-y.patch"


def test_identity_ignores_comments_but_not_patch_ids_or_facts():
    s1 = parse_series(GOOD)
    s2 = parse_series(GOOD.replace("# why a", "# other words").replace("# header comment", ""))
    ids = {"0001-a.patch": "1" * 40, "0002-b.patch": "2" * 40, "0003-c.diff": "3" * 40}
    assert series_identity(s1, ids) == series_identity(s2, ids)
    assert series_identity(s1, ids).startswith("sha256:") and len(series_identity(s1, ids)) == 71
    assert series_identity(s1, {**ids, "0002-b.patch": "4" * 40}) != series_identity(s1, ids)
    s3 = parse_series(GOOD.replace("index_k_dtype=bf16", "index_k_dtype=fp8"))
    assert series_identity(s3, ids) != series_identity(s1, ids)


def test_index_k_facts_need_the_patch_and_its_switch():
    s = parse_series(GOOD)
    on = {"SGLANG_DSV4_INDEX_K_DTYPE": "bf16"}
    assert index_k_facts(s, ["0001-a.patch"], on) == (
        {"index_k_dtype": "bf16", "index_k_accounting": "exact"}, [])
    facts, notes = index_k_facts(s, ["0001-a.patch"], {})
    assert facts == {} and notes == [
        "0001-a.patch is applied but SGLANG_DSV4_INDEX_K_DTYPE=bf16 is not set: its "
        "index_k_dtype=bf16, index_k_accounting=exact does not hold"]
    assert index_k_facts(s, [], on) == ({}, [])
    later = parse_series(GOOD + "0004-d.patch index_k_dtype=fp8\n")
    assert index_k_facts(later, ["0001-a.patch", "0004-d.patch"], on)[0] == {
        "index_k_dtype": "fp8", "index_k_accounting": "exact"}


def test_shipped_series_parses_with_the_documented_facts():
    s = parse_series((SERIES / "series").read_text(), dirname=SERIES.name)
    assert s.base == "sglang==0.5.23"
    a, b = s.entries
    assert a.facts["index_k_dtype"] == "bf16" and a.facts["index_k_accounting"] == "exact"
    assert a.when == ("SGLANG_DSV4_INDEX_K_DTYPE", "bf16")
    assert b.facts == {"log_line": "DSV4_POOL_PLAN"}


def test_diffparse_on_the_shipped_patch():
    text = (SERIES / "0001-dsv4-bf16-index-k-exact-accounting.patch").read_text()
    assert subject(text) == "dsv4: budget a bf16 C4 index-K at its real size (SGLANG_DSV4_INDEX_K_DTYPE)"
    assert touched_files(text) == ["python/sglang/srt/environ.py",
                                   "python/sglang/srt/mem_cache/deepseek_v4_memory_pool.py",
                                   "python/sglang/srt/model_executor/pool_configurator.py"]
    files = parse_files(text)
    assert [len(f.hunks) for f in files] == [1, 3, 2]
    h = files[1].hunks[0]
    assert h.index == 1 and h.header.startswith("@@ -50,")
    assert "    return index_head_dim + index_head_dim // 128 * 4" in h.old
    assert "        return index_head_dim * 2" in h.new


PATCH = """\
diff --git a/f.py b/f.py
--- a/f.py
+++ b/f.py
@@ -1,3 +1,3 @@
 a
-b
+B
 c
@@ -6,3 +6,3 @@ def g():
 x
-y
+Y
 z
"""


def test_failing_hunks_names_the_hunk_that_does_not_fit():
    fp = parse_files(PATCH)[0]
    assert failing_hunks("a\nb\nc\nq\nr\nx\ny\nz\n", fp) == []
    bad = failing_hunks("a\nb\nc\nq\nr\nx\nchanged\nz\n", fp)
    assert [h.index for h in bad] == [2] and bad[0].header == "@@ -6,3 +6,3 @@ def g():"
    assert [h.index for h in failing_hunks("a\nbb\nc\n", fp)] == [1, 2]
    # offsets do not matter, as with git: the block is found elsewhere
    assert failing_hunks("0\n0\n0\na\nb\nc\nx\ny\nz\n", fp) == []


def C(sha, pid=None, reverts=None):
    return Commit(sha=sha * 40, subject=f"s{sha}", patch_id=pid, reverts=reverts and reverts * 40)


def test_match_series_applied_reverted_missing_extra():
    ids = {"p1": "a" * 40, "p2": "b" * 40, "p3": "c" * 40}
    commits = [C("1", "a" * 40), C("2", "b" * 40), C("3", "e" * 40), C("4", "f" * 40, reverts="2"),
               C("5", "9" * 40, reverts="0")]
    st = match_series(ids, ["p1", "p2", "p3"], commits)
    assert [(e.name, e.state) for e in st.entries] == [("p1", "applied"), ("p2", "reverted"), ("p3", "missing")]
    assert st.entries[0].commit == "1" * 40
    assert st.entries[1].reverted_by == "4" * 40
    assert [c.sha[0] for c in st.extra] == ["3"]
    assert [c.sha[0] for c in st.reverts] == ["5"]
    assert st.applied == ["p1"] and not st.complete
    # re-applied after the revert: applied again, by the newest commit
    st = match_series(ids, ["p1", "p2", "p3"], commits + [C("6", "b" * 40), C("7", "c" * 40)])
    assert st.complete and st.entries[1].commit == "6" * 40
