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
    from dsv4ctl.profile.yamlpos import load_yaml
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
    from dsv4ctl.plan.capacity import ModelGeometry
    g = ModelGeometry.from_config(FLASH, "flash")
    assert (g.num_hidden_layers, g.qk_nope_head_dim, g.index_head_dim, g.sliding_window) == (43, 448, 128, 128)
    g = ModelGeometry.from_config(dict(FLASH, kv_source_layer_ids=[0, 42]), "flash")
    assert g.kv_source_layer_ids == (0, 42)


# --- 5: PP topology is input, not a verdict ---------------------------------------------------

@pytest.mark.parametrize("sets,msg", [
    (["pp_size=44"], "--set pp_size: pp_size 44 exceeds num_hidden_layers 43"),
    (["pp_size=2", "SGLANG_PP_LAYER_PARTITION=43"],
     "--set SGLANG_PP_LAYER_PARTITION: SGLANG_PP_LAYER_PARTITION 43 must have 2 entries summing to "
     "num_hidden_layers 43"),
    (["pp_size=2", "SGLANG_PP_LAYER_PARTITION=0,43"],
     "--set SGLANG_PP_LAYER_PARTITION: SGLANG_PP_LAYER_PARTITION 0,43: every stage needs >= 1 layer"),
    (["pp_size=2", "SGLANG_PP_LAYER_PARTITION=-1,44"],
     "--set SGLANG_PP_LAYER_PARTITION: SGLANG_PP_LAYER_PARTITION -1,44: every stage needs >= 1 layer"),
    (["pp_size=2", "SGLANG_PP_LAYER_PARTITION=20,20"],
     "--set SGLANG_PP_LAYER_PARTITION: SGLANG_PP_LAYER_PARTITION 20,20 must have 2 entries summing to "
     "num_hidden_layers 43"),
])
def test_pp_inputs_exit_2(sets, msg):
    from tests.conftest import DEFAULT_PROFILE
    args = [a for s in sets for a in ("--set", s)]
    assert one_error(run_cli("plan", str(DEFAULT_PROFILE), "-g", "decode", *args)) == msg


def test_pp_partition_from_profile_env_names_the_line(tmp_path):
    prof = copy_profile(tmp_path)
    text = edit(prof, "    tp: 4\n    serve_config: dsv4-flash-8xb200-pd/decode.yaml",
                "    tp: 4\n    env: {SGLANG_PP_LAYER_PARTITION: '0,43'}\n"
                "    serve_config: dsv4-flash-8xb200-pd/decode.yaml")
    err = one_error(plan(prof, "-g", "decode", "--set", "pp_size=2"))
    assert err == (f"{prof}:{line_of(text, 'SGLANG_PP_LAYER_PARTITION')}: groups[1].env.SGLANG_PP_LAYER_PARTITION: "
                   "SGLANG_PP_LAYER_PARTITION 0,43: every stage needs >= 1 layer")


def test_valid_pp_partition_still_plans():
    from tests.conftest import DEFAULT_PROFILE
    r = run_cli("plan", str(DEFAULT_PROFILE), "-g", "decode", "--json", "--set", "pp_size=2", "--set", "tp_size=2",
                "--set", "SGLANG_PP_LAYER_PARTITION=21,22")
    assert r.code in (0, 1), r.err
    ranks = json.loads(r.out)["groups"][0]["ranks"]
    assert sorted({tuple(x["layers"]) for x in ranks}) == [(0, 21), (21, 43)]


# --- 6: rank count cap ----------------------------------------------------------------------

def test_rank_product_capped():
    from tests.conftest import DEFAULT_PROFILE
    r = run_cli("plan", str(DEFAULT_PROFILE), "-g", "decode", "--set", "tp_size=1024", "--set", "dp_size=1024",
                timeout=20)
    assert one_error(r) == ("group decode: tp_size*pp_size*dp_size = 1048576 ranks exceeds 1024 "
                            "(a plan lists every rank)")


def test_rank_product_with_dp_attention_counts_tp_pp():
    from tests.conftest import DEFAULT_PROFILE
    r = run_cli("plan", str(DEFAULT_PROFILE), "-g", "decode", "--set", "tp_size=1024", "--set", "dp_size=8",
                "--set", "enable_dp_attention=true", "--set", "pp_size=2", timeout=20)
    assert one_error(r) == ("group decode: tp_size*pp_size = 2048 ranks exceeds 1024 "
                            "(a plan lists every rank)")


# --- 7: chunked prefill disabled ------------------------------------------------------------

def _plan_json(prof: Path, *args: str) -> dict:
    r = plan(prof, "-g", "prefill", "--json", *args)
    assert r.code in (0, 1), r.err
    return json.loads(r.out)["groups"][0]


