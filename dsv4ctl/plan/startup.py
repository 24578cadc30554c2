"""What an SGLang release refuses at start-up for DeepSeek-V4: one rule set (pure) shared by
``dsv4ctl plan`` (and its ``--set``), ``config lint``, the deploy preflight (which runs both) and
``config set``.

A serve config reaches SGLang as ``sglang serve ... --config FILE``: the release's
``ConfigArgumentMerger`` (``srt/utils/server_args_config_parser.py``) turns each YAML key into an
option, its argparse parser reads them, and its argument resolution (``ServerArgs.resolve_once``;
0.5.18: ``ServerArgs.__post_init__``) runs the model hooks. Each refusal below is one of those
steps refusing, with SGLang's own message and the file that raises it:

=====================  ==========================================================================
rule                   SGLang (file; releases)
=====================  ==========================================================================
SGL001 unknown key     argparse ``unrecognized arguments`` (every release; the release's table:
                       ``dsv4-attn-backend`` is 0.5.20+, ``attn-dp-size`` 0.5.22+)
SGL003 not in config   ``Unsupported config option`` (server_args_config_parser.py; e.g.
                       ``enable-dp-attention`` 0.5.22+, a DeprecatedStoreTrueAction)
SGL004 bad value       argparse type / choices / ambiguous abbreviation
SGL007 duplicate       one argument under two spellings
DSV101 HiCache/radix   ``enable-hierarchical-cache and disable-radix-cache are mutually exclusive``
                       (0.5.18: server_args.py; 0.5.19+: arg_groups/kv_cache_hook.py)
DSV106 HiCache decode  the same refusal: a PD decode server runs without the radix cache
DSV117 KV dtype        ``X is not supported for DeepseekV4ForCausalLM`` (model override
                       ``deepseek_v4``: fp8_e4m3 / bfloat16 only)
SGL010 DP attention    ``tp_size % attn_dp_size == 0`` (arg_groups/parallel_hook.py 0.5.22+,
                       server_args.py before), ``--dp-size`` with ``--attn-dp-size`` (0.5.22+),
                       ``enable-dp-lm-head`` without attention DP
SGL011 trtllm          ``--dsv4-attn-backend trtllm`` needs an SM100 GPU, fp8 KV, no PD
                       disaggregation, chunked prefill (arg_groups/deepseek_v4_hook.py, 0.5.20+)
SGL012 speculative     DeepSeek-V4 takes EAGLE (top-k 1) or DSPARK only (deepseek_v4_hook.py);
                       EAGLE with a top-k or draft-token count needs ``speculative-num-steps``
                       (arg_groups/speculative_hook.py ``_handle_eagle_family``)
=====================  ==========================================================================

Proven per release by running that release's own ``prepare_server_args`` + resolution on CPU over
a generated matrix (``tests/oracle/startup.py``, ``tests/test_startup_oracle.py``)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from .argtable import ConvertError, Table, convert

#: kv-cache dtypes the DeepSeek-V4 model override accepts (``auto`` resolves to fp8_e4m3)
DSV4_KV_DTYPES = ("auto", "fp8_e4m3", "bfloat16", "bf16")
#: speculative algorithms the DeepSeek-V4 hook accepts
DSV4_SPEC_ALGOS = ("EAGLE", "DSPARK")
#: SGLang's words for HiCache without the radix cache (every release)
HICACHE_RADIX = ("The arguments enable-hierarchical-cache and disable-radix-cache are mutually exclusive and "
                 "cannot be used at the same time")


#: The ``source`` of a refusal that is dsv4ctl's own (SGLang accepts it, silently): a message says
#: "dsv4ctl refuses it", never that SGLang does.
OWN_RULE = "dsv4ctl: "


@dataclass(frozen=True)
class Refusal:
    """One refusal (or, with ``severity`` warning/info, a lint note) of a serve config.

    ``key``: the key as written in the file (None: the whole config, or a ``--set`` value);
    ``message``: ``key: what`` (SGLang's own words where it has some); ``source``: the SGLang
    file that refuses."""

    rule: str
    severity: str
    key: Optional[str]
    message: str
    source: str = ""


@dataclass
class Resolved:
    """Values of one config after argparse: ``args`` by dest (defaults filled in), ``given`` dest → key."""

    args: dict[str, Any]
    given: dict[str, str]


def is_sm100(gpu_model: Optional[str], gpu_mib: Optional[int]) -> bool:
    """Whether a host's GPUs are SM100/SM103 (B200, B300, GB200, GB300): a ``B`` in the model
    name, or (model unknown) 160 GiB or more. An unknown GPU counts as SM100 (the shipped
    profiles' B200), which keeps SGLang's SM100-only refusals from firing on a guess."""
    if gpu_model:
        return "B" in gpu_model.upper().replace("NVIDIA", "")
    return gpu_mib is None or gpu_mib >= 160 * 1024


def _unknown(key: str, table: Table, pref: list[str]) -> Refusal:
    hint = ""
    if len(pref) > 1:
        return Refusal("SGL001", "error", key, f"{key}: SGLang rejects it: ambiguous option: --{key} could match "
                       + ", ".join(f"--{k}" for k in pref), "argparse: ambiguous option")
    if "_" in key and table.get(key.replace("_", "-")):
        hint = f" (SGLang --config keys use dashes: {key.replace('_', '-')})"
    else:
        close = difflib.get_close_matches(key, list(table.by_key), n=1, cutoff=0.75)
        if close:
            hint = f" (did you mean {close[0]}?)"
    return Refusal("SGL001", "error", key, f"{key}: not an SGLang {table.version} server argument{hint}",
                   "argparse: unrecognized arguments")


def _unsupported(key: str, arg, table: Table) -> Refusal:
    if arg.action == "BooleanOptionalAction":
        msg = (f"{key}: SGLang rejects {arg.action} flags in --config "
               f"(pass --{arg.name} / --no-{arg.name} on the command line)")
    elif arg.name == "enable-dp-attention":
        msg = (f"{key}: SGLang rejects {arg.action} flags in --config; use attn-dp-size: N (N = the "
               f"dp-size you meant), its {table.version} replacement")
    else:
        msg = f"{key}: SGLang rejects {arg.action} flags in --config (pass it on the command line)"
    return Refusal("SGL003", "error", key, msg, "srt/utils/server_args_config_parser.py: Unsupported config option")


def _all_spellings(table: Table) -> bool:
    """Whether the release's ``--config`` reader refuses an unsupported action under any of its
    long spellings (0.5.23: ``_config_keys``) or only under its dest (0.5.18-0.5.22: a deprecated
    alias such as 0.5.19's ``cuda-graph-max-bs`` passes through to argparse, which takes it)."""
    from .versions import rules_for
    return rules_for(table.version).config_all_spellings


def check_keys(data: Mapping, table: Table) -> tuple[list[Refusal], Resolved]:
    """Every key of a serve config (raw YAML mapping ``data``) as the release's ``--config`` reader
    and argparse read it: refusals SGL001/SGL003/SGL004/SGL007 and the notes SGL002 (works only as
    an abbreviation), SGL005 (null), SGL006 (false flag), and the values resolved by dest."""
    out: list[Refusal] = []
    args = dict(table.defaults)
    given: dict[str, str] = {}
    for raw_key, value in data.items():
        key = str(raw_key)
        arg = table.get(key)
        if arg is None:
            pref = table.prefix_matches(key) if "_" not in key else []
            if len(pref) != 1:
                out.append(_unknown(key, table, pref))
                continue
            arg = table.get(pref[0])
            out.append(Refusal("SGL002", "warning", key, f"{key}: only works as an abbreviation of "
                                                        f"--{pref[0]}; write {pref[0]}"))
        if arg.config == "unsupported" and (_all_spellings(table) or key.replace("-", "_") == arg.dest):
            out.append(_unsupported(key, arg, table))
            continue
        if arg.dest in given:
            out.append(Refusal("SGL007", "error", key, f"{key}: {arg.name} already given as {given[arg.dest]}",
                               OWN_RULE + "SGLang's argparse would silently take the last one"))
            continue
        if value is None:
            try:
                convert(arg, "None")
                out.append(Refusal("SGL005", "warning", key, f"{key}: null is passed as the string 'None'; "
                                                            "leave the key out"))
            except ConvertError as e:
                out.append(Refusal("SGL004", "error", key, f"{key}: null becomes 'None': {e}", "argparse"))
                continue
        if value is False and arg.config == "store_true":
            out.append(Refusal("SGL006", "info", key, f"{key}: false is omitted (the flag stays at its default "
                                                     f"{arg.default!r}; a true on the command line still wins)"))
        try:
            v = convert(arg, value)
        except ConvertError as e:
            out.append(Refusal("SGL004", "error", key, f"{key}: {e}", "argparse"))
            continue
        given[arg.dest] = key
        if v is not None:
            args[arg.dest] = v
    return out, Resolved(args=args, given=given)


def attn_dp_of(args: Mapping, table: Table) -> int:
    """The attention-DP size SGLang resolves: ``attn_dp_size`` (0.5.22+), else ``dp_size`` with
    ``enable_dp_attention``, else 1."""
    if table.get("attn-dp-size") is not None and (args.get("attn_dp_size") or 1) > 1:
        return int(args["attn_dp_size"])
    if args.get("enable_dp_attention"):
        return int(args.get("dp_size") or 1)
    return 1


def _parallel(r: Resolved, table: Table) -> list[Refusal]:
    a, g = r.args, r.given
    out = []
    tp, dp, attn = int(a.get("tp_size") or 1), int(a.get("dp_size") or 1), attn_dp_of(a, table)
    new = table.get("attn-dp-size") is not None
    src = "srt/arg_groups/parallel_hook.py" if new else "srt/server_args.py"
    if new and attn > 1 and dp > 1:
        out.append(Refusal("SGL010", "error", g.get("dp_size"),
                           f"--dp-size {dp} with --attn-dp-size {attn}: data-parallel replicas combined with "
                           "attention data parallelism are not supported.", src))
    elif attn > 1 and tp % attn:
        out.append(Refusal("SGL010", "error", g.get("attn_dp_size") or g.get("dp_size"),
                           f"{'attn-dp-size' if new and g.get('attn_dp_size') else 'dp-size'} {attn} does not "
                           f"divide tp-size {tp} (SGLang asserts tp_size % attn_dp_size == 0)", src))
    if a.get("enable_dp_lm_head") and attn <= 1 and dp > 1:
        # with one DP rank SGLang turns the flag off (overrides.py _data_parallelism_defaults)
        msg = ("--enable-dp-lm-head requires attention DP (--attn-dp-size)." if new
               else "Please enable dp attention when setting enable_dp_lm_head.")
        out.append(Refusal("SGL010", "error", g.get("enable_dp_lm_head"), msg, src))
    return out


def _trtllm(r: Resolved, mode: Optional[str], sm100: bool) -> list[Refusal]:
    a, g = r.args, r.given
    if a.get("dsv4_attn_backend") != "trtllm":
        return []
    key, src = g.get("dsv4_attn_backend"), "srt/arg_groups/deepseek_v4_hook.py"
    checks = (
        (not sm100, "--dsv4-attn-backend trtllm requires an SM100/SM103 (Blackwell) GPU."),
        (a.get("kv_cache_dtype", "auto") not in ("auto", "fp8_e4m3"),
         f"--dsv4-attn-backend trtllm requires kv_cache_dtype=fp8_e4m3, got {a.get('kv_cache_dtype')}."),
        (mode in ("prefill", "decode"), "--dsv4-attn-backend trtllm does not support PD disaggregation yet"),
        (a.get("chunked_prefill_size") is not None and a["chunked_prefill_size"] <= 0,
         "--dsv4-attn-backend trtllm requires chunked prefill (--chunked-prefill-size > 0)."),
    )
    return [Refusal("SGL011", "error", key, msg, src) for bad, msg in checks if bad]


def _speculative(r: Resolved) -> list[Refusal]:
    a, g = r.args, r.given
    algo = a.get("speculative_algorithm")
    if algo is None:
        return []
    key = g.get("speculative_algorithm")
    if str(algo) not in DSV4_SPEC_ALGOS:
        return [Refusal("SGL012", "error", key, "Only EAGLE and DSPARK speculative algorithms are supported for "
                        "DeepseekV4ForCausalLM", "srt/arg_groups/deepseek_v4_hook.py")]
    if algo != "EAGLE":
        return []
    if a.get("speculative_eagle_topk") != 1:
        return [Refusal("SGL012", "error", g.get("speculative_eagle_topk") or key,
                        "Only EAGLE speculative algorithm with topk == 1 is supported for DeepseekV4ForCausalLM "
                        "(set speculative-eagle-topk: 1)", "srt/arg_groups/deepseek_v4_hook.py")]
    if a.get("speculative_num_steps") is None:
        return [Refusal("SGL012", "error", g.get("speculative_eagle_topk") or key,
                        "speculative-eagle-topk or speculative-num-draft-tokens without speculative-num-steps: "
                        "SGLang asserts both are unset before it picks all three (set speculative-num-steps)",
                        "srt/arg_groups/speculative_hook.py (_handle_eagle_family)")]
    return []


def _kv_and_hicache(r: Resolved, mode: Optional[str], version: str) -> list[Refusal]:
    a, g = r.args, r.given
    out = []
    kvd = a.get("kv_cache_dtype", "auto")
    if kvd not in DSV4_KV_DTYPES:
        out.append(Refusal("DSV117", "error", g.get("kv_cache_dtype"),
                           f"kv-cache-dtype {kvd}: DeepSeek-V4 accepts fp8_e4m3 or bfloat16 (auto = fp8_e4m3): "
                           f"{kvd} is not supported for DeepseekV4ForCausalLM",
                           "srt/arg_groups/model_overrides/deepseek_v4.py"))
    if a.get("enable_hierarchical_cache"):
        hk = g.get("enable_hierarchical_cache")
        src = "srt/server_args.py" if version == "0.5.18" else "srt/arg_groups/kv_cache_hook.py"
        if a.get("disable_radix_cache"):
            out.append(Refusal("DSV101", "error", g.get("disable_radix_cache"),
                               f"{HICACHE_RADIX} (HiCache needs the radix cache)", src))
        elif mode == "decode":
            out.append(Refusal("DSV106", "error", hk, f"HiCache on a decode server: not usable for DeepSeek-V4 in "
                               f"SGLang {version} (decode radix cache is off; enable HiCache on prefill only): "
                               f"{HICACHE_RADIX}", src))
    return out


def combination_refusals(r: Resolved, table: Table, *, sm100: bool = True, role: Optional[str] = None) -> list[Refusal]:
    """The refusals of SGLang ``table.version``'s argument resolution for a DeepSeek-V4 server whose
    arguments resolved to ``r`` (:func:`check_keys`), on an SM100 GPU or not, in PD role ``role``
    (``prefill``/``decode``: the mode when the config has no ``disaggregation-mode``)."""
    mode = r.args.get("disaggregation_mode")
    if mode in (None, "null"):
        mode = role if role in ("prefill", "decode") else None
    return (_parallel(r, table) + _trtllm(r, mode, sm100) + _speculative(r)
            + _kv_and_hicache(r, mode, table.version))


def validate(data: Mapping, table: Table, *, sm100: bool = True, role: Optional[str] = None,
             overrides: Optional[Mapping[str, Any]] = None) -> tuple[list[Refusal], Resolved]:
    """All refusals and notes of a serve config ``data`` on SGLang ``table.version``: its keys
    (:func:`check_keys`), then ``overrides`` ({dest: value}: plan's ``--set`` of server arguments,
    applied after the file as the command line would; a dest this release lacks is SGL001), then
    the combinations (:func:`combination_refusals`). Pure."""
    out, r = check_keys(data, table)
    dests = table.by_dest
    for dest, value in (overrides or {}).items():
        if dest not in dests:
            out.append(Refusal("SGL001", "error", None, f"--set {dest}: not an SGLang {table.version} server "
                                                        "argument", "argparse: unrecognized arguments"))
            continue
        r.args[dest] = value
        r.given[dest] = f"--set {dest}"
    if (overrides or {}).get("enable_dp_attention") and table.get("attn-dp-size") is not None:
        # plan's what-if "dp_size N with DP attention" is attn-dp-size N in 0.5.22+ (its replacement)
        r.args["attn_dp_size"], r.args["dp_size"] = r.args.get("dp_size") or 1, 1
    return out + combination_refusals(r, table, sm100=sm100, role=role), r


def first_error(refusals: list[Refusal]) -> Optional[Refusal]:
    """The first refusal of severity ``error`` (None when SGLang starts)."""
    return next((x for x in refusals if x.severity == "error"), None)
