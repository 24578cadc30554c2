"""Plan integration: index-K facts from the series applied to sglang.tree, and
``dsv4ctl plan --from-log`` against log lines printed by the real (patched) SGLang configurator."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import DEFAULT_PROFILE, run_cli
from tests.oracle.fixtures import forked_oracle  # noqa: F401 - oracle_runs uses it (the oracle's fork servers)
from tests.patchoracle.fixtures import FLASH_BYTES, oracle_runs, patched_tree  # noqa: F401
from tests.patchoracle.trees import ENV, SERIES, fresh_tree

PATCH_A = "0001-dsv4-bf16-index-k-exact-accounting.patch"


def profile(tmp: Path, tree: str | None, env: dict, name: str = "p.yaml") -> Path:
    doc = dict(version=1, name="t-flash-tp8", model="deepseek-v4-flash",
               sglang=dict(version="0.5.23", tree=tree, base_ref="v0.5.23", series=str(SERIES),
                           index_k_dtype="bf16", index_k_accounting="fp8"),
               hosts=[dict(name="h", address="127.0.0.1",
                           gpus=dict(model="NVIDIA B200", count=8, memory_mib=183359))],
               groups=[dict(name="main", role="colocated", host="h", gpus=list(range(8)), tp=8, env=env,
                            memory=dict(free_gib_before_load=177.0, weights_gib_per_rank=21.83))])
    p = tmp / name
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


@pytest.fixture(scope="module")
def patched(patched_tree) -> Path:
    """The directory holding the session's patched tree (as ``sglang``)."""
    return patched_tree.parent


def plan(p: Path, *args):
    r = run_cli("plan", str(p), "--set", f"available_bytes={FLASH_BYTES}", "--json", *args, env=ENV)
    assert r.code in (0, 1), r.err
    g = r.json()["groups"][0]
    return g, g["ranks"][0]


def test_plan_takes_bf16_exact_from_the_applied_series_when_the_switch_is_set(patched):
    g, r = plan(profile(patched, "sglang", {"SGLANG_DSV4_INDEX_K_DTYPE": "bf16"}))
    assert (r["index_k"]["dtype"], r["index_k"]["accounting"]) == ("bf16", "exact")
    assert g["index_k_source"].startswith("series sglang-0.5.23 applied to ")
    assert g["index_k_source"].endswith(f"({PATCH_A})")
    assert r["full_max_total_num_tokens"] == 17_546_240 and r["index_k"]["overcommit_gib"] == 0


def test_switch_unset_falls_back_to_the_profile_with_a_note(patched):
    g, r = plan(profile(patched, "sglang", {}))
    assert (r["index_k"]["dtype"], r["index_k"]["accounting"]) == ("bf16", "fp8")
    assert g["index_k_source"] == "profile"
    assert f"{PATCH_A} is applied but SGLANG_DSV4_INDEX_K_DTYPE=bf16 is not set" in g["warnings"][0]
    assert r["full_max_total_num_tokens"] == 19_158_016


def test_set_still_wins(patched):
    g, r = plan(profile(patched, "sglang", {"SGLANG_DSV4_INDEX_K_DTYPE": "bf16"}),
                "--set", "index_k_accounting=fp8", "--set", "index_k_dtype=fp8")
    assert (r["index_k"]["dtype"], r["index_k"]["accounting"], g["index_k_source"]) == ("fp8", "fp8", "--set")


def test_unpatched_tree_keeps_profile_values(tmp_path):
    fresh_tree(tmp_path / "sglang")
    g, r = plan(profile(tmp_path, "sglang", {"SGLANG_DSV4_INDEX_K_DTYPE": "bf16"}))
    assert (r["index_k"]["accounting"], g["index_k_source"]) == ("fp8", "profile")


def test_bad_tree_is_input_error(tmp_path):
    r = run_cli("plan", str(profile(tmp_path, "missing", {})), env=ENV)
    assert r.code == 2 and "sglang.tree:" in r.err and "missing: no such directory" in r.err


# -- --from-log, on lines the real configurator printed -----------------------------------


@pytest.fixture(scope="module")
def real_lines(oracle_runs) -> dict:
    """Log lines the patched configurator printed for Flash at FLASH_BYTES, switch on and off."""
    return dict(bf16=oracle_runs[("deepseek-v4-flash", FLASH_BYTES, "bf16")]["log"],
                fp8=oracle_runs[("deepseek-v4-flash", FLASH_BYTES, "off")]["log"])


