"""The oracle's fork server (tests/oracle/zygote.py): a forked child is what a new
``.venv-oracle/bin/python ARGS`` process would be, for what the oracle runs read."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.oracle.fixtures import forked_oracle  # noqa: F401 - the oracle's fork servers
from tests.oracle.zygote import ORACLE_PY, REPO

pytestmark = [pytest.mark.oracle, pytest.mark.usefixtures("forked_oracle"),
              pytest.mark.skipif(not ORACLE_PY.exists(), reason="needs .venv-oracle (bash scripts/oracle-env.sh)")]

SHOW = ("import json, os, sys, warnings; data = sys.stdin.read(); "
        "print(json.dumps({'path': sys.path, 'argv': sys.argv, 'cwd': os.getcwd(), 'in': data, "
        "'x': os.environ.get('H13_X'), 'nobc': sys.dont_write_bytecode, 'sglang': 'sglang' in sys.modules, "
        "'main': sys.modules['__main__'].__name__, 'ignore': warnings.filters[0][0]})); "
        "print('to stderr', file=sys.stderr); sys.exit(3)")


def _both(args, env, cwd, stubs=()):
    from tests.oracle import zygote
    fresh = subprocess.run([str(ORACLE_PY), *args], cwd=cwd, env=env, input="abc", capture_output=True,
                           text=True, timeout=120)
    forked = zygote.run(args, env, cwd, "abc", 120, stubs=stubs)
    return fresh, forked


@pytest.mark.parametrize("mode", ["-c", "script", "-m"])
def test_a_forked_child_is_a_new_process(mode, tmp_path):
    """sys.path (working directory or script folder, PYTHONPATH, then the environment's own),
    argv, cwd, stdin, environment, bytecode flag, ``-W``, stderr and the exit code are a new
    process's, and SGLang is not imported before the run imports it."""
    (tmp_path / "show_mod.py").write_text(SHOW)
    args = {"-c": ["-W", "ignore", "-c", SHOW, "a1"], "script": ["-W", "ignore", str(tmp_path / "show_mod.py"), "a1"],
            "-m": ["-W", "ignore", "-m", "show_mod", "a1"]}[mode]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    env.update(PYTHONPATH=f"{tmp_path}:{REPO}", H13_X="yes", PYTHONDONTWRITEBYTECODE="1")
    fresh, forked = _both(args, env, str(tmp_path / ".." if mode == "script" else tmp_path))
    assert (forked.returncode, forked.stderr.strip().splitlines()[-1:]) == (fresh.returncode, ["to stderr"]) == \
        (3, fresh.stderr.strip().splitlines()[-1:])
    a, b = json.loads(fresh.stdout), json.loads(forked.stdout)
    assert b == a
    assert a["in"] == "abc" and a["x"] == "yes" and a["nobc"] is True and a["sglang"] is False
    assert a["ignore"] == "ignore" and a["argv"][-1] == "a1"


def test_a_child_wanting_other_stubs_is_refused():
    """The server's stubs are the ones transformers saw at import: a run that would stub another
    set fails loudly instead of running on the wrong ones (0.5.20's driver on the 0.5.21+ set)."""
    from tests.oracle import zygote
    code = ("from tests.oracle import tv_stub; "
            "tv_stub.install(('torchvision',) + tv_stub.FUNCTION_CALL_DEPS)")
    p = zygote.run(["-c", code], dict(os.environ), REPO, None, 120, stubs=("torchvision",))
    assert p.returncode == 1
    assert "RuntimeError: stubs installed for ['torchvision'], this run wants" in p.stderr
