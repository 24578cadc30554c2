"""Build hook: the wheel carries what dsv4ctl ships.

The repository's ``profiles/`` (with their serve configs), ``patches/`` (patch series),
``playbooks/`` and ``completions/`` are copied into the wheel as ``dsv4ctl/_shipped/<name>/``;
:mod:`dsv4ctl.resources` finds them there when dsv4ctl runs from a wheel (pipx, uv tool, pip)
and uses the repository folders in a checkout or an editable install. Model configs, the
argument table and the JSON Schemas live inside the package (``dsv4ctl/data/``). Everything
else is in pyproject.toml."""

from __future__ import annotations

import runpy
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# one home for what is shipped: dsv4ctl/resources.py (plain stdlib module, read without importing dsv4ctl)
_RES = runpy.run_path(str(HERE / "dsv4ctl" / "resources.py"))
SHIPPED = _RES["SHIPPED_FOLDERS"]
PROFILES = _RES["SHIPPED_PROFILES"]
SCHEMA_LINE = "# yaml-language-server: $schema="


def _profile_files(names: list, path: str) -> list[str]:
    """copytree ignore for profiles/: only the shipped profiles and their folders (an operator's
    own profiles/my.yaml in a checkout never goes into a wheel)."""
    if Path(path).resolve() != (HERE / "profiles").resolve():
        return []
    keep = {f"{p}.yaml" for p in PROFILES} | set(PROFILES)
    return [n for n in names if n not in keep]


class build_py_shipped(build_py):
    """build_py, then the shipped folders copied to ``<build_lib>/dsv4ctl/_shipped/``."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):  # an editable install reads the checkout itself
            return
        dest = Path(self.build_lib) / "dsv4ctl" / "_shipped"
        shutil.rmtree(dest, ignore_errors=True)
        for name in SHIPPED:
            src = HERE / name
            if not src.is_dir():
                raise SystemExit(f"setup.py: {src} is missing: the wheel would ship without it")
            skip = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")
            shutil.copytree(src, dest / name, ignore=lambda d, names: set(skip(d, names)) | set(_profile_files(names, d)))
        for prof in (dest / "profiles").glob("*.yaml"):     # the schema line, relative to the wheel's copy
            text = prof.read_text()
            prof.write_text(text.replace(SCHEMA_LINE + "../dsv4ctl/data/", SCHEMA_LINE + "../../data/", 1))

    def get_outputs(self, include_bytecode=True):
        outs = list(super().get_outputs(include_bytecode))
        dest = Path(self.build_lib) / "dsv4ctl" / "_shipped"
        if dest.is_dir():
            outs += [str(p) for p in sorted(dest.rglob("*")) if p.is_file()]
        return outs


setup(cmdclass={"build_py": build_py_shipped})
