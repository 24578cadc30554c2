"""``patch check``: prove a series against a pristine tree of its base version.

Builds a pristine tree (:mod:`.pristine`), applies the series with the same code as
``patch apply``, compiles every touched Python file with :mod:`py_compile`, and reads the tree
back to confirm each patch is recognised by patch-id."""

from __future__ import annotations

import py_compile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .diffparse import touched_files
from .gitio import Git
from .ops import LoadedSeries, execute_apply, plan_apply, series_status
from .pristine import pristine_tree
from .tree import read_tree


@dataclass
class PatchCheck:
    name: str
    files: list[str]
    compiled: list[str] = field(default_factory=list)
    state: str = ""                 # patch-id state after applying: "applied" expected


@dataclass
class CheckReport:
    base: str
    identity: str
    tree: str
    base_commit: str
    head: str
    patches: list[PatchCheck]
    ok: bool
    errors: list[str] = field(default_factory=list)


def check_series(ls: LoadedSeries, package: str, version: str, workdir: Optional[Path] = None,
                 cache: Optional[Path] = None) -> CheckReport:
    """Apply ``ls`` to a fresh pristine ``package==version`` tree in ``workdir`` (a temporary
    directory when None, removed afterwards) and compile what it touches.

    A patch that does not apply raises VerdictError naming patch, file and hunk (exit 1);
    compile errors and patches not recognised after applying are reported in ``errors`` with
    ``ok`` False."""
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="dsv4ctl-check-") as d:
            return check_series(ls, package, version, Path(d), cache)
    tree = pristine_tree(package, version, workdir / f"{package}-{version}", cache)
    git = Git(str(tree))
    state = read_tree(git, base=f"v{version}")
    execute_apply(git, ls, state, plan_apply(ls, state, any_version=True))
    after = read_tree(git, base=f"v{version}")
    st = series_status(ls, after)
    patches, errors = [], []
    pyc = workdir / "pyc"
    for e, s in zip(ls.series.entries, st.entries):
        files = touched_files(ls.texts[e.name])
        pc = PatchCheck(name=e.name, files=files, state=s.state)
        if s.state != "applied":
            errors.append(f"{e.name}: not recognised by patch-id after applying ({s.state})")
        for f in files:
            path = tree / f
            if not f.endswith(".py") or not path.exists():
                continue
            try:
                py_compile.compile(str(path), cfile=str(pyc / f"{f}c"), doraise=True)
                pc.compiled.append(f)
            except py_compile.PyCompileError as exc:
                errors.append(f"{e.name}: {f}: {str(exc.msg).strip().splitlines()[-1]}")
        patches.append(pc)
    return CheckReport(base=f"{package}=={version}", identity=ls.identity, tree=str(tree),
                       base_commit=after.base_commit, head=after.head, patches=patches,
                       ok=not errors, errors=errors)