def test_chunked_prefill_disabled_uses_max_prefill_tokens(tmp_path):
    prof = copy_profile(tmp_path)
    sc = tmp_path / "dsv4-flash-8xb200-pd" / "prefill.yaml"
    edit(sc, "chunked-prefill-size: 8192", "chunked-prefill-size: -1")
    text = sc.read_text()
    sc.write_text("\n".join(ln for ln in text.splitlines() if not ln.startswith("mem-fraction-static")) + "\n")
    off = _plan_json(prof)
    assert off["server_args"]["chunked_prefill_size"] == -1
    assert off["mem_fraction_static_source"] == "default (memory_hook.py)"
    # memory_hook.py:304-307: activation tokens = max(max_prefill_tokens (16384), 2048)
    same = _plan_json(prof, "--set", "chunked_prefill_size=16384")
    assert (off["mem_fraction_static"], off["activation_reserve_gib"]) == \
        (same["mem_fraction_static"], same["activation_reserve_gib"])
    big = _plan_json(prof, "--set", "max_prefill_tokens=32768")
    big_chunk = _plan_json(prof, "--set", "chunked_prefill_size=32768")
    assert big["activation_reserve_gib"] == big_chunk["activation_reserve_gib"] > off["activation_reserve_gib"]
    assert big["mem_fraction_static"] == big_chunk["mem_fraction_static"] < off["mem_fraction_static"]
    zero = _plan_json(prof, "--set", "chunked_prefill_size=0")
    assert zero["server_args"]["chunked_prefill_size"] == 0
    assert zero["activation_reserve_gib"] == off["activation_reserve_gib"]


def test_chunked_prefill_below_minus_one_rejected():
    from tests.conftest import DEFAULT_PROFILE
    assert one_error(run_cli("plan", str(DEFAULT_PROFILE), "--set", "chunked_prefill_size=-2")) == \
        "--set chunked_prefill_size: must be >= -1, got -2"


# --- 9: duplicate -g ----------------------------------------------------------------------------

def test_duplicate_group_planned_once():
    from tests.conftest import DEFAULT_PROFILE
    r = run_cli("plan", str(DEFAULT_PROFILE), "-g", "decode", "-g", "decode", "--json")
    assert r.code in (0, 1), r.err
    assert [g["name"] for g in json.loads(r.out)["groups"]] == ["decode"]


# --- 8: plan --from-log with malformed pool lines --------------------------------------------

from tests.test_patch_poollog import CALC, PLAN, SIZES  # noqa: E402  (real 0.5.23 line formats)


@pytest.mark.parametrize("line,msg", [
    (f"[t TP0] {CALC.replace('bytes_per_full_token=7737.75', 'bytes_per_full_token=abc')}",
     "bytes_per_full_token: expected a number, got 'abc'"),
    (f"[t TP0] {CALC.replace('bytes_per_full_token=7737.75', 'bytes_per_full_token=nan')}",
     "bytes_per_full_token: expected a finite number, got nan"),
    ("[t TP0] " + PLAN.replace('7737.75', '"7737.75"'),
     "DSV4_POOL_PLAN.bytes_per_full_token: expected a finite number, got '7737.75'"),
    ("[t TP0] " + PLAN.replace('"full":17546240', '"full":"17546240"'),
     "DSV4_POOL_PLAN.full: expected an integer >= 0, got '17546240'"),
    ("[t TP0] " + PLAN.replace('"available_bytes":138484778008', '"available_bytes":"x"'),
     "DSV4_POOL_PLAN.available_bytes: expected an integer, got 'x'"),
])
def test_from_log_malformed_line_is_input_error(tmp_path, line, msg):
    from tests.conftest import DEFAULT_PROFILE
    log = tmp_path / "server.log"
    log.write_text(f"[t TP0] {SIZES}\n{line}\n")
    r = run_cli("plan", str(DEFAULT_PROFILE), "-g", "decode", "--from-log", str(log))
    assert one_error(r) == f"{log}:2: {msg}"


def test_from_log_too_large_is_input_error(tmp_path, monkeypatch):
    """A log over the cap is refused before it is read into memory (the cap is lowered here to
    keep the file small; the real one is 256 MiB)."""
    import io
    import contextlib
    from dsv4ctl.commands import planlog
    from dsv4ctl.errors import InputError
    monkeypatch.setattr(planlog, "MAX_LOG_BYTES", 1000)
    log = tmp_path / "server.log"
    log.write_text(f"[t TP0] {SIZES}\n" + "x" * 2000 + "\n")
    with pytest.raises(InputError, match=r"larger than 0 MiB; pass the start-up part"), \
            contextlib.redirect_stdout(io.StringIO()):
        planlog.from_log({"groups": []}, str(log), False, False)


