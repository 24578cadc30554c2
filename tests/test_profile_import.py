"""``dsv4ctl profile import srt-slurm RECIPE`` (issue 43 item 6): an NVIDIA srt-slurm SGLang recipe
becomes a profile and serve configs that ``plan`` and ``config lint`` judge.

The recipes in ``tests/data/srt-slurm/`` are written by hand from srt-slurm's documented recipe
fields (its docs/config-reference.md), each in the layout of the NVIDIA/srt-slurm recipe its first
comment names: a 1P1D DEP4/DEP8 disagg with MTP, a TP4/TP4 disagg, an aggregated TP8, a decode DEP16
over four GB300 nodes, and GB200 TP8 workers over two nodes each (three decode replicas). Each is
imported through the real CLI, then planned and linted; the plan's groups (roles, nodes and GPUs,
replicas, tp, dp, attention DP) and the serve configs' expert parallelism are the recipe's."""

from __future__ import annotations

import json
import re
import os
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_cli

DATA = Path(__file__).parent / "data" / "srt-slurm"

# recipe -> {group: (role, [[hosts of each server]], GPUs on each node, tp, dp, attention DP, ep)}
EXPECT = {
    "disagg-1p1d-dep4-dep8-mtp": {
        "prefill": ("prefill", [["prefill-0"]], [0, 1, 2, 3], 4, 4, True, 4),
        "decode": ("decode", [["decode-0"]], list(range(8)), 8, 8, True, 8)},
    "disagg-1p1d-tp4-tp4": {
        "prefill": ("prefill", [["prefill-0"]], [0, 1, 2, 3], 4, 1, False, 1),
        "decode": ("decode", [["decode-0"]], [0, 1, 2, 3], 4, 1, False, 1)},
    "agg-tp8": {
        "agg": ("colocated", [["agg-0"]], list(range(8)), 8, 1, False, 1)},
    "disagg-1p1d-dep4-dep16-mtp": {
        "prefill": ("prefill", [["prefill-0"]], [0, 1, 2, 3], 4, 4, True, 4),
        "decode": ("decode", [["decode-0", "decode-1", "decode-2", "decode-3"]], [0, 1, 2, 3], 16, 16, True, 16)},
    "disagg-1p3d-tp8-replicas": {
        "prefill": ("prefill", [["prefill-0", "prefill-1"]], [0, 1, 2, 3], 8, 1, False, 1),
        "decode": ("decode", [["decode-0", "decode-1"], ["decode-2", "decode-3"], ["decode-4", "decode-5"]],
                   [0, 1, 2, 3], 8, 1, False, 1)},
}
GPU = {"disagg-1p1d-dep4-dep8-mtp": ("NVIDIA B300", 8, 275040), "disagg-1p1d-tp4-tp4": ("NVIDIA B300", 8, 275040),
       "agg-tp8": ("NVIDIA B300", 8, 275040), "disagg-1p1d-dep4-dep16-mtp": ("NVIDIA GB300", 4, 284208),
       "disagg-1p3d-tp8-replicas": ("NVIDIA GB200", 4, 189471)}


def env(tmp: Path) -> dict:
    return {"DSV4CTL_CACHE": str(tmp / "cache"), "DSV4CTL_STATE_DIR": str(tmp / "state")}


def imported(tmp: Path, recipe: str | Path, *extra: str) -> Path:
    """Import ``recipe`` (a name in DATA or a path) to ``tmp/out/p.yaml``; assert exit 0."""
    src = recipe if isinstance(recipe, Path) else DATA / f"{recipe}.yaml"
    out = tmp / "out" / "p.yaml"
    r = run_cli("profile", "import", "srt-slurm", str(src), "--out", str(out), *extra, env=env(tmp))
    assert r.code == 0, r.err
    return out


def load(p: Path) -> dict:
    return yaml.safe_load(p.read_text())


