"""dsv4ctl patch on real git trees of the real sglang 0.5.23 sources (built from the wheel)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4ctl.patches.gitio import Git, transport_runner
from dsv4ctl.patches.ops import load_series
from dsv4ctl.patches.tree import read_tree
from tests.conftest import run_cli
from tests.patchoracle.trees import ENV, SERIES, fresh_tree, git, snapshot

POOL = "python/sglang/srt/mem_cache/deepseek_v4_memory_pool.py"


@pytest.fixture
def tree(tmp_path) -> Path:
    return fresh_tree(tmp_path / "sglang")


def cli(*args):
    return run_cli(*args, env=ENV, timeout=300)


def test_check_proves_the_shipped_series_on_pristine_sglang():
    r = cli("patch", "check", "--base", "sglang==0.5.23", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["ok"] and doc["base"] == "sglang==0.5.23" and doc["errors"] == []
    assert [p["name"] for p in doc["patches"]] == ["0001-dsv4-bf16-index-k-exact-accounting.patch",
                                                    "0002-dsv4-log-pool-plan.patch"]
    assert all(p["state"] == "applied" for p in doc["patches"])
    assert doc["patches"][0]["compiled"] == [
        "python/sglang/srt/environ.py", POOL, "python/sglang/srt/model_executor/pool_configurator.py"]
    assert doc["patches"][1]["compiled"] == ["python/sglang/srt/model_executor/pool_configurator.py"]
    assert doc["series_identity"] == load_series(SERIES).identity


def test_check_fails_on_a_patch_that_does_not_compile(tmp_path):
    # a long series path: the title line keeps it whole off a terminal ($COLUMNS unset: 200)
    d = tmp_path / "a-series-folder-whose-name-is-long-enough-to-pass-seventy-eight-columns" / "sglang-0.5.23"
    d.mkdir(parents=True)
    text = (SERIES / "0002-dsv4-log-pool-plan.patch").read_text()
    broken = text.replace('+        self._log_pool_plan(config)\n', '+        self._log_pool_plan(config\n')
    assert broken != text
    (d / "0001-broken.patch").write_text(broken)
    (d / "series").write_text("0001-broken.patch\n")
    r = cli("patch", "check", "--series", str(d))
    assert r.code == 1
    assert "0001-broken.patch: python/sglang/srt/model_executor/pool_configurator.py:" in r.err
    title = next(ln for ln in r.out.splitlines() if ln.startswith("patch check: "))
    assert title.startswith(f"patch check: {d} on pristine sglang==0.5.23 ("), r.out   # not wrapped at 78 (issue 46.7)


def test_apply_status_revert_round_trip(tree):
    base = git(tree, "rev-parse", "HEAD")
    st = cli("patch", "status", str(tree), "--json").json()
    assert st["version"] == "0.5.23" and st["base_ref"] == "v0.5.23" and st["base_commit"] == base
    assert [p["state"] for p in st["patches"]] == ["missing", "missing"] and st["dirty"] == []

    dry = cli("patch", "apply", str(tree), "--dry-run")
    assert dry.code == 0 and dry.out.count("dry-run: git am -3") == 2
    assert git(tree, "rev-parse", "HEAD") == base            # dry run changed nothing

    dry = cli("patch", "apply", str(tree), "--dry-run", "-m", "bf16 index-K for the PD pair")   # issue 46.8
    assert dry.out.splitlines()[-1].startswith("dry-run: git notes --ref=dsv4ctl add -f -m 'patch apply by ")
    r = cli("patch", "apply", str(tree), "--json", "-m", "bf16 index-K for the PD pair")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["note"].startswith("patch apply by ") and doc["note"].endswith(": bf16 index-K for the PD pair")
    assert doc["applied"] == ["0001-dsv4-bf16-index-k-exact-accounting.patch", "0002-dsv4-log-pool-plan.patch"]
    assert git(tree, "rev-list", "--count", f"{base}..HEAD") == "2"
    assert "SGLANG_DSV4_INDEX_K_DTYPE" in (tree / POOL).read_text()

    st = cli("patch", "status", str(tree), "--json").json()
    assert [p["state"] for p in st["patches"]] == ["applied", "applied"] and st["complete"]
    c1, c2 = (p["commit"] for p in st["patches"])
    assert git(tree, "rev-list", "--reverse", f"{base}..HEAD").split() == [c1, c2]
    assert st["notes"] == {c1: doc["note"], c2: doc["note"]}
    assert git(tree, "notes", "--ref=dsv4ctl", "show", c2) == doc["note"]

    again = cli("patch", "apply", str(tree), "--json").json()   # idempotent
    assert again["applied"] == [] and len(again["skipped"]) == 2

    r = cli("patch", "revert", str(tree), c2, c1, "-m", "canary corrupted tool calls")
    assert r.code == 0, r.err
    assert r.out.splitlines()[-1].startswith("noted on 2 commit(s) (refs/notes/dsv4ctl): patch revert by ")
    assert f"note on {c1[:12]}: patch apply by " in cli("patch", "status", str(tree)).out
    st = cli("patch", "status", str(tree), "--json").json()
    assert [st["notes"][p["reverted_by"]].endswith(": canary corrupted tool calls") for p in st["patches"]] == [True, True]
    assert [p["state"] for p in st["patches"]] == ["reverted", "reverted"]
    assert git(tree, "diff", base, "HEAD") == ""               # content is back to pristine
    assert cli("patch", "revert", str(tree), c1).code == 2     # already reverted

    r = cli("patch", "apply", str(tree))                          # re-apply after the revert
    assert r.code == 0, r.err
    st = cli("patch", "status", str(tree), "--json").json()
    assert [p["state"] for p in st["patches"]] == ["applied", "applied"]


def test_status_sees_patches_by_patch_id_not_message(tree):
    # Apply 0001 by hand with another message and at another line offset: still "applied".
    text = (SERIES / "0001-dsv4-bf16-index-k-exact-accounting.patch").read_text()
    env_py = tree / "python/sglang/srt/environ.py"
    env_py.write_text("# local header line\n" + env_py.read_text())
    git(tree, "commit", "-qam", "local: header")
    git(tree, "apply", "-", input=text)
    git(tree, "commit", "-qam", "my own words for the index-K fix")
    (tree / "scratch.txt").write_text("x")
    st = cli("patch", "status", str(tree), "--json").json()
    assert [p["state"] for p in st["patches"]] == ["applied", "missing"]
    assert [c["subject"] for c in st["extra_commits"]] == ["local: header"]
    assert st["dirty"] == ["?? scratch.txt"]


def test_conflict_restores_the_tree_byte_for_byte(tree):
    # A local commit changes the line patch 0001's hunk #1 in the pool file rewrites.
    p = tree / POOL
    p.write_text(p.read_text().replace("    return index_head_dim + index_head_dim // 128 * 4\n",
                                       "    return index_head_dim + (index_head_dim // 128) * 4\n", 1))
    git(tree, "commit", "-qam", "local: parenthesise")
    (tree / "untracked.txt").write_text("keep me\n")
    before = snapshot(tree)
    r = cli("patch", "apply", str(tree))
    assert r.code == 1
    assert r.err.startswith("dsv4ctl: failed: ")       # a verdict on the tree, not an error of the command
    assert ("patch 0001-dsv4-bf16-index-k-exact-accounting.patch does not apply: "
            f"{POOL} hunk #1 @@ -50,10 +50,37 @@ (line 50)") in r.err
    assert "tree restored to" in r.err
    assert snapshot(tree) == before
    assert not (tree / ".git" / "rebase-apply").exists()


def test_conflict_in_a_later_patch_also_undoes_the_earlier_ones(tree, tmp_path):
    d = tmp_path / "sglang-0.5.23"
    d.mkdir()
    for f in SERIES.glob("*.patch"):
        (d / f.name).write_text(f.read_text())
    # 0003 expects a line that no release has.
    (d / "0003-bogus.patch").write_text(
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: t <t@example.org>\nDate: Sun, 29 Nov 2026 12:00:00 +0000\nSubject: [PATCH] bogus\n\n---\n"
        f"diff --git a/{POOL} b/{POOL}\n--- a/{POOL}\n+++ b/{POOL}\n@@ -1,3 +1,3 @@\n"
        " from __future__ import annotations\n-import nothing_like_this\n+import something\n \n")
    (d / "series").write_text((SERIES / "series").read_text() + "0003-bogus.patch\n")
    before = snapshot(tree)
    r = cli("patch", "apply", str(tree), "--series", str(d))
    assert r.code == 1
    assert f"patch 0003-bogus.patch does not apply: {POOL} hunk #1 @@ -1,3 +1,3 @@ (line 1)" in r.err
    assert snapshot(tree) == before


def test_dirty_tree_is_refused_and_left_alone(tree):
    p = tree / POOL
    p.write_text(p.read_text() + "# wip\n")
    before = snapshot(tree)
    r = cli("patch", "apply", str(tree))
    assert r.code == 2
    assert f"uncommitted changes in {POOL}" in r.err
    assert snapshot(tree) == before


@pytest.mark.parametrize("args,msg", [
    (("patch", "status", "/nonexistent/tree"), "/nonexistent/tree: no such directory"),
    (("patch", "check", "--series", "{tmp}/nope"), "nope: no series file"),
    (("patch", "check", "--base", "sglang>=1"), "--base: expected PACKAGE==VERSION"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, args, msg):
    r = cli(*(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert r.code == 2 and msg in r.err and len(r.err.strip().splitlines()) == 1


def test_not_a_git_tree(tmp_path):
    r = cli("patch", "status", str(tmp_path))
    assert r.code == 2 and "not a git work tree" in r.err


def test_export_turns_commits_into_a_series_that_applies_elsewhere(tree, tmp_path):
    base = git(tree, "rev-parse", "HEAD")
    p = tree / POOL
    p.write_text(p.read_text().replace("ONLINE_C128 = not _is_hip", "ONLINE_C128 = (not _is_hip)", 1))
    git(tree, "commit", "-qam", "dsv4: parenthesise ONLINE_C128")
    out = tmp_path / "myseries"
    dry = cli("patch", "export", f"{base}..HEAD", "--tree", str(tree), "--series", str(out),
              "--fact", "index_k_dtype=fp8", "--dry-run")
    assert dry.code == 0 and "dry-run: write" in dry.out and not out.exists()
    r = cli("patch", "export", f"{base}..HEAD", "--tree", str(tree), "--series", str(out),
            "--fact", "index_k_dtype=fp8")
    assert r.code == 0, r.err
    ls = load_series(out)
    assert ls.series.base == "sglang==0.5.23"
    (e,) = ls.series.entries
    assert e.name == "0001-dsv4-parenthesise-ONLINE-C128.patch" and e.facts == {"index_k_dtype": "fp8"}
    # exporting again finds it already there
    r = cli("patch", "export", "HEAD", "--tree", str(tree), "--series", str(out))
    assert "already in the series" in r.out and len(load_series(out).series.entries) == 1
    other = fresh_tree(tmp_path / "other")
    assert cli("patch", "apply", str(other), "--series", str(out)).code == 0
    st = cli("patch", "status", str(other), "--series", str(out), "--json").json()
    assert st["patches"][0]["state"] == "applied"
    assert "ONLINE_C128 = (not _is_hip)" in (other / POOL).read_text()
    assert cli("patch", "export", "HEAD", "--tree", str(tree), "--series", str(out),
               "--fact", "index_k_dtype=fp16").code == 2


def test_transport_runner_reads_the_same_state(tree):
    """The remote path: git through a dsv4ctl.remote Transport (here the local one)."""
    from dsv4ctl.remote import LocalTransport
    local = read_tree(Git(str(tree)))
    remote = read_tree(Git(str(tree), transport_runner(LocalTransport("b200-0")), where=f"b200-0:{tree}"))
    assert remote.tree == f"b200-0:{tree}"
    assert (remote.head, remote.base_commit, remote.version, remote.dirty) == (
        local.head, local.base_commit, local.version, local.dirty)


def test_half_done_git_operation_is_reported_and_blocks_apply(tree):
    p = tree / POOL
    p.write_text(p.read_text().replace("    return index_head_dim + index_head_dim // 128 * 4\n",
                                       "    return index_head_dim + (index_head_dim // 128) * 4\n", 1))
    git(tree, "commit", "-qam", "local: parenthesise")
    import subprocess
    am = subprocess.run(["git", "-C", str(tree), "am", str(SERIES / "0001-dsv4-bf16-index-k-exact-accounting.patch")],
                        capture_output=True, text=True)
    assert am.returncode != 0                        # the user's own am stopped half-way
    st = cli("patch", "status", str(tree), "--json").json()
    assert st["operation"] == "am"
    before = snapshot(tree)
    r = cli("patch", "apply", str(tree))
    assert r.code == 2 and "a git am is in progress; finish or abort it before apply" in r.err
    assert snapshot(tree) == before
    git(tree, "am", "--abort")
    assert cli("patch", "status", str(tree), "--json").json()["operation"] is None


def test_pristine_tree_is_the_wheel_at_its_tag(tree, tmp_path):
    from dsv4ctl.patches.pristine import build_tree, find_wheel
    from tests.patchoracle.trees import CACHE
    assert git(tree, "rev-parse", "HEAD") == git(tree, "rev-parse", "v0.5.23^{commit}")
    assert git(tree, "log", "--format=%s").startswith("sglang 0.5.23 (from sglang-0.5.23-")
    assert (tree / "python/sglang/srt/model_executor/pool_configurator.py").is_file()
    assert not list((tree / "python/sglang/srt/mem_cache").glob("__pycache__"))
    assert "__version__ = version = '0.5.23'" in (tree / "python/sglang/_version.py").read_text()
    # same wheel, same commit id: a rebuild reproduces the cached repository exactly
    again = build_tree(find_wheel("sglang", "0.5.23", CACHE / "wheels"), tmp_path / "again")
    assert git(again, "rev-parse", "HEAD") == git(tree, "rev-parse", "HEAD")
