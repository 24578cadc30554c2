"""Serve-config lint for SGLang 0.5.23 serving DeepSeek-V4: pure rules over parsed inputs.

Every rule has an id, a severity and a source (``RULES``). Generic rules check each key against
the argument table extracted from the real 0.5.23 parser (:mod:`dsv4ctl.argtable`); DSV4 rules
encode the ops reference (``sglang-0.5.23-ops.md`` §1.2, §2, §3, §5.1, §8) and the field reports
(H5). Inputs are plain data built by :mod:`dsv4ctl.configs`; nothing here reads files."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from .argtable import Table
from ..plan.startup import DSV4_KV_DTYPES, Resolved, validate  # noqa: F401 (DSV4_KV_DTYPES: re-exported)
from ..profile.serveconfig import ServeConfig

GIB = 1024 ** 3
HICACHE_HOST_RESERVE_GIB = 10.0   # sglang 0.5.23 srt/mem_cache/pool_host/base.py HICACHE_HOST_MEMORY_RESERVE_BYTES
HICACHE_HOST_FRACTION = 0.8       # default --hicache-host-memory-fraction (srt/arg_groups/fields/memory.py)
DSV4_HOST_LAYOUTS = ("layer_first", "page_first", "page_first_direct")   # memory_pool_host.py DeepSeekV4PagedHostPool
PAGE_FIRST_DIRECT_LIMIT_GIB = 256.0   # field report H5 (sglang PR #26691 review)

# id: (name, severity, what it checks, source)
RULES: dict[str, tuple[str, str, str, str]] = {
    "SGL001": ("unknown-key", "error", "every key is a long option of the server of the release that runs (its argument table; dashes, no abbreviation)", "ops §1.2; server_args.py"),
    "SGL002": ("abbreviated-key", "warning", "a key that only works as an argparse prefix abbreviation", "ops §1.2"),
    "SGL003": ("unsupported-in-config", "error", "BooleanOptionalAction/deprecated flags are rejected in --config YAML", "ops §1.2; server_args_config_parser.py"),
    "SGL004": ("invalid-value", "error", "the value passes the argument's type, choices and arity", "server_args.py (argparse)"),
    "SGL005": ("null-value", "warning", "null becomes the string 'None'; omit the key", "ops §1.2"),
    "SGL006": ("flag-false", "info", "false on a store_true flag is omitted; it cannot switch a flag off", "ops §1.2"),
    "SGL007": ("duplicate-argument", "error", "one argument given under two spellings", "ops §1.2 (argparse keeps the last)"),
    "SGL010": ("dp-attention-refused", "error", "attention DP SGLang resolves: tp-size divisible by the attention-DP size, no dp-size replicas with attn-dp-size, enable-dp-lm-head only with attention DP", "arg_groups/parallel_hook.py, overrides.py (dsv4ctl.plan.startup)"),
    "SGL011": ("trtllm-refused", "error", "dsv4-attn-backend trtllm: an SM100 GPU, fp8 KV cache, no PD disaggregation, chunked prefill", "arg_groups/deepseek_v4_hook.py (dsv4ctl.plan.startup)"),
    "SGL012": ("speculative-refused", "error", "DeepSeek-V4 speculative decoding: EAGLE with speculative-eagle-topk 1 and speculative-num-steps, or DSPARK", "arg_groups/deepseek_v4_hook.py, speculative_hook.py (dsv4ctl.plan.startup)"),
    "SGL008": ("kv-canary-sweep-alone", "error", "kv-canary-sweep-interval > 0 needs kv-canary log or raise", "srt/arg_groups/validation_hook.py:374"),
    "DSV101": ("hicache-needs-radix", "error", "HiCache needs the radix cache; exclusive with LMCache / the external linker", "ops §2.2; kv_cache_hook.py, hicache_hook.py"),
    "DSV102": ("hicache-ratio-required", "error", "DSV4 HiCache needs an explicit hicache-ratio (no auto-sizing)", "ops §2.3; hicache_auto_size.py"),
    "DSV103": ("hicache-size-rejected", "error", "DSV4 HiCache rejects hicache-size > 0", "ops §2.3; hybrid_pool_assembler.py"),
    "DSV104": ("hicache-layout", "error", "DSV4 host pools accept layer_first, page_first, page_first_direct only", "ops §2.3; memory_pool_host.py"),
    "DSV105": ("hicache-normalised", "warning", "SGLang rewrites the layout / io backend at start-up", "ops §2.2; hicache_hook.py"),
    "DSV106": ("hicache-on-decode", "error", "no HiCache on a 0.5.23 DSV4 decode server", "ops §2.4, §8.3"),
    "DSV107": ("pd-mismatch", "error", "prefill and decode of a PD pair agree on page size, KV dtype, fp4 indexer, KV layout, parsers, allocation policy", "ops §1.3, §3.3"),
    "DSV108": ("dsv4-parsers", "error", "tool-call-parser deepseekv4 and reasoning-parser deepseek-v4 are set", "ops §5.1, §8.5"),
    "DSV109": ("hicache-host-ram", "error", "all HiCache host pools of a host fit its RAM after SGLang's 10 GiB reserve", "pool_host/base.py, hybrid_pool_assembler.py"),
    "DSV110": ("hicache-host-ram-headroom", "warning", "host pools stay within 0.8 of RAM after the reserve (SGLang's own auto-sizing share)", "hicache_auto_size.py"),
    "DSV111": ("index-k-ungated", "error", "bf16 index-K + HiCache on a tree whose index-K read is not gated on the layer transfer", "deepseek_v4_memory_pool.py (get_index_k_with_scale_buffer)"),
    "DSV112": ("index-k-gating-unknown", "warning", "bf16 index-K + HiCache and no tree to check the gating on", "profile sglang.tree / --tree"),
    "DSV113": ("role-mode-mismatch", "error", "disaggregation-mode matches the group's role", "ops §3.1"),
    "DSV114": ("buffer-only-storage", "error", "buffer_only host memory mode needs a storage backend and is not for decode", "ops §2.2; hicache_hook.py"),
    "DSV115": ("hicache-host-fraction", "error", "hicache-host-memory-fraction in (0, 1]", "ops §2.2; hicache_hook.py"),
    "DSV116": ("page-first-direct-large-pool", "warning", "page_first_direct host pools past 256 GiB per rank crash without the alignment fix", "field report H5"),
    "DSV117": ("dsv4-kv-dtype", "error", "DSV4 accepts kv-cache-dtype fp8_e4m3 or bfloat16 only", "ops §7.1; model_overrides/deepseek_v4.py"),
    "DSV118": ("dsv4-page-size", "error", "DSV4 pools need page-size 256 on CUDA (the pool builder asserts it)", "kv_cache_configurator.py _build_dsv4_kv_pool"),
    "DSV119": ("pd-hicache-eagle-page-first-direct", "error", "PD prefill + HiCache + EAGLE + page_first_direct: known failure", "sglang #31252"),
    "DSV120": ("topology-mismatch", "error", "the serve config runs the topology the profile says (tp/dp/pp/attention DP, nnodes, GPU placement, dist-init host; SGLang's defaults when a key is left out)", "server_args.py; engine.py _calculate_rank_ranges; dsv4ctl.plan.plan.topology"),
    "DSV122": ("sglang-version-mismatch", "error", "the profile's sglang.version is the version of the SGLang tree it ships", "dsv4ctl.plan.sglang_version"),
    "DSV123": ("series-version-mismatch", "error", "the patch series (sglang.series) is cut against the SGLang release the deployment runs (its `base` line or folder name)", "dsv4ctl.patches.series; patches/sglang-VERSION"),
    "DSV124": ("model-build", "error", "SGLang can build and serve the model with the group's arguments: the attention-TP split divides the attention projections and leaves each rank heads and output groups; context-length is at most the model's derived one unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "models/deepseek_v4.py; distributed/utils.py divide; configs/model_config.py _derive_context_length; dsv4ctl.plan.inputs.model_refusal"),
    "DSV121": ("port-clash", "error", "no two listeners on one host share a port: HTTP, KV bootstrap, dist-init and attention-DP ZMQ ports, router and Prometheus ports (replicas included)", "server_args.py PortArgs; disaggregation bootstrap"),
}


@dataclass(frozen=True)
class Finding:
    """One rule hit at ``file:line`` (1-based)."""

    rule: str
    severity: str
    file: str
    line: int
    message: str
    group: Optional[str] = None

    @property
    def name(self) -> str:
        return RULES[self.rule][0]

    def format(self) -> str:
        """``file:line: severity RULE name: message``"""
        return f"{self.file}:{self.line}: {self.severity} {self.rule} {self.name}: {self.message}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["name"] = self.name
        return d


@dataclass
class GroupInput:
    """One server group. ``rank_device_gib``: per rank, the device KV pool GiB the plan allocates
    (``allocated_gib`` of :func:`dsv4ctl.plan.build_plan`); None when the plan is unavailable."""

    name: str
    role: str
    host: str
    config: Optional[ServeConfig]
    env: dict[str, str] = field(default_factory=dict)
    rank_device_gib: Optional[list[float]] = None
    topology_error: Optional[str] = None     # :func:`dsv4ctl.plan.plan.topology`'s refusal, if any
    model_error: Optional[str] = None        # :func:`dsv4ctl.plan.inputs.model_refusal`, if any: DSV124
    rank_hosts: Optional[list[str]] = None   # host of every GPU of every server (replica, node order)
    binds: list = field(default_factory=list)   # (host, first, last, what, file:line): GroupView.binds
    sm100: bool = True                          # the host's GPUs are SM100 (dsv4ctl.plan.startup.is_sm100)


@dataclass
class LintInput:
    """Everything the rules look at. ``gating`` is a :class:`dsv4ctl.treegate.GatingVerdict` or None
    when no tree was given; ``index_k_dtype`` comes from the profile (``sglang.index_k_dtype``)."""

    groups: list[GroupInput]
    pairs: list[tuple[str, str]] = field(default_factory=list)
    host_ram_gib: dict[str, Optional[float]] = field(default_factory=dict)
    index_k_dtype: str = "fp8"
    dsv4: bool = True
    gating: Any = None
    tree: Optional[str] = None
    plan_error: Optional[str] = None
    sglang_version: str = "0.5.23"            # the release linted for (its argument table)
    version_mismatch: Optional[tuple[str, int, str]] = None   # (profile, line, message): DSV122
    series_mismatch: Optional[tuple[str, int, str]] = None    # (profile, line, message): DSV123


def _f(rule: str, cfg: ServeConfig, key: Optional[str], msg: str, group: Optional[str] = None,
       severity: Optional[str] = None) -> Finding:
    return Finding(rule, severity or RULES[rule][1], cfg.path, cfg.line(key), msg, group)


def check_keys(cfg: ServeConfig, table: Table, group: Optional[str] = None, *, sm100: bool = True,
               role: Optional[str] = None) -> tuple[list[Finding], Resolved]:
    """What the release refuses at start-up (:func:`dsv4ctl.plan.startup.validate`, the rule set
    plan, the preflight and ``config set`` share: SGL001-SGL007, SGL010-SGL012, DSV101, DSV106,
    DSV117) as findings at ``file:line``, SGL008, and the config's values resolved as argparse
    would."""
    refusals, r = validate(cfg.data, table, sm100=sm100, role=role)
    out = [Finding(x.rule, x.severity, cfg.path, cfg.line(x.key), x.message, group) for x in refusals]
    sweep = r.args.get("kv_canary_sweep_interval")
    if isinstance(sweep, int) and sweep > 0 and r.args.get("kv_canary", "none") == "none":
        # SGLang 0.5.23 raises at start-up (srt/arg_groups/validation_hook.py:374)
        out.append(_f("SGL008", cfg, r.given.get("kv_canary_sweep_interval"),
                      "kv-canary-sweep-interval requires kv-canary: log or raise (SGLang refuses to start)", group))
    return out, r


def _hicache_on(r: Resolved) -> bool:
    return bool(r.args.get("enable_hierarchical_cache"))


def _key(r: Resolved, dest: str, fallback: Optional[str] = None) -> Optional[str]:
    return r.given.get(dest, r.given.get(fallback) if fallback else None)


def normalised_hicache(args: dict) -> tuple[str, str, list[str]]:
    """(layout, io backend, notes) after SGLang 0.5.23's normalisations, in its order
    (``hicache_hook.py``: resolve_layout_io_compatibility, resolve_storage_layout_compatibility,
    resolve_unified_memory_layout_io)."""
    layout, io = args.get("hicache_mem_layout", "page_first"), args.get("hicache_io_backend", "kernel")
    notes = []
    if layout == "page_first_direct" and io == "kernel":
        io = "direct"
        notes.append("hicache-io-backend kernel does not support page_first_direct: SGLang switches io to direct")
    if layout == "page_first" and io == "direct":
        layout = "page_first_direct"
        notes.append("hicache-mem-layout page_first with io direct: SGLang switches the layout to page_first_direct")
    storage = args.get("hicache_storage_backend")
    if storage in ("mooncake", "npu_memcache") and layout == "layer_first" and not (
            storage == "mooncake" and (args.get("dcp_size") or 1) > 1):
        new = {"direct": "page_first_direct", "kernel": "page_first"}.get(io, layout)
        if new != layout:
            notes.append(f"storage {storage} does not support layer_first: SGLang switches the layout to {new}")
            layout = new
    if args.get("enable_unified_memory") and layout == "page_first_direct":
        layout, io = "page_first", "kernel"
        notes.append("enable-unified-memory with page_first_direct: SGLang switches to page_first + kernel io")
    return layout, io, notes


def _mode(g: GroupInput, r: Resolved) -> Optional[str]:
    m = r.args.get("disaggregation_mode")
    if m in (None, "null"):
        return g.role if g.role in ("prefill", "decode") else None
    return m


def _topology_findings(g: GroupInput, r: Resolved) -> list[Finding]:
    """DSV120 (the serve config's topology disagrees with the profile's), DSV113 (disaggregation
    mode against the group's role) and DSV115 (hicache-host-memory-fraction out of (0, 1])."""
    cfg, a = g.config, r.args
    out: list[Finding] = []
    if g.topology_error:      # "FILE:LINE: text" (a key that disagrees) or "FILE: text" (a key left out)
        msg, line = g.topology_error, 1
        if msg.startswith(cfg.path + ":"):
            head, _, rest = msg[len(cfg.path) + 1:].partition(": ")
            msg, line = (rest, int(head)) if head.isdigit() else (msg[len(cfg.path) + 2:], 1)
        out.append(Finding("DSV120", RULES["DSV120"][1], cfg.path, line, msg, g.name))
    if g.model_error:
        key = "context_length" if "context_length" in g.model_error.split(":", 2)[1] else "tp_size"
        out.append(_f("DSV124", cfg, _key(r, key), g.model_error.split(": ", 1)[1], g.name))
    file_mode = a.get("disaggregation_mode")
    if g.role in ("prefill", "decode") and file_mode not in (None, "null") and file_mode != g.role:
        out.append(_f("DSV113", cfg, _key(r, "disaggregation_mode"),
                      f"disaggregation-mode {file_mode} but the profile's group {g.name!r} is a {g.role} group", g.name))
    if g.role in ("prefill", "decode") and file_mode in (None, "null"):
        out.append(_f("DSV113", cfg, None, f"no disaggregation-mode: the profile's group {g.name!r} is a {g.role} "
                                           f"group (set disaggregation-mode: {g.role})", g.name))
    frac = a.get("hicache_host_memory_fraction")
    if frac is not None and not 0 < frac <= 1:
        out.append(_f("DSV115", cfg, _key(r, "hicache_host_memory_fraction"),
                      f"hicache-host-memory-fraction {frac} must be in (0, 1]", g.name))
    return out


def _dsv4_server_findings(g: GroupInput, r: Resolved) -> list[Finding]:
    """DeepSeek-V4 servers with or without HiCache: DSV118 (page-size other than 256) and DSV108
    (tool-call and reasoning parsers)."""
    cfg, a = g.config, r.args
    out: list[Finding] = []
    page = a.get("page_size")
    if page is not None and page != 256:
        out.append(_f("DSV118", cfg, _key(r, "page_size"),
                      f"page-size {page}: the DeepSeek-V4 pool builder asserts page_size == 256 on CUDA "
                      "(leave page-size out: DSV4 defaults to 256)", g.name))
    unset_effect = {
        "tool_call_parser": "tool calls reach clients as raw DSML text in content",
        # 0.5.23 without a reasoning parser: the reasoning goes into content, its think tags stripped
        "reasoning_parser": "the reasoning text goes into content, without its think tags",
    }
    for dest, want in (("tool_call_parser", "deepseekv4"), ("reasoning_parser", "deepseek-v4")):
        have = a.get(dest)
        name = dest.replace("_", "-")
        if have is None:
            out.append(_f("DSV108", cfg, None, f"{name} is not set: {unset_effect[dest]} "
                                               f"(set {name}: {want})", g.name))
        elif have not in (want, "auto"):
            out.append(_f("DSV108", cfg, _key(r, dest), f"{name} {have}: DeepSeek-V4 needs {want}", g.name))
    return out


def _hicache_findings(g: GroupInput, r: Resolved, mode: Optional[str]) -> list[Finding]:
    """HiCache on, any model: DSV101 (mutually exclusive caches) and DSV114 (buffer_only host
    memory without a storage backend, or on decode)."""
    cfg, a = g.config, r.args
    out: list[Finding] = []
    if a.get("enable_lmcache"):
        out.append(_f("DSV101", cfg, _key(r, "enable_lmcache"), "HiCache and enable-lmcache are mutually exclusive", g.name))
    if a.get("enable_unified_cache_external_linker"):
        out.append(_f("DSV101", cfg, _key(r, "enable_unified_cache_external_linker"),
                      "HiCache and enable-unified-cache-external-linker are mutually exclusive", g.name))
    if a.get("hicache_host_memory_mode") == "buffer_only":
        if a.get("hicache_storage_backend") is None:
            out.append(_f("DSV114", cfg, _key(r, "hicache_host_memory_mode"),
                          "hicache-host-memory-mode buffer_only requires hicache-storage-backend", g.name))
        if mode == "decode":
            out.append(_f("DSV114", cfg, _key(r, "hicache_host_memory_mode"),
                          "hicache-host-memory-mode buffer_only is not supported on decode", g.name))
    return out


def _dsv4_hicache_findings(g: GroupInput, r: Resolved, mode: Optional[str]) -> list[Finding]:
    """HiCache on a DeepSeek-V4 server: DSV102 (no hicache-ratio), DSV103 (hicache-size), DSV105
    (SGLang's layout/io normalisations), DSV104 (a host layout DSV4 pools refuse), DSV119
    (sglang #31252's combination) and DSV116 (a page_first_direct host pool past the limit)."""
    cfg, a = g.config, r.args
    hk = _key(r, "enable_hierarchical_cache")
    out: list[Finding] = []
    if a.get("hicache_ratio") is None:
        out.append(_f("DSV102", cfg, hk, "DeepSeek-V4 HiCache needs an explicit hicache-ratio "
                                         "(auto-sizing does not support DeepSeekV4TokenToKVPool)", g.name))
    if (a.get("hicache_size") or 0) > 0:
        out.append(_f("DSV103", cfg, _key(r, "hicache_size"),
                      "DeepSeek V4 HiCache does not support hicache-size; use hicache-ratio", g.name))
    layout, io, notes = normalised_hicache(a)
    for n in notes:
        out.append(_f("DSV105", cfg, _key(r, "hicache_mem_layout", "hicache_io_backend") or hk, n, g.name))
    if layout not in DSV4_HOST_LAYOUTS:
        out.append(_f("DSV104", cfg, _key(r, "hicache_mem_layout") or hk,
                      f"hicache-mem-layout {layout}: DeepSeek-V4 host pools accept {', '.join(DSV4_HOST_LAYOUTS)}", g.name))
    if layout == "page_first_direct" and mode == "prefill" and a.get("speculative_algorithm"):
        out.append(_f("DSV119", cfg, _key(r, "hicache_mem_layout", "speculative_algorithm") or hk,
                      f"PD prefill with HiCache, {a.get('speculative_algorithm')} and page_first_direct: the "
                      "combination of sglang #31252 (use hicache-mem-layout: page_first, or no speculative "
                      "decoding on this server)", g.name))
    ratio = a.get("hicache_ratio")
    if layout == "page_first_direct" and ratio and g.rank_device_gib:
        worst = max(g.rank_device_gib) * ratio
        if worst > PAGE_FIRST_DIRECT_LIMIT_GIB:
            out.append(_f("DSV116", cfg, _key(r, "hicache_mem_layout") or hk,
                          f"page_first_direct host pool {worst:.1f} GiB per rank > {PAGE_FIRST_DIRECT_LIMIT_GIB:.0f} GiB: "
                          f"crashes past 256 GiB without the host-registration alignment fix", g.name))
    return out


def _index_k_gating_findings(g: GroupInput, r: Resolved, inp: LintInput) -> list[Finding]:
    """bf16 index-K with HiCache on a DeepSeek-V4 server: DSV112 (no tree to read) or DSV111 (the
    tree's index-K read is not gated on the HiCache layer transfer, or cannot be read)."""
    if inp.index_k_dtype != "bf16":
        return []
    cfg, hk, v = g.config, _key(r, "enable_hierarchical_cache"), inp.gating
    if v is None:
        return [_f("DSV112", cfg, hk, "bf16 index-K with HiCache: cannot check that the index-K read waits "
                                      "for the HiCache layer transfer (give sglang.tree or --tree)", g.name)]
    if v.gated is None:
        return [_f("DSV111", cfg, hk, f"bf16 index-K with HiCache on tree {inp.tree}: {v.summary()}", g.name)]
    if not v.gated:
        p = v.problems[0]
        return [_f("DSV111", cfg, hk, f"bf16 index-K with HiCache on a tree whose index-K read is not gated "
                                      f"on the HiCache layer transfer: {inp.tree}/{p}"
                                      f" (turn HiCache off: dsv4ctl hicache off --group {g.name}, "
                                      f"or restore wait_layer_transfer)", g.name)]
    return []


def check_group(g: GroupInput, r: Resolved, inp: LintInput) -> list[Finding]:
    """DSV4 rules of one group (DSV101-DSV106, DSV108, DSV111-DSV120), in this order: topology and
    mode, DeepSeek-V4 server settings, then with HiCache on its exclusions, its DeepSeek-V4 pool
    rules and the bf16 index-K gating."""
    assert g.config is not None
    mode = _mode(g, r)
    out = _topology_findings(g, r)
    if inp.dsv4:
        out += _dsv4_server_findings(g, r)
    if not _hicache_on(r):
        return out
    out += _hicache_findings(g, r, mode)
    if inp.dsv4:
        out += _dsv4_hicache_findings(g, r, mode) + _index_k_gating_findings(g, r, inp)
    return out


PD_KEYS = (
    ("page_size", "page-size"),
    ("disaggregation_transfer_backend", "disaggregation-transfer-backend"),
    ("kv_cache_dtype", "kv-cache-dtype"),
    ("enable_deepseek_v4_fp4_indexer", "enable-deepseek-v4-fp4-indexer"),
    ("dsv4_attn_backend", "dsv4-attn-backend"),
    ("SGLANG_DSV4_KV_LAYOUT", "SGLANG_DSV4_KV_LAYOUT"),
    ("SGLANG_DSV4_COMPRESSED_KV_LAYOUT", "SGLANG_DSV4_COMPRESSED_KV_LAYOUT"),
    ("tool_call_parser", "tool-call-parser"),
    ("reasoning_parser", "reasoning-parser"),
    ("disaggregation_decode_allocation_policy", "disaggregation-decode-allocation-policy"),
)


def pd_value(dest: str, g: GroupInput, r: Resolved) -> Any:
    """The value a PD handshake compares, with DSV4's resolutions (ops §2.3, §7.1): page 256,
    kv dtype auto → fp8_e4m3 (bf16 = bfloat16), attention backend auto → flashmla, KV layout
    env default v4, compressed layout auto, parser auto → the DSV4 parser."""
    a = r.args
    if dest.startswith("SGLANG_"):
        return str(g.env.get(dest, "v4" if dest == "SGLANG_DSV4_KV_LAYOUT" else "auto")).lower()
    v = a.get(dest)
    if dest == "page_size":
        return v if v is not None else 256
    if dest == "kv_cache_dtype":
        return {"auto": "fp8_e4m3", "bf16": "bfloat16"}.get(v, v)
    if dest == "dsv4_attn_backend":
        return "flashmla" if v in (None, "auto") else v
    if dest == "tool_call_parser":
        return "deepseekv4" if v == "auto" else v
    if dest == "reasoning_parser":
        return "deepseek-v4" if v == "auto" else v
    return v


def check_pair(p: GroupInput, rp: Resolved, d: GroupInput, rd: Resolved) -> list[Finding]:
    """DSV107: the settings a PD pair must share (ops §1.3 "Keep P and D identical", §3.3)."""
    out = []
    for dest, label in PD_KEYS:
        pv, dv = pd_value(dest, p, rp), pd_value(dest, d, rd)
        if pv != dv:
            where = "profile env" if dest.startswith("SGLANG_") else None
            msg = (f"{label}: prefill {p.name!r} has {pv!r}, decode {d.name!r} has {dv!r}"
                   f"{' (' + where + ')' if where else ''}; a PD pair must agree")
            if rd.given.get(dest):
                cfg, key = d.config, rd.given[dest]
            elif rp.given.get(dest):
                cfg, key = p.config, rp.given[dest]
            else:
                cfg, key = d.config, None
            out.append(_f("DSV107", cfg, key, msg, d.name))
    return out


def check_host_ram(inp: LintInput, resolved: dict[str, Resolved]) -> list[Finding]:
    """DSV109/DSV110: per host, Σ over HiCache ranks of ratio × the rank's device pool GiB
    (plan ``allocated_gib``; host pages = device pages × ratio, hybrid_pool_assembler.py
    ``_deepseek_v4_num_host_pages``) against RAM − 10 GiB (error) and 0.8 × that (warning)."""
    out = []
    by_host: dict[str, list[tuple[GroupInput, float]]] = {}
    for g in inp.groups:
        r = resolved.get(g.name)
        if r is None or not _hicache_on(r) or not r.args.get("hicache_ratio") or not g.rank_device_gib:
            continue
        # every node of every server holds the host pools of its own ranks
        n = len(g.rank_device_gib)
        for i, h in enumerate(g.rank_hosts or [g.host] * n):
            share = r.args["hicache_ratio"] * g.rank_device_gib[i % n]
            items = by_host.setdefault(h, [])
            if items and items[-1][0] is g:
                items[-1] = (g, items[-1][1] + share)
            else:
                items.append((g, share))
    for host, items in by_host.items():
        ram = inp.host_ram_gib.get(host)
        if ram is None:
            continue
        total = sum(x for _, x in items)
        usable = ram - HICACHE_HOST_RESERVE_GIB
        parts = ", ".join(f"{g.name} {x:.1f}" for g, x in items)
        g0 = items[0][0]
        ratio_key = resolved[g0.name].given.get("hicache_ratio")
        if total > usable:
            out.append(_f("DSV109", g0.config, ratio_key,
                          f"host {host}: HiCache host pools {total:.1f} GiB ({parts}) exceed its {ram:g} GiB RAM "
                          f"minus SGLang's {HICACHE_HOST_RESERVE_GIB:g} GiB reserve ({usable:.1f} GiB)", g0.name))
        elif total > usable * HICACHE_HOST_FRACTION:
            out.append(_f("DSV110", g0.config, ratio_key,
                          f"host {host}: HiCache host pools {total:.1f} GiB ({parts}) leave less than "
                          f"{1 - HICACHE_HOST_FRACTION:.0%} of {usable:.1f} GiB for the rest of the host", g0.name))
    return out


def check_ports(inp: LintInput) -> list[Finding]:
    """DSV121: per host, every pair of listeners (:attr:`GroupInput.binds`) whose port ranges
    overlap, reported at the later one's ``file:line``. Pure."""
    out = []
    seen: dict[str, list[tuple[int, int, str, str]]] = {}
    for g in inp.groups:
        for host, lo, hi, what, where, rep in g.binds:
            me = g.name if not rep else f"{g.name} (replica {rep})"
            for lo2, hi2, who, what2 in seen.get(host, []):
                if lo <= hi2 and lo2 <= hi:
                    ports = str(lo) if lo == hi else f"{lo}-{hi}"
                    other = str(lo2) if lo2 == hi2 else f"{lo2}-{hi2}"
                    file, _, line = where.rpartition(":")
                    out.append(Finding("DSV121", RULES["DSV121"][1], file, int(line) if line.isdigit() else 1,
                                       f"host {host}: group {me!r} {what} {ports} overlaps group {who!r} "
                                       f"{what2} {other}: the second listener fails with 'Address already in use'",
                                       g.name))
            seen.setdefault(host, []).append((lo, hi, me, what))
    return out


def lint(inp: LintInput, table: Table) -> list[Finding]:
    """All findings for the groups of ``inp``, sorted by file and line. Pure."""
    out: list[Finding] = []
    resolved: dict[str, Resolved] = {}
    by_name = {g.name: g for g in inp.groups}
    for g in inp.groups:
        if g.config is None:
            continue
        f, r = check_keys(g.config, table, g.name, sm100=g.sm100, role=g.role)
        out += f
        resolved[g.name] = r
        out += check_group(g, r, inp)
    for pn, dn in inp.pairs:
        if pn in resolved and dn in resolved:
            out += check_pair(by_name[pn], resolved[pn], by_name[dn], resolved[dn])
    out += check_host_ram(inp, resolved)
    out += check_ports(inp)
    if inp.version_mismatch:
        file, line, msg = inp.version_mismatch
        out.append(Finding("DSV122", RULES["DSV122"][1], file, line, msg))
    if inp.series_mismatch:
        file, line, msg = inp.series_mismatch
        out.append(Finding("DSV123", RULES["DSV123"][1], file, line, msg))
    seen = set()
    uniq = []
    for f in out:
        if f not in seen:
            seen.add(f)
            uniq.append(f)
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(uniq, key=lambda f: (f.file, f.line, order[f.severity], f.rule))


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]
