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


# --- 3: config.json -------------------------------------------------------------------------

FLASH = json.loads((Path(__file__).parent.parent / "dsv4ctl/data/models/deepseek-v4-flash.json").read_text())


def _with_config(tmp_path: Path, mutate) -> tuple[Path, Path, str]:
    prof = copy_profile(tmp_path)
    cfg = dict(FLASH)
    mutate(cfg)
    cp = tmp_path / "config.json"
    cp.write_text(json.dumps(cfg))   # allow_nan: NaN/Infinity written as JSON does
    text = edit(prof, "model: deepseek-v4-flash ", "model: config.json ")
    return prof, cp, text


def _set(key, value):
    def m(cfg):
        cfg[key] = value
    return m


CONFIG_CASES = [
    ("ratios-int", _set("compress_ratios", 4), "compress_ratios: expected a list of integers, got 4"),
    ("ratios-null", _set("compress_ratios", None), "compress_ratios: expected a list of integers, got None"),
    ("ratios-str", _set("compress_ratios", "4,128"), "compress_ratios: expected a list of integers, got '4,128'"),
    ("ratios-x", _set("compress_ratios", ["x"] * 44), "compress_ratios[0]: expected an integer, got 'x'"),
    ("ratios-float", _set("compress_ratios", [4.7] * 44), "compress_ratios[0]: expected an integer, got 4.7"),
    ("head-nan", _set("head_dim", float("nan")), "head_dim: expected an integer, got nan"),
    ("head-inf", _set("head_dim", float("inf")), "head_dim: expected an integer, got inf"),
    ("head-lt-rope", _set("head_dim", 32),
     "head_dim: 32 must exceed qk_rope_head_dim 64 (qk_nope_head_dim = head_dim - qk_rope_head_dim)"),
    ("index-neg", _set("index_head_dim", -128), "index_head_dim: must be within 1..1048576, got -128"),
    ("index-zero", _set("index_head_dim", 0), "index_head_dim: must be within 1..1048576, got 0"),
    ("window-zero", _set("sliding_window", 0), "sliding_window: must be within 1..1073741824, got 0"),
    ("kvsrc-int", _set("kv_source_layer_ids", 5), "kv_source_layer_ids: expected a list of layer ids, got 5"),
    ("kvsrc-str", _set("kv_source_layer_ids", ["a"]), "kv_source_layer_ids[0]: expected an integer, got 'a'"),
    ("kvsrc-range", _set("kv_source_layer_ids", [43]), "kv_source_layer_ids[0]: must be within 0..42, got 43"),
    ("layers-bool", _set("num_hidden_layers", True), "num_hidden_layers: expected an integer, got True"),
]


@pytest.mark.parametrize("case,mutate,msg", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_bad_config_json(tmp_path, case, mutate, msg):
    prof, cp, text = _with_config(tmp_path, mutate)
    err = one_error(plan(prof))
    assert err == f"{prof}:{line_of(text, 'model: config.json')}: model: model config {cp}: {msg}"


def test_config_json_size_cap(tmp_path):
    prof, cp, text = _with_config(tmp_path, lambda c: None)
    with open(cp, "ab") as f:
        f.write(b" " * (16 * 1024 * 1024))
    err = one_error(plan(prof))
    assert err == f"{prof}:{line_of(text, 'model: config.json')}: model: {cp}: config.json larger than 16 MiB"


def test_from_config_accepts_shipped_configs():
    from dsv4ctl.capacity import ModelGeometry
    g = ModelGeometry.from_config(FLASH, "flash")
    assert (g.num_hidden_layers, g.qk_nope_head_dim, g.index_head_dim, g.sliding_window) == (43, 448, 128, 128)
    g = ModelGeometry.from_config(dict(FLASH, kv_source_layer_ids=[0, 42]), "flash")
    assert g.kv_source_layer_ids == (0, 42)
