"""Each lint rule with a failing and a passing serve config (pure rules, real argument table)."""

from __future__ import annotations

import pytest

from dsv4ctl.serve.argtable import ConvertError, convert, load_table
from dsv4ctl.profile.serveconfig import parse_serve_config as parse_config_text
from dsv4ctl.serve.lint import RULES, GroupInput, LintInput, lint, normalised_hicache
from dsv4ctl.serve.treegate import GatingVerdict, Site

T = load_table()

PREFILL = """\
model-path: deepseek-ai/DeepSeek-V4-Flash   # checkpoint
tp-size: 4
disaggregation-mode: prefill
enable-hierarchical-cache: true
hicache-ratio: 2.0
hicache-write-policy: write_through
hicache-io-backend: kernel
hicache-mem-layout: page_first
reasoning-parser: deepseek-v4
tool-call-parser: deepseekv4
"""
DECODE = """\
model-path: deepseek-ai/DeepSeek-V4-Flash
tp-size: 4
disaggregation-mode: decode
reasoning-parser: deepseek-v4
tool-call-parser: deepseekv4
"""


def edit(text: str, **kv) -> str:
    """Replace/append/remove (value None) keys given with underscores for dashes."""
    lines = text.splitlines()
    for k, v in kv.items():
        k = k.replace("_", "-")
        idx = [i for i, l in enumerate(lines) if l.split(":")[0] == k]
        new = None if v is None else f"{k}: {v}"
        if idx:
            if new is None:
                del lines[idx[0]]
            else:
                lines[idx[0]] = new
        elif new is not None:
            lines.append(new)
    return "\n".join(lines) + "\n"


def run(prefill=PREFILL, decode=DECODE, *, ram=2048.0, pools=(120.0,) * 4, dkv=("bf16"), gating=None,
        env_p=None, env_d=None, raw_prefill=None, topo_p=None, ports=(30000, 30001), version_mismatch=None, series_mismatch=None,
        model_p=None):
    pc = parse_config_text(prefill, "prefill.yaml") if raw_prefill is None else raw_prefill
    groups = [GroupInput("prefill", "prefill", "h0", pc, env=env_p or {}, rank_device_gib=list(pools),
                         topology_error=topo_p, model_error=model_p, binds=[("h0", ports[0], ports[0], "HTTP port", "prefill.yaml:3", 0),
                                                       ("h0", 8998, 8998, "KV bootstrap port", "prefill.yaml:9", 0)]),
              GroupInput("decode", "decode", "h0", parse_config_text(decode, "decode.yaml"), env=env_d or {},
                         rank_device_gib=list(pools), binds=[("h0", ports[1], ports[1], "HTTP port", "decode.yaml:3", 0)])]
    inp = LintInput(groups=groups, pairs=[("prefill", "decode")], host_ram_gib={"h0": ram},
                    index_k_dtype=dkv, gating=gating, tree="/t" if gating else None, version_mismatch=version_mismatch,
                    series_mismatch=series_mismatch)
    return lint(inp, T)


def rules(findings):
    return {f.rule for f in findings}


GATED = GatingVerdict(gated=True, pool_file="p.py")


def test_base_pair_is_clean():
    assert run(gating=GATED) == []


