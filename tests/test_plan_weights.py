"""Weights per rank from the checkpoint (issue 27 item 2): safetensors headers of a local
checkpoint folder, sharded as SGLang 0.5.23 shards DeepSeek-V4 (dsv4ctl/plan/weights.py), and
the shipped table for the published checkpoints, checked against the measured logs.

The synthetic checkpoints are written in the real safetensors format (8-byte little-endian
header length, JSON header, data) by :func:`write_shard` below, and once by the ``safetensors``
package itself (from the oracle environment ``.venv-oracle``, skipped without it). Expected
numbers are computed by hand in each test, not by the code under test."""

from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path

import pytest

from dsv4ctl.errors import InputError
from dsv4ctl.plan import weights as W
from dsv4ctl.plan.plan import build_plan
from dsv4ctl.profile.model import load_profile
from dsv4ctl.resources import MODELS_DIR
from tests.conftest import DEFAULT_PROFILE, ORACLE_PY, REPO, run_cli

GIB = 1 << 30
SIZES = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "I64": 8}

# A tiny DeepSeek-V4: 4 layers (ratios 0, 4, 128, 4) + 1 MTP layer, 8 heads, 4 experts.
TINY = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "hidden_size": 256,
        "vocab_size": 1024, "num_attention_heads": 8, "head_dim": 128, "qk_rope_head_dim": 64,
        "q_lora_rank": 128, "o_groups": 8, "o_lora_rank": 128, "n_routed_experts": 4,
        "moe_intermediate_size": 128, "n_shared_experts": 1, "num_experts_per_tok": 2, "hc_mult": 4,
        "num_hidden_layers": 4, "num_hash_layers": 1, "index_head_dim": 128, "index_n_heads": 4,
        "index_topk": 64, "sliding_window": 128, "max_position_embeddings": 4096,
        "compress_ratios": [0, 4, 128, 4, 0], "num_key_value_heads": 1, "num_nextn_predict_layers": 1,
        "rms_norm_eps": 1e-6, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}


def write_shard(path: Path, tensors: dict[str, tuple[str, list[int]]], *, pad: int = 0) -> int:
    """A .safetensors file: 8-byte LE header length + JSON header + zero data (the format spec);
    returns the data bytes written."""
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, shape) in tensors.items():
        n = SIZES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(off + pad))
    return off


def _nbytes(dtype: str, shape: list[int]) -> int:
    n = SIZES[dtype]
    for d in shape:
        n *= d
    return n


def tiny_tensors() -> dict[str, tuple[str, list[int]]]:
    """The tiny model's tensors in the published naming, by hand."""
    t: dict[str, tuple[str, list[int]]] = {
        "embed.weight": ("BF16", [1024, 256]), "head.weight": ("BF16", [1024, 256]),
        "norm.weight": ("BF16", [256])}
    for p in ["layers.0", "layers.1", "layers.2", "layers.3", "mtp.0"]:
        t[f"{p}.attn.wq_a.weight"] = ("F8_E4M3", [128, 256])
        t[f"{p}.attn.wkv.weight"] = ("F8_E4M3", [128, 256])
        t[f"{p}.attn.wq_b.weight"] = ("F8_E4M3", [1024, 128])        # 8 heads x 128
        t[f"{p}.attn.wo_a.weight"] = ("F8_E4M3", [256, 512])          # 2 groups x 128, 8*128/2
        t[f"{p}.attn.wo_b.weight"] = ("F8_E4M3", [256, 256])
        t[f"{p}.attn.attn_sink"] = ("F32", [8])
        t[f"{p}.ffn.gate.weight"] = ("BF16", [4, 256])
        for e in range(4):
            t[f"{p}.ffn.experts.{e}.w1.weight"] = ("I8", [128, 128])
            t[f"{p}.ffn.experts.{e}.w1.scale"] = ("F8_E8M0", [128, 8])
        t[f"{p}.ffn.shared_experts.w1.weight"] = ("F8_E4M3", [128, 256])
        t[f"{p}.hc_attn_fn"] = ("F32", [24, 1024])
    t["layers.1.attn.indexer.wq_b.weight"] = ("F8_E4M3", [512, 128])
    t["layers.1.attn.compressor.wkv.weight"] = ("BF16", [256, 256])
    t["mtp.0.e_proj.weight"] = ("F8_E4M3", [256, 256])
    return t


