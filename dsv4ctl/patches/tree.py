"""Reading an SGLang tree's patch state (never changes the tree).

:func:`read_tree` gathers the facts with git; :func:`match_series` (pure) decides which series
patches are applied by comparing ``git patch-id --stable`` values, not commit messages — a patch
re-applied with another subject, author or line offsets is still recognised."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import InputError
from .gitio import Git, Runner, local_runner
from .series import Series

_REVERT_RE = re.compile(r"This reverts commit ([0-9a-f]{40})")
VERSION_FILES = ("python/sglang/_version.py", "sglang/_version.py", "python/sglang/version.py",
                 "sglang/version.py")


@dataclass(frozen=True)
class Commit:
    """A commit between the base and HEAD: ``sha``, ``subject``, ``patch_id`` (None for merges
    and empty commits), ``reverts`` (sha named by git revert's "This reverts commit" line)."""

    sha: str
    subject: str
    patch_id: Optional[str] = None
    reverts: Optional[str] = None


@dataclass
class TreeState:
    """What ``patch status`` reports about a tree."""

    tree: str
    version: Optional[str]
    base_ref: str
    base_commit: str
    head: str
    branch: Optional[str]
    commits: list[Commit]
    dirty: list[str]                 # porcelain lines: "XY path"
    operation: Optional[str] = None  # "am" / "rebase" / "merge" / "revert" / "cherry-pick" in progress

    @property
    def clean(self) -> bool:
        """No tracked change and no half-done git operation (untracked files are allowed)."""
        return self.operation is None and not any(not ln.startswith("??") for ln in self.dirty)


@dataclass
class EntryStatus:
    name: str
    state: str                       # "applied" | "reverted" | "missing"
    commit: Optional[str] = None
    reverted_by: Optional[str] = None


@dataclass
class SeriesStatus:
    """Series patches by state, plus local commits that are not series patches."""

    entries: list[EntryStatus]
    extra: list[Commit] = field(default_factory=list)       # local commits outside the series
    reverts: list[Commit] = field(default_factory=list)     # reverts of commits not in the series

    @property
    def applied(self) -> list[str]:
        return [e.name for e in self.entries if e.state == "applied"]

    @property
    def complete(self) -> bool:
        return all(e.state == "applied" for e in self.entries)


def match_series(series_ids: dict[str, str], order: list[str], commits: list[Commit]) -> SeriesStatus:
    """Match series patches (``name → patch-id``, in series ``order``) with ``commits`` (oldest
    first). A patch is *applied* when a commit has its patch-id and no later commit reverts it,
    *reverted* when that commit was reverted, else *missing*. Pure."""
    by_pid: dict[str, list[Commit]] = {}
    for c in commits:
        if c.patch_id:
            by_pid.setdefault(c.patch_id, []).append(c)
    reverted = {c.reverts: c for c in commits if c.reverts}
    entries, used = [], set()
    for name in order:
        pid = series_ids.get(name)
        cands = by_pid.get(pid, []) if pid else []
        live = [c for c in cands if c.sha not in reverted]
        if live:
            entries.append(EntryStatus(name, "applied", commit=live[-1].sha))
        elif cands:
            entries.append(EntryStatus(name, "reverted", commit=cands[-1].sha,
                                       reverted_by=reverted[cands[-1].sha].sha))
        else:
            entries.append(EntryStatus(name, "missing"))
        used.update(c.sha for c in cands)
        used.update(reverted[c.sha].sha for c in cands if c.sha in reverted)
    extra = [c for c in commits if c.sha not in used and not c.reverts]
    reverts = [c for c in commits if c.sha not in used and c.reverts]
    return SeriesStatus(entries=entries, extra=extra, reverts=reverts)


def patch_ids_of_files(paths: list[Path], runner: Runner = local_runner) -> dict[str, str]:
    """``git patch-id --stable`` of each patch file, keyed by file name. Files whose diff is empty
    get no id. Runs git locally (patch files are local even for a remote tree)."""
    out: dict[str, str] = {}
    for p in paths:
        code, stdout, stderr = runner(["git", "patch-id", "--stable"], p.read_bytes())
        if code != 0:
            raise InputError(f"{p}: git patch-id failed: {stderr.decode(errors='replace').strip()}")
        words = stdout.decode().split()
        if words:
            out[p.name] = words[0]
    return out


_OPERATIONS = (("in the middle of an am session", "am"), ("currently reverting", "revert"),
               ("currently cherry-picking", "cherry-pick"), ("currently rebasing", "rebase"),
               ("rebase in progress", "rebase"), ("still merging", "merge"), ("unmerged paths", "merge"))


def operation_in_progress(long_status: str) -> Optional[str]:
    """The git operation a ``git status`` (long format, LC_ALL=C) says is in progress, or None."""
    for needle, name in _OPERATIONS:
        if needle in long_status:
            return name
    return None


def version_assigned(source: str) -> Optional[str]:
    """The string Python code assigns to ``__version__`` in ``source`` (a ``_version.py`` or
    ``version.py``), read with :mod:`ast`, so comments and strings that merely mention it count
    for nothing: ``__version__ = "X"``, ``__version__ = version = "X"``, ``__version__: str = "X"``.
    A module-level assignment wins (the last one, as Python runs them); else one inside ``if``/
    ``try`` blocks, when those agree. Development fallbacks (``0.0.0...``, a wheel's
    ``version.py``) say nothing: None. Raises SyntaxError/ValueError for source that is no Python."""
    tree = ast.parse(source)
    top: list[str] = []
    nested: list[str] = []

    def visit(body: list, into: list[str]) -> None:
        for node in body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if (any(isinstance(t, ast.Name) and t.id == "__version__" for t in targets)
                        and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
                    into.append(node.value.value.strip())
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                for block in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", []),
                              *[h.body for h in getattr(node, "handlers", [])]):
                    visit(block, nested)
    visit(tree.body, top)
    found = [v for v in (top[-1:] or nested) if v and not v.startswith("0.0.0")]
    return found[0] if len(set(found)) == 1 else None


def _file_versions(git: Git, rev: str) -> list[tuple[str, str]]:
    """``(file, version)`` of every version source of ``rev`` that names one: the
    :data:`VERSION_FILES` (:func:`version_assigned`) and ``python/pyproject.toml``'s ``[project]
    version``. InputError (exit 2) for a version file that is not Python."""
    out: list[tuple[str, str]] = []
    for path in VERSION_FILES:
        r = git.run("show", f"{rev}:{path}", check=False)
        if not r.ok:
            continue
        try:
            v = version_assigned(r.out)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            line = f" line {e.lineno}" if getattr(e, "lineno", None) else ""
            raise InputError(f"{git.where}: {path} at {rev} is not Python ({type(e).__name__}{line}): "
                             "cannot read the SGLang version") from None
        if v:
            out.append((path, v))
    r = git.run("show", f"{rev}:python/pyproject.toml", check=False)
    if r.ok:
        import tomllib
        try:
            v = (tomllib.loads(r.out).get("project") or {}).get("version")
        except tomllib.TOMLDecodeError:
            v = None
        if isinstance(v, str) and v.strip():
            out.append(("python/pyproject.toml", v.strip()))
    return out


def tree_version(git: Git, rev: str = "HEAD") -> Optional[str]:
    """The SGLang version of ``rev``: ``__version__`` as assigned in ``python/sglang/_version.py``
    (a wheel-built tree; :func:`version_assigned`, a wheel's ``version.py`` fallback ``0.0.0.dev0``
    says nothing) or ``[project] version`` of ``python/pyproject.toml``, else the nearest ``vX.Y.Z``
    tag (an upstream checkout). None when none exists. InputError (exit 2) when two of those files
    name different versions (which one would ship is unknowable), naming both files and versions."""
    found = _file_versions(git, rev)
    for path, v in found[1:]:
        if v.removeprefix("v") != found[0][1].removeprefix("v"):
            raise InputError(f"{git.where}: {found[0][0]} at {rev} says SGLang {found[0][1][:40]!r} but {path} "
                             f"says {v[:40]!r}: make the tree's version files agree")
    if found:
        return found[0][1]
    r = git.run("describe", "--tags", "--abbrev=0", "--match", "v[0-9]*", rev, check=False)
    if r.ok and r.out.strip():
        return r.out.strip()[1:]
    return None


_UNREAD = object()


def read_tree(git: Git, base: Optional[str] = None, version=_UNREAD) -> TreeState:
    """Read a tree's state. ``base``: the pristine ref (default ``v<version>``). ``version``: the
    tree's SGLang version when the caller has read it already (:func:`tree_version`; a resolved
    Deployment's, :func:`dsv4ctl.patches.resolved.tree_version_at`, at its base ref when the
    caller reads only the commits), not read again.

    Raises InputError when the path is not a git work tree, has no commit, or the base cannot be
    found or is not an ancestor of HEAD."""
    r = git.run("rev-parse", "--is-inside-work-tree", check=False)
    if not r.ok or r.out.strip() != "true":
        raise InputError(f"{git.where}: not a git work tree")
    r = git.run("rev-parse", "--verify", "-q", "HEAD", check=False)
    if not r.ok:
        raise InputError(f"{git.where}: the repository has no commit")
    head = r.out.strip()
    branch = git.run("symbolic-ref", "-q", "--short", "HEAD", check=False).out.strip() or None
    if version is _UNREAD:
        version = tree_version(git)
    base_ref = base or (f"v{version}" if version else None)
    if base_ref is None:
        raise InputError(f"{git.where}: cannot tell the SGLang version (no python/sglang/_version.py, "
                         "no vX.Y.Z tag); pass --base REF")
    r = git.run("rev-parse", "--verify", "-q", f"{base_ref}^{{commit}}", check=False)
    if not r.ok:
        raise InputError(f"{git.where}: base {base_ref!r} not found; pass --base REF (the pristine "
                         f"SGLang {version or ''} commit or tag)")
    base_commit = r.out.strip()
    if not git.run("merge-base", "--is-ancestor", base_commit, head, check=False).ok:
        raise InputError(f"{git.where}: base {base_ref} is not an ancestor of HEAD")
    log = git.out("log", "--reverse", "--format=%H%x1f%P%x1f%s%x1f%b%x1e", f"{base_commit}..{head}")
    raw = []
    for rec in log.split("\x1e"):
        rec = rec.strip("\n")
        if not rec:
            continue
        sha, parents, subj, body = (rec.split("\x1f") + ["", "", ""])[:4]
        m = _REVERT_RE.search(body)
        raw.append((sha, len(parents.split()) > 1, subj, m.group(1) if m else None))
    pids: dict[str, str] = {}
    if raw:
        diff = git.run("log", "--reverse", "-p", "--no-merges", "--no-color", "--no-ext-diff",
                       "--format=commit %H", f"{base_commit}..{head}").out
        for line in git.run("patch-id", "--stable", input=diff).out.splitlines():
            words = line.split()
            if len(words) == 2:
                pids[words[1]] = words[0]
    commits = [Commit(sha=s, subject=subj, patch_id=None if merge else pids.get(s), reverts=rv)
               for s, merge, subj, rv in raw]
    status = git.run("status", "--porcelain=v1", "--untracked-files=normal").out
    dirty = [ln for ln in status.splitlines() if ln.strip()]
    return TreeState(tree=git.where, version=version, base_ref=base_ref, base_commit=base_commit,
                     head=head, branch=branch, commits=commits, dirty=dirty,
                     operation=operation_in_progress(git.run("status", check=False).out))