# (rule, failing (prefill, decode) edits, passing edits)
CASES = [
    ("SGL001", dict(p=dict(model_path=None, **{"tp_size": None}), extra_p="model_path: x\n"), dict()),
    ("SGL001", dict(extra_p="hicache-ratioo: 2\n"), dict()),
    ("SGL002", dict(extra_p="watchdog: 900\n"), dict(extra_p="watchdog-timeout: 900\n")),
    ("SGL003", dict(extra_p="enable-fused-qk-norm-rope: true\n"), dict()),
    ("SGL003", dict(extra_p="enable-dp-attention: true\n"), dict()),
    ("SGL004", dict(p=dict(hicache_ratio="two")), dict(p=dict(hicache_ratio=3))),
    ("SGL004", dict(p=dict(hicache_write_policy="write_sometimes")), dict(p=dict(hicache_write_policy="write_back"))),
    ("SGL004", dict(p=dict(tp_size="[4, 8]")), dict()),
    ("SGL004", dict(extra_p="trust-remote-code: yes please\n"), dict(extra_p="trust-remote-code: true\n")),
    ("SGL004", dict(extra_p="hicache-storage-backend: null\n"), dict()),
    ("SGL005", dict(extra_p="served-model-name: null\n"), dict(extra_p="served-model-name: v4\n")),
    ("SGL006", dict(extra_p="trust-remote-code: false\n"), dict(extra_p="trust-remote-code: true\n")),
    ("SGL007", dict(extra_p="enable-hicache: true\n"), dict()),
    ("SGL008", dict(extra_p="kv-canary-sweep-interval: 100\n"), dict(extra_p="kv-canary-sweep-interval: 100\nkv-canary: log\n")),
    ("DSV101", dict(extra_p="disable-radix-cache: true\n"), dict(extra_p="disable-radix-cache: false\n")),
    # what SGLang's argument resolution refuses (dsv4ctl.plan.startup, proven by tests/test_startup_oracle.py)
    ("SGL010", dict(extra_p="dp-size: 2\nenable-dp-lm-head: true\n"), dict(extra_p="enable-dp-lm-head: true\n")),
    ("SGL011", dict(extra_d="dsv4-attn-backend: trtllm\n", extra_p="dsv4-attn-backend: trtllm\n"),
     dict(extra_d="dsv4-attn-backend: flashmla\n", extra_p="dsv4-attn-backend: flashmla\n")),
    ("SGL012", dict(extra_p="speculative-algorithm: NEXTN\n"),
     dict(extra_p="speculative-algorithm: EAGLE\nspeculative-num-steps: 3\nspeculative-eagle-topk: 1\n")),
    ("DSV101", dict(extra_p="enable-lmcache: true\n"), dict()),
    ("DSV102", dict(p=dict(hicache_ratio=None)), dict()),
    ("DSV103", dict(extra_p="hicache-size: 100\n"), dict(extra_p="hicache-size: 0\n")),
    ("DSV104", dict(p=dict(hicache_mem_layout="page_head")), dict(p=dict(hicache_mem_layout="layer_first"))),
    ("DSV104", dict(p=dict(hicache_mem_layout="page_first_kv_split")), dict(p=dict(hicache_mem_layout="page_first_direct", hicache_io_backend="direct"))),
    ("DSV105", dict(p=dict(hicache_mem_layout="page_first_direct")), dict(p=dict(hicache_mem_layout="page_first_direct", hicache_io_backend="direct"))),
    ("DSV105", dict(p=dict(hicache_io_backend="direct")), dict()),
    ("DSV105", dict(p=dict(hicache_mem_layout="layer_first"), extra_p="hicache-storage-backend: mooncake\n"),
     dict(p=dict(hicache_mem_layout="layer_first"), extra_p="hicache-storage-backend: file\n")),
    ("DSV106", dict(extra_d="enable-hierarchical-cache: true\nhicache-ratio: 2\n"), dict(extra_d="enable-hierarchical-cache: false\n")),
    ("DSV107", dict(extra_d="page-size: 64\n"), dict(extra_d="page-size: 256\n")),
    ("DSV107", dict(extra_p="kv-cache-dtype: bfloat16\n"), dict(extra_p="kv-cache-dtype: fp8_e4m3\n")),
    ("DSV107", dict(extra_p="enable-deepseek-v4-fp4-indexer: true\n"), dict(extra_p="enable-deepseek-v4-fp4-indexer: true\n", extra_d="enable-deepseek-v4-fp4-indexer: true\n")),
    ("DSV107", dict(env_p={"SGLANG_DSV4_KV_LAYOUT": "v41"}), dict(env_p={"SGLANG_DSV4_KV_LAYOUT": "v41"}, env_d={"SGLANG_DSV4_KV_LAYOUT": "V41"})),
    ("DSV107", dict(extra_d="dsv4-attn-backend: flashmla_mega\n"), dict(extra_d="dsv4-attn-backend: flashmla\n")),
    ("DSV107", dict(d=dict(tool_call_parser="deepseekv41")), dict(d=dict(tool_call_parser="auto"))),
    ("DSV108", dict(p=dict(tool_call_parser=None)), dict(p=dict(tool_call_parser="auto"), d=dict(tool_call_parser="auto"))),
    ("DSV108", dict(p=dict(reasoning_parser="deepseek-v41"), d=dict(reasoning_parser="deepseek-v41")), dict()),
    ("DSV109", dict(ram=900.0), dict(ram=1400.0)),
    ("DSV110", dict(ram=1000.0), dict(ram=1400.0)),
    ("DSV111", dict(gating=GatingVerdict(gated=False, pool_file="p.py", problems=[Site("p.py", 7, "no wait")])), dict(gating=GATED)),
    ("DSV111", dict(gating=GatingVerdict(gated=False, pool_file="p.py", problems=[Site("p.py", 7, "no wait")])), dict(dkv="fp8", gating=GatingVerdict(gated=False, pool_file="p.py", problems=[Site("p.py", 7, "x")]))),
    ("DSV112", dict(gating=None), dict(gating=None, dkv="fp8")),
    ("DSV113", dict(p=dict(disaggregation_mode="decode")), dict()),
    ("DSV113", dict(p=dict(disaggregation_mode=None)), dict()),
    ("DSV114", dict(extra_p="hicache-host-memory-mode: buffer_only\n"), dict(extra_p="hicache-host-memory-mode: buffer_only\nhicache-storage-backend: file\n")),
    ("DSV115", dict(extra_p="hicache-host-memory-fraction: 1.5\n"), dict(extra_p="hicache-host-memory-fraction: 1.0\n")),
    ("DSV116", dict(p=dict(hicache_mem_layout="page_first_direct", hicache_io_backend="direct", hicache_ratio=2.5), ram=4096.0),
     dict(p=dict(hicache_mem_layout="page_first", hicache_ratio=2.5), ram=4096.0)),
    ("DSV117", dict(extra_p="kv-cache-dtype: fp8_e5m2\n", extra_d="kv-cache-dtype: fp8_e5m2\n"),
     dict(extra_p="kv-cache-dtype: bf16\n", extra_d="kv-cache-dtype: bfloat16\n")),
    # issue 16: page-size 1 on both sides passed (the pair agrees); the DSV4 pool builder asserts 256
    ("DSV118", dict(extra_p="page-size: 1\n", extra_d="page-size: 1\n"), dict(extra_p="page-size: 256\n", extra_d="page-size: 256\n")),
    # issue 16: a prefill on mooncake paired with a decode on nixl
    ("DSV107", dict(extra_p="disaggregation-transfer-backend: mooncake\n", extra_d="disaggregation-transfer-backend: nixl\n"),
     dict(extra_p="disaggregation-transfer-backend: nixl\n", extra_d="disaggregation-transfer-backend: nixl\n")),
    # issue 16: PD + HiCache + EAGLE + page_first_direct (sglang #31252)
    ("DSV119", dict(p=dict(hicache_mem_layout="page_first_direct", hicache_io_backend="direct"), extra_p="speculative-algorithm: EAGLE\n"),
     dict(p=dict(hicache_mem_layout="page_first"), extra_p="speculative-algorithm: EAGLE\n")),
    # issue 25: the profile's topology is not what the serve config runs (dsv4ctl.plan.plan.topology's words)
    ("DSV120", dict(topo_p="prefill.yaml:2: tp-size: 8 disagrees with the profile's group 'prefill' (tp: 4)"), dict()),
    ("DSV120", dict(topo_p="prefill.yaml: no tp-size: SGLang runs tp-size 1 (its default), but ..."), dict()),
    # SGLang refuses it when it builds the model (dsv4ctl.plan.inputs.model_refusal's words)
    ("DSV124", dict(model_p="group prefill: context_length 2097152 is greater than the derived context_length "
                            "(1048576): SGLang refuses it at start-up unless ..."), dict()),
    # issue 25: two listeners on one host and port (here decode's HTTP port on prefill's KV bootstrap port)
    ("DSV121", dict(ports=(30000, 8998)), dict(ports=(30000, 8999))),
    ("DSV121", dict(ports=(30000, 30000)), dict()),
    # issue 27: the profile says one release, the tree it ships is another
    ("DSV122", dict(version_mismatch=("prefill.yaml", 4, "sglang.version is 0.5.22 but the tree ... is SGLang 0.5.23")),
     dict()),
    # issue 27: the patch series is cut against another release than the one that runs
    ("DSV123", dict(series_mismatch=("prefill.yaml", 7, "sglang.series ... is cut against sglang==0.5.23 but the deployment runs SGLang 0.5.22")),
     dict()),
]


