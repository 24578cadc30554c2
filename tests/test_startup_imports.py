"""Start-up stays light: what ``import dsv4ctl.cli``, ``--help`` and ``plan --json`` import.

Each check runs a fresh interpreter (sys.modules of this pytest process is irrelevant). The
timing itself is measured by ``benchmarks/startup.py``, not here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DEFAULT_PROFILE, REPO

# Never at CLI start-up (project standard) nor in `plan`: heavy or remote-only libraries.
HEAVY = ("torch", "sglang", "aiohttp", "fabric", "paramiko", "ruamel", "invoke")
# typer 0.29+ pulls pydantic into every command run; rich help pulls typer.rich_utils + markdown.
SLOW = ("pydantic", "typer.rich_utils", "rich.markdown")

PROBE = r"""
import contextlib, io, json, sys
argv = json.loads(sys.argv[1])
rc = None
if argv is not None:
    from dsv4ctl.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
else:
    import dsv4ctl.cli
print(json.dumps({"rc": rc, "modules": sorted(sys.modules)}))
"""


def probe(argv: list[str] | None, cache: Path | None = None) -> tuple[int | None, set[str]]:
    """Run ``main(argv)`` (or only ``import dsv4ctl.cli`` for None) in a new interpreter; return
    (exit code, top-level and dotted names of every imported module)."""
    env = dict(os.environ, COLUMNS="200", NO_COLOR="1")
    if cache is not None:
        env["DSV4CTL_CACHE"] = str(cache)
    p = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True,
                       cwd=REPO, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    return doc["rc"], set(doc["modules"])


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """Those of ``names`` present in ``modules`` as a package or any of its submodules."""
    return [n for n in names if any(m == n or m.startswith(n + ".") for m in modules)]


def test_import_cli_is_light():
    _, mods = probe(None)
    # typer is imported by main() (after the shell completions' ``__complete`` fast path)
    assert "dsv4ctl.cli" in mods
    assert loaded(mods, HEAVY + SLOW + ("jsonschema", "yaml", "rich", "typer")) == []


def test_help_does_not_import_rich_help_or_pydantic():
    rc, mods = probe(["--help"])
    assert rc == 0
    assert loaded(mods, HEAVY + SLOW + ("jsonschema",)) == []


def test_plan_json_imports_no_heavy_module(tmp_path):
    rc, first = probe(["plan", "--json"], cache=tmp_path)
    assert rc == 0 and "yaml" in first
    rc, mods = probe(["plan", "--json"], cache=tmp_path)     # the same bytes again: parsed YAML kept
    assert rc == 0
    assert "dsv4ctl.plan.capacity" in mods and "yaml" not in mods
    assert loaded(mods, HEAVY + SLOW) == []
    # the default profile has no sglang.tree: the patch-series reader is not needed
    assert loaded(mods, ("dsv4ctl.patches",)) == []


def test_yaml_cache_never_hides_an_edit_and_keeps_only_json_data(tmp_path):
    from dsv4ctl.profile.yamlpos import parse_yaml
    import os as _os
    _os.environ["DSV4CTL_CACHE"] = str(tmp_path / "c")
    try:
        data, pos = parse_yaml(b"a: 1\nb:\n  - x\n", "f.yaml")
        assert data == {"a": 1, "b": ["x"]} and pos.lines[("b", 0)] == 3
        assert len(list((tmp_path / "c" / "yaml").iterdir())) == 1
        again, pos2 = parse_yaml(b"a: 1\nb:\n  - x\n", "g.yaml")
        assert again == data and pos2.lines == pos.lines and pos2.file == "g.yaml"
        with pytest.raises(Exception, match="g.yaml:2: b: duplicate key|duplicate"):
            parse_yaml(b"b: 1\nb: 2\n", "g.yaml")
        parse_yaml(b"when: 2026-12-01\n", "d.yaml")          # a date is not JSON: not kept
        parse_yaml(b"1: x\n", "k.yaml")                       # an int key is not JSON: not kept
        assert len(list((tmp_path / "c" / "yaml").iterdir())) == 1
    finally:
        del _os.environ["DSV4CTL_CACHE"]


def test_a_valid_profile_never_imports_jsonschema_and_an_invalid_one_gets_its_message(tmp_path):
    """conforms() accepts a valid profile alone; an invalid one is reported by jsonschema, by line."""
    from tests.conftest import run_cli

    rc, mods = probe(["plan", "--json"])
    assert rc == 0 and "jsonschema" not in mods and "rich" not in mods
    rc, mods = probe(["plan"])
    assert rc == 0 and "jsonschema" not in mods and "rich" not in mods, "the plan table is drawn without rich"
    prof = copy_default_profile(tmp_path)
    text = prof.read_text()
    line = text.splitlines().index("    ram_gib: 2048") + 2  # 1-based line of the inserted key
    prof.write_text(text.replace("    ram_gib: 2048\n", "    ram_gib: 2048\n    colour: blue\n"))
    r = run_cli("plan", str(prof), "--json")
    assert r.code == 2
    assert r.err.strip() == f"dsv4ctl: error: {prof}:{line}: hosts[0].colour: unknown field"


def copy_default_profile(dst: Path) -> Path:
    """A copy of the default profile and its serve configs under ``dst``; returns its path."""
    shutil.copy(DEFAULT_PROFILE, dst / DEFAULT_PROFILE.name)
    shutil.copytree(DEFAULT_PROFILE.with_suffix(""), dst / DEFAULT_PROFILE.stem)
    return dst / DEFAULT_PROFILE.name