def make_checkpoint(folder: Path, tensors=None, *, index: bool = True, split: int = 2) -> Path:
    """config.json + ``split`` shards (+ index) of ``tensors`` (default :func:`tiny_tensors`)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY))
    tensors = tensors or tiny_tensors()
    names = sorted(tensors)
    wmap = {}
    for i in range(split):
        part = {n: tensors[n] for n in names[i::split]}
        fname = f"model-{i + 1:05d}-of-{split:05d}.safetensors"
        write_shard(folder / fname, part)
        wmap.update({n: fname for n in part})
    if index:
        (folder / W.INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
    return folder


def by_hand(tp: int, *, dp_attention: bool = False, dp: int = 1) -> tuple[float, float]:
    """Target and draft bytes per rank of :func:`tiny_tensors`, summed by hand from SGLang
    0.5.23's placement: wq_b/wo_a/wo_b / attn_tp; experts and shared / tp; embed / tp (replicated
    with DP attention); head / tp; the rest replicated; mtp.0 = draft, plus the draft's own
    embedding and head copies sharded like the target's (deepseek_v4_nextn.py:67-72, 275-281:
    held while the pools are built, issue 44.3)."""
    attn_tp = tp // dp if dp_attention else tp
    per_layer_attn_tp = _nbytes("F8_E4M3", [1024, 128]) + _nbytes("F8_E4M3", [256, 512]) + _nbytes("F8_E4M3", [256, 256])
    per_layer_routed = 4 * (_nbytes("I8", [128, 128]) + _nbytes("F8_E8M0", [128, 8]))
    per_layer_shared = _nbytes("F8_E4M3", [128, 256])
    per_layer_repl = (2 * _nbytes("F8_E4M3", [128, 256]) + _nbytes("F32", [8]) + _nbytes("BF16", [4, 256])
                      + _nbytes("F32", [24, 1024]))
    layer = per_layer_attn_tp / attn_tp + (per_layer_routed + per_layer_shared) / tp + per_layer_repl
    vocab = _nbytes("BF16", [1024, 256])
    target = (4 * layer + vocab / (1 if dp_attention else tp) + vocab / tp + _nbytes("BF16", [256])
              + _nbytes("F8_E4M3", [512, 128]) + _nbytes("BF16", [256, 256]))
    draft = layer + _nbytes("F8_E4M3", [256, 256]) + vocab / (1 if dp_attention else tp) + vocab / tp
    return target, draft


@pytest.mark.parametrize("tp,dp,dpa", [(1, 1, False), (2, 1, False), (4, 1, False), (4, 4, True), (8, 2, True)])
def test_checkpoint_per_rank_matches_hand_sum(tmp_path, tp, dp, dpa):
    folder = make_checkpoint(tmp_path / "ck")
    est = W.checkpoint_estimate(folder, 4, W.Sharding(tp=tp, dp=dp, dp_attention=dpa))
    target, draft = by_hand(tp, dp=dp, dp_attention=dpa)
    assert est.target_gib == round(target / GIB + W.LOAD_OVERHEAD_GIB, 3)
    assert est.draft_gib == round(draft / GIB, 3)
    rw = W.per_rank(W.read_checkpoint(folder), 4, W.Sharding(tp=tp, dp=dp, dp_attention=dpa))
    assert rw.target == pytest.approx(target, rel=1e-12)
    assert rw.draft + rw.draft_own == pytest.approx(draft, rel=1e-12)
    vocab = _nbytes("BF16", [1024, 256])
    assert rw.draft_own == pytest.approx(vocab / (1 if dpa else tp) + vocab / tp, rel=1e-12)
    assert est.draft_freed_gib == round(rw.draft_own / GIB, 3)
    assert rw.tensors == len(tiny_tensors())
    assert rw.checkpoint_bytes == sum(_nbytes(*v) for v in tiny_tensors().values())


def test_pp_puts_layers_embed_and_head_on_their_stages(tmp_path):
    folder = make_checkpoint(tmp_path / "ck", split=3)
    rw = W.per_rank(W.read_checkpoint(folder), 4, W.Sharding(tp=1, pp=2))
    t = tiny_tensors()
    layer = sum(_nbytes(*v) for k, v in t.items() if k.startswith("layers.0."))
    extra1 = _nbytes("F8_E4M3", [512, 128]) + _nbytes("BF16", [256, 256])     # layer 1's indexer + compressor
    stage0 = 2 * layer + extra1 + _nbytes("BF16", [1024, 256])                # layers 0,1 + embed
    stage1 = 2 * layer + _nbytes("BF16", [1024, 256]) + _nbytes("BF16", [256])   # layers 2,3 + head + norm
    assert rw.target == max(stage0, stage1) == stage0


def test_hf_names_and_nextn_layer_classified_like_published():
    assert W.classify("model.layers.3.self_attn.wq_b.weight", 4) == ("attn_tp", 3, False)
    assert W.classify("model.layers.3.self_attn.indexer.wq_b.weight", 4) == ("replicated", 3, False)
    assert W.classify("model.layers.3.mlp.experts.7.down_proj.weight", 4) == ("routed", 3, False)
    assert W.classify("model.layers.3.mlp.shared_experts.gate_proj.weight", 4) == ("shared", 3, False)
    assert W.classify("model.layers.4.mlp.experts.0.up_proj.weight", 4) == ("routed", None, True)
    assert W.classify("model.embed_tokens.weight", 4) == ("embed", None, False)
    assert W.classify("lm_head.weight", 4) == ("head", None, False)
    assert W.classify("mtp.0.emb.tok_emb.weight", 4) == ("skip", None, True)
    assert W.classify("mtp.0.head.weight", 4) == ("skip", None, True)
    assert W.classify("hc_head_fn", 4) == ("final", None, False)


def test_shared_expert_replicated_with_a2a_backend(tmp_path):
    folder = make_checkpoint(tmp_path / "ck")
    a = W.per_rank(W.read_checkpoint(folder), 4, W.Sharding(tp=4))
    b = W.per_rank(W.read_checkpoint(folder), 4, W.sharding_from_args({"moe_a2a_backend": "deepep"}, 4, 1, 1, False, None))
    shared = 4 * _nbytes("F8_E4M3", [128, 256])
    assert b.target - a.target == pytest.approx(shared - shared / 4)


@pytest.mark.skipif(not ORACLE_PY.exists(), reason="the safetensors package comes with .venv-oracle")
def test_reader_agrees_with_safetensors_package(tmp_path):
    """A shard written by the safetensors package (torch tensors, e8m0/e4m3 included)."""
    code = ("import sys, torch; from safetensors.torch import save_file\n"
            "save_file({'layers.0.attn.wq_b.weight': torch.zeros(1024, 128, dtype=torch.float8_e4m3fn),"
            " 'layers.0.ffn.experts.0.w1.scale': torch.zeros(128, 8, dtype=torch.float8_e8m0fnu),"
            " 'layers.0.ffn.experts.0.w1.weight': torch.zeros(128, 128, dtype=torch.int8),"
            " 'embed.weight': torch.zeros(1024, 256, dtype=torch.bfloat16),"
            " 'layers.0.hc_attn_fn': torch.zeros(24, 1024, dtype=torch.float32)}, sys.argv[1])\n")
    path = tmp_path / "model.safetensors"
    subprocess.run([str(ORACLE_PY), "-c", code, str(path)], check=True, timeout=300, cwd=REPO)
    got = {t.name: (t.dtype, t.shape, t.nbytes) for t in W.read_header(path)}
    assert got == {"layers.0.attn.wq_b.weight": ("F8_E4M3", (1024, 128), 131072),
                   "layers.0.ffn.experts.0.w1.scale": ("F8_E8M0", (128, 8), 1024),
                   "layers.0.ffn.experts.0.w1.weight": ("I8", (128, 128), 16384),
                   "embed.weight": ("BF16", (1024, 256), 524288),
                   "layers.0.hc_attn_fn": ("F32", (24, 1024), 98304)}


def plan(groups=None, **overrides):
    """build_plan of the default profile with ``--set`` style overrides."""
    return build_plan(load_profile(DEFAULT_PROFILE), overrides=overrides, groups=groups)


# --- bad input: one line, exit 2 ---------------------------------------------------------------

def test_folder_without_headers(tmp_path):
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY))
    with pytest.raises(InputError, match="no safetensors headers"):
        W.read_checkpoint(folder)


def test_truncated_file(tmp_path):
    folder = make_checkpoint(tmp_path / "ck", index=False, split=1)
    shard = next(folder.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(InputError, match="truncated safetensors file"):
        W.read_checkpoint(folder)
    shard.write_bytes(b"\x10\x00\x00")
    with pytest.raises(InputError, match="truncated safetensors file"):
        W.read_checkpoint(folder)
    shard.write_bytes(struct.pack("<Q", 4096) + b"{}")           # header longer than the file
    with pytest.raises(InputError, match="truncated safetensors file"):
        W.read_checkpoint(folder)


@pytest.mark.parametrize("header,match", [
    (b"{not json", "malformed safetensors header"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"a": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}}', "unknown dtype"),
    (b'{"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}', "bad shape"),
    (b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}', "8 expected"),
    (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}', "bad data_offsets"),
    (b'{"a": 3}', "not an object"),
    (b"\xff\xfe", "malformed safetensors header"),
])
def test_malformed_header(tmp_path, header, match):
    p = tmp_path / "model.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
    with pytest.raises(InputError, match=match):
        W.read_header(p)


def test_index_naming_a_missing_shard(tmp_path):
    folder = make_checkpoint(tmp_path / "ck")
    next(folder.glob("*.safetensors")).unlink()
    with pytest.raises(InputError, match="missing shard"):
        W.read_checkpoint(folder)


@pytest.mark.parametrize("damage,match", [
    ("none", "no safetensors headers"), ("truncate", "truncated safetensors file"),
    ("header", "malformed safetensors header")])
def test_plan_bad_checkpoint_is_one_line_exit_2(tmp_path, damage, match):
    folder = tmp_path / "ck"
    if damage == "none":
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(TINY))
    else:
        make_checkpoint(folder, index=False, split=1)
        shard = next(folder.glob("*.safetensors"))
        raw = shard.read_bytes()
        shard.write_bytes(raw[:-10] if damage == "truncate" else raw[:8] + b"X" + raw[9:])
    r = run_cli("plan", "--set", f"model={folder}")
    code, out, err = r.code, r.out, r.err
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and match in lines[0] and "Traceback" not in err


def test_plan_reads_the_checkpoint(tmp_path):
    """A profile whose model is a checkpoint folder plans with the headers' weights and says so."""
    folder = make_checkpoint(tmp_path / "ck")
    rep = plan(model=str(folder))
    for g in rep.groups:
        target, _ = by_hand(g.inputs.tp, dp=g.inputs.dp, dp_attention=g.inputs.dp_attention)
        assert g.inputs.weights_gib_per_rank == round(target / GIB + W.LOAD_OVERHEAD_GIB, 3)
        assert any(e.startswith("weights_gib_per_rank=") and "safetensors headers of" in e
                   for e in g.inputs.estimated)