def server_log(lines: list[str], keep=lambda ln: True) -> str:
    out = ["[2026-11-29 12:00:00] server_args=ServerArgs(model_path='deepseek-ai/DeepSeek-V4-Flash', tp_size=8)"]
    for tp in range(8):
        out += [f"[2026-11-29 12:00:05 TP{tp}] {ln}" for ln in lines if keep(ln)]
    out.append("[2026-11-29 12:00:06 TP0] KV Cache is allocated. #tokens: 17546240")
    return "\n".join(out) + "\n"


def test_from_log_matches_the_patched_server(patched, real_lines, tmp_path):
    log = tmp_path / "server.log"
    log.write_text(server_log(real_lines["bf16"]))
    p = profile(patched, "sglang", {"SGLANG_DSV4_INDEX_K_DTYPE": "bf16"})
    r = run_cli("plan", str(p), "--set", f"available_bytes={FLASH_BYTES}", "--from-log", str(log), "--json", env=ENV)
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["ok"] and doc["group"] == "main" and len(doc["ranks"]) == 8
    r0 = doc["ranks"][0]
    assert r0["source"] == "DSV4_POOL_PLAN" and r0["rank"] == "TP0" and r0["plan_rank"] == 0
    assert r0["pools"]["full"] == dict(planned=17546240, logged=17546240, diff=0, pct=0.0)
    assert r0["pools"]["c128_state"]["logged"] == 32896
    assert r0["bytes_per_full_token"] == dict(logged=7737.75, planned=7737.75, match=True)
    assert r0["available"]["logged_bytes"] == r0["available"]["planned_bytes"] == FLASH_BYTES
    text = run_cli("plan", str(p), "--set", f"available_bytes={FLASH_BYTES}", "--from-log", str(log), env=ENV)
    assert text.code == 0 and "ok: the log matches the plan" in text.out


def test_from_log_reports_the_difference_per_pool(patched, real_lines, tmp_path):
    """A stock server (switch off: fp8 budget) against the bf16/exact plan: every pool differs."""
    log = tmp_path / "server.log"
    log.write_text(server_log(real_lines["fp8"], keep=lambda ln: not ln.startswith("DSV4_POOL_PLAN")))
    p = profile(patched, "sglang", {"SGLANG_DSV4_INDEX_K_DTYPE": "bf16"})
    r = run_cli("plan", str(p), "--set", f"available_bytes={FLASH_BYTES}", "--from-log", str(log), "--json", env=ENV)
    assert r.code == 1
    doc = r.json()
    assert not doc["ok"]
    r0 = doc["ranks"][0]
    assert r0["source"] == "DSV4 pool sizes" and "c128_state" not in r0["pools"]
    assert r0["pools"]["full"] == dict(planned=17546240, logged=19158016, diff=1611776, pct=9.186)
    assert r0["pools"]["c4"]["diff"] == 4789504 - 4386560
    assert r0["bytes_per_full_token"] == dict(logged=7086.75, planned=7737.75, match=False)
    assert r0["available"]["logged_gib"] == 128.97
    assert "40 pool value(s) differ from the plan; bytes per full token differs on 8 rank(s)" in r.err


def test_from_log_errors(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("[t TP0] nothing\n")
    r = run_cli("plan", "--from-log", str(empty), env=ENV)
    assert r.code == 2 and "no 'DSV4 pool sizes' or 'DSV4_POOL_PLAN' line" in r.err
    log = tmp_path / "x.log"
    log.write_text("[t TP0] DSV4 pool sizes: full=1, swa=1, c4=1, c128=1, c4_state=1, c128_state=0\n")
    r = run_cli("plan", str(DEFAULT_PROFILE), "--from-log", str(log), env=ENV)
    assert r.code == 2 and "name the server's group with -g" in r.err
    r = run_cli("plan", "--from-log", str(tmp_path / "nope.log"), "-g", "decode", env=ENV)
    assert r.code == 2 and "No such file" in r.err
    r = run_cli("plan", "--from-log", str(log), "-g", "decode", "--json", env=ENV)
    assert r.code == 1 and r.json()["ranks"][0]["pools"]["full"]["logged"] == 1