def refused(tmp: Path, text: str | bytes, *extra: str) -> str:
    """Import a recipe of ``text``: exit 2, one ``error:`` line, nothing written; the message."""
    src = tmp / "recipe.yaml"
    (src.write_bytes if isinstance(text, bytes) else src.write_text)(text)
    r = run_cli("profile", "import", "srt-slurm", str(src), "--out", str(tmp / "out" / "p.yaml"), *extra, env=env(tmp))
    assert r.code == 2, (r.code, r.out, r.err)
    assert r.err.startswith("dsv4ctl: error: ") and r.err.count("\n") == 1 and "Traceback" not in r.err, r.err
    assert not (tmp / "out").exists()
    return r.err


@pytest.mark.parametrize("name", list(EXPECT))
def test_an_imported_recipe_plans_and_lints_with_the_recipes_topology(tmp_path, name):
    p = imported(tmp_path, name)
    plan = run_cli("plan", str(p), "--json", env=env(tmp_path))
    assert plan.code == 0, plan.err
    doc = plan.json()
    assert doc["model"] == "deepseek-v4-pro" and doc["sglang_version"] == "0.5.23"
    got = {g["name"]: g for g in doc["groups"]}
    assert list(got) == list(EXPECT[name])
    for gname, (role, servers, gpus, tp, dp, attn, ep) in EXPECT[name].items():
        g = got[gname]
        assert (g["role"], g["nnodes"], g["replicas"]) == (role, len(servers[0]), len(servers))
        assert [(n["host"], n["gpus"]) for n in g["nodes"]] == [(h, gpus) for h in servers[0]]
        assert (g["tp"], g["dp"], g["dp_attention"]) == (tp, dp, attn)
        assert g["server_args"]["attn_dp_size"] == (dp if attn else 1)
        assert g["gpu_memory_mib"] == GPU[name][2]
        assert g["verdict"]["level"] in ("fits", "tight")
        serve = load(p.parent / "p" / f"{gname}.yaml")
        assert serve.get("expert-parallel-size", 1) == ep and serve.get("nnodes", 1) == len(servers[0])
    prof = load(p)
    n_hosts = sum(len(srv) for v in EXPECT[name].values() for srv in v[1])
    assert [(h["gpus"]["model"], h["gpus"]["count"], h["gpus"]["memory_mib"]) for h in prof["hosts"]] == [GPU[name]] * n_hosts
    assert all(h["address"] == f"{h['name']}.invalid" for h in prof["hosts"])
    for g in prof["groups"]:
        if g["role"] != "router":
            servers = EXPECT[name][g["name"]][1]
            where = g.get("replicas") or [g.get("nodes") or [g["host"]]]
            assert [w if isinstance(w, list) else (w["nodes"] if isinstance(w, dict) else [w]) for w in where] == servers
    lint = run_cli("config", "lint", str(p), "--json", env=env(tmp_path))
    assert lint.code == 0, lint.out + lint.err
    assert [f for f in lint.json()["findings"] if f["severity"] == "error"] == []


def test_the_pd_profile_gets_a_router_and_the_aggregated_one_none(tmp_path):
    pd = load(imported(tmp_path, "disagg-1p1d-dep4-dep8-mtp"))
    assert pd["groups"][-1] == {"name": "router", "role": "router", "host": "prefill-0", "port": 8000,
                                "prefill": ["prefill"], "decode": ["decode"]}
    agg = load(imported(tmp_path / "agg", "agg-tp8"))
    assert [g["role"] for g in agg["groups"]] == ["colocated"]


