"""Build hook: the wheel carries what dsv4ctl ships.

The repository's ``profiles/`` (with their serve configs), ``patches/`` (patch series),
``playbooks/`` and ``completions/`` are copied into the wheel as ``dsv4ctl/_shipped/<name>/``;
:mod:`dsv4ctl.resources` finds them there when dsv4ctl runs from a wheel (pipx, uv tool, pip)
and uses the repository folders in a checkout or an editable install. Model configs, the
argument table and the JSON Schemas live inside the package (``dsv4ctl/data/``). Everything
else is in pyproject.toml."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED = ("profiles", "patches", "playbooks", "completions")
HERE = Path(__file__).resolve().parent


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
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))

    def get_outputs(self, include_bytecode=True):
        outs = list(super().get_outputs(include_bytecode))
        dest = Path(self.build_lib) / "dsv4ctl" / "_shipped"
        if dest.is_dir():
            outs += [str(p) for p in sorted(dest.rglob("*")) if p.is_file()]
        return outs


setup(cmdclass={"build_py": build_py_shipped})