# --- the shipped table --------------------------------------------------------------------------

def _cfg(key: str) -> dict:
    return json.loads((MODELS_DIR / f"{key}.json").read_text())


def test_published_pro_inventory_is_the_inspected_checkpoint():
    """gogongxt/python scripts/models/deepseek_v4_pro.md: 145,116 tensors, 805.32 GiB of tensors,
    861,608,274,846 elements (I8-packed FP4 counted as one element per byte)."""
    inv = W.published_inventory(_cfg("deepseek-v4-pro"))
    assert len(inv) == 145_116
    assert round(sum(t.nbytes for t in inv) / GIB, 2) == 805.32
    numel = 0
    for t in inv:
        n = 1
        for d in t.shape:
            n *= d
        numel += n
    assert numel == 861_608_274_846


def test_published_routed_experts_match_reference():
    """Capacity reference §1.1: Pro routed experts 12.55 GiB per layer, 95.7 GiB per rank at TP8;
    Flash 3.19 GiB per layer, 17.1 GiB per rank."""
    for key, per_layer, rank in (("deepseek-v4-pro", 12.55, 95.7), ("deepseek-v4-flash", 3.19, 17.1)):
        cfg = _cfg(key)
        rw = W.per_rank(W.published_inventory(cfg), cfg["num_hidden_layers"], W.Sharding(tp=8))
        assert round(rw.by_kind["routed"] / GIB / cfg["num_hidden_layers"] * 8, 2) == per_layer
        assert round(rw.by_kind["routed"] / GIB, 1) == rank


