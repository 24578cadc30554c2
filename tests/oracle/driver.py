"""The CPU oracle: SGLang 0.5.23's own DeepSeek-V4 pool sizing and argument resolution, run on CPU.

Runs only in ``.venv-oracle`` (``bash scripts/oracle-env.sh``), from the repository root::

    .venv-oracle/bin/python -m tests.oracle.driver < cases.json > results.json

stdin: ``{"cases": [case, ...]}``; stdout: ``{"sglang_version", "torch_version", "results"}``
with one result per case, in order. Environment switches (``SGLANG_DSV4_*``,
``SGLANG_OPT_USE_ONLINE_COMPRESS``, ...) are read from the process environment, some of them at
import time (the online-c128 ring size is a module constant of ``deepseek_v4_memory_pool``), so
every case in one run must want the same environment: :mod:`tests.oracle.runner` batches cases by
environment, one subprocess per batch.

Two kinds of case (see ``docs/oracle.md`` for the schema):

* ``"pool"``: one DeepSeek-V4 server group. Per PP stage the real ``DSV4PoolConfigurator``
  (``srt/model_executor/pool_configurator.py``) sizes the pools; the real
  ``KVCacheConfigurator.config_from_budget``, ``_apply_token_constraints`` and
  ``resolve_max_num_reqs`` (``srt/mem_cache/kv_cache_configurator.py``) apply
  ``--max-total-tokens``, the PP MIN and the final max_running_requests, then
  ``finalize_with_max_running_requests`` sizes the c128 state, exactly the sequence of
  ``_resolve_memory_pool_config``. The layer slice comes from the real ``get_pp_indices``; the
  page layouts (and SGLang's refusals of a layout the GPU or backend cannot use) from the real
  ``select_dsv4_kv_layout`` / ``resolve_compressed_kv_layout`` that the pool builder calls.
* ``"resolve"``: the real ``ServerArgs`` resolution pipeline (capacity reference §5.4) with the
  GPU memory size injected, returning ``mem_fraction_static``, chunked prefill, decode
  ``max_bs`` and the other DeepSeek-V4 defaults.

What is replaced, and why (everything else is SGLang's code):

* ``KVCacheConfigurator`` is a ``SimpleNamespace`` with exactly the attributes the code reads
  (reference §5.3); building the real one needs a loaded model.
* The PP all-reduce MIN in ``_apply_token_constraints`` (a torch.distributed collective) is
  replaced by the MIN over the stages' own results computed in a first pass, and the server
  args are published with ``pp_size=1`` so the real function does not call the collective.
* ``torch.cuda.is_available`` / ``get_device_capability`` / ``torch.version.cuda`` report an
  SM100 GPU while a case with ``sm100`` runs (the V4.1 layouts assert SM100/SM103).
* ``bf16`` index-K: ``get_dsv4_indexer_bytes_per_token`` returns ``2*d`` for the non-fp4 case
  (reference §5.3 ``patch_bf16_index_k``); upstream 0.5.23 has no bf16 C4 indexer.
* torchvision is stubbed (:mod:`tests.oracle.tv_stub`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace as NS

from tests.oracle import tv_stub

# 0.5.20 imports FunctionCallParser (openai, partial_json_parser, xgrammar) with server_args:
# those are stubbed too when the release does and they are missing (tv_stub.roots_for_sglang).
tv_stub.install(tv_stub.roots_for_sglang())
tv_stub.tolerate_config_reregistration()

import sglang  # noqa: E402
import torch  # noqa: E402
from sglang.srt.distributed.utils import get_pp_indices  # noqa: E402
try:  # 0.5.21+; 0.5.20 has one page layout (V4, 584-byte slots) and no layout selection
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import (  # noqa: E402
        resolve_compressed_kv_layout,
        select_dsv4_kv_layout,
    )
except ImportError:
    resolve_compressed_kv_layout = select_dsv4_kv_layout = None
from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator  # noqa: E402
from sglang.srt.model_executor import pool_configurator as pc  # noqa: E402
from sglang.srt.runtime_context import get_context  # noqa: E402

from tests.oracle.runner import DEFAULT_SERVER_ARGS, FORKABLE_ENV  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "dsv4ctl" / "data" / "models"

POOL_FIELDS = ("full_max_total_num_tokens", "swa_max_total_num_tokens", "c4_max_total_num_tokens",
               "c128_max_total_num_tokens", "c4_state_pool_size", "c128_state_pool_size")


def model_config(name: str) -> dict:
    """The shipped ``config.json`` of ``deepseek-v4-flash`` / ``deepseek-v4-pro``."""
    return json.loads((MODELS / f"{name}.json").read_text())


def _spec(algo):
    return NS(is_none=lambda: algo is None, is_eagle=lambda: algo == "EAGLE",
              is_dspark=lambda: algo == "DSPARK", is_dflash_family=lambda: False)


def _kvc(cfg: dict, layers: tuple[int, int], pp_size: int, pp_rank: int, attn_dp_size: int,
         page_size: int, spec_algo):
    """Stand-in for ``KVCacheConfigurator`` with the attributes the pool-sizing code reads."""
    model = NS(qk_nope_head_dim=cfg["head_dim"] - cfg["qk_rope_head_dim"],
               qk_rope_head_dim=cfg["qk_rope_head_dim"], index_head_dim=cfg["index_head_dim"],
               context_len=cfg["max_position_embeddings"], compress_ratios=cfg["compress_ratios"],
               window_size=cfg["sliding_window"], num_hidden_layers=cfg["num_hidden_layers"],
               hf_config=NS(architectures=cfg.get("architectures") or ["DeepseekV4ForCausalLM"],
                            kv_source_layer_ids=cfg.get("kv_source_layer_ids") or []))
    return NS(kv_cache_dtype_str="fp8_e4m3", model_config=model, spec_algorithm=_spec(spec_algo),
              layer_info=NS(start_layer=layers[0], end_layer=layers[1]), pp_size=pp_size,
              pp_group=NS(rank_in_group=pp_rank) if pp_size > 1 else None,
              sliding_window_size=cfg["sliding_window"], page_size=page_size,
              attn_dp_size=attn_dp_size, spec_aux_config=None, is_draft_worker=False,
              is_hybrid_swa=True, mambaish_config=None,
              # 0.5.20 reads the parallel sizes from kvc.ps (0.5.21: kvc.pp_size, kvc.attn_dp_size)
              ps=NS(pp_size=pp_size, attn_dp_size=attn_dp_size))


@contextlib.contextmanager
def sm100(enabled: bool):
    """Make torch report an SM100 (Blackwell) CUDA device while the block runs."""
    if not enabled:
        yield
        return
    saved = (torch.cuda.is_available, torch.cuda.get_device_capability, torch.version.cuda)
    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_capability = lambda device=None: (10, 0)
    torch.version.cuda = "12.9"
    try:
        yield
    finally:
        torch.cuda.is_available, torch.cuda.get_device_capability, torch.version.cuda = saved


@contextlib.contextmanager
def index_k(dtype: str):
    """``bf16``: price the non-fp4 C4 indexer at ``2*d`` bytes (reference §5.3)."""
    if dtype == "fp8":
        yield
        return
    if dtype != "bf16":
        raise ValueError(f"index_k {dtype!r} not in fp8|bf16")
    if not hasattr(pc, "get_dsv4_indexer_bytes_per_token"):
        # 0.5.19 prices the indexer inline in _get_bytes_per_full_token: no hook to re-price
        raise ValueError("bf16 index-K: this release budgets the C4 indexer inline (no hook)")
    orig = pc.get_dsv4_indexer_bytes_per_token
    pc.get_dsv4_indexer_bytes_per_token = (
        lambda d, use_fp4_indexer=False: orig(d, use_fp4_indexer) if use_fp4_indexer else 2 * d)
    try:
        yield
    finally:
        pc.get_dsv4_indexer_bytes_per_token = orig


def run_pool_case(case: dict) -> dict:
    """Size one server group's pools with SGLang's code; one dict per PP stage under ``stages``."""
    cfg = model_config(case["model"])
    pp = case.get("pp_size", 1)
    dp = case.get("attn_dp_size", 1)
    avail = case["available_bytes"]
    avails = list(avail) if isinstance(avail, list) else [avail] * pp
    if len(avails) != pp:
        raise ValueError("available_bytes must be one int or one per PP stage")
    fields = {k: v for k, v in {**DEFAULT_SERVER_ARGS, **case.get("server_args", {})}.items()
              if v is not None}
    from sglang.srt.server_args import ServerArgs
    known = getattr(ServerArgs, "__struct_fields__", None) or ServerArgs.__dataclass_fields__  # 0.5.19: a dataclass
    if "dsv4_attn_backend" not in known and fields.get("dsv4_attn_backend") == "flashmla":
        # 0.5.19 has no --dsv4-attn-backend (FlashMLA pools only): the default is no argument
        del fields["dsv4_attn_backend"]
    page = fields["page_size"]
    spec_algo = fields.get("speculative_algorithm")
    real_constraints = KVCacheConfigurator._apply_token_constraints
    with sm100(case.get("sm100", True)), index_k(case.get("index_k", "fp8")), \
            get_context().override_server_args(**fields):
        kvcs = []
        for r in range(pp):
            kvc = _kvc(cfg, get_pp_indices(cfg["num_hidden_layers"], r, pp), pp, r, dp, page,
                       spec_algo)
            kvc._apply_token_constraints = functools.partial(real_constraints, kvc)
            # 0.5.18's DSV4PoolConfigurator reads the published server args from kvc.server_args
            kvc.server_args = get_context().server_args
            kvcs.append(kvc)
        # Pass 1: what each stage contributes to the all-reduce MIN (its own constrained value).
        local = [KVCacheConfigurator.config_from_budget(k, a).max_total_num_tokens
                 for k, a in zip(kvcs, avails)]
        pp_min = min(local)
        stages = []
        for r, (kvc, a) in enumerate(zip(kvcs, avails)):
            if pp > 1:
                kvc._apply_token_constraints = (
                    lambda tokens, k=kvc: min(real_constraints(k, tokens), pp_min))
            conf = pc.create_memory_pool_configurator(kvc)
            if type(conf) is not pc.DSV4PoolConfigurator:
                raise TypeError(f"SGLang chose {type(conf).__name__}, not DSV4PoolConfigurator")
            c128_fixed = _c128_state_fixed_bytes(conf, a)
            unconstrained = conf.calculate_pool_sizes(a, page).full_max_total_num_tokens
            # _resolve_memory_pool_config (kv_cache_configurator.py:3174)
            config = KVCacheConfigurator.config_from_budget(kvc, a)
            config.max_running_requests = KVCacheConfigurator.resolve_max_num_reqs(
                kvc, config.max_total_num_tokens)
            config = pc.create_memory_pool_configurator(kvc).finalize_with_max_running_requests(config)
            stage = dict(
                pp_rank=r, layers=[kvc.layer_info.start_layer, kvc.layer_info.end_layer],
                available_bytes=a,
                bytes_per_full_token=conf.bytes_per_full_token,
                c128_state_fixed_bytes=c128_fixed,
                unconstrained_full_tokens=unconstrained,
                **_swa_terms(conf),
            )
            stage.update({f: getattr(config, f) for f in POOL_FIELDS})
            stage["max_total_num_tokens"] = config.max_total_num_tokens
            stage["max_running_requests"] = config.max_running_requests
            stages.append(stage)
        # _build_dsv4_kv_pool (kv_cache_configurator.py:2098) then selects the page layout, which
        # is where SGLang refuses a layout / backend / GPU mismatch the sizing did not look at.
        if select_dsv4_kv_layout is None:  # 0.5.20: DeepSeekV4SingleKVPool, V4 pages only
            return {"kv_layout": "v4", "compressed_kv_layouts": None, "stages": stages}
        layout, option = select_dsv4_kv_layout()
        trtllm = fields.get("dsv4_attn_backend") == "trtllm"
        compressed = None if trtllm else {
            str(r): resolve_compressed_kv_layout(layout, r, option).value for r in (4, 128)}
    return {"kv_layout": layout.value, "compressed_kv_layouts": compressed, "stages": stages}


def _c128_state_fixed_bytes(conf, available: int) -> int:
    """The c128 state bytes ``calculate_pool_sizes`` subtracts. 0.5.19 has no
    ``_resolve_max_running_requests_per_worker``: its own two branches (pool_configurator.py
    ``calculate_pool_sizes``), which compute the same requests."""
    if hasattr(conf, "_resolve_max_running_requests_per_worker"):
        return conf._get_c128_state_fixed_bytes(conf._resolve_max_running_requests_per_worker(available))
    if conf.requested_max_running_requests_per_worker is not None:
        return conf._get_c128_state_fixed_bytes(conf.requested_max_running_requests_per_worker)
    return conf._get_c128_state_fixed_bytes_for_token_capacity(int(available / conf.bytes_per_full_token))


def _swa_terms(conf) -> dict:
    """The SWA terms of a configurator. 0.5.21+: SWA bytes per slot, cap-mode pool and the rings
    per owner ratio. 0.5.20 (pool_configurator.py l.926-1346) has neither a SWA cap mode nor a
    separate SWA coefficient (its per-token bytes are one sum): ``None`` for those, no fixed SWA
    bytes, and ``c4_ring_size`` / ``c128_ring_size`` for the ratios the stage has."""
    if hasattr(conf, "ring_sizes"):
        return dict(bytes_per_swa_token=conf.bytes_per_swa_token,
                    swa_fixed_bytes=conf._get_swa_fixed_bytes(), swa_cap_tokens=conf.swa_cap_tokens,
                    ring_sizes={str(k): v for k, v in sorted(conf.ring_sizes.items())})
    rings = {"4": conf.c4_ring_size, "128": conf.c128_ring_size}
    counts = {"4": conf.num_layers_ca4, "128": conf.num_layers_ca128}
    return dict(bytes_per_swa_token=None, swa_fixed_bytes=0, swa_cap_tokens=None,
                ring_sizes={k: v for k, v in sorted(rings.items(), key=lambda kv: int(kv[0]))
                            if counts[k]})


RESOLVED = ("page_size", "kv_cache_dtype", "swa_full_tokens_ratio", "_swa_full_tokens_ratio_explicitly_set",
            "max_running_requests", "chunked_prefill_size", "mem_fraction_static", "dsv4_attn_backend",
            "disaggregation_decode_extra_slots")


def _run_resolve_0518(case: dict, model_dir: str) -> dict:
    """0.5.18 resolves the arguments in ``ServerArgs.__post_init__`` (server_args.py l.3585-3677;
    ``_handle_gpu_memory_settings`` l.4802, the GPU memory read at l.3674): construct it with the
    GPU memory injected there and read the fields."""
    import sglang.srt.server_args as sam
    saved = sam.get_device_memory_capacity
    sam.get_device_memory_capacity = lambda device=None: case["gpu_memory_mib"]
    try:
        sa = sam.ServerArgs(model_path=model_dir, device="cuda", skip_tokenizer_init=True,
                            **case.get("server_args", {}))
    finally:
        sam.get_device_memory_capacity = saved
    out = {n: getattr(sa, n, None) for n in RESOLVED}
    out["decode_max_bs"] = sa.cuda_graph_config.decode.max_bs
    return out


def run_resolve_case(case: dict) -> dict:
    """SGLang's argument resolution for a DeepSeek-V4 model on a GPU of ``gpu_memory_mib`` MiB."""
    if not importlib.util.find_spec("sglang.srt.arg_groups.memory_hook"):
        model_dir = tempfile.mkdtemp(prefix="dsv4ctl-oracle-model-")
        try:
            shutil.copy(MODELS / f"{case['model']}.json", Path(model_dir) / "config.json")
            return _run_resolve_0518(case, model_dir)
        finally:
            shutil.rmtree(model_dir, ignore_errors=True)
    import sglang.srt.arg_groups.memory_hook as memory_hook
    from sglang.srt.arg_groups.overrides import resolution_result
    from sglang.srt.server_args import ServerArgs

    model_dir = tempfile.mkdtemp(prefix="dsv4ctl-oracle-model-")
    try:
        shutil.copy(MODELS / f"{case['model']}.json", Path(model_dir) / "config.json")
        gpu = case["gpu_memory_mib"]
        # 0.5.20+ read the GPU memory in memory_hook.py; 0.5.19 in arg_groups/pipeline.py, which
        # passes it to handle_gpu_memory_settings
        import sglang.srt.arg_groups.pipeline as pipeline
        hook = memory_hook if hasattr(memory_hook, "get_device_memory_capacity") else pipeline
        saved = hook.get_device_memory_capacity
        hook.get_device_memory_capacity = lambda device=None: gpu
        try:
            sa = ServerArgs(model_path=model_dir, device="cuda", skip_tokenizer_init=True,
                            **case.get("server_args", {}))
            sa.resolve_once()
        finally:
            hook.get_device_memory_capacity = saved
        out = {n: resolution_result(sa, n) for n in RESOLVED}
        out["decode_max_bs"] = resolution_result(sa, "cuda_graph_config").decode.max_bs
        return out
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)