@pytest.mark.parametrize("args,msg", [
    (("-c", "4097"), "--concurrency '4097': at most 64 levels of at most 4096 sessions"),
    (("-c", ",".join(["1"] * 65)), "at most 64 levels of at most 4096 sessions"),
    (("--turns", "10001"), "--turns must be in 1..10000"),
    (("--turns", "0"), "--turns must be in 1..10000"),
    (("--min-requests", "10000001"), "--min-requests must be in 0..10,000,000"),
])
def test_check_load_knobs_are_bounded(args, msg):
    r = run_cli("check", "load", "http://127.0.0.1:9", *args)
    assert r.code == 2 and one_error(r).endswith(msg), r.err


def test_parse_log_raises_log_format_error_with_line():
    from dsv4ctl.plan.poollog import LogFormatError, parse_log
    with pytest.raises(LogFormatError) as e:
        parse_log("x\n\n[t TP1] " + PLAN.replace('"c4":4386560', '"c4":-1') + "\n")
    assert (e.value.line, e.value.field, e.value.message) == (3, "DSV4_POOL_PLAN.c4", "expected an integer >= 0, got -1")


# --- 1 (what-ifs): --set memory values are bounded like the profile's --------------------------

@pytest.mark.parametrize("item,msg", [
    ("free_gib_before_load=1e300", "--set free_gib_before_load: must be <= 100000, got '1e300'"),
    ("other_gib=1e300", "--set other_gib: must be <= 100000, got '1e300'"),
    ("weights_gib_per_rank=inf", "--set weights_gib_per_rank: must be a finite number >= 0.0, got 'inf'"),
    ("gpu_memory_mib=0", "--set gpu_memory_mib: must be >= 1, got 0"),
    ("gpu_memory_mib=1000000000000", "--set gpu_memory_mib: must be <= 102400000, got 1000000000000"),
])
def test_set_memory_bounds(item, msg):
    from tests.conftest import DEFAULT_PROFILE
    assert one_error(run_cli("plan", str(DEFAULT_PROFILE), "-g", "decode", "--set", item)) == msg


# --- serve config and env numbers ------------------------------------------------------------

@pytest.mark.parametrize("old,new,anchor,msg", [
    ("mem-fraction-static: 0.885", "mem-fraction-static: .nan", "mem-fraction-static",
     "mem-fraction-static: must be a finite number >= 0.0, got nan"),
    ("max-running-requests: 128", "max-running-requests: 128.0", "max-running-requests",
     "max-running-requests: invalid int value: '128.0' (SGLang 0.5.23 refuses it at start-up: argparse)"),
])
def test_serve_config_numbers(tmp_path, old, new, anchor, msg):
    prof = copy_profile(tmp_path)
    sc = tmp_path / "dsv4-flash-8xb200-pd" / "decode.yaml"
    text = edit(sc, old, new)
    assert one_error(plan(prof, "-g", "decode")) == f"{sc}:{line_of(text, anchor)}: {msg}"


def test_profile_env_nan(tmp_path):
    prof = copy_profile(tmp_path)
    text = edit(prof, "    tp: 4\n    serve_config: dsv4-flash-8xb200-pd/decode.yaml",
                "    tp: 4\n    env: {SGLANG_SWA_EVICTION_INTERVAL: .nan}\n"
                "    serve_config: dsv4-flash-8xb200-pd/decode.yaml")
    assert one_error(plan(prof)) == (f"{prof}:{line_of(text, 'SGLANG_SWA_EVICTION_INTERVAL')}: "
                                     "groups[1].env.SGLANG_SWA_EVICTION_INTERVAL: must be a finite number, got nan")


@pytest.mark.parametrize("argv", [["plan"], ["config", "lint"], ["status"], ["deploy", "--dry-run"], ["verify"]])
def test_an_overlong_path_component_is_one_line_exit_2(argv):
    long = "p" * 300
    for path in (f"{long}.yaml", f"/tmp/{long}/x.yaml"):
        r = run_cli(*argv, path)
        assert r.code == 2, (argv, r.err)
        assert r.err.strip() == f"dsv4ctl: error: profile path: a component of {len(long) + 5 * path.startswith('p')} " \
                                f"bytes ({'p' * 24}…) is longer than file names may be (255)", r.err


# --- operator files are regular files of bounded size (issue 41 item 2) -----------------------
# Every file an operator names goes through dsv4ctl.resources.read_regular: a FIFO is never waited
# on (before: plan --from-log, config lint's model config.json and a series hung), /dev/zero is
# never read (before: 256 MiB read before "larger than"), a huge file is refused by its size.