# The table's stated error against the logs it is calibrated on (README / MEASURED).
TABLE_ERROR_PCT = 1.5


def test_table_against_measured_logs():
    cal = W.calibration()
    used = [(m, w, e) for m, w, e in cal if m.calibrates]
    assert len(used) == 3
    for m, w, e in used:
        assert abs(e) <= TABLE_ERROR_PCT, (m, w, e)
    # the load overhead is the mean residual of the calibrating logs
    resid = [m.gib - (w - W.LOAD_OVERHEAD_GIB) for m, w, _ in used]
    assert round(sum(resid) / len(resid), 1) == W.LOAD_OVERHEAD_GIB
    # Pro TP8 (published checkpoint, SGLang logs it as quant=fp8): 101.94 GiB of checkpoint + 2.6
    pro = [w for m, w, _ in cal if m.model == "deepseek-v4-pro"]
    assert set(pro) == {104.54}
    older = [(m, e) for m, _, e in cal if not m.calibrates]
    assert older and older[0][0].gib == 125.65 and round(older[0][1], 1) == -16.8


def test_plan_prints_source_and_error():
    rep = plan(["decode"], model="deepseek-v4-pro", tp_size=8)
    g = rep.groups[0]
    assert g.inputs.weights_gib_per_rank == 104.54
    note = next(e for e in g.inputs.estimated if e.startswith("weights_gib_per_rank="))
    assert "published deepseek-v4-pro checkpoint" in note and "145,116 tensors" in note
    assert "125.65 (older image): -16.8 %" in note and "103.5: +1.0 %" in note


def test_measured_weights_still_win(tmp_path):
    rep = plan()
    for g in rep.groups:
        assert g.inputs.weights_gib_per_rank == 43.66
        assert not any(e.startswith("weights_gib_per_rank=") for e in g.inputs.estimated)


def test_draft_weights_from_table():
    rep = plan(["decode"], model="deepseek-v4-pro", tp_size=8, speculative_algorithm="EAGLE",
               speculative_num_draft_tokens=2)
    g = rep.groups[0]
    cfg = _cfg("deepseek-v4-pro")
    mtp = sum(t.nbytes for t in W.published_inventory(cfg) if t.name.startswith("mtp.0.ffn.experts.")) / 8
    assert g.inputs.draft_weights_gib_per_rank > round(mtp / GIB, 3)
    # the MTP layer 1.73 GiB + the draft's own embedding and head (bf16 129,280 x 7,168 each, / 8):
    # InferenceX#2128's "adds mem usage=3.07 GB" is -29.6 % off (was -43.6 % before issue 44.3)
    own = 2 * 129_280 * 7168 * 2 / 8 / GIB
    assert round(own, 3) == g.inputs.draft_freed_gib_per_rank == 0.432
    assert g.inputs.draft_weights_gib_per_rank == 2.161
    note = next(e for e in g.inputs.estimated if e.startswith("draft_weights_gib_per_rank="))
    assert "+ 0.432 GiB of the draft's own embedding and head" in note
    assert "vs 3.07 measured (older image): -29.6 %" in note


@pytest.mark.parametrize("key,fmt", [("deepseek-v4-pro", "fp4"), ("deepseek-v4-flash", "fp8")])
def test_stacked_inventory_is_the_same_bytes(key, fmt):
    """The plan's fast path (experts stacked per layer) gives what the tensor-by-tensor list gives."""
    cfg = _cfg(key)
    for sh in (W.Sharding(tp=8), W.Sharding(tp=16, dp=16, dp_attention=True), W.Sharding(tp=4, pp=2)):
        a = W.per_rank(W.published_inventory(cfg, fmt), cfg["num_hidden_layers"], sh)
        b = W.per_rank(W.published_inventory(cfg, fmt, stacked=True), cfg["num_hidden_layers"], sh)
        assert (a.tensors, a.checkpoint_bytes) == (b.tensors, b.checkpoint_bytes)
        assert a.target == pytest.approx(b.target, rel=1e-12) and a.draft == pytest.approx(b.draft, rel=1e-12)