@contextlib.contextmanager
def _gpu(gpu_mib: int, is_sm100: bool):
    """The GPU a start-up case runs on: its memory (every module that reads it in some release:
    ``memory_hook`` 0.5.20+, ``pipeline`` 0.5.19, ``server_args`` 0.5.18) and whether it is an
    SM100 GPU (``srt/utils/common.py is_sm100_supported``, read function-locally by the DSV4
    hook, so replacing the module attribute is what the hook sees)."""
    import sglang.srt.server_args as sam
    import sglang.srt.utils.common as common
    mods = [sam]
    for name in ("sglang.srt.arg_groups.memory_hook", "sglang.srt.arg_groups.pipeline"):
        if importlib.util.find_spec(name):
            mods.append(importlib.import_module(name))
    mods = [m for m in mods if hasattr(m, "get_device_memory_capacity")]
    saved = [(m, m.get_device_memory_capacity) for m in mods] + [(common, common.is_sm100_supported)]
    for m in mods:
        m.get_device_memory_capacity = lambda device=None: gpu_mib
    common.is_sm100_supported = lambda device=None: is_sm100
    try:
        yield
    finally:
        for m, f in saved[:-1]:
            m.get_device_memory_capacity = f
        common.is_sm100_supported = saved[-1][1]


def run_startup_case(case: dict) -> dict:
    """SGLang's start-up argument path for a DeepSeek-V4 server: the serve config ``config``
    ({YAML key: value}) written to a file and launched as ``sglang serve --model-path M --device
    cuda --skip-tokenizer-init --config FILE`` would read it (``prepare_server_args``: the real
    ``ConfigArgumentMerger`` and argparse), then the release's argument resolution
    (``resolve_once``; 0.5.18 resolves in ``ServerArgs.__post_init__``) on a GPU of
    ``gpu_memory_mib`` MiB, SM100 or not (``sm100``). ``{"accepted": True}``, or SGLang's refusal:
    argparse's ``error:`` line as ``{"error": "argparse: ..."}`` (its SystemExit), an exception as
    ``{"error": "Type: message"}``."""
    import io
    import yaml
    import sglang.srt.server_args as sam
    model_dir = tempfile.mkdtemp(prefix="dsv4ctl-oracle-startup-")
    err = io.StringIO()
    try:
        shutil.copy(MODELS / f"{case.get('model', 'deepseek-v4-flash')}.json", Path(model_dir) / "config.json")
        path = Path(model_dir) / "serve.yaml"
        path.write_text(yaml.safe_dump(case.get("config") or {}, sort_keys=False))
        argv = ["--model-path", model_dir, "--device", "cuda", "--skip-tokenizer-init", "--config", str(path)]
        with _gpu(case.get("gpu_memory_mib", 183359), case.get("sm100", True)):
            try:
                with contextlib.redirect_stderr(err):
                    sa = sam.prepare_server_args(argv)
            except SystemExit:
                lines = [ln for ln in err.getvalue().splitlines() if "error:" in ln]
                return {"error": "argparse: " + (lines[-1].split("error:", 1)[1].strip() if lines else "exit")}
            if hasattr(sa, "resolve_once"):
                sa.resolve_once()
        return {"accepted": True}
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)


