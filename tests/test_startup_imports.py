"""Start-up stays light: what ``import dsv4ctl.cli``, ``--help`` and ``plan --json`` import.

Each check runs a fresh interpreter (sys.modules of this pytest process is irrelevant). The
timing itself is measured by ``benchmarks/startup.py``, not here."""

from __future__ import annotations

import functools
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


# --- the dataclass code cache (dsv4ctl/codecache.py) -------------------------------------------

CODE_PROBE = r"""
import json
from dsv4ctl.codecache import dataclass_code_cache
with dataclass_code_cache() as memo:
    import dsv4ctl.plan.plan
    from dsv4ctl.plan.capacity import MemoryArgs
    a, b = MemoryArgs(gpu_memory_mib=1, tp_size=2), MemoryArgs(gpu_memory_mib=1, tp_size=2)
    assert a == b and hash(a) == hash(b) and repr(a).startswith("MemoryArgs(gpu_memory_mib=1, tp_size=2")
print(json.dumps({"new": len(memo.new), "used": len(memo.used)}))
"""


def code_probe(cache: Path) -> dict:
    """Import the plan's modules in a new interpreter under :func:`dataclass_code_cache` with
    ``DSV4CTL_CACHE=cache``: how many dataclass method texts were compiled (``new``) and how many
    came from the table (``used``)."""
    env = dict(os.environ, DSV4CTL_CACHE=str(cache))
    p = subprocess.run([sys.executable, "-c", CODE_PROBE], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_dataclass_methods_are_compiled_once_then_read_from_the_cache(tmp_path):
    from dsv4ctl.codecache import table_name
    first = code_probe(tmp_path)
    assert first["new"] > 50 and first["used"] == 0          # ~28 dataclasses, several methods each
    table = tmp_path / "code" / table_name()
    assert table.is_file() and (table.stat().st_mode & 0o777) == 0o600
    assert (tmp_path / "code").stat().st_mode & 0o777 == 0o700
    again = code_probe(tmp_path)
    assert again == {"new": 0, "used": first["new"]}         # nothing compiled, the same classes work


def test_dataclass_code_cache_trusts_only_a_private_folder_and_file(tmp_path):
    from dsv4ctl.codecache import table_name
    code_probe(tmp_path)
    folder, table = tmp_path / "code", tmp_path / "code" / table_name()
    folder.chmod(0o777)                                       # another user could plant code here
    assert code_probe(tmp_path)["used"] == 0
    folder.chmod(0o700)
    real = tmp_path / "elsewhere.marshal"
    table.rename(real)
    real.write_bytes(b"not written through")
    table.symlink_to(real)                                    # a link is never followed, nor written through
    assert code_probe(tmp_path)["used"] == 0
    assert not table.is_symlink() and real.read_bytes() == b"not written through"   # replaced by rename
    table.unlink()
    table.write_bytes(b"\x00garbage")                         # a corrupt table: compiled as before, replaced
    table.chmod(0o600)
    assert code_probe(tmp_path)["used"] == 0
    assert code_probe(tmp_path)["new"] == 0


# --- what each start-up path may import beyond `import typer` (issue 48.1) ----------------------

PLAN_MODULES = {
    "dataclasses", "typer._click.decorators", "dsv4ctl", "dsv4ctl.cli", "dsv4ctl.codecache", "dsv4ctl.errors",
    "dsv4ctl.render", "dsv4ctl.resources", "dsv4ctl.commands", "dsv4ctl.commands.common", "dsv4ctl.commands.examples",
    "dsv4ctl.commands.grammar", "dsv4ctl.commands.plan", "dsv4ctl.plan",
    "dsv4ctl.plan.capacity", "dsv4ctl.plan.fixes", "dsv4ctl.plan.inputs", "dsv4ctl.plan.models", "dsv4ctl.plan.plan",
    "dsv4ctl.plan.sglang_version", "dsv4ctl.plan.stages", "dsv4ctl.plan.verdict", "dsv4ctl.plan.versions",
    "dsv4ctl.profile", "dsv4ctl.profile.deployment", "dsv4ctl.profile.model", "dsv4ctl.profile.serveconfig",
    "dsv4ctl.profile.yamlpos",
    # build_app gives every command its whole first sentence and telling metavars (46.7)
    "dsv4ctl.commands.helptext",
    # SGLang's start-up refusals, checked for every group (plan/startup.py and its argument tables)
    "dsv4ctl.plan.startup", "dsv4ctl.plan.argtable"}
# Per start-up path: the modules it may import beyond those `import typer` imports (a profile seen
# before: its parsed YAML in the cache). A module not listed fails the test: import it where it is
# used, or list it here with the reason (benchmarks/startup.py measures what it costs).
ALLOWED = {
    "import dsv4ctl.cli": {"dsv4ctl", "dsv4ctl.cli", "dsv4ctl.errors"},
    # the command list kept in the cache by the first --help (commands/listing.py): printed without
    # typer, a command module or a dataclass
    "--help": {"dsv4ctl", "dsv4ctl.cli", "dsv4ctl.errors", "dsv4ctl.commands", "dsv4ctl.commands.listing",
               "dsv4ctl.resources"},
    "plan --json": PLAN_MODULES,
    "plan": PLAN_MODULES | {"dsv4ctl.report", "dsv4ctl.report.memory", "dsv4ctl.report.terminal"},
    # the shipped Pro model has no measured weights in its profile: the published inventory is read
    "plan dsv4-pro-4xh200-pd --json": PLAN_MODULES | {"dsv4ctl.plan.weights"},
}


@functools.lru_cache(maxsize=1)
def typer_modules() -> frozenset[str]:
    """The modules ``import typer`` loads (the start-up baseline of benchmarks/startup.py)."""
    p = subprocess.run([sys.executable, "-c", "import json, sys, typer; print(json.dumps(sorted(sys.modules)))"],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert p.returncode == 0, p.stderr
    return frozenset(json.loads(p.stdout))


@pytest.mark.parametrize("path", sorted(ALLOWED))
def test_each_start_up_path_imports_only_its_allowed_modules(tmp_path, path):
    argv = None if path == "import dsv4ctl.cli" else path.split()
    if argv is not None:
        probe(argv, cache=tmp_path)                  # the first run parses the YAML and keeps it
    rc, mods = probe(argv, cache=tmp_path)
    assert rc in (None, 0)
    extra = sorted(mods - typer_modules() - ALLOWED[path])
    assert extra == [], f"`{path}` imports modules it does not need: {extra}"
    if path in ("import dsv4ctl.cli", "--help"):
        assert loaded(mods, ("typer", "dataclasses")) == []     # (json: the probe's own)
