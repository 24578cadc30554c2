"""Run SGLang's own ``DSV4PoolConfigurator`` from an SGLang tree on CPU and print its pool sizes.

Usage (under ``.venv-oracle/bin/python``, from the repository root)::

    PYTHONPATH=TREE/python:. python -m tests.patchoracle.driver < cases.json

``cases.json`` is a list of ``{"config": PATH, "available_bytes": INT, "env": {NAME: VALUE},
"indexer_pool": BOOL}`` (the last: also build the real C4 ``DeepSeekV4IndexerPool`` on CPU at the
resulting size and report its bytes).
``env`` is applied to ``os.environ`` before each case (SGLang reads ``SGLANG_DSV4_INDEX_K_DTYPE``
at call time). Prints a JSON list, one object per case: where ``sglang`` was imported from, the
configurator's ``bytes_per_full_token`` and the final ``MemoryPoolConfig`` sizes (after
``resolve_max_num_reqs`` and ``finalize_with_max_running_requests``, as in
``kv_cache_configurator.py`` ``_resolve_memory_pool_config``), plus every ``DSV4`` log line
SGLang emitted. Recipe: capacity reference §5.3."""

from __future__ import annotations

import json
import logging
import sys
from types import SimpleNamespace as NS

from tests.oracle import tv_stub


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if "DSV4" in msg:
            self.lines.append(msg)


def _spec(algo):
    return NS(is_none=lambda: algo is None, is_eagle=lambda: algo == "EAGLE",
              is_dspark=lambda: algo == "DSPARK", is_dflash_family=lambda: False)


def _indexer_pool(cfg: dict, out, page_size: int) -> dict:
    """Build SGLang's real ``DeepSeekV4IndexerPool`` on CPU the way ``DeepSeekV4TokenToKVPool``
    does for the C4 indexer (size = c4 logical slots = c128 * 32, pages of page_size / 4 slots, one
    reserved global page) and report what it allocated."""
    import torch
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4IndexerPool
    n4 = sum(1 for r in cfg["compress_ratios"][:cfg["num_hidden_layers"]] if r == 4)
    pool = DeepSeekV4IndexerPool(out.c128_max_total_num_tokens * 32, page_size // 4, torch.uint8,
                                 cfg["index_head_dim"], n4, "cpu", False, use_fp4_indexer=False,
                                 global_page_size=page_size)
    bufs = pool.index_k_with_scale_buffer
    return dict(layers=len(bufs), pages=bufs[0].shape[0], page_bytes=bufs[0].shape[1],
                bytes_per_token=pool.get_bytes_per_token(),
                bytes=sum(b.numel() * b.element_size() for b in bufs))


def pool_sizes(config_path: str, available_bytes: int, *, page_size: int = 256,
               max_running_requests: int = 256, chunked_prefill_size: int = 16384,
               indexer_pool: bool = False) -> dict:
    """Pool sizes from the real configurator of whatever ``sglang`` is first on sys.path."""
    tv_stub.install(tv_stub.roots_for_sglang())      # 0.5.20: its function-call deps too
    tv_stub.tolerate_config_reregistration()         # 0.5.19: configs transformers 5.19 has
    import sglang
    from sglang.srt.model_executor import pool_configurator as pc
    from sglang.srt.runtime_context import get_context

    cap = _Capture()
    log = logging.getLogger(pc.__name__)
    log.addHandler(cap)
    log.setLevel(logging.INFO)
    cfg = json.load(open(config_path))
    fields = dict(page_size=page_size, max_running_requests=max_running_requests,
                  swa_full_tokens_ratio=0.1, chunked_prefill_size=chunked_prefill_size,
                  _swa_full_tokens_ratio_explicitly_set=True)
    model = NS(qk_nope_head_dim=cfg["head_dim"] - cfg["qk_rope_head_dim"],
               qk_rope_head_dim=cfg["qk_rope_head_dim"], index_head_dim=cfg["index_head_dim"],
               context_len=cfg["max_position_embeddings"], compress_ratios=cfg["compress_ratios"],
               window_size=cfg["sliding_window"],
               hf_config=NS(kv_source_layer_ids=cfg.get("kv_source_layer_ids", [])))
    kvc = NS(kv_cache_dtype_str="fp8_e4m3", model_config=model, spec_algorithm=_spec(None),
             layer_info=NS(start_layer=0, end_layer=cfg["num_hidden_layers"]), pp_size=1,
             pp_group=None, sliding_window_size=cfg["sliding_window"], page_size=page_size,
             attn_dp_size=1, spec_aux_config=None, is_draft_worker=False,
             ps=NS(pp_size=1, attn_dp_size=1))      # 0.5.20 reads them from kvc.ps
    with get_context().override_server_args(**fields):
        kvc.server_args = get_context().server_args     # 0.5.18's configurator reads it there
        conf = pc.DSV4PoolConfigurator(kvc)
        out = conf.calculate_pool_sizes(available_bytes, page_size)
        out.max_running_requests = min(max(1, max_running_requests), out.full_max_total_num_tokens // 2)
        out = pc.DSV4PoolConfigurator(kvc).finalize_with_max_running_requests(out)
    log.removeHandler(cap)
    pool = _indexer_pool(cfg, out, page_size) if indexer_pool else None
    return dict(sglang_file=sglang.__file__, indexer_pool=pool,
                bytes_per_full_token=conf.bytes_per_full_token,
                indexer_bytes_per_token=conf.indexer_bytes_per_token,
                full=out.full_max_total_num_tokens, swa=out.swa_max_total_num_tokens,
                c4=out.c4_max_total_num_tokens, c128=out.c128_max_total_num_tokens,
                c4_state=out.c4_state_pool_size, c128_state=out.c128_state_pool_size,
                max_running_requests=out.max_running_requests, log=cap.lines)


def main(argv: list[str]) -> int:
    import os
    out = []
    for case in json.load(sys.stdin):
        saved = {k: os.environ.get(k) for k in case.get("env", {})}
        os.environ.update(case.get("env", {}))
        try:
            out.append(pool_sizes(case["config"], int(case["available_bytes"]),
                                  indexer_pool=bool(case.get("indexer_pool"))))
        except Exception as e:  # reported per case, the test decides
            out.append({"error": f"{type(e).__name__}: {e}"})
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
