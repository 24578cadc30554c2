"""Every server argument SGLang reads where it sizes DeepSeek-V4 memory, and what the plan does with
it (issue 44.2).

``dsv4ctl/data/memory_keys.json`` (written by ``scripts/gen_memory_keys.py`` from each release's
own source) lists, per release, the server-argument ``dest`` names the memory-sizing files read
(activation / CUDA-graph reserve and default ``mem_fraction_static``, decode-graph configuration,
pool sizing, weight sharding) and the files that read each. Each such key is, for the plan:

* **sized** -- read from the serve config and ``--set`` (:data:`dsv4ctl.plan.inputs.SET_KEYS`)
  and used in the arithmetic;
* **noted** -- read, not sized: the plan prints which way it moves the numbers (:data:`NOTED`);
* **outside** -- read by those files on a path DeepSeek-V4 on CUDA GPUs does not take, with the
  reason (:data:`OUTSIDE`).

:func:`ignored` is the list of keys of a release that are none of these (empty: the test
``tests/test_plan_memory_keys.py`` walks every release's table and fails on any)."""

from __future__ import annotations

import json
from functools import lru_cache

from ..resources import DATA_DIR
from .inputs import SET_KEYS

# read and said, not sized: the sentence the plan prints is dsv4ctl.plan.inputs._offload_notes
NOTED = {
    "cpu_offload_gb": "weights kept in host memory: the plan counts them on the GPU (headroom low by up to N GB)",
    "offload_group_size": "layer groups offloaded to host memory: the plan counts them on the GPU",
    "enable_symm_mem": "symmetric-memory preallocation (4 GB per rank by default): not counted, give it in other_gib",
    "dcp_size": "decode context parallel splits the KV cache over ranks: the plan sizes one rank's pools as without it",
    "attn_cp_size": "attention context parallel: the plan shards attention as without it",
    "enable_hisparse": "HiSparse device pools (pool_configurator.py): not sized",
}
_PREFILL_GRAPH = ("the prefill CUDA graph: DeepSeek-V4 runs without one, so SGLang's reserve has no prefill-graph "
                  "term (dsv4ctl.plan.capacity.reserved_mb)")
_CASCADE = ("the prefill-graph compatibility cascade (cuda_graph_hook.py apply_cuda_graph_compatibility / "
            "disable_*_cudagraph_if_incompatible): it turns a prefill graph backend off")
_CAPTURE_LIST = ("the list of captured decode batch sizes (generate_decode_cuda_graph_batch_sizes): SGLang's reserve "
                 "reads only the largest (max_bs); per-size capture memory is issue 44.3")
OUTSIDE = {
    "cuda_graph_backend_prefill": _PREFILL_GRAPH, "cuda_graph_bs_prefill": _PREFILL_GRAPH,
    "cuda_graph_max_seq_len_prefill": _PREFILL_GRAPH, "cuda_graph_prefill_max_context": _PREFILL_GRAPH,
    "disable_prefill_cuda_graph": _PREFILL_GRAPH,
    "cuda_graph_tc_compiler": _CASCADE, "debug_cuda_graph": _CASCADE, "dllm_algorithm": _CASCADE,
    "enable_deterministic_inference": _CASCADE, "enable_dsa_prefill_context_parallel": _CASCADE,
    "enable_eplb": _CASCADE, "enable_hierarchical_cache": _CASCADE + " (HiCache's host pool is host memory)",
    "enable_lora": _CASCADE, "lora_paths": _CASCADE, "expert_distribution_recorder_mode": _CASCADE,
    "load_format": _CASCADE, "enable_torch_compile": _CASCADE,
    "disable_cuda_graph_padding": _CAPTURE_LIST, "enable_two_batch_overlap": _CAPTURE_LIST,
    "device": "the device branch (cpu, xpu, npu): the plan is for CUDA GPUs",
    "torch_compile_max_bs": "the CPU graph's batch-size limit (memory_hook.py, device cpu only)",
    "model_path": "the model: the plan reads it from the profile's model (or --set model)",
    "language_only": "the multimodal (VLM) adjustment of mem_fraction_static: DeepSeek-V4 is text-only",
    "language_model_only": "the multimodal (VLM) adjustment of mem_fraction_static: DeepSeek-V4 is text-only",
    "ple_offload_backend": "per-layer-embedding offload (PLE models): not DeepSeek-V4",
    "ple_offload_embedding": "per-layer-embedding offload (PLE models): not DeepSeek-V4",
    "mm_feature_transport": "multimodal feature buffers (kv_cache_configurator.py): DeepSeek-V4 is text-only",
    "dsa_decode_backend": "the DeepSeek-V3.2 DSA (NSA) pool branch of kv_cache_configurator.py (0.5.18), not DSV4's",
    "dsa_prefill_backend": "the DeepSeek-V3.2 DSA (NSA) pool branch of kv_cache_configurator.py (0.5.18), not DSV4's",
    "enable_memory_saver": "torch_memory_saver's pausable allocations (RL weight sync): the same bytes",
}


@lru_cache(maxsize=1)
def memory_keys() -> dict[str, dict[str, list[str]]]:
    """``{release: {dest: [SGLang files reading it]}}`` from ``dsv4ctl/data/memory_keys.json``."""
    return json.loads((DATA_DIR / "memory_keys.json").read_text())["releases"]


def treatment(dest: str) -> tuple[str, str]:
    """``("sized" | "noted" | "outside" | "ignored", why)`` of a server-argument ``dest``."""
    if dest in NOTED:
        return "noted", NOTED[dest]
    if dest in SET_KEYS:
        return "sized", "serve config and --set (dsv4ctl.plan.inputs.SET_KEYS)"
    if dest in OUTSIDE:
        return "outside", OUTSIDE[dest]
    return "ignored", ""


def ignored(version: str, table: dict[str, list[str]] | None = None) -> list[tuple[str, list[str]]]:
    """The memory keys of ``version`` (or of ``table``, ``{dest: files}``) the plan neither sizes,
    notes nor explains: ``[(dest, files)]``, empty when every key is accounted for."""
    keys = memory_keys()[version] if table is None else table
    return [(d, f) for d, f in keys.items() if treatment(d)[0] == "ignored"]


__all__ = ["NOTED", "OUTSIDE", "memory_keys", "treatment", "ignored"]
