"""``dsv4ctl config lint`` end to end: exit codes, one-line errors, JSON."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli


@pytest.fixture
def prof(tmp_path) -> Path:
    shutil.copytree(REPO / "profiles" / "dsv4-flash-8xb200-pd", tmp_path / "dsv4-flash-8xb200-pd")
    text = (REPO / "profiles" / "dsv4-flash-8xb200-pd.yaml").read_text()
    p = tmp_path / "p.yaml"
    p.write_text(text.replace("series: ../patches/sglang-0.5.23", "series: null"))
    return p


def test_default_profile_lints_with_only_the_gating_warning():
    r = run_cli("config", "lint", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["schema"] == "dsv4ctl.lint/1" and doc["ok"] is True
    assert [f["rule"] for f in doc["findings"]] == ["DSV112"]


def test_missing_file_exit_2(prof):
    (prof.parent / "dsv4-flash-8xb200-pd" / "decode.yaml").unlink()
    r = run_cli("config", "lint", str(prof))
    assert r.code == 2
    # the one serve-config reader's message: the profile line of the group, then the missing file
    assert r.err.strip().endswith(f"groups[1].serve_config: no such file {prof.parent}/dsv4-flash-8xb200-pd/decode.yaml")
    assert r.err.count("\n") == 1 and "Traceback" not in r.err


def test_yaml_syntax_error_names_file_and_line(prof):
    f = prof.parent / "dsv4-flash-8xb200-pd" / "prefill.yaml"
    lines = f.read_text().splitlines(keepends=True)
    lines[6] = "tp-size: [4\n"
    f.write_text("".join(lines))
    r = run_cli("config", "lint", str(prof))
    assert r.code == 2
    assert f"{f}:8: YAML syntax error" in r.err


def test_unknown_key_and_bad_value_exit_2_with_table(prof):
    f = prof.parent / "dsv4-flash-8xb200-pd" / "decode.yaml"
    f.write_text(f.read_text() + "mem_fraction_static: 0.8\nhicache-io-backend: dma\n")
    r = run_cli("config", "lint", str(prof), "-g", "decode")
    assert r.code == 2
    assert "SGL001 unknown-key" in r.out and "SGL004 invalid-value" in r.out
    assert "2 error(s)" in r.out
    assert r.err.startswith(f"dsv4ctl: error: config lint: 2 error(s); first: {f}:19: error SGL001")


def test_markdown_and_router_group_rejected(prof):
    r = run_cli("config", "lint", str(prof), "--markdown", "-g", "prefill")
    assert r.code == 0 and r.out.startswith("## dsv4ctl config lint")
    r = run_cli("config", "lint", str(prof), "-g", "router")
    assert r.code == 2 and "router" in r.err