def test_serve_configs_are_what_sglang_0_5_23_reads_from_a_config_file(tmp_path):
    p = imported(tmp_path, "disagg-1p1d-dep4-dep8-mtp")
    decode = load(p.parent / "p" / "decode.yaml")
    # enable-dp-attention + data-parallel-size 8 -> attn-dp-size 8 (0.5.23 refuses the flag in --config)
    assert "enable-dp-attention" not in decode and "data-parallel-size" not in decode and decode["attn-dp-size"] == 8
    assert decode["cuda-graph-max-bs-decode"] == 256 and "cuda-graph-max-bs" not in decode
    assert decode["speculative-algorithm"] == "EAGLE" and "speculative-algo" not in decode
    assert decode["speculative-num-draft-tokens"] == 4 and decode["context-length"] == 16384
    assert decode["model-path"] == "/model/" and decode["served-model-name"] == "deepseek-ai/DeepSeek-V4-Pro"
    assert (decode["tool-call-parser"], decode["reasoning-parser"]) == ("deepseekv4", "deepseek-v4")
    text = (p.parent / "p" / "decode.yaml").read_text()
    assert "reasoning-parser: \"deepseek-v4\"   # DeepSeek-V4 needs it behind an SGLang gateway" in text
    # snake_case keys become --config keys; a missing model-path is the model's repository
    tp4 = imported(tmp_path / "b", "disagg-1p1d-tp4-tp4")
    assert load(tp4.parent / "p" / "prefill.yaml")["mem-fraction-static"] == 0.9
    assert load(tp4.parent / "p" / "decode.yaml")["max-running-requests"] == 64
    rep = imported(tmp_path / "c", "disagg-1p3d-tp8-replicas")
    pre = load(rep.parent / "p" / "prefill.yaml")
    assert (pre["model-path"], pre["nnodes"], pre["disaggregation-bootstrap-port"]) == ("deepseek-ai/DeepSeek-V4-Pro", 2, 30001)


