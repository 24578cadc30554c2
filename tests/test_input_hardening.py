"""Adversarial inputs (non-finite numbers, float sizes, YAML bombs, broken config.json, bad PP
partitions, huge rank counts, broken logs): each is one line ``dsv4ctl: error: ...`` with exit 2,
never a traceback, and fast. Every case runs the real CLI on an edited copy of the default profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.test_profile_errors import copy_profile, edit, line_of, one_error


def plan(prof: Path, *args: str, timeout: float = 60):
    return run_cli("plan", str(prof), *args, timeout=timeout)


# --- 1/2: profile numbers -------------------------------------------------------------------

@pytest.mark.parametrize("value,msg", [
    (".nan", "must be a finite number, got nan"),
    (".inf", "must be a finite number, got inf"),
    ("1.0e+300", "1e+300 is greater than the maximum of 100000"),
    ("100001", "100001 is greater than the maximum of 100000"),
])
def test_memory_non_finite_or_absurd(tmp_path, value, msg):
    prof = copy_profile(tmp_path)
    text = edit(prof, "      free_gib_before_load: 177.0   #", f"      free_gib_before_load: {value}   #")
    err = one_error(plan(prof))
    assert err == f"{prof}:{line_of(text, 'free_gib_before_load: ' + value)}: groups[0].memory.free_gib_before_load: {msg}"


@pytest.mark.parametrize("field,value", [("tp", "4.0"), ("tp", "true"), ("pp", "1.0")])
def test_parallel_sizes_must_be_real_ints(tmp_path, field, value):
    prof = copy_profile(tmp_path)
    old = "    tp: 4\n    serve_config: dsv4-flash-8xb200-pd/prefill.yaml"
    new = (f"    tp: {value}\n" if field == "tp" else f"    tp: 4\n    pp: {value}\n") + \
        "    serve_config: dsv4-flash-8xb200-pd/prefill.yaml"
    text = edit(prof, old, new)
    err = one_error(plan(prof))
    shown = {"4.0": "4.0", "true": "True", "1.0": "1.0"}[value]
    assert err == (f"{prof}:{line_of(text, f'{field}: {value}')}: groups[0].{field}: "
                   f"{shown} is not of type 'integer'")


# --- 4: YAML bombs ----------------------------------------------------------------------------

def _laughs() -> str:
    out = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        out.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(out) + "\n"


def test_billion_laughs_profile(tmp_path):
    prof = tmp_path / "bomb.yaml"
    prof.write_text(_laughs())
    err = one_error(plan(prof, timeout=20))
    assert err == f"{prof}:2: d[0][0]: more than 100 YAML alias uses (billion-laughs guard)"


def test_billion_laughs_serve_config(tmp_path):
    prof = copy_profile(tmp_path)
    sc = tmp_path / "dsv4-flash-8xb200-pd" / "decode.yaml"
    sc.write_text(sc.read_text() + "x-bomb:\n" + "".join("  " + ln + "\n" for ln in _laughs().splitlines()))
    err = one_error(plan(prof, timeout=20))
    assert err.startswith(f"{sc}:") and err.endswith("more than 100 YAML alias uses (billion-laughs guard)")


def test_recursive_alias(tmp_path):
    prof = tmp_path / "rec.yaml"
    prof.write_text("name: x\nmodel: flash\na: &a [*a]\n")
    assert one_error(plan(prof)) == f"{prof}:3: a[0]: recursive YAML alias"


def test_a_few_aliases_still_work(tmp_path):
    from dsv4ctl.yamlpos import load_yaml
    p = tmp_path / "ok.yaml"
    p.write_text("base: &b {x: 1}\none: *b\ntwo: *b\n")
    data, _ = load_yaml(p)
    assert data == {"base": {"x": 1}, "one": {"x": 1}, "two": {"x": 1}}


def test_yaml_file_size_cap(tmp_path):
    prof = tmp_path / "big.yaml"
    with open(prof, "wb") as f:
        f.write(b"# " + b"x" * (16 * 1024 * 1024) + b"\n")
    assert one_error(plan(prof)) == f"{prof}:1: file larger than 16 MiB"
