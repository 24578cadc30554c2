"""Index-K facts of a profile's SGLang tree, for ``dsv4ctl plan``.

When the profile sets ``sglang.tree`` (a local git checkout, relative to the profile), the plan
reads which patches of the series ``sglang.series`` the tree carries — by ``git patch-id`` — and takes
``index_k_dtype`` / ``index_k_accounting`` from their facts (:func:`series.index_k_facts`).
The profile's own values remain the fallback, and ``--set`` still wins."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import DsvError, InputError
from .gitio import Git
from .ops import LoadedSeries, load_series, series_status
from .resolved import loaded_series, tree_version_at
from .series import index_k_facts
from .tree import read_tree


@dataclass
class TreeFacts:
    """The series state of the profile's tree: ``applied`` entry names, in series order."""

    tree: str
    head: str
    loaded: LoadedSeries
    applied: list[str]

    def for_env(self, env: dict) -> tuple[dict, list[str]]:
        """``(facts, notes)`` for a server group running with ``env`` (its SGLANG_* switches)."""
        return index_k_facts(self.loaded.series, self.applied, {k: str(v) for k, v in env.items()})

    def source(self, facts: dict) -> str:
        """One line naming where ``facts`` came from, for the plan report."""
        names = [n for n in self.applied if set(self.loaded.series.entry(n).facts) & set(facts)]
        return f"series {self.loaded.dir.resolve().name} applied to {self.tree} @ {self.head[:12]} ({', '.join(names)})"


def tree_facts(sglang, dep=None) -> Optional[TreeFacts]:
    """Which patches of the profile's series the profile's tree carries (``sglang``: the resolved
    :class:`~dsv4ctl.profile.deployment.SGLangSettings`). None when ``tree`` or ``series`` is unset:
    without a series nothing is shipped on top of ``base_ref``, so the profile's own index-K
    values apply (the same answer ``deploy`` gives). With ``dep`` (the Deployment of ``sglang``)
    the series is the one it keeps and the tree's version the one read for its SGLang release
    (:mod:`dsv4ctl.patches.resolved`: read once per Deployment); asked through
    :func:`deployment_tree_facts`, the tree is read once per Deployment too.

    InputError (exit 2) when the tree or series cannot be read; the message names the profile key."""
    if sglang.tree is None or sglang.series is None:
        return None
    path = sglang.tree.resolve()
    if not path.is_dir():
        raise InputError(f"sglang.tree: {path}: no such directory")
    try:
        state = read_tree(Git(str(path)), sglang.base_ref, **_known_version(dep, sglang))
    except InputError as e:
        raise InputError(f"sglang.tree: {e}") from None
    try:
        ls = load_series(sglang.series.resolve()) if dep is None else loaded_series(dep)
    except InputError as e:
        raise InputError(f"sglang.series: {e}") from None
    st = series_status(ls, state)
    return TreeFacts(tree=str(path), head=state.head, loaded=ls, applied=st.applied)


def deployment_tree_facts(dep):
    """:func:`tree_facts` of the Deployment ``dep`` (which patches of its series its tree carries;
    None without tree or series), once per Deployment (:meth:`Deployment.once`, kept by
    ``with_serve_texts``): the tree is read once (``read_tree``) and the series is the one
    :func:`dsv4ctl.patches.resolved.loaded_series` keeps. InputError (exit 2) as ``tree_facts``
    says, raised again when asked again."""
    def facts():
        try:
            return tree_facts(dep.sglang, dep=dep), None
        except DsvError as e:
            return None, e
    value, err = dep.once("tree_facts", facts)
    if err is not None:
        raise err
    return value


def _known_version(dep, sglang) -> dict:
    """``read_tree``'s ``version`` keyword: the tree's SGLang version as the Deployment ``dep``
    read it for its release (at ``sglang.base_ref``, else HEAD; one ``git show`` per revision and
    Deployment), so the tree's version files are not read again; nothing without ``dep`` or when
    that read found no version (read_tree then reads HEAD's, for its base and its messages). The
    facts use the tree's commits and HEAD only, never its version."""
    if dep is None:
        return {}
    try:
        version = tree_version_at(dep, sglang.tree, sglang.base_ref or "HEAD")
    except Exception:        # noqa: BLE001 -- read_tree reads it and says what is wrong, in its words
        return {}
    return {} if version is None else {"version": version}
