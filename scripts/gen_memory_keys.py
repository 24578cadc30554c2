#!/usr/bin/env python3
"""The server arguments each SGLang release reads where it sizes DeepSeek-V4 memory (issue 44.2).

Reads the Python source of every release that serves DeepSeek-V4 (0.5.23: the oracle
environment's own wheel; older ones: ``.venv-oracle/versions/<v>/sglang``, scripts/oracle-env.sh)
without importing it, and writes ``dsv4ctl/data/memory_keys.json``: for each release, every
server-argument ``dest`` of that release's table (``dsv4ctl/data/server_args-<v>.json``) that the
memory-sizing files read, with the files that read it.

The memory-sizing files (:data:`FILES`): the activation / CUDA-graph reserve and default
``mem_fraction_static`` (``srt/arg_groups/memory_hook.py``; before it, ``ServerArgs.
_handle_gpu_memory_settings`` / ``reserve_for_graph_mb`` / ``_handle_cuda_graph_config`` of
``srt/server_args.py``), the decode CUDA-graph configuration (``srt/arg_groups/cuda_graph_hook.py``),
the pool sizing (``srt/model_executor/pool_configurator.py``, ``srt/mem_cache/
kv_cache_configurator.py``, ``srt/mem_cache/deepseek_v4_memory_pool.py``) and the weights' sharding
(``srt/models/deepseek_v4.py``, ``deepseek_v4_nextn.py``, ``srt/layers/vocab_parallel_embedding.py``).

A read is an attribute ``<base>.<dest>`` whose base is a server-args object as those files name it
(``server_args``, ``args``, ``cfg``, ``sa``, ``global_server_args``, ``get_global_server_args()``,
``get_parallel()``; ``self`` only inside ``ServerArgs`` methods) or a subscript ``[...]["<dest>"]``.

    .venv/bin/python scripts/gen_memory_keys.py            # rewrite dsv4ctl/data/memory_keys.json
    .venv/bin/python scripts/gen_memory_keys.py --check    # exit 1 when the shipped file differs

How dsv4ctl's plan treats each key is :mod:`dsv4ctl.plan.memkeys` (tests/test_plan_memory_keys.py).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "dsv4ctl" / "data" / "memory_keys.json"
SCHEMA = "dsv4ctl.memory_keys/1"
VERSIONS = ("0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
FILES = ("srt/arg_groups/memory_hook.py",
         "srt/server_args.py:_handle_gpu_memory_settings,reserve_for_graph_mb,_handle_cuda_graph_config",
         "srt/arg_groups/cuda_graph_hook.py", "srt/model_executor/pool_configurator.py",
         "srt/mem_cache/kv_cache_configurator.py", "srt/mem_cache/deepseek_v4_memory_pool.py",
         "srt/models/deepseek_v4.py", "srt/models/deepseek_v4_nextn.py", "srt/layers/vocab_parallel_embedding.py")
BASES = frozenset({"server_args", "args", "cfg", "sa", "global_server_args", "server_args_dict"})
CALLS = frozenset({"get_global_server_args", "get_parallel"})


def sglang_root(version: str) -> Path:
    """The release's ``sglang`` package folder in the oracle environment."""
    if version == VERSIONS[-1]:
        return next((REPO / ".venv-oracle" / "lib").glob("python3*/site-packages/sglang"))
    return REPO / ".venv-oracle" / "versions" / version / "sglang"


def _reads(node: ast.AST, dests: set[str], bases: frozenset) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr in dests:
            b = n.value
            if ((isinstance(b, ast.Name) and b.id in bases) or (isinstance(b, ast.Attribute) and b.attr in bases)
                    or (isinstance(b, ast.Call) and isinstance(b.func, ast.Name) and b.func.id in CALLS)):
                out.add(n.attr)
        elif isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and n.slice.value in dests:
            out.add(n.slice.value)
    return out


def scan(version: str) -> dict[str, list[str]]:
    """{dest: [files reading it]} of one release (files relative to the ``sglang`` package)."""
    root = sglang_root(version)
    table = json.loads((REPO / "dsv4ctl" / "data" / f"server_args-{version}.json").read_text())
    dests = {a["dest"] for a in table["arguments"]}
    found: dict[str, set[str]] = {}
    for spec in FILES:
        rel, _, funcs = spec.partition(":")
        path = root / rel
        if not path.is_file():
            continue
        tree = ast.parse(path.read_text())
        nodes = [tree] if not funcs else [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                                          and n.name in funcs.split(",")]
        for node in nodes:
            for d in _reads(node, dests, BASES | ({"self"} if funcs else frozenset())):
                found.setdefault(d, set()).add(rel)
    return {d: sorted(f) for d, f in sorted(found.items())}


def document() -> dict:
    """The whole ``dsv4ctl.memory_keys/1`` document."""
    return {"schema": SCHEMA, "generator": "scripts/gen_memory_keys.py", "files": list(FILES),
            "releases": {v: scan(v) for v in VERSIONS}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the shipped file differs")
    a = ap.parse_args()
    text = json.dumps(document(), indent=1) + "\n"
    if a.check:
        same = OUT.read_text() == text
        print("memory_keys.json is current" if same else "memory_keys.json differs: run scripts/gen_memory_keys.py")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