def test_dp_attention_replicates_attention_and_embedding():
    """Capacity reference §3.3: with attention DP (attn_tp = tp/dp = 1) attention weights are
    replicated per rank: Pro TP16 DP16 holds the 61 layers' wq_b/wo_a/wo_b (with their scales) and
    the embedding whole on every rank, TP16 a sixteenth of them."""
    cfg = _cfg("deepseek-v4-pro")
    a = W.per_rank(W.published_inventory(cfg, stacked=True), 61, W.Sharding(tp=16))
    b = W.per_rank(W.published_inventory(cfg, stacked=True), 61, W.Sharding(tp=16, dp=16, dp_attention=True))
    attn = 61 * (65536 * 1536 + 512 * 12 + 16384 * 4096 + 128 * 32 + 7168 * 16384 + 56 * 128)
    embed = 129280 * 7168 * 2
    assert b.target - a.target == pytest.approx((attn + embed) * (1 - 1 / 16))


def test_more_gpus_fix_uses_the_table_at_its_tp():
    """A weights failure's "use N GPUs" fix rescales only what SGLang splits: Pro on the 4-GPU
    group (203.166 GiB/rank) is offered TP8 at the table's own TP8 figure, 104.54 GiB."""
    rep = plan(["decode"], model="deepseek-v4-pro", available_bytes=48569637666, index_k_dtype="fp8")
    g = rep.groups[0]
    assert g.inputs.weights_gib_per_rank == 203.166
    assert g.fixes and "tp-size: 8, weights ~104.54 GiB per rank" in g.fixes[0]
    assert plan(["decode"], model="deepseek-v4-pro", tp_size=8).groups[0].inputs.weights_gib_per_rank == 104.54


def test_any_bytes_are_a_header_or_one_input_error(tmp_path):
    """Random and mutated shards: read_header returns tensors or raises InputError, nothing else
    (hypothesis; DSV4CTL_FUZZ_EXAMPLES raises the count as for tests/test_fuzz_inputs.py)."""
    import os
    from hypothesis import given, settings, strategies as st
    good = tmp_path / "good.safetensors"
    write_shard(good, {"a": ("F32", [2, 3]), "b": ("I8", [5])})
    base = good.read_bytes()
    p = tmp_path / "x.safetensors"

    @settings(max_examples=int(os.environ.get("DSV4CTL_FUZZ_EXAMPLES", 200)), deadline=None, database=None)
    @given(st.one_of(st.binary(max_size=200),
                     st.tuples(st.integers(0, len(base) - 1), st.integers(0, 255), st.integers(0, len(base)))
                     .map(lambda t: (base[:t[0]] + bytes([t[1]]) + base[t[0] + 1:])[:max(t[2], 1)])))
    def check(raw):
        p.write_bytes(raw)
        try:
            out = W.read_header(p)
        except InputError as e:
            assert "\n" not in str(e)
        else:
            assert all(isinstance(t, W.Tensor) for t in out)

    check()


def test_names_with_newlines_stay_on_one_line(tmp_path):
    p = tmp_path / "model.safetensors"
    hdr = json.dumps({"a\nb": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}).encode()
    p.write_bytes(struct.pack("<Q", len(hdr)) + hdr + bytes(8))
    with pytest.raises(InputError) as e:
        W.read_header(p)
    assert "\n" not in str(e.value) and "'a\\nb'" in str(e.value)


def test_tensor_in_two_shards(tmp_path):
    folder = tmp_path / "ck"
    folder.mkdir()
    write_shard(folder / "a.safetensors", {"embed.weight": ("BF16", [4, 4])})
    write_shard(folder / "b.safetensors", {"embed.weight": ("BF16", [4, 4])})
    with pytest.raises(InputError, match="is also in a.safetensors"):
        W.read_checkpoint(folder)


INFX_2128 = dict(model="deepseek-v4-pro", tp_size=8, gpu_memory_mib=143771, free_gib_before_load=137.9,
                 mem_fraction_static=0.88, disaggregation_mode="null")


def test_inferencex_2128_measured_weights_reproduce_sglangs_refusal():
    """InferenceX#2128 (8xH200 TP8, Pro, mfs 0.88): 'avail mem=12.25 GB, mem usage=125.65 GB' at
    load end, so P = 137.9 GiB; SGLang refused: 'Raise --mem-fraction-static above 0.912 (minimum
    viable = 1 - available/pre = 0.9113)', KV available_bytes -4.31 GB. With the measured weights the
    plan fails with the same words; 1 - 12.25/137.9 = 0.9112... rounds up to 0.912."""
    rep = plan(["decode"], weights_gib_per_rank=125.65, **INFX_2128)
    g = rep.groups[0]
    assert round(137.9 - 125.65 - 137.9 * (1 - 0.88), 2) == -4.30       # the log's -4.31 GB, P rounded
    assert (g.verdict["level"], g.verdict["deciding"]) == ("fails", "no_kv_memory")
    assert "Raise --mem-fraction-static above 0.912 (SGLang's minimum for any KV memory; the plan first passes at" in g.errors[0]


def test_inferencex_2128_with_the_table_says_estimated():
    """The same configuration without a measurement plans on the table (what the pinned image later
    measured, ~103-104 GB, served) and says the weights are estimated, with the 125.65 log's error."""
    rep = plan(["decode"], **INFX_2128)
    g = rep.groups[0]
    assert g.inputs.weights_gib_per_rank == 104.54 and not g.errors
    note = next(e for e in g.inputs.estimated if e.startswith("weights_gib_per_rank="))
    assert "125.65 (older image): -16.8 %" in note


