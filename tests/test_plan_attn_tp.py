"""What SGLang refuses only when it builds the model (after the arguments resolved, so the
start-up rule set of :mod:`dsv4ctl.plan.startup` does not see it): an attention-TP size that does
not divide DeepSeek-V4's attention projections (``wq_b``/``wo_a`` are ``ColumnParallelLinear``
over the attention-TP group; its ``divide`` asserts) or leaves a rank no output group, and a
context past the model's derived one. ``plan`` (exit 2, so the deploy preflight) and ``config
lint`` (DSV124) refuse them by one rule (:func:`dsv4ctl.plan.inputs.model_refusal`); each
release's own ``divide`` and ``get_context_length``, run from that release's source, decide
the same."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from dsv4ctl.plan.capacity import ModelGeometry
from dsv4ctl.plan.versions import VERSIONS
from tests.oracle.runner import VERSIONS_DIR

REPO = Path(__file__).resolve().parent.parent
SITE = REPO / ".venv-oracle" / "lib" / "python3.11" / "site-packages"
MODELS = {name: json.loads((REPO / "dsv4ctl" / "data" / "models" / f"{name}.json").read_text())
          for name in ("deepseek-v4-flash", "deepseek-v4-pro")}


def _source(version: str) -> Path:
    """The release's ``sglang`` package folder in the oracle environment (0.5.23 is the venv's own)."""
    own = VERSIONS_DIR / version / "sglang"
    return own if own.is_dir() else SITE / "sglang"


def _release_code(version: str, rel: str, names: tuple[str, ...]) -> dict:
    """The named top-level functions and assignments of a release's source file ``rel``, compiled
    from its source without the module's imports (torch)."""
    tree = ast.parse((_source(version) / rel).read_text())
    body = [n for n in tree.body if (isinstance(n, ast.FunctionDef) and n.name in names) or (
        isinstance(n, ast.Assign) and any(getattr(t, "id", None) in names for t in n.targets))]
    ns: dict = {}
    exec(compile(ast.Module(body=body, type_ignores=[]), f"sglang-{version}/{rel}", "exec"), ns)
    assert set(names) <= set(ns), (version, rel, names)
    return ns


def _release_divide(version: str):
    """The release's own ``divide`` (``srt/distributed/utils.py``)."""
    return _release_code(version, "srt/distributed/utils.py", ("divide", "ensure_divisibility"))["divide"]


def _sglang_says(divide, n: int, tp: int):
    try:
        divide(n, tp)
        return None
    except AssertionError as e:
        return str(e)


pytestmark = pytest.mark.skipif(not (SITE / "sglang").is_dir(), reason="run bash scripts/oracle-env.sh")


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_each_release_builds_the_projections_over_attention_tp_and_refuses_as_planned(version):
    src = (_source(version) / "srt" / "models" / "deepseek_v4.py").read_text()
    # the two projections dsv4ctl checks are column-parallel over the attention-TP group in this release
    for name, out in (("wq_b", r"self\.n_heads \* self\.head_dim"), ("wo_a", r"self\.n_groups \* self\.o_lora_rank")):
        m = re.search(rf"self\.{name} = ColumnParallelLinear\(\s*[^,]+,\s*{out},(.*?)\n        \)", src, re.S)
        assert m, (version, name)
        assert 'parallel_group="attn_tp"' in m.group(1) or "tp_size=self.attn_tp_size" in m.group(1), (version, name)
    divide = _release_divide(version)
    for name, cfg in MODELS.items():
        geo = ModelGeometry.from_config(cfg, name)
        for tp in range(1, 33):
            ours = geo.attn_tp_refusal(tp)
            theirs = (_sglang_says(divide, geo.num_attention_heads * geo.attn_head_dim, tp)
                      or _sglang_says(divide, geo.o_groups * geo.o_lora_rank, tp))
            if theirs:
                assert ours is not None and ours.startswith(theirs + ":"), (version, name, tp, ours, theirs)
            elif tp > geo.o_groups:      # divide passes; n_local_groups = o_groups // attn_tp is 0
                assert ours == (f"o_groups {geo.o_groups} // attention TP {tp} = 0 per rank: the model builds and "
                                "its first forward fails (dsv4ctl refuses it)"), (version, name, tp)
                assert "self.n_local_groups = self.n_groups // self.attn_tp_size" in src
            else:
                assert ours is None, (version, name, tp, ours)


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_the_derived_context_length_is_each_releases_own(version):
    from types import SimpleNamespace
    get = _release_code(version, "srt/utils/hf_transformers/common.py",
                        ("get_context_length", "CONTEXT_LENGTH_KEYS"))["get_context_length"]
    flash = MODELS["deepseek-v4-flash"]
    yarn = flash["rope_scaling"]
    variants = {"flash": flash, "pro": MODELS["deepseek-v4-pro"],
                "no-original": {**flash, "rope_scaling": {k: v for k, v in yarn.items()
                                                          if k != "original_max_position_embeddings"}},
                "llama3": {**flash, "rope_scaling": {"rope_type": "llama3", "factor": 8}},
                "none": {**flash, "rope_scaling": None}}
    got = {k: ModelGeometry.from_config(cfg, k).context_len for k, cfg in variants.items()}
    assert got == {k: get(SimpleNamespace(**cfg)) for k, cfg in variants.items()}
    assert got["flash"] == 1048576 and got["no-original"] == 16 * 1048576


