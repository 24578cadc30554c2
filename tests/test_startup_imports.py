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


def probe(argv: list[str] | None, cache_dir: Path | str | None = None) -> tuple[int | None, set[str]]:
    """Run ``main(argv)`` (or only ``import dsv4ctl.cli`` for None) in a new interpreter; return
    (exit code, top-level and dotted names of every imported module)."""
    env = dict(os.environ, COLUMNS="200", NO_COLOR="1")
    if cache_dir is not None:
        env["DSV4CTL_CACHE_DIR"] = str(cache_dir)
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
    assert "dsv4ctl.cli" in mods and "typer" in mods
    assert loaded(mods, HEAVY + SLOW + ("jsonschema", "yaml", "rich")) == []


def test_help_does_not_import_rich_help_or_pydantic():
    rc, mods = probe(["--help"])
    assert rc == 0
    assert loaded(mods, HEAVY + SLOW + ("jsonschema",)) == []


def test_plan_json_imports_no_heavy_module(tmp_path):
    rc, mods = probe(["plan", "--json"], cache_dir=tmp_path)
    assert rc == 0
    assert "dsv4ctl.plan.capacity" in mods and "yaml" in mods
    assert loaded(mods, HEAVY + SLOW) == []
    # the default profile has no sglang.tree: the patch-series reader is not needed
    assert loaded(mods, ("dsv4ctl.patches",)) == []


def test_plan_validates_with_jsonschema_once_per_profile_content(tmp_path):
    """The first plan of a profile runs jsonschema; a second plan of the same bytes does not."""
    rc, cold = probe(["plan", "--json"], cache_dir=tmp_path)
    assert rc == 0 and "jsonschema" in cold
    markers = list((tmp_path / "valid-profiles").iterdir())
    assert len(markers) == 1 and len(markers[0].name) == 64
    rc, warm = probe(["plan", "--json"], cache_dir=tmp_path)
    assert rc == 0 and "jsonschema" not in warm


def copy_default_profile(dst: Path) -> Path:
    """A copy of the default profile and its serve configs under ``dst``; returns its path."""
    shutil.copy(DEFAULT_PROFILE, dst / DEFAULT_PROFILE.name)
    shutil.copytree(DEFAULT_PROFILE.with_suffix(""), dst / DEFAULT_PROFILE.stem)
    return dst / DEFAULT_PROFILE.name


def test_validation_cache_never_hides_an_edit(tmp_path):
    """An edited profile misses the cache: an invalid edit is still reported, a valid one adds
    a second marker; an invalid profile is never remembered."""
    from tests.conftest import run_cli

    cache = tmp_path / "cache"
    prof = copy_default_profile(tmp_path)
    env = {"DSV4CTL_CACHE_DIR": str(cache)}
    assert run_cli("plan", str(prof), "--json", env=env).code == 0
    assert len(list((cache / "valid-profiles").iterdir())) == 1

    text = prof.read_text()
    line = text.splitlines().index("    ram_gib: 2048") + 2  # 1-based line of the inserted key
    prof.write_text(text.replace("    ram_gib: 2048\n", "    ram_gib: 2048\n    colour: blue\n"))
    for _ in range(2):
        r = run_cli("plan", str(prof), "--json", env=env)
        assert r.code == 2
        assert r.err.strip() == f"dsv4ctl: error: {prof}:{line}: hosts[0].colour: unknown field"
    assert len(list((cache / "valid-profiles").iterdir())) == 1

    prof.write_text(text.replace("ram_gib: 2048", "ram_gib: 1024"))
    assert run_cli("plan", str(prof), "--json", env=env).code == 0
    assert len(list((cache / "valid-profiles").iterdir())) == 2


def test_validation_cache_off_and_unwritable(tmp_path):
    """DSV4CTL_CACHE_DIR='' turns the cache off; an unwritable cache folder is not an error."""
    rc, mods = probe(["plan", "--json"], cache_dir="")  # empty: off
    assert rc == 0 and "jsonschema" in mods
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    rc, mods = probe(["plan", "--json"], cache_dir=blocker / "sub")
    assert rc == 0 and "jsonschema" in mods
