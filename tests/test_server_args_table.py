"""The shipped SGLang 0.5.23 argument table vs the real parser (oracle) and its own shape."""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, oracle_available
from tests.oracle.fixtures import forked_oracle  # noqa: F401 - the oracle's fork servers

TABLE = REPO / "dsv4ctl" / "data" / "server_args-0.5.23.json"
GEN = REPO / "scripts" / "gen_server_args.py"


# Both generator runs in one oracle process (importing SGLang's server_args, torch included, is
# nearly all of a run: about 15 CPU-s each on this machine kind), each through the script's own
# main() with its own argv, as the command line would call it.
_BOTH = """
import contextlib, importlib.util, io, json, sys
spec = importlib.util.spec_from_file_location("gen_server_args", sys.argv[1])
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)
runs = {}
for key, argv in (("stdout", ["--stdout"]), ("check", ["--check", "--out", sys.argv[2]])):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = gen.main(argv)
    runs[key] = {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}
print(json.dumps(runs))
"""


def oracle_python(args: list[str], version: str):
    """``.venv-oracle/bin/python ARGS`` from the repository root, as ``subprocess.run`` gives it: a
    child of the oracle's fork server (tests/oracle/zygote.py) with the modules the generator
    stubs for ``version`` (scripts/gen_server_args.py ``use_version``: none for 0.5.21+)."""
    import os
    from tests.oracle import tv_stub, zygote
    stubs = ("torchvision", *tv_stub.FUNCTION_CALL_DEPS) if version in ("0.5.18", "0.5.19", "0.5.20") else ()
    return zygote.run(args, dict(os.environ), REPO, None, 300, stubs=stubs)


@pytest.fixture(scope="module")
def generator_runs(tmp_path_factory, forked_oracle):
    """{"stdout": run, "check": run} of ``gen_server_args.py --stdout`` and of ``--check --out``
    a table missing ``hicache-ratio``; a run is {code, stdout, stderr}."""
    if not oracle_available():
        pytest.skip("needs .venv-oracle (bash scripts/oracle-env.sh)")
    stale = tmp_path_factory.mktemp("gen") / "t.json"
    doc = json.loads(TABLE.read_text())
    doc["arguments"] = [a for a in doc["arguments"] if a["name"] != "hicache-ratio"]
    stale.write_text(json.dumps(doc))
    p = oracle_python(["-W", "ignore", "-c", _BOTH, str(GEN), str(stale)], "0.5.23")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.oracle
def test_table_matches_real_0523_parser(generator_runs):
    p = generator_runs["stdout"]
    assert p["code"] == 0, p["stderr"]
    live = json.loads(p["stdout"])
    shipped = json.loads(TABLE.read_text())
    assert live["sglang_version"] == "0.5.23"
    live_by = {a["name"]: a for a in live["arguments"]}
    shipped_by = {a["name"]: a for a in shipped["arguments"]}
    assert sorted(live_by) == sorted(shipped_by)
    for name, a in live_by.items():
        assert shipped_by[name] == a, name
    # byte-for-byte: the generator is re-runnable and deterministic
    assert p["stdout"] == TABLE.read_text()


@pytest.mark.oracle
def test_generator_check_mode_detects_drift(generator_runs):
    p = generator_runs["check"]
    assert p["code"] == 1
    assert "differs" in p["stderr"] and "t.json" in p["stderr"]


def test_shipped_table_facts():
    """Facts of the reference (ops §1.2, §2.1) the table must carry."""
    doc = json.loads(TABLE.read_text())
    assert doc["schema"] == "dsv4ctl.server_args/1" and doc["sglang_version"] == "0.5.23"
    by = {a["name"]: a for a in doc["arguments"]}
    assert by["enable-hierarchical-cache"]["aliases"] == ["enable-hicache"]
    assert by["enable-hierarchical-cache"]["config"] == "store_true"
    assert by["hicache-ratio"]["type"] == "float" and by["hicache-ratio"]["default"] is None
    assert by["hicache-size"]["type"] == "int" and by["hicache-size"]["default"] == 0
    assert by["hicache-mem-layout"]["choices"] == ["layer_first", "page_first", "page_first_direct",
                                                   "page_first_kv_split", "page_head"]
    assert by["hicache-io-backend"]["choices"] == ["direct", "kernel", "kernel_ascend"]
    assert by["hicache-write-policy"]["default"] == "write_through"
    assert by["enable-fused-qk-norm-rope"]["config"] == "unsupported"   # BooleanOptionalAction
    assert by["enable-dp-attention"]["config"] == "unsupported"         # DeprecatedStoreTrueAction
    assert set(by["ep-size"]["aliases"]) == {"expert-parallel-size", "ep"}
    assert "deepseekv4" in by["tool-call-parser"]["choices"]
    assert "deepseek-v4" in by["reasoning-parser"]["choices"]
    assert by["cuda-graph-bs-decode"]["nargs"] == "+" and by["cuda-graph-bs-decode"]["type"] == "int"


@pytest.mark.oracle
@pytest.mark.parametrize("version", ["0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22"])
@pytest.mark.usefixtures("forked_oracle")
def test_other_releases_tables_are_their_parsers(version):
    """The shipped table of each other supported release is what that release's own parser
    gives (its sources from .venv-oracle/versions, scripts/oracle-env.sh)."""
    if not oracle_available() or not (REPO / ".venv-oracle" / "versions" / version / "sglang").is_dir():
        pytest.skip("needs .venv-oracle with the other releases (bash scripts/oracle-env.sh)")
    p = oracle_python(["-W", "ignore", str(GEN), "--check", "--version", version], version)
    assert p.returncode == 0, p.stderr
    assert f"server_args-{version}.json matches" in p.stdout
