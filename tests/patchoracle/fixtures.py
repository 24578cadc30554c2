"""Session fixtures shared by the patch test modules (import them into a test module):
one pristine sglang 0.5.23 tree with the shipped series applied through the CLI, and one run of
SGLang's real configurator from it (``driver.py``) over every case the modules check."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import run_cli
from tests.oracle.fixtures import forked_oracle  # noqa: F401 - oracle_runs uses it

from .trees import ENV, ORACLE_PY, REPO, fresh_tree

FLASH_BYTES = 138_484_778_008      # capacity reference §4 worked example (8xB200 Flash TP8)
PRO_BYTES = 48_569_637_666
BYTES_CASES = [("deepseek-v4-flash", FLASH_BYTES), ("deepseek-v4-pro", PRO_BYTES),
               ("deepseek-v4-flash", 20 * 2**30 + 12345)]
BF16 = {"SGLANG_DSV4_INDEX_K_DTYPE": "bf16"}
SMALL_BYTES = 3 * 2**30 + 777      # Flash: ~0.47 GiB for tokens after the 2.53 GiB c128 state


def model_config(model: str) -> str:
    return str(REPO / "dsv4ctl" / "data" / "models" / f"{model}.json")


def drive(pythonpath: str, cases: list[dict]) -> list[dict]:
    """Run ``tests.patchoracle.driver`` under ``.venv-oracle`` with ``pythonpath`` first."""
    env = {**os.environ, "PYTHONPATH": pythonpath, "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONWARNINGS": "ignore"}
    env.pop("SGLANG_DSV4_INDEX_K_DTYPE", None)
    from tests.oracle import zygote      # a child of the oracle's fork server
    p = zygote.run(["-m", "tests.patchoracle.driver"], env, REPO, json.dumps(cases), 600)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def shared_once(tmp_path_factory, name: str, build):
    """``build(folder)``'s JSON-able result, computed once per test run however many xdist
    workers ask: the first one builds under a file lock in the run's shared base folder, the
    others wait and read its result (``folder`` stays for all of them; tests must not change it)."""
    import fcntl
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent                # shared by the workers of this run
    folder = base / f"shared-{name}"
    with open(base / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = folder / "result.json"
        if not done.is_file():
            folder.mkdir(exist_ok=True)
            result = build(folder)
            done.write_text(json.dumps(result))
        return json.loads(done.read_text())


@pytest.fixture(scope="session")
def patched_tree(tmp_path_factory):
    """A fresh pristine tree with ``patches/sglang-0.5.23`` applied by ``dsv4ctl patch apply``,
    built once per run (:func:`shared_once`). Tests must not change it."""
    from pathlib import Path

    def build(folder):
        tree = fresh_tree(folder / "sglang")
        r = run_cli("patch", "apply", str(tree), env=ENV, timeout=300)
        assert r.code == 0, r.err
        return str(tree)
    return Path(shared_once(tmp_path_factory, "patched-tree", build))


@pytest.fixture(scope="session")
def oracle_runs(patched_tree, tmp_path_factory, forked_oracle):
    """``{(model, available_bytes, switch): result}`` from the patched tree's real configurator,
    run once per test run (:func:`shared_once`); ``switch`` is "bf16", "off" or "int8" (the
    last: Flash only, an invalid value)."""
    if not ORACLE_PY.exists():
        pytest.skip("needs .venv-oracle (bash scripts/oracle-env.sh)")
    keys, cases = [], []
    for model, avail in BYTES_CASES:
        for switch, env in (("bf16", BF16), ("off", {})):
            keys.append((model, avail, switch))
            cases.append(dict(config=model_config(model), available_bytes=avail, env=env))
    for switch, env in (("bf16", BF16), ("off", {})):      # small enough to allocate on CPU
        keys.append(("deepseek-v4-flash", SMALL_BYTES, switch))
        cases.append(dict(config=model_config("deepseek-v4-flash"), available_bytes=SMALL_BYTES,
                          env=env, indexer_pool=True))
    keys.append(("deepseek-v4-flash", FLASH_BYTES, "int8"))
    cases.append(dict(config=model_config("deepseek-v4-flash"), available_bytes=FLASH_BYTES,
                      env={"SGLANG_DSV4_INDEX_K_DTYPE": "int8"}))
    runs = shared_once(tmp_path_factory, "oracle-runs",
                       lambda folder: drive(f"{patched_tree}/python:{REPO}", cases))
    return dict(zip(keys, runs))