def test_deploy_preflight_names_groups_on_checkpoint_weights(tmp_path):
    """The deploy preflight's line names the groups whose weights come from the checkpoint's
    headers (estimated: not a measurement) and still plans them."""
    import shutil
    from dsv4ctl.deploy.preflight import preflight
    src = Path(DEFAULT_PROFILE)
    shutil.copytree(src.parent / src.stem, tmp_path / src.stem)
    text = src.read_text()
    assert text.count("weights_gib_per_rank: 43.66") == 2
    text = "\n".join(l for l in text.splitlines() if "weights_gib_per_rank: 43.66" not in l) + "\n"
    folder = make_checkpoint(tmp_path / "ck")
    text = text.replace("model: deepseek-v4-flash ", f"model: {folder} ", 1)
    (tmp_path / src.name).write_text(text)
    out = preflight(load_profile(tmp_path / src.name))
    assert out["estimated"] == ["prefill", "decode"]
    assert "weights or free memory estimated for prefill, decode" in out["summary"]


def test_published_layout_as_a_folder_gives_the_tables_figure(tmp_path):
    """The published layout of a (tiny) config written as real shards: the headers path and the
    table path agree, so a local copy of a shipped checkpoint plans like its name."""
    inv = W.published_inventory(TINY)
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY))
    half = len(inv) // 2
    wmap = {}
    for i, part in enumerate((inv[:half], inv[half:])):
        write_shard(folder / f"model-{i + 1:05d}-of-00002.safetensors", {t.name: (t.dtype, list(t.shape)) for t in part})
        wmap.update({t.name: f"model-{i + 1:05d}-of-00002.safetensors" for t in part})
    (folder / W.INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
    for sh in (W.Sharding(tp=4), W.Sharding(tp=8, dp=8, dp_attention=True), W.Sharding(tp=2, pp=2)):
        est = W.checkpoint_estimate(folder, 4, sh)
        rw = W.per_rank(inv, 4, sh)
        assert est.target_gib == round(rw.target_gib + W.LOAD_OVERHEAD_GIB, 3)
        assert est.draft_gib == round(rw.draft_gib, 3)
        assert f"{len(inv):,} tensors" in est.note


def test_a_fifo_named_like_a_shard_is_refused_not_read(tmp_path):
    """A FIFO (or device) named ``*.safetensors`` would block the header read forever: it is
    not a regular file, one error (breaker's finding: plan and config lint hung)."""
    folder = make_checkpoint(tmp_path / "ck", index=False, split=1)
    os.mkfifo(folder / "b.safetensors")
    with pytest.raises(InputError, match=r"b\.safetensors: not a regular file"):
        W.read_checkpoint(folder)


@pytest.mark.parametrize("where", ["shape", "offset", "layer"])
def test_integers_past_pythons_digit_limit_are_one_error(tmp_path, where):
    """A 5,000-digit integer in a header (shape or data_offsets) is a malformed header, and one in
    a layer's name is no layer number (the tensor is placed as a non-layer one): never a traceback."""
    big = "9" * 5000
    p = tmp_path / "model.safetensors"
    if where == "layer":
        write_shard(p, {f"layers.{big}.attn.wq_b.weight": ("BF16", [2, 2])})
        (t,) = W.read_header(p)
        kind, layer, draft = W.classify(t.name, 4)
        assert layer is None and draft is False and kind != "routed"
        return
    header = ('{"a": {"dtype": "F32", "shape": [%s], "data_offsets": [0, 4]}}' % big if where == "shape" else
              '{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, %s]}}' % big).encode()
    p.write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
    with pytest.raises(InputError, match="malformed safetensors header"):
        W.read_header(p)


def test_an_index_naming_tensors_no_shard_has_is_a_partial_download(tmp_path):
    """The index lists every tensor of the checkpoint; headers that lack some of them are a
    partial download (or another checkpoint's index): refused, not planned on the few that are
    there (breaker's finding: 1 tensor of 44 planned as 2.8 GiB/rank, tight)."""
    folder = make_checkpoint(tmp_path / "ck")
    idx = json.loads((folder / "model.safetensors.index.json").read_text())
    idx["weight_map"]["layers.9.attn.wq_b.weight"] = next(iter(idx["weight_map"].values()))
    (folder / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(InputError, match=r"1 tensor\(s\) of its weight_map are in no shard's header, first "
                                         r"'layers\.9\.attn\.wq_b\.weight'"):
        W.read_checkpoint(folder)


# --- shards and config.json that do not match (issue 41 item 5) ---------------------------------

def _one_line_exit_2(folder: Path) -> str:
    r = run_cli("plan", "--set", f"model={folder}")
    assert r.code == 2 and "Traceback" not in r.err, (r.out, r.err)
    lines = r.err.strip().splitlines()
    assert len(lines) == 1, r.err
    return lines[0]


def test_config_with_fewer_layers_than_the_shards_is_refused(tmp_path):
    """A config.json naming 2 layers over shards holding 4 (+ mtp.0): layers 2 and 3 were planned
    as draft weights (target 2 layers lighter, no word); now exit 2 naming them and their files."""
    folder = make_checkpoint(tmp_path / "ck", split=2)
    (folder / "config.json").write_text(json.dumps({**TINY, "num_hidden_layers": 2}))
    with pytest.raises(InputError) as e:
        W.checkpoint_estimate(folder, 2, W.Sharding(tp=1))
    files = sorted({f"model-0000{i}-of-00002.safetensors" for i in (1, 2)})
    assert str(e.value) == (f"{folder}: the shards hold 2 layer(s) config.json does not name: layers.2, layers.3 "
                            f"(in {', '.join(files)}); its num_hidden_layers is 2 and num_nextn_predict_layers 1: "
                            "a config.json of another model than its shards")
    line = _one_line_exit_2(folder)
    assert "layers.2, layers.3" in line and "model-00001-of-00002.safetensors" in line


def test_hf_named_nextn_layer_is_draft_and_one_past_it_is_refused(tmp_path):
    """Hugging Face naming: layers.<L> .. layers.<L+n-1> are the MTP layers the config declares
    (num_nextn_predict_layers); layers.<L+n> is a layer nobody named."""
    t = {k.replace("mtp.0.", "layers.4."): v for k, v in tiny_tensors().items()}
    folder = make_checkpoint(tmp_path / "ok", t)
    est = W.checkpoint_estimate(folder, 4, W.Sharding(tp=1))
    assert est.draft_gib == round(by_hand(1)[1] / GIB, 3)
    t["layers.5.attn.wq_b.weight"] = ("F8_E4M3", [1024, 128])
    folder = make_checkpoint(tmp_path / "bad", t, split=1)
    with pytest.raises(InputError, match=r"the shards hold 1 layer\(s\) config\.json does not name: layers\.5 "
                                         r"\(in model-00001-of-00001\.safetensors\)"):
        W.checkpoint_estimate(folder, 4, W.Sharding(tp=1))
    # with published mtp.* names beside them, the MTP layers are those: layers.4 is no MTP layer then
    t["mtp.1.attn.wq_b.weight"] = ("F8_E4M3", [1024, 128])
    folder = make_checkpoint(tmp_path / "mixed", t, split=1)
    with pytest.raises(InputError, match=r"3 layer\(s\) config\.json does not name: layers\.4, layers\.5, mtp\.1 "):
        W.checkpoint_estimate(folder, 4, W.Sharding(tp=1))


def test_no_mtp_declared_means_no_draft_layer(tmp_path):
    """num_nextn_predict_layers 0 (or absent): mtp.0 in the shards is a layer the config does not name."""
    folder = make_checkpoint(tmp_path / "ck")
    (folder / "config.json").write_text(json.dumps({k: v for k, v in TINY.items() if k != "num_nextn_predict_layers"}))
    with pytest.raises(InputError, match=r"1 layer\(s\) config\.json does not name: mtp\.0 "):
        W.checkpoint_estimate(folder, 4, W.Sharding(tp=1))


def test_several_shards_without_their_index_are_a_partial_checkpoint(tmp_path):
    """Two of three shards and no index: planned on what was there (32.6 instead of 42.6 GiB/rank in
    the issue); now a partial checkpoint, naming the files and the shard their names say is missing."""
    folder = make_checkpoint(tmp_path / "ck", index=False, split=3)
    (folder / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(InputError) as e:
        W.read_checkpoint(folder)
    assert str(e.value) == (f"{folder}: partial checkpoint: 2 safetensors files (model-00001-of-00003.safetensors, "
                            "model-00003-of-00003.safetensors) and no model.safetensors.index.json; missing by their "
                            "names: model-00002-of-00003.safetensors: download the whole checkpoint with its index "
                            "(or give memory.weights_gib_per_rank)")
    assert "partial checkpoint" in _one_line_exit_2(folder)
    # all three there, still no index: refused too (nothing says which shards belong)
    make_checkpoint(folder, index=False, split=3)
    with pytest.raises(InputError, match=r"partial checkpoint: 3 safetensors files .* no model\.safetensors\.index\.json: "):
        W.read_checkpoint(folder)
    # one shard whose name says 1 of 3, no index (breaker's finding: planned on a third of the tensors)
    for n in (2, 3):
        (folder / f"model-0000{n}-of-00003.safetensors").unlink()
    with pytest.raises(InputError, match=r"partial checkpoint: 1 safetensors files \(model-00001-of-00003.safetensors\) "
                                         r"and no model\.safetensors\.index\.json; missing by their names: "
                                         r"model-00002-of-00003.safetensors, model-00003-of-00003.safetensors"):
        W.read_checkpoint(folder)
    # an index that is a folder is refused, not ignored
    (folder / "model.safetensors.index.json").mkdir()
    with pytest.raises(InputError, match=r"model\.safetensors\.index\.json: not a regular file"):
        W.read_checkpoint(folder)


# --- the header cache (issue 48 item 2) --------------------------------------------------------

@pytest.fixture
def header_cache(tmp_path, monkeypatch):
    """A private DSV4CTL_CACHE; the per-process reads forgotten before and after; yields the
    header cache folder and a list that records every header really read."""
    monkeypatch.setenv("DSV4CTL_CACHE", str(tmp_path / "cache"))
    W._read_files.cache_clear()
    reads: list[str] = []
    real = W._read_header

    def counting(path, budget):
        reads.append(Path(path).name)
        return real(path, budget)
    monkeypatch.setattr(W, "_read_header", counting)
    yield tmp_path / "cache" / "headers", reads
    W._read_files.cache_clear()


def _again(folder: Path, sh: W.Sharding):
    """A new command's read of ``folder`` (the per-process memo forgotten): (per-rank, tensors)."""
    W._read_files.cache_clear()
    tensors = W.read_checkpoint(folder)
    return W.per_rank(tensors, 4, sh), tensors


def test_headers_are_read_once_and_the_cache_holds_no_tensor_data(tmp_path, header_cache):
    cache, reads = header_cache
    folder = make_checkpoint(tmp_path / "ck")
    sh = W.Sharding(tp=2)
    first, tensors = _again(folder, sh)
    assert sorted(reads) == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    target, _ = by_hand(2)
    assert first.target == target and first.tensors == len(tiny_tensors())
    # a layer's experts of one shard are one stacked entry: 10 entries for the 40 expert tensors
    stacked = [t for t in tensors if ".experts.*." in t.name]
    assert len(stacked) == 10 and sum(t.count for t in stacked) == 40
    assert {(t.name, t.count, t.shape) for t in stacked if t.name.startswith("layers.0.")} == {
        ("layers.0.ffn.experts.*.w1.weight", 4, (4, 128, 128)), ("layers.0.ffn.experts.*.w1.scale", 4, (4, 128, 8))}
    entries = sorted(p.name for p in cache.iterdir())
    assert len(entries) == 3 and sum(e.startswith("shard-") for e in entries) == 2 and entries[0].startswith("index-")
    assert cache.stat().st_mode & 0o777 == 0o700 and all((cache / e).stat().st_mode & 0o777 == 0o600 for e in entries)
    doc = json.loads((cache / entries[1]).read_text())
    assert set(doc) == {"v", "id", "groups"}                  # names, dtypes, shapes: no offsets, no data
    assert all(len(g) == 5 and g[2] in W.DTYPE_BYTES for g in doc["groups"])
    reads.clear()
    again, tensors2 = _again(folder, sh)
    assert reads == [] and again == first and tensors2 == tensors


def test_a_changed_shard_invalidates_its_entry(tmp_path, header_cache):
    _, reads = header_cache
    folder = make_checkpoint(tmp_path / "ck")
    sh = W.Sharding(tp=1)
    before, _ = _again(folder, sh)
    shard = folder / "model-00001-of-00002.safetensors"
    wmap = json.loads((folder / W.INDEX_NAME).read_text())["weight_map"]
    mine = {n: v for n, v in tiny_tensors().items() if wmap[n] == shard.name}
    sink = next(n for n in mine if n.endswith("attn_sink") and not n.startswith("mtp."))
    big = {**mine, sink: ("F32", [8 + 1024])}                  # 4 KiB more of a replicated tensor
    write_shard(shard, big)
    reads.clear()
    after, _ = _again(folder, sh)
    assert reads == [shard.name]                              # only the changed shard is read again
    assert after.target - before.target == 1024 * 4
    # the same file replaced by one of the same size and an older mtime: another inode, read again
    os.replace(shard, tmp_path / "old")
    write_shard(shard, big)
    st = (tmp_path / "old").stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    reads.clear()
    assert _again(folder, sh)[0] == after and reads == [shard.name]


def test_expert_tensor_in_two_shards_and_a_partial_index_still_refused_from_the_cache(tmp_path, header_cache):
    folder = tmp_path / "ck"
    folder.mkdir()
    write_shard(folder / "a.safetensors", {f"layers.0.ffn.experts.{e}.w1.weight": ("I8", [4, 4]) for e in range(0, 6)})
    write_shard(folder / "b.safetensors", {f"layers.0.ffn.experts.{e}.w1.weight": ("I8", [4, 4]) for e in range(5, 9)})
    wmap = {f"layers.0.ffn.experts.{e}.w1.weight": "a.safetensors" if e < 5 else "b.safetensors" for e in range(9)}
    (folder / W.INDEX_NAME).write_text(json.dumps({"weight_map": wmap}))
    with pytest.raises(InputError, match=r"b.safetensors: tensor 'layers.0.ffn.experts.5.w1.weight' is also in a.safetensors"):
        W.read_checkpoint(folder)
    write_shard(folder / "b.safetensors", {f"layers.0.ffn.experts.{e}.w1.weight": ("I8", [4, 4]) for e in range(7, 9)})
    wmap["layers.0.ffn.experts.6.w1.weight"] = "b.safetensors"
    (folder / W.INDEX_NAME).write_text(json.dumps({"weight_map": wmap}))
    for _ in range(2):                                        # read, then from the cache: the same refusal
        W._read_files.cache_clear()
        with pytest.raises(InputError, match=r"1 tensor\(s\) of its weight_map are in no shard's header, first "
                                             r"'layers.0.ffn.experts.6.w1.weight'"):
            W.read_checkpoint(folder)


def test_header_cache_in_a_folder_others_can_write_is_not_used(tmp_path, header_cache):
    cache, reads = header_cache
    folder = make_checkpoint(tmp_path / "ck")
    _again(folder, W.Sharding(tp=1))
    cache.chmod(0o777)
    reads.clear()
    _again(folder, W.Sharding(tp=1))
    assert len(reads) == 2


def test_headers_have_a_total_memory_cap(tmp_path, header_cache, monkeypatch):
    folder = make_checkpoint(tmp_path / "ck")
    sizes = [struct.unpack("<Q", p.read_bytes()[:8])[0] for p in sorted(folder.glob("*.safetensors"))]
    monkeypatch.setattr(W, "MAX_TOTAL_HEADER_BYTES", sizes[0] + sizes[1] - 1)
    with pytest.raises(InputError, match=r"model-00002-of-00002.safetensors: the checkpoint's safetensors headers take "
                                         r"more than [\d,]+ bytes together"):
        W.read_checkpoint(folder)