def run_case(case: dict) -> dict:
    """One case; SGLang's refusal (exception or assertion) becomes ``{"error": "Type: msg"}``."""
    kind = case.get("kind", "pool")
    try:
        if kind == "resolve":
            out = run_resolve_case(case)
        elif kind == "startup":
            out = run_startup_case(case)
        else:
            out = run_pool_case(case)
    except (AssertionError, RuntimeError, ValueError) as e:
        out = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    except (TypeError, KeyError, AttributeError, NotImplementedError, ImportError) as e:
        if kind != "startup":
            raise
        out = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    return {"id": case.get("id"), **out}


def _import_time_env() -> None:
    """Set again what SGLang computed from the environment at import, with that module's own
    expression. Found by walking the module-level code of every SGLang module this driver imports
    for environment reads: of the switches in ``runner.FORKABLE_ENV`` only
    ``deepseek_v4_memory_pool.ONLINE_C128`` (0.5.23, line 50) is read at import; the others are
    read when the code runs."""
    from sglang.srt.environ import envs
    from sglang.srt.mem_cache import deepseek_v4_memory_pool as m
    m.ONLINE_C128 = not m._is_hip and envs.SGLANG_OPT_USE_ONLINE_COMPRESS.get()


def run_cases_here(cases: list[dict]) -> list[dict]:
    """Every case in this process, in order of ``cases``. Pool cases run first: argument
    resolution leaves state behind (published defaults) that a later override_server_args must
    not see."""
    order = sorted(range(len(cases)), key=lambda i: cases[i].get("kind", "pool") != "pool")
    results: list = [None] * len(cases)
    for i in order:
        results[i] = run_case(cases[i])
    return results


