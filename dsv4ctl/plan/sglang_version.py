"""Which SGLang release a deployment runs: the tree's own version when a tree is given (what
really ships), else the profile's ``sglang.version``; the rules of that release
(:mod:`dsv4ctl.plan.versions`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import InputError
from .versions import VersionRules, rules_for


@dataclass(frozen=True)
class VersionChoice:
    """``version`` used and its ``rules``; ``source`` in words (``tree /src/sglang at v0.5.22`` or
    ``profile sglang.version``); ``profile``: the profile's value; ``tree``: the tree's (None
    without a tree or when it says none)."""

    version: str
    rules: VersionRules
    source: str
    profile: str
    tree: Optional[str]

    @property
    def disagree(self) -> bool:
        """The profile names another release than the tree it ships."""
        return self.tree is not None and self.tree != self.profile


# Counts every resolution :func:`resolve_version` computes (tests assert one per command).
RESOLUTIONS: list[str] = []


def resolve_version(dep) -> VersionChoice:
    """The SGLang release of Deployment ``dep``. Reads the tree at ``sglang.base_ref`` (``git
    show``; :func:`dsv4ctl.patches.tree.tree_version`) when ``sglang.tree`` is a folder. InputError
    (exit 2) for a release dsv4ctl does not support, naming the supported ones and where the
    version came from, and for a tree whose version files disagree. Computed once per Deployment
    (the answer is kept on it: every later caller of one command gets the same choice)."""
    kept = getattr(dep, "_version_choice", None)
    if kept is not None:
        return kept
    choice = _resolve_version(dep)
    try:
        dep._version_choice = choice
    except AttributeError:          # a frozen or slotted stand-in: no keeping
        pass
    return choice


def _resolve_version(dep) -> VersionChoice:
    RESOLUTIONS.append(str(getattr(getattr(dep, "profile", None), "path", "")))
    prof = dep.sglang.version
    where = f"{dep.profile.positions.where(('sglang', 'version'))}: sglang.version"
    tree_v, tree_src = None, ""
    tree = dep.sglang.tree
    if tree is not None and tree.is_dir():
        ref = dep.sglang.base_ref or "HEAD"
        try:
            tree_v = _tree_version(dep, tree, ref)
        except InputError:       # version files that disagree or are no Python: said, never guessed
            raise
        except Exception:        # not a git checkout, a bad ref: the profile's value is all there is
            tree_v = None
        tree_src = f"tree {tree} at {ref}"
    if tree_v is not None:
        rules = rules_for(tree_v, f"{tree} at {dep.sglang.base_ref or 'HEAD'} (sglang.tree)")
        return VersionChoice(rules.version, rules, tree_src, _canonical(prof), rules.version)
    rules = rules_for(prof, where)
    # the release's own spelling ("v0.5.23" and " 0.5.23" are 0.5.23): file names and titles use it
    return VersionChoice(rules.version, rules, "profile sglang.version", rules.version, None)


def _tree_version(dep, tree, ref: str):
    """The tree's version at ``ref``, read once per Deployment (shared with the plan's tree facts:
    :func:`dsv4ctl.patches.resolved.tree_version_at`); read directly for a stand-in without
    ``Deployment.once``."""
    if hasattr(dep, "once"):
        from ..patches.resolved import tree_version_at
        return tree_version_at(dep, tree, ref)
    from ..patches.gitio import Git
    from ..patches.tree import tree_version
    return tree_version(Git(str(tree)), ref)


def _canonical(version) -> str:
    """``version`` as the releases table spells it when it names one (``v0.5.22`` -> ``0.5.22``),
    else as given (a disagreement with the tree is still reported in the profile's words)."""
    v = str(version).strip()
    v = v[1:] if v.startswith("v") else v
    from .versions import VERSIONS
    return v if v in VERSIONS else str(version)