def _build(spec):
    spec = dict(spec)
    p = edit(PREFILL, **spec.pop("p", {})) + spec.pop("extra_p", "")
    d = edit(DECODE, **spec.pop("d", {})) + spec.pop("extra_d", "")
    spec.setdefault("gating", GATED)
    return run(p, d, **spec)


@pytest.mark.parametrize("rule,bad,good", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule_fails_and_passes(rule, bad, good):
    fb = _build(bad)
    assert rule in rules(fb), [f.format() for f in fb]
    hit = next(f for f in fb if f.rule == rule)
    assert hit.severity == RULES[rule][1]
    assert hit.line >= 1 and hit.file in ("prefill.yaml", "decode.yaml")
    fg = _build(good)
    assert rule not in rules(fg), [f.format() for f in fg]


def test_every_rule_has_a_failing_case():
    assert {c[0] for c in CASES} == set(RULES)


def test_findings_name_the_line_of_the_key():
    text = PREFILL + "hicache-size: 64\n"
    f = next(f for f in run(text, gating=GATED) if f.rule == "DSV103")
    assert (f.file, f.line) == ("prefill.yaml", 11)
    assert f.format() == ("prefill.yaml:11: error DSV103 hicache-size-rejected: DeepSeek V4 HiCache does not "
                          "support hicache-size; use hicache-ratio")


def test_underscore_key_hint_and_unknown_suggestion():
    fs = run(PREFILL + "mem_fraction_static: 0.8\nhicache-ratoi: 2\n", gating=GATED)
    msgs = [f.message for f in fs if f.rule == "SGL001"]
    assert "mem_fraction_static: not an SGLang 0.5.23 server argument (SGLang --config keys use dashes: mem-fraction-static)" in msgs
    assert any("did you mean hicache-ratio?" in m for m in msgs)


def test_host_ram_numbers():
    # 2.0 x 4 ranks x 120 GiB = 960 GiB of host pools; 900 GiB RAM - 10 GiB reserve = 890
    f = next(f for f in run(ram=900.0, gating=GATED) if f.rule == "DSV109")
    assert "960.0 GiB" in f.message and "890.0 GiB" in f.message
    # 1000 - 10 = 990 usable; 0.8 x 990 = 792 < 960 -> headroom warning only
    assert rules(run(ram=1000.0, gating=GATED)) == {"DSV110"}


def test_normalisation_order_matches_hicache_hook():
    assert normalised_hicache({"hicache_mem_layout": "page_first_direct", "hicache_io_backend": "kernel"})[:2] == ("page_first_direct", "direct")
    assert normalised_hicache({"hicache_mem_layout": "page_first", "hicache_io_backend": "direct"})[:2] == ("page_first_direct", "direct")
    assert normalised_hicache({"hicache_mem_layout": "layer_first", "hicache_io_backend": "direct",
                               "hicache_storage_backend": "mooncake"})[:2] == ("page_first_direct", "direct")
    assert normalised_hicache({"hicache_mem_layout": "page_first_direct", "hicache_io_backend": "direct",
                               "enable_unified_memory": True})[:2] == ("page_first", "kernel")


@pytest.mark.parametrize("key,value,expect", [
    ("tp-size", 4, 4), ("tp-size", "4", 4), ("mem-fraction-static", 0.85, 0.85),
    ("cuda-graph-bs-decode", [1, 2, 4], [1, 2, 4]), ("enable-hierarchical-cache", True, True),
    ("enable-hierarchical-cache", False, None), ("hicache-storage-backend-extra-config", {"a": 1}, '{"a": 1}'),
    ("trust-remote-code", True, True), ("hicache-write-policy", "write_back", "write_back"),
])
def test_convert_like_sglang(key, value, expect):
    assert convert(T.get(key), value) == expect


@pytest.mark.parametrize("key,value", [
    ("tp-size", 4.5), ("tp-size", [4, 8]), ("enable-hierarchical-cache", "yes"), ("hicache-io-backend", "dma"),
    ("page-size", None), ("cuda-graph-bs-decode", ["x"]),
])
def test_convert_rejects_like_sglang(key, value):
    with pytest.raises(ConvertError):
        convert(T.get(key), value)


def test_issue16_lint_messages():
    # DSV108 with only the reasoning parser missing says what 0.5.23 does with the reasoning
    f = next(f for f in _build(dict(p=dict(reasoning_parser=None))) if f.rule == "DSV108")
    assert f.message == ("reasoning-parser is not set: the reasoning text goes into content, without its think tags "
                         "(set reasoning-parser: deepseek-v4)")
    # enable-dp-attention: the fix is attn-dp-size
    f = next(f for f in _build(dict(extra_p="enable-dp-attention: true\n")) if f.rule == "SGL003")
    assert "use attn-dp-size: N" in f.message
    # monokernel-backend takes a value (DeprecatedStoreConstAction, nargs None): not a bare flag
    arg = T.get("monokernel-backend")
    assert arg.config == "value" and convert(arg, "amd") == "amd"
    with pytest.raises(ConvertError):
        convert(arg, "nvidia")
    assert "SGL006" not in rules(_build(dict(extra_p="monokernel-backend: amd\n")))


def test_v32_model_gets_no_dsv4_rules(tmp_path):
    """A DeepSeek-V3.2 config (model_type deepseek_v32, no compress_ratios) is not DSV4."""
    import json
    import shutil
    from dsv4ctl.plan.models import model_type_of
    from dsv4ctl.profile.deployment import resolve
    from dsv4ctl.profile.model import load_profile
    from dsv4ctl.serve.lintinput import is_dsv4
    from tests.conftest import DEFAULT_PROFILE
    (tmp_path / "v32").mkdir()
    (tmp_path / "v32" / "config.json").write_text(json.dumps({"model_type": "deepseek_v32", "num_hidden_layers": 61}))
    shutil.copytree(DEFAULT_PROFILE.parent / DEFAULT_PROFILE.stem, tmp_path / DEFAULT_PROFILE.stem)
    text = DEFAULT_PROFILE.read_text().replace("model: deepseek-v4-flash", "model: v32")
    text = text.replace("series: ../patches/sglang-0.5.23", "series: null")
    (tmp_path / "p.yaml").write_text(text)
    assert model_type_of("v32", tmp_path) == "deepseek_v32" and model_type_of("flash") == "deepseek_v4"
    assert model_type_of("nope", tmp_path) is None
    assert is_dsv4(resolve(load_profile(tmp_path / "p.yaml"))) is False


def test_host_ram_counts_each_node_of_a_multi_node_server_on_its_own_host():
    # prefill over two hosts, two ranks on each: 2.0 x 2 x 120 = 480 GiB per host, not 960 on h0
    pc = parse_config_text(PREFILL, "prefill.yaml")
    groups = [GroupInput("prefill", "prefill", "h0", pc, rank_device_gib=[120.0] * 4,
                         rank_hosts=["h0", "h0", "h1", "h1"])]
    inp = LintInput(groups=groups, host_ram_gib={"h0": 600.0, "h1": 480.0}, gating=GATED, tree="/t")
    fs = [f for f in lint(inp, T) if f.rule in ("DSV109", "DSV110")]
    assert [(f.rule, f.message.split(":")[0]) for f in fs] == [("DSV109", "host h1"), ("DSV110", "host h0")]
    assert "HiCache host pools 480.0 GiB (prefill 480.0)" in fs[0].message
