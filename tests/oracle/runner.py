"""Run oracle cases in ``.venv-oracle`` (stdlib only).

SGLang reads its environment switches from the process environment, some at import time, so the
cases are grouped by their ``env`` (a batch). One ``.venv-oracle/bin/python -m tests.oracle.driver``
process imports torch and SGLang once and forks a child per batch whose switches it knows how to
set after import (``driver.FORKABLE_ENV``); a batch with any other switch runs in a process of its
own with exactly that environment. Every inherited ``SGLANG_*`` variable is removed first.
Measured on this machine kind: the capacity oracle's five batches 71 CPU-s / 42 s wall as five
processes, since nearly all of a process's cost is the imports (about 15 CPU-s).
"""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
ORACLE_PY = REPO / ".venv-oracle" / "bin" / "python"

# SGLang 0.5.23's resolved server args for DeepSeek-V4 on a B200 (capacity reference §1.2): the
# driver publishes these under a pool case's own ``server_args``.
DEFAULT_SERVER_ARGS = {
    "page_size": 256,
    "max_running_requests": 256,
    "swa_full_tokens_ratio": 0.1,
    "_swa_full_tokens_ratio_explicitly_set": True,
    "chunked_prefill_size": 16384,
    "dsv4_attn_backend": "flashmla",
}


class OracleError(RuntimeError):
    """The oracle subprocess failed (not SGLang refusing a configuration: that is a result)."""


def batch_key(case: dict) -> tuple:
    """Cases with the same environment share one subprocess."""
    env = case.get("env") or {}
    return tuple(sorted((k, str(v)) for k, v in env.items()))


# SGLang switches a batch may set in a child forked after the imports (driver.run_batches):
# SGLang reads them when its code runs, except deepseek_v4_memory_pool.ONLINE_C128, which the
# child computes again (driver._import_time_env). A batch with any other switch gets a process.
FORKABLE_ENV = frozenset({"SGLANG_DSV4_COMPRESS_STATE_DTYPE", "SGLANG_DSV4_KV_LAYOUT",
                          "SGLANG_OPT_USE_ONLINE_COMPRESS",
                          # read when called, never at import (0.5.23: ``envs.X.get()`` in
                          # pool_configurator.py and deepseek_v4_memory_pool.py, os.getenv in
                          # distributed/utils.py get_pp_indices); the stored matrix, made by
                          # separate processes, and each release's twin check would disagree if not
                          "SGLANG_SWA_EVICTION_INTERVAL", "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP",
                          "SGLANG_DSV4_COMPRESSED_KV_LAYOUT", "SGLANG_PP_LAYER_PARTITION"})


#: Sources of other SGLang releases (the ``sglang/`` package of each wheel, extracted by
#: scripts/oracle-env.sh): put first on the oracle's path, they run on its torch and packages.
VERSIONS_DIR = REPO / ".venv-oracle" / "versions"


def version_path(version: str | None) -> str:
    """PYTHONPATH of an oracle run of SGLang ``version`` (None: the installed 0.5.23)."""
    if version is None:
        return str(REPO)
    src = VERSIONS_DIR / version
    if not (src / "sglang").is_dir():
        raise OracleError(f"{src}/sglang not found: run `bash scripts/oracle-env.sh` first")
    return f"{REPO}:{src}"


def _driver(python: Path, key: tuple, doc: dict, timeout: float, what: str, version: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env.update(dict(key))
    env.update(PYTHONPATH=version_path(version), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    if python == ORACLE_PY:      # a child of the oracle's fork server (tests/oracle/zygote.py)
        from tests.oracle import zygote
        p = zygote.run(["-m", "tests.oracle.driver"], env, REPO, json.dumps(doc), timeout)
    else:
        p = subprocess.run([str(python), "-m", "tests.oracle.driver"], cwd=REPO, env=env,
                           input=json.dumps(doc), capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        tail = "\n".join(p.stderr.strip().splitlines()[-15:])
        raise OracleError(f"oracle {what} exited {p.returncode}:\n{tail}")
    return json.loads(p.stdout)


def _run_batch(python: Path, key: tuple, cases: list[dict], timeout: float, version: str | None = None) -> dict:
    return _driver(python, key, {"cases": cases}, timeout, f"batch {key}", version)


def _run_forked(python: Path, keys: list[tuple], cases: list[list[dict]], jobs: int,
                timeout: float, version: str | None = None) -> list[dict]:
    doc = {"jobs": jobs, "batches": [{"env": dict(k), "cases": c} for k, c in zip(keys, cases)]}
    out = _driver(python, (), doc, timeout, f"fork server for {len(keys)} batches", version)
    answers = []
    for key, b in zip(keys, out["batches"]):
        if "error" in b:
            raise OracleError(f"oracle batch {key} failed in its forked child: {b['error']}")
        answers.append({"sglang_version": out["sglang_version"], "torch_version": out["torch_version"],
                        "results": b["results"]})
    return answers


def run_cases(cases: list[dict], python: Optional[Path] = None, jobs: Optional[int] = None,
              timeout: float = 600, version: Optional[str] = None) -> dict:
    """Run ``cases`` through the real SGLang code (``version``: another release's sources from
    :data:`VERSIONS_DIR` instead of the installed 0.5.23).

    Returns ``{"sglang_version", "torch_version", "batches", "results"}`` with ``results`` in the
    order of ``cases`` (each result carries the case ``id``). Raises OracleError when a
    subprocess fails or the batches disagree on the SGLang version."""
    python = Path(python or ORACLE_PY)
    if not python.exists():
        raise OracleError(f"{python} not found: run `bash scripts/oracle-env.sh` first")
    groups: dict[tuple, list[int]] = {}
    for i, case in enumerate(cases):
        groups.setdefault(batch_key(case), []).append(i)
    jobs = jobs or max(2, min(4, os.cpu_count() or 2))
    results: list = [None] * len(cases)
    versions = set()
    forked = [k for k in groups if {name for name, _ in k} <= FORKABLE_ENV]
    alone = [k for k in groups if k not in forked]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {key: pool.submit(_run_batch, python, key, [cases[i] for i in groups[key]], timeout, version)
                   for key in alone}
        answers = dict(zip(forked, _run_forked(python, forked, [[cases[i] for i in groups[k]] for k in forked],
                                               jobs, timeout, version))) if forked else {}
        answers.update({key: fut.result() for key, fut in futures.items()})
    for key, out in answers.items():
        versions.add((out["sglang_version"], out["torch_version"]))
        for i, res in zip(groups[key], out["results"]):
            results[i] = res
    if len(versions) != 1:
        raise OracleError(f"oracle batches report different versions: {sorted(versions)}")
    (sglang_version, torch_version), = versions
    return {"sglang_version": sglang_version, "torch_version": torch_version,
            "batches": len(groups), "results": results}
