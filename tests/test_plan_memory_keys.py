"""Every key SGLang reads for DeepSeek-V4 memory is read by the plan (issue 44.2).

``dsv4ctl/data/memory_keys.json`` (scripts/gen_memory_keys.py) lists, per release, the server
arguments the release's memory-sizing files read; :mod:`dsv4ctl.plan.memkeys` says what the plan
does with each. The walk over each release's server-argument table fails on a key the plan ignores;
``enable-dp-lm-head`` (the LM head over the attention-TP group, ``deepseek_v4.py`` ``ParallelLMHead(
use_attn_tp_group=enable_dp_lm_head)``) and the decode CUDA-graph keys change the plan as SGLang's
code says."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dsv4ctl.plan import memkeys
from dsv4ctl.plan.plan import build_plan, parse_set
from dsv4ctl.profile.model import load_profile
from dsv4ctl.resources import DATA_DIR
from tests.conftest import DEFAULT_PROFILE, ORACLE_PY, REPO, run_cli

SRT = Path(__file__).parent / "data" / "srt-slurm"


def _table(v: str) -> set[str]:
    return {a["dest"] for a in json.loads((DATA_DIR / f"server_args-{v}.json").read_text())["arguments"]}


def test_the_walk_of_every_release_table_finds_no_ignored_memory_key():
    keys = memkeys.memory_keys()
    assert set(keys) == {"0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"}
    for v, read in keys.items():
        table = _table(v)
        assert set(read) <= table, (v, sorted(set(read) - table))        # stale data: not the release's keys
        walked = {d: read[d] for d in sorted(table) if d in read}
        assert memkeys.ignored(v, walked) == [], v
        assert "enable_dp_lm_head" in walked and "srt/models/deepseek_v4.py" in walked["enable_dp_lm_head"]
        assert memkeys.treatment("enable_dp_lm_head")[0] == "sized"
    assert {"mem_fraction_static", "cuda_graph_bs_decode", "disable_decode_cuda_graph"} <= set(keys["0.5.23"])


def test_the_walk_fails_on_a_key_the_plan_ignores(monkeypatch):
    """Before issue 44.2 the plan did not read enable-dp-lm-head: the walk names it, with its files."""
    import dsv4ctl.plan.memkeys as mk
    monkeypatch.setattr(mk, "SET_KEYS", {k: v for k, v in mk.SET_KEYS.items() if k != "enable_dp_lm_head"})
    assert mk.ignored("0.5.23") == [("enable_dp_lm_head", ["srt/models/deepseek_v4.py", "srt/models/deepseek_v4_nextn.py"])]
    assert mk.ignored("0.5.23", {"new_pool_knob": ["srt/mem_cache/kv_cache_configurator.py"]}) == \
        [("new_pool_knob", ["srt/mem_cache/kv_cache_configurator.py"])]


def _decode(p: Path, sets: list[str]) -> dict:
    doc = build_plan(load_profile(p), parse_set(sets)).to_dict()
    return {g["name"]: g for g in doc["groups"]}


@pytest.mark.parametrize("recipe,extra_gib", [("disagg-1p1d-dep4-dep8-mtp", 1.51), ("disagg-1p1d-dep4-dep16-mtp", 1.618)])
def test_enable_dp_lm_head_puts_the_whole_head_on_each_dep_rank(tmp_path, recipe, extra_gib):
    """Both srt-slurm Pro recipes set enable-dp-lm-head with DEP8 / DEP16 decode: the head is split over
    the attention-TP group (size tp/dp = 1), so each rank holds all of it (1.726 GiB) instead of 1/tp.
    The plan read the recipe's serve config without the key before (weights 1.51 / 1.62 GiB low)."""
    out = tmp_path / "p.yaml"
    r = run_cli("profile", "import", "srt-slurm", str(SRT / f"{recipe}.yaml"), "--out", str(out),
                env={"DSV4CTL_CACHE": str(tmp_path / "c"), "DSV4CTL_STATE_DIR": str(tmp_path / "s")})
    assert r.code == 0, r.err
    on, off = _decode(out, []), _decode(out, ["enable_dp_lm_head=false"])
    d_on, d_off = on["decode"], off["decode"]
    assert round(d_on["memory_inputs"]["weights_gib_per_rank"] - d_off["memory_inputs"]["weights_gib_per_rank"], 3) == extra_gib
    tok = [min(r["full_max_total_num_tokens"] for r in g["ranks"]) for g in (d_on, d_off)]
    assert tok[0] < tok[1]
    # --set turns it on again: the serve config's reading and --set's agree
    again = _decode(out, ["enable_dp_lm_head=false", "enable_dp_lm_head=true"])["decode"]
    assert again["memory_inputs"]["weights_gib_per_rank"] == d_on["memory_inputs"]["weights_gib_per_rank"]


def _act(sets: list[str]) -> float:
    doc = build_plan(load_profile(DEFAULT_PROFILE), parse_set(["mem_fraction_static=0.8"] + sets)).to_dict()
    return doc["groups"][-1]["activation_estimate_gib"]


def test_decode_graph_keys_change_sglangs_reserve_with_its_precedence():
    """memory_hook.py reserves 2 MB per decode-graph batch (max_bs) unless the decode graph is off;
    a batch-size list sets max_bs to its largest; --cuda-graph-backend-decode beats
    --disable-decode-cuda-graph and --cuda-graph-config beats both (cuda_graph_hook.py)."""
    base = _act(["cuda_graph_max_bs=64"])
    assert _act(["cuda_graph_bs_decode=1,8,256"]) == round(base + (256 - 64) * 2 / 1024, 3)
    off = _act(["cuda_graph_max_bs=64", "disable_decode_cuda_graph=true"])
    assert off == round(base - 64 * 2 / 1024, 3)
    assert _act(["cuda_graph_max_bs=64", "disable_decode_cuda_graph=true", "cuda_graph_backend_decode=full"]) == base
    assert _act(["cuda_graph_max_bs=64", 'cuda_graph_config={"decode": {"backend": "disabled"}}']) == off
    assert _act(['cuda_graph_config={"decode": {"max_bs": 256}}', "cuda_graph_max_bs=64"]) == \
        _act(["cuda_graph_bs_decode=256"])


def test_noted_keys_are_said_and_bad_values_refused(tmp_path):
    doc = build_plan(load_profile(DEFAULT_PROFILE), parse_set(["cpu_offload_gb=8", "enable_symm_mem=true"])).to_dict()
    warnings = " ".join(doc["groups"][0]["warnings"])
    assert "cpu-offload-gb 8.0" in warnings and "enable-symm-mem" in warnings
    r = run_cli("plan", str(DEFAULT_PROFILE), "--set", "cuda_graph_config=[1]")
    assert r.code == 2 and r.err.count("\n") == 1 and "cuda_graph_config" in r.err, r.err


@pytest.mark.oracle
@pytest.mark.skipif(not ORACLE_PY.exists(), reason="oracle environment missing: bash scripts/oracle-env.sh")
def test_stored_memory_keys_are_each_releases_source():
    r = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "scripts/gen_memory_keys.py", "--check"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
