"""SGLang releases dsv4ctl plans and lints for, and what differs between them (pure).

Each supported release is proven on CPU by its own code (tests/test_versions_oracle.py runs the
release's ``DSV4PoolConfigurator`` and ``ServerArgs`` resolution, wheels fetched by
``scripts/oracle-env.sh``, against dsv4ctl's model with that release's rules). What differs, read
from the releases' code (``srt/arg_groups/memory_hook.py``, ``srt/model_executor/pool_configurator.py``):

* 0.5.18 → 0.5.19: 0.5.18 resolves its arguments in ``ServerArgs.__post_init__``
  (``server_args.py``, ``_handle_gpu_memory_settings`` l.4802: the same reserve formula as 0.5.19's
  ``memory_hook.py``) and its configurator reads ``kvc.server_args`` instead of the runtime
  context, with 0.5.19's arithmetic: the same pools and default ``mem_fraction_static`` on every
  case run. It refuses an ``SGLANG_PP_LAYER_PARTITION`` whose length is not ``pp_size`` even with
  one stage (``distributed/utils.py`` ``get_pp_indices``; 0.5.19+ ignore it there:
  ``pp_partition_at_pp1``).
* 0.5.19 → 0.5.20: 0.5.19's configurator (l.763-1048) accepts a ratio-sized SWA pool too small
  to admit one request (0.5.20 refuses it in ``validate_swa_pool_size``: ``swa_floor_check``;
  e.g. Flash at 3 GiB with ``--swa-full-tokens-ratio 0.003``: 0.5.19 plans 127,232 full and 256
  SWA tokens, 0.5.20 refuses), has no ``--dsv4-attn-backend`` (FlashMLA pools only:
  ``resolved_attn_backend`` None) and prices the C4 indexer inline (fp8, the same figure); every
  other pool size and the default ``mem_fraction_static`` are 0.5.20's.
* 0.5.20 → 0.5.21: the ``DSV4PoolConfigurator`` was rewritten (0.5.20: l.926-1346 of
  ``pool_configurator.py``). 0.5.20 sizes the SWA pool by ``--swa-full-tokens-ratio`` only (no
  cap mode: ``swa_cap_mode``; no ``_swa_full_tokens_ratio_explicitly_set``, no
  ``--swa-prefix-tails``), knows one page layout (V4: no ``SGLANG_DSV4_KV_LAYOUT``, no
  ``select_dsv4_kv_layout`` in ``deepseek_v4_memory_pool.py``: ``v41_layouts``), prices a latent
  slot at ``nope + 2*rope + 8`` = 584 bytes where 0.5.21 prices the page padded to 576-byte
  multiples (585 bytes a slot for 256-slot SWA/64-slot C4 pages, 864 for 2-slot C128 pages) and
  trtllm's 512 (``paged_kv_budget``), and addresses the C4 compress-state ring per sliding window
  (``swa_page_size = window_size`` = 128) where 0.5.21 does per page (256): twice the C4 state
  rows, priced per token in the coefficient too (``c4_state_per_window``). Measured (B200 TP8
  Flash, 138,484,778,008 available bytes): 0.5.20 7,705.45 bytes per full token, 17,619,712
  full tokens, c4 state 110,112 rows; 0.5.21 7,086.75, 19,158,016 and 59,864. Argument
  resolution, ``memory_hook.py`` (identical files) and the per-worker requests (no floor) are
  0.5.21's.
* 0.5.21 → 0.5.22: the default decode CUDA-graph ``max_bs`` is capped at
  ``--max-running-requests`` (``decode_max_bs_is_default``), so the activation reserve and the
  default ``mem_fraction_static`` of a server with few requests are smaller; the DP-attention
  graph term is scaled by the attention-DP size instead of the DP size (the same number:
  ``--attn-dp-size`` first appears in 0.5.22; in 0.5.21 attention DP is ``--dp-size`` with
  ``--enable-dp-attention``, and 0.5.21's argument table has no ``attn-dp-size``).
* 0.5.22 → 0.5.23: requests per attention-DP worker ``max(1, mrr // attn_dp_size)`` (0.5.22:
  ``mrr // attn_dp_size``, 0 when fewer requests than workers); the prefill CUDA-graph max batch
  2048 → ``min(8192, chunk)`` (no effect: DeepSeek-V4 disables the prefill graph); the DeepSeek-V4
  output path goes through deepseek-recipe (0.5.22 parses with the regex detector).

0.5.18 is the first release with DeepSeek-V4 pools (``DSV4PoolConfigurator``): every release
that serves DeepSeek-V4 is supported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Optional

from ..errors import InputError
from .capacity import ReleaseFlags

DEFAULT_VERSION = "0.5.23"


@dataclass(frozen=True)
class VersionRules(ReleaseFlags):
    """What dsv4ctl's models need to know of one SGLang release.

    ``mrr_floor``: requests per attention-DP worker floored at 1; ``graph_bs_capped_by_mrr``: the
    default decode CUDA-graph batch capped at ``--max-running-requests``; ``output_path``:
    ``deepseek-recipe`` (token-level parser) or ``detector`` (regex ``DeepSeekV4Detector``);
    ``resolved_attn_backend``: ``--dsv4-attn-backend`` after server-args resolution when unset
    (0.5.20-0.5.22 leave ``auto``, which sizes pools as flashmla: only ``trtllm`` differs).
    ``swa_cap_mode``, ``v41_layouts``, ``paged_kv_budget``, ``c4_state_per_window``: the
    configurator generation (0.5.20 against 0.5.21+, see the module docstring and
    :class:`dsv4ctl.plan.capacity.PoolInputs`); ``swa_floor_check``: a ratio-sized SWA pool that
    cannot admit one request is refused (``validate_swa_pool_size``, 0.5.20+);
    ``pp_partition_at_pp1``: ``SGLANG_PP_LAYER_PARTITION`` is checked against ``pp_size`` even
    with one stage (0.5.18; 0.5.19+ ``get_pp_indices`` ignores it at ``pp_size`` 1);
    ``logits_chunked``: the C4 indexer's fp32 logits of a prefill chunk are split by query rows
    under a free-memory budget (0.5.21+: ``srt/layers/attention/mqa_logits_utils.py``,
    ``dsv4/metadata.py`` ``plan_indexer_row_chunks``); 0.5.18-0.5.20 score every row of the chunk
    in one tensor (``dsv4/indexer.py`` ``run_paged_indexer(all_rows, ...)``; only SM120 splits, by
    row count): logits larger than the free memory fail the first long prefill (field report C2);
    ``v41_new_layout``: ``SGLANG_DSV4_KV_LAYOUT=v41_new`` is a layout (0.5.23; 0.5.21/0.5.22's
    ``select_dsv4_kv_layout`` asserts ``mode in ("v41", "auto")``, 0.5.18-0.5.20 have no V4.1
    layouts at all and ignore the variable); ``config_all_spellings``: the ``--config`` reader refuses
    an unsupported action under every long spelling (0.5.23 ``_config_keys`` in
    ``srt/utils/server_args_config_parser.py``; 0.5.18-0.5.22 only under its dest)."""

    version: str
    graph_bs_capped_by_mrr: bool
    output_path: str
    resolved_attn_backend: Optional[str] = "flashmla"
    pp_partition_at_pp1: bool = False
    logits_chunked: bool = True
    config_all_spellings: bool = False
    # and the configurator's flags, declared once in dsv4ctl.plan.capacity.ReleaseFlags (keyword
    # arguments): mrr_floor, swa_cap_mode, v41_layouts, paged_kv_budget, c4_state_per_window,
    # swa_floor_check, v41_new_layout

    def pool_flags(self) -> dict:
        """This release's :class:`dsv4ctl.plan.capacity.ReleaseFlags`, the fields it shares with
        :class:`dsv4ctl.plan.capacity.PoolInputs`: ``{name: value}`` in their declared order."""
        return {f.name: getattr(self, f.name) for f in fields(ReleaseFlags)}

    @property
    def server_args_file(self) -> str:
        """The shipped argument table of this release (``dsv4ctl/data/``)."""
        return f"server_args-{self.version}.json"


VERSIONS: dict[str, VersionRules] = {
    "0.5.18": VersionRules("0.5.18", mrr_floor=False, graph_bs_capped_by_mrr=False, output_path="detector",
                           resolved_attn_backend=None, swa_cap_mode=False, v41_layouts=False,
                           paged_kv_budget=False, c4_state_per_window=True, swa_floor_check=False,
                           pp_partition_at_pp1=True, logits_chunked=False),
    "0.5.19": VersionRules("0.5.19", mrr_floor=False, graph_bs_capped_by_mrr=False, output_path="detector",
                           resolved_attn_backend=None, swa_cap_mode=False, v41_layouts=False,
                           paged_kv_budget=False, c4_state_per_window=True, swa_floor_check=False,
                           logits_chunked=False),
    "0.5.20": VersionRules("0.5.20", mrr_floor=False, graph_bs_capped_by_mrr=False, output_path="detector",
                           resolved_attn_backend="auto", swa_cap_mode=False, v41_layouts=False,
                           paged_kv_budget=False, c4_state_per_window=True, logits_chunked=False),
    "0.5.21": VersionRules("0.5.21", mrr_floor=False, graph_bs_capped_by_mrr=False, output_path="detector",
                           resolved_attn_backend="auto", v41_new_layout=False),
    "0.5.22": VersionRules("0.5.22", mrr_floor=False, graph_bs_capped_by_mrr=True, output_path="detector",
                           resolved_attn_backend="auto", v41_new_layout=False),
    "0.5.23": VersionRules("0.5.23", mrr_floor=True, graph_bs_capped_by_mrr=True, output_path="deepseek-recipe",
                           config_all_spellings=True),
}


#: The exit-2 line's last clause.
UNSUPPORTED_REASON = "0.5.18 is the first release that serves DeepSeek-V4"


def supported() -> str:
    """``0.5.18, 0.5.19, 0.5.20, 0.5.21, 0.5.22, 0.5.23``."""
    return ", ".join(VERSIONS)


def rules_for(version: str, where: str = "sglang.version") -> VersionRules:
    """The rules of SGLang ``version``. InputError (exit 2) naming ``where`` and the supported
    releases for anything else (no fallback: a plan for 0.5.20 computed with 0.5.23's rules
    would be silently wrong)."""
    v = str(version).strip()
    if v.startswith("v"):
        v = v[1:]
    if v in VERSIONS:
        return VERSIONS[v]
    if not re.fullmatch(r"\d+\.\d+\.\d+([.-]?(post|rc|dev)\d*)?", v):
        raise InputError(f"{where}: {version!r} is not an SGLang version (supported: {supported()})")
    raise InputError(f"{where}: SGLang {v} is not supported (supported: {supported()}; {UNSUPPORTED_REASON})")