def test_each_group_gets_its_roles_environment_over_the_global_one(tmp_path):
    prof = load(imported(tmp_path, "disagg-1p1d-tp4-tp4"))
    env_of = {g["name"]: g.get("env") for g in prof["groups"]}
    assert env_of["prefill"] == {"PYTHONUNBUFFERED": "1", "NCCL_CUMEM_ENABLE": "0",
                                 "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "100000"}
    assert env_of["decode"] == {"PYTHONUNBUFFERED": "1", "NCCL_CUMEM_ENABLE": "1",
                                "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "100000"}
    agg = load(imported(tmp_path / "agg", "agg-tp8"))
    assert agg["groups"][0]["env"] == {"PYTHONUNBUFFERED": "1", "SGLANG_JIT_DEEPGEMM_PRECOMPILE": "1",
                                       "SGLANG_OPT_USE_JIT_NORM": "1"}


def test_image_and_slurm_settings_are_recorded_and_skipped_keys_listed(tmp_path):
    out = tmp_path / "out" / "p.yaml"
    r = run_cli("profile", "import", "srt-slurm", str(DATA / "disagg-1p1d-dep4-dep8-mtp.yaml"), "--out", str(out),
                "--json", env=env(tmp_path))
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["schema"] == "dsv4ctl.profile-import/1" and doc["dry_run"] is False
    assert doc["container"] == "lmsysorg/sglang:nightly-dev-cu13-20260721-8905cbd4"
    assert doc["slurm"] == {"partition": "batch", "account": "inference", "time_limit": "04:00:00"}
    assert (doc["model"], doc["gpu_type"], doc["gpus_per_node"]) == ("deepseek-v4-pro", "b300", 8)
    assert [(g["name"], g["tp"], g["dp"], g["attn_dp_size"], g["ep"], g["nnodes"], g["replicas"]) for g in doc["groups"]] \
        == [("prefill", 4, 1, 4, 4, 1, 1), ("decode", 8, 1, 8, 8, 1, 1)]
    assert doc["files"] == [str(out), str(out.parent / "p" / "prefill.yaml"), str(out.parent / "p" / "decode.yaml"),
                            str(out.parent / "p" / "profile.schema.json")]
    assert doc["warnings"] == []
    assert "not imported (srt-slurm job settings): benchmark, frontend, identity" in doc["notes"]
    assert "frontend.type dynamo: the profile's router group runs sglang-router in front instead" in doc["notes"]
    prof = load(out)
    assert prof["description"] == ("srt-slurm recipe dsv4-pro-b300-1p1d-dep4-dep8-mtp, container "
                                   "lmsysorg/sglang:nightly-dev-cu13-20260721-8905cbd4")
    text = out.read_text()
    assert text.startswith("# yaml-language-server: $schema=p/profile.schema.json\n")
    assert "# slurm: partition batch, account inference, time_limit 04:00:00 (srt-slurm job settings)" in text


def test_unknown_recipe_keys_are_warned_by_name(tmp_path):
    text = (DATA / "agg-tp8.yaml").read_text().replace("resources:\n", "mystery_knob: 3\nresources:\n  spread_workers: true\n")
    src = tmp_path / "r.yaml"
    src.write_text(text)
    r = run_cli("profile", "import", "srt-slurm", str(src), "--out", str(tmp_path / "o" / "p.yaml"), env=env(tmp_path))
    assert r.code == 0, r.err
    warned = [ln for ln in r.out.splitlines() if ln.startswith("warning: ")]
    assert warned == [f"warning: {src}:19: unknown recipe key(s) mystery_knob: not imported",
                      f"warning: {src}:21: unknown recipe key(s) resources.spread_workers: not imported"]


def test_dry_run_writes_nothing_and_existing_files_need_force(tmp_path):
    out = tmp_path / "out" / "p.yaml"
    args = ("profile", "import", "srt-slurm", str(DATA / "agg-tp8.yaml"), "--out", str(out))
    r = run_cli(*args, "--dry-run", env=env(tmp_path))
    assert r.code == 0 and r.out.splitlines()[:3] == [f"dry run: would write {out}", f"dry run: would write {out.parent}/p/agg.yaml",
                                                      f"dry run: would write {out.parent}/p/profile.schema.json"]
    assert not (tmp_path / "out").exists()
    assert run_cli(*args, env=env(tmp_path)).code == 0
    before = out.read_text()
    r = run_cli(*args, env=env(tmp_path))
    assert r.code == 2 and r.err == f"dsv4ctl: error: {out}: already exists (--force overwrites)\n"
    out.write_text("edited\n")
    assert run_cli(*args, "--force", env=env(tmp_path)).code == 0 and out.read_text() == before


def test_default_out_is_the_recipes_name_here(tmp_path):
    r = run_cli("profile", "import", "srt-slurm", str(DATA / "agg-tp8.yaml"), cwd=tmp_path, env=env(tmp_path))
    assert r.code == 0, r.err
    assert load(tmp_path / "agg-tp8.yaml")["name"] == "agg-tp8" and (tmp_path / "agg-tp8" / "agg.yaml").is_file()


def test_a_cluster_alias_needs_model(tmp_path):
    text = (DATA / "agg-tp8.yaml").read_text().replace('path: "dsv4-pro"', 'path: "big-moe"').replace(
        '"deepseek-ai/DeepSeek-V4-Pro"', '"served"')
    err = refused(tmp_path, text)
    assert "model.path big-moe: not DeepSeek-V4-Pro or -Flash" in err and "--model" in err
    out = imported(tmp_path, tmp_path / "recipe.yaml", "--model", "deepseek-v4-flash")
    assert load(out)["model"] == "deepseek-v4-flash"


# ------------------------------------------------------------------------------------- bad inputs
def _tweak(name: str, old: str, new: str) -> str:
    text = (DATA / f"{name}.yaml").read_text()
    assert old in text
    return text.replace(old, new)


BAD = {
    "not-yaml": ("name: [unclosed\n", "YAML syntax error"),
    "a-list": ("- one\n- two\n", "not an srt-slurm recipe (a YAML mapping with model, resources and backend)"),
    "no-sglang-config": (_tweak("agg-tp8", "  sglang_config:\n", "  other_config_x:\n").split("  other_config_x:")[0],
                         "backend.sglang_config: missing"),
    "trtllm": (_tweak("disagg-1p1d-tp4-tp4", "  type: sglang\n", "  type: trtllm\n"),
               "backend.type: trtllm: dsv4ctl runs SGLang; only backend.type sglang recipes import"),
    "vllm-config": (_tweak("agg-tp8", "  sglang_config:", "  vllm_config:"), "backend.vllm_config: dsv4ctl runs SGLang"),
    "other-model": (_tweak("disagg-1p1d-tp4-tp4", "DeepSeek-V4-Pro", "DeepSeek-R1").replace('"deepseek-v4-pro"', '"deepseek-r1"'),
                    "not DeepSeek-V4-Pro or -Flash"),
    "unknown-gpu": (_tweak("agg-tp8", 'gpu_type: "b300"', 'gpu_type: "mi355x"'), "'mi355x' is not a GPU dsv4ctl knows"),
    "missing-section": (_tweak("agg-tp8", "    aggregated:\n", "    prefill:\n"),
                        "backend.sglang_config.aggregated is missing: resources run agg workers"),
    "tp-mismatch": (_tweak("agg-tp8", "tensor-parallel-size: 8", "tensor-parallel-size: 4"),
                    "tp 4 x pp 1 x dp 1 = 4 GPUs, but resources give each agg worker 8"),
    "packed-workers": (_tweak("disagg-1p1d-tp4-tp4", "decode_workers: 1", "decode_workers: 2"),
                       "2 workers of 4 GPUs share 8-GPU nodes (srt-slurm packs them)"),
    "too-few-nodes": (_tweak("disagg-1p1d-dep4-dep16-mtp", "decode_nodes: 4", "decode_nodes: 2"),
                      "resources.decode_nodes: 2, but 1 worker(s) of 16 GPUs need 4 node(s) of 4 GPUs"),
    "variants": ("base:\n  name: x\noverride_big:\n  resources: {decode_nodes: 16}\n",
                 "a recipe with variants (base, override_*)"),
    "bad-count": (_tweak("agg-tp8", "agg_workers: 1", "agg_workers: -1"), "resources.agg_workers: must be a whole number from 0 to 4096"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_recipe_that_cannot_be_imported_is_a_one_line_exit_2(tmp_path, case):
    text, want = BAD[case]
    err = refused(tmp_path, text)
    assert want in err and str(tmp_path / "recipe.yaml") in err, err


def test_an_oversized_or_special_file_is_refused_before_it_is_parsed(tmp_path):
    err = refused(tmp_path, b"# x\n" * ((1 << 20) // 4 + 1))
    assert err == f"dsv4ctl: error: {tmp_path / 'recipe.yaml'}: larger than 1 MiB: not an srt-slurm recipe\n"
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    r = run_cli("profile", "import", "srt-slurm", str(fifo), "--out", str(tmp_path / "o" / "p.yaml"), env=env(tmp_path))
    assert r.code == 2 and r.err == f"dsv4ctl: error: {fifo}: not a regular file (a pipe)\n"
    r = run_cli("profile", "import", "srt-slurm", str(tmp_path / "none.yaml"), env=env(tmp_path))
    assert r.code == 2 and r.err == f"dsv4ctl: error: {tmp_path / 'none.yaml'}: No such file or directory\n"


def test_import_json_is_one_document_with_dry_run(tmp_path):
    r = run_cli("profile", "import", "srt-slurm", str(DATA / "disagg-1p3d-tp8-replicas.yaml"), "--out",
                str(tmp_path / "x.yaml"), "--dry-run", "--json", env=env(tmp_path))
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["dry_run"] is True and not (tmp_path / "x.yaml").exists()
    dec = doc["groups"][1]
    assert dec["hosts"] == [["decode-0", "decode-1"], ["decode-2", "decode-3"], ["decode-4", "decode-5"]]
    assert (dec["replicas"], dec["nnodes"], dec["gpus"], dec["tp"]) == (3, 2, [0, 1, 2, 3], 8)


# ----------------------------------------------------------------------------------- fuzzed recipes
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dsv4ctl.errors import InputError  # noqa: E402
from dsv4ctl.profile import srtslurm  # noqa: E402

_BASE = {n: yaml.safe_load((DATA / f"{n}.yaml").read_text()) for n in EXPECT}
_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-3, 40) | st.floats(allow_nan=False) |
                       st.sampled_from(["", "8", "sglang", "trtllm", "b300", "gb300", "x", "dsv4-pro", "DeepSeek-V4-Flash"]),
                       lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(
                           ["prefill", "decode", "aggregated", "type", "tp-size", "path", "repo", "model"]), c, max_size=3),
                       max_leaves=6)


def _paths(d, prefix=()):
    if isinstance(d, dict):
        for k, v in d.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))


@pytest.mark.fuzz
@settings(max_examples=int(os.environ.get("DSV4CTL_FUZZ_EXAMPLES", 150)), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(list(EXPECT)), data=st.data())
def test_a_mutated_recipe_imports_or_is_an_input_error(tmp_path, monkeypatch, name, data):
    """Any recipe made from a real one by replacing or deleting values is imported (and renders) or
    refused with InputError: never another exception."""
    monkeypatch.setenv("DSV4CTL_CACHE", str(tmp_path / "cache"))     # parsed YAML is cached there
    rec = json.loads(json.dumps(_BASE[name]))
    for _ in range(data.draw(st.integers(1, 3))):
        paths = list(_paths(rec))
        if not paths:
            break
        path = data.draw(st.sampled_from(paths))
        parent = rec
        for k in path[:-1]:
            parent = parent[k]
        if data.draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(_VALUES)
    src = tmp_path / f"{name}-fuzz.yaml"
    src.write_text(yaml.safe_dump(rec))
    try:
        r = srtslurm.read_recipe(src)
    except InputError as e:
        assert "\n" not in str(e) and str(e)
        return
    text = srtslurm.profile_text(r, "p", {g.name: f"p/{g.name}.yaml" for g in r.groups})
    assert yaml.safe_load(text)["groups"][0]["name"] == r.groups[0].name
    for g in r.groups:
        assert isinstance(yaml.safe_load(srtslurm.serve_text(r, g)), dict)


def test_the_recipe_is_never_written_over(tmp_path):
    """Run in the recipe's own folder (the default PATH is the recipe's name): the profile goes to
    NAME-profile.yaml; --out naming the recipe is refused, --force or not (follower's finding)."""
    import shutil
    rec = tmp_path / "recipe.yaml"
    shutil.copy(DATA / "agg-tp8.yaml", rec)
    before = rec.read_bytes()
    r = run_cli("profile", "import", "srt-slurm", "recipe.yaml", cwd=tmp_path, env=env(tmp_path))
    assert r.code == 0, r.err
    assert rec.read_bytes() == before and load(tmp_path / "recipe-profile.yaml")["name"] == "recipe-profile"
    for extra in ([], ["--force"]):
        r = run_cli("profile", "import", "srt-slurm", "recipe.yaml", "--out", "recipe.yaml", *extra, cwd=tmp_path,
                    env=env(tmp_path))
        assert r.code == 2 and "that is the recipe itself" in r.err, r.err
    assert rec.read_bytes() == before


@pytest.mark.parametrize("field, value, msg", [
    ("container", "lmsysorg/sglang:dsv4\\ndeploy: {launch: {server: x}}", "has a control character"),
    ("gpus_per_node", 100000000, "must be a whole number from 0 to 4096"),
])
def test_recipe_values_cannot_write_keys_or_blow_up(tmp_path, field, value, msg):
    """A newline in a recorded string ended the header comment and wrote keys into the profile; a
    huge count built a list of that many GPUs (breaker's findings)."""
    text = (DATA / "agg-tp8.yaml").read_text()
    if field == "container":
        text = re.sub(r"(?m)^(\s*container:).*$", lambda m: f'{m.group(1)} "{value}"', text, count=1)
        assert "deploy: {launch" in text
    else:
        text = re.sub(r"(?m)^(\s*gpus_per_node:).*$", lambda m: f"{m.group(1)} {value}", text, count=1)
    assert msg in refused(tmp_path, text)