@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_model_config_json_that_is_no_regular_file(tmp_path, kind):
    import os
    prof = copy_profile(tmp_path)
    cp = tmp_path / "config.json"
    os.mkfifo(cp) if kind == "fifo" else os.symlink("/dev/zero", cp)
    text = edit(prof, "model: deepseek-v4-flash ", "model: config.json ")
    what = "a pipe" if kind == "fifo" else "a device"
    assert one_error(plan(prof, timeout=30)) == (
        f"{prof}:{line_of(text, 'model: config.json')}: model: {cp}: config.json is not a regular file ({what})")
    r = run_cli("config", "lint", str(prof), timeout=30)          # before: hung on the FIFO
    assert r.code == 0 and f"plan unavailable: {prof}:{line_of(text, 'model: config.json')}: model: {cp}: " \
        f"config.json is not a regular file ({what})" in r.out


@pytest.mark.parametrize("kind,what", [("fifo", "a pipe"), ("dev-zero", "a device")])
def test_from_log_that_is_no_regular_file(tmp_path, kind, what):
    import os
    log = tmp_path / "startup.log"
    os.mkfifo(log) if kind == "fifo" else os.symlink("/dev/zero", log)
    r = run_cli("plan", "--from-log", str(log), timeout=30)
    assert r.code == 2 and r.err == f"dsv4ctl: error: --from-log {log}: not a regular file ({what})\n"


def _series(tmp_path: Path) -> Path:
    import shutil
    from tests.conftest import REPO
    d = tmp_path / "series"
    shutil.copytree(REPO / "patches" / "sglang-0.5.23", d)
    return d


@pytest.mark.parametrize("which,kind", [("series", "fifo"), ("patch", "fifo"), ("patch", "dev-zero"),
                                        ("patch", "huge"), ("series", "huge")])
def test_series_and_patch_files_are_regular_and_bounded(tmp_path, which, kind):
    import os
    d = _series(tmp_path)
    name = "0001-dsv4-bf16-index-k-exact-accounting.patch"
    f = d / ("series" if which == "series" else name)
    f.unlink()
    if kind == "fifo":
        os.mkfifo(f)
    elif kind == "dev-zero":
        os.symlink("/dev/zero", f)
    else:
        with open(f, "wb") as out:
            out.truncate((16 << 20) + 1)          # sparse: the size alone refuses it
    r = run_cli("patch", "check", "--series", str(d), "--dry-run", "--json", timeout=30)
    lines = (tmp_path / "series" / "series").read_text().splitlines() if which == "patch" else []
    label = f"{d / 'series'}" if which == "series" else \
        f"{d / 'series'}:{next(i for i, ln in enumerate(lines, 1) if ln.startswith(name))}: {name}"
    why = {"fifo": "not a regular file (a pipe)", "dev-zero": "not a regular file (a device)",
           "huge": "larger than 16 MiB (not a patch series)"}[kind]
    assert r.code == 2 and r.err == f"dsv4ctl: error: {label}: {why}\n", r.err


@pytest.mark.parametrize("field,kind", [("key", "fifo"), ("key", "dev-zero"), ("known_hosts", "fifo")])
def test_ssh_key_and_known_hosts_are_regular_files(tmp_path, field, kind):
    """paramiko would block on a FIFO key before it connects (the per-host timeout never starts)."""
    import os
    from dsv4ctl.errors import InputError
    from dsv4ctl.remote.ssh import SSHTransport
    f = tmp_path / field
    os.mkfifo(f) if kind == "fifo" else os.symlink("/dev/zero", f)
    kw = {"key": str(f)} if field == "key" else {"known_hosts": f}
    t = SSHTransport("node0", "127.0.0.1", port=9, **kw)
    with pytest.raises(InputError) as e:
        t._connection()
    label = "ssh.key" if field == "key" else "known_hosts"
    assert str(e.value) == f"node0: {label} {f}: not a regular file ({'a pipe' if kind == 'fifo' else 'a device'})"


def test_deploy_patch_files_are_bounded_regular_utf8_files(tmp_path):
    """``deploy --patch`` files get the series' checks: a FIFO is refused unread (it hung the
    build), /dev/zero and non-UTF-8 are one line, exit 2 (issue 41 item 2)."""
    import os
    import re
    from dsv4ctl.deploy.release import series_patches
    from dsv4ctl.errors import InputError
    fifo = tmp_path / "p.fifo"
    os.mkfifo(fifo)
    bad = tmp_path / "bin.patch"
    bad.write_bytes(b"\xff\xfe--- a\n")
    for p, msg in ((fifo, "not a regular file (a pipe)"), (Path("/dev/zero"), "not a regular file"),
                   (bad, "not UTF-8 text"), (tmp_path / "missing.patch", "patch file not found")):
        with pytest.raises(InputError, match=re.escape(msg)):
            series_patches(None, [p])
    ok = tmp_path / "ok.patch"
    ok.write_text("--- a/x\n+++ b/x\n")
    assert series_patches(None, [ok]) == ([ok], None)
