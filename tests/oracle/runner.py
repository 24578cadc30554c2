"""Run oracle cases in ``.venv-oracle`` subprocesses, one per environment batch (stdlib only).

SGLang reads its environment switches from the process environment, some at import time, so the
cases are grouped by their ``env`` and each group runs as ``.venv-oracle/bin/python -m tests.oracle.driver`` with exactly that
environment: every inherited ``SGLANG_*`` variable is removed first. Groups run in parallel.
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


def _run_batch(python: Path, key: tuple, cases: list[dict], timeout: float) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env.update(dict(key))
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    p = subprocess.run([str(python), "-m", "tests.oracle.driver"], cwd=REPO, env=env,
                       input=json.dumps({"cases": cases}), capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        tail = "\n".join(p.stderr.strip().splitlines()[-15:])
        raise OracleError(f"oracle batch {key} exited {p.returncode}:\n{tail}")
    return json.loads(p.stdout)


def run_cases(cases: list[dict], python: Optional[Path] = None, jobs: Optional[int] = None,
              timeout: float = 600) -> dict:
    """Run ``cases`` through the real SGLang code.

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
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {key: pool.submit(_run_batch, python, key, [cases[i] for i in idx], timeout)
                   for key, idx in groups.items()}
        for key, fut in futures.items():
            out = fut.result()
            versions.add((out["sglang_version"], out["torch_version"]))
            for i, res in zip(groups[key], out["results"]):
                results[i] = res
    if len(versions) != 1:
        raise OracleError(f"oracle batches report different versions: {sorted(versions)}")
    (sglang_version, torch_version), = versions
    return {"sglang_version": sglang_version, "torch_version": torch_version,
            "batches": len(groups), "results": results}