def test_plan_refuses_tp3_and_plans_tp4_and_dp_attention_divides_first(cli):
    r = cli("plan", "--set", "tp_size=3", timeout=60)
    assert r.code == 2, (r.code, r.err)
    assert r.err.count("\n") == 1
    assert r.err.startswith("dsv4ctl: error: group prefill: tp_size 3: SGLang refuses it when it builds the model: "
                            "32768 is not divisible by 3: num_attention_heads x head_dim (wq_b)"), r.err
    assert cli("plan", "--set", "tp_size=4", "--json", timeout=60).code in (0, 1)
    # with DP attention the split is tp / dp: TP 6 over 2 attention-DP ranks is attention TP 3
    r = cli("plan", "--set", "tp_size=6", "--set", "dp_size=2", "--set", "enable_dp_attention=true", timeout=60)
    assert r.code == 2 and "tp_size 6 / dp_size 2: SGLang refuses it" in r.err and "divisible by 3:" in r.err, r.err
    r = cli("plan", "--set", "tp_size=6", "--set", "dp_size=6", "--set", "enable_dp_attention=true", "--json",
            timeout=60)
    assert r.code in (0, 1) and "divisible" not in r.err, r.err
    # a context longer than the model's: refused unless the server's env allows it, as SGLang does
    r = cli("plan", "--set", "context_length=1048577", timeout=60)
    assert r.code == 2 and r.err == (
        "dsv4ctl: error: group prefill: context_length 1048577 is greater than the derived context_length (1048576): "
        "SGLang refuses it at start-up unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 "
        "(srt/configs/model_config.py)\n"), r.err
    r = cli("plan", "--set", "context_length=1048577", "--set", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1",
            "--json", timeout=60)
    assert r.code in (0, 1) and r.json()["groups"][0]["context_length"] == 1048577, r.err


def test_a_custom_config_without_the_projection_fields_is_not_checked():
    cfg = {k: v for k, v in MODELS["deepseek-v4-flash"].items() if k not in ("num_attention_heads", "o_groups")}
    geo = ModelGeometry.from_config(cfg, "custom")
    assert geo.num_attention_heads == 0 and geo.attn_tp_refusal(3) is None
    assert ModelGeometry.from_config(MODELS["deepseek-v4-pro"], "pro").attn_tp_refusal(3) == (
        "65536 is not divisible by 3: num_attention_heads x head_dim (wq_b) split over attention TP 3")


def test_config_lint_refuses_them_as_dsv124(cli, tmp_path):
    import shutil
    src = REPO / "profiles"
    shutil.copytree(src / "dsv4-flash-8xb200-pd", tmp_path / "dsv4-flash-8xb200-pd")
    prof = tmp_path / "p.yaml"
    text = (src / "dsv4-flash-8xb200-pd.yaml").read_text().replace("series: ../patches", f"series: {src.parent}/patches")
    prof.write_text(text)
    decode = tmp_path / "dsv4-flash-8xb200-pd" / "decode.yaml"
    decode.write_text(decode.read_text() + "context-length: 2097152\n")
    r = cli("config", "lint", str(prof), "--json", timeout=120)
    found = [f for f in r.json()["findings"] if f["rule"] == "DSV124"]
    assert r.code != 0 and [(f["group"], f["line"]) for f in found] == [("decode", len(decode.read_text().splitlines()))]
    assert found[0]["message"].startswith("context_length 2097152 is greater than the derived context_length (1048576)")
    # the server's env switch allows it, as in SGLang
    anchor = "    serve_config: dsv4-flash-8xb200-pd/decode.yaml\n"
    prof.write_text(text.replace(anchor, anchor + "    env: {SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN: 'true'}\n", 1))
    r = cli("config", "lint", str(prof), "--json", timeout=120)
    assert not [f for f in r.json()["findings"] if f["rule"] == "DSV124"], r.out