def run_batches(batches: list[dict], jobs: int) -> list[dict]:
    """Each ``{"env": {...}, "cases": [...]}`` batch in a child forked from this process, which
    has imported torch and SGLang once (about 15 CPU-s a process on this machine kind, nearly all
    of a batch's cost), at most ``jobs`` at a time. A child starts from the state right after the
    imports, sets the batch's ``SGLANG_*`` switches (only :data:`FORKABLE_ENV`; ValueError
    otherwise) and answers ``{"results": [...]}`` or ``{"error": "..."}`` (a crash, with its
    exit status) over a pipe."""
    import selectors
    for b in batches:
        extra = set(b.get("env") or {}) - FORKABLE_ENV
        if extra:
            raise ValueError(f"switches read at import, not forkable: {sorted(extra)}")
    out: list = [None] * len(batches)
    pending = list(range(len(batches)))
    running: dict = {}
    sel = selectors.DefaultSelector()
    while pending or running:
        while pending and len(running) < jobs:
            i = pending.pop(0)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: the batch's switches, its cases, the answer, exit
                os.close(r)
                code = 0
                try:
                    for k in [k for k in os.environ if k.startswith("SGLANG_")]:
                        del os.environ[k]
                    os.environ.update({k: str(v) for k, v in (batches[i].get("env") or {}).items()})
                    _import_time_env()
                    data = json.dumps({"results": run_cases_here(batches[i]["cases"])}).encode()
                except BaseException as e:  # noqa: BLE001 - reported to the parent
                    data, code = json.dumps({"error": f"{type(e).__name__}: {e}"}).encode(), 1
                with os.fdopen(w, "wb") as f:
                    f.write(data)
                os._exit(code)
            os.close(w)
            f = os.fdopen(r, "rb")
            running[f] = (i, pid, [])
            sel.register(f, selectors.EVENT_READ)
        for key, _ in sel.select():
            f = key.fileobj
            chunk = f.read1(1 << 16)
            i, pid, parts = running[f]
            if chunk:
                parts.append(chunk)
                continue
            sel.unregister(f)
            f.close()
            del running[f]
            _, status = os.waitpid(pid, 0)
            try:
                out[i] = json.loads(b"".join(parts))
            except ValueError:
                out[i] = {"error": f"batch child exited with status {status} without an answer"}
    return out


def main() -> int:
    """stdin ``{"cases": [...]}`` (one batch, this process's environment) or ``{"batches":
    [{"env", "cases"}, ...], "jobs": N}`` (:func:`run_batches`)."""
    doc = json.load(sys.stdin)
    # SGLang and its dependencies print to stdout; keep fd 1 for the JSON answer only.
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    head = {"sglang_version": sglang.__version__, "torch_version": torch.__version__}
    if "batches" in doc:
        head["batches"] = run_batches(doc["batches"], int(doc.get("jobs") or 2))
    else:
        head["results"] = run_cases_here(doc["cases"])
    json.dump(head, answer)
    answer.write("\n")
    answer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
