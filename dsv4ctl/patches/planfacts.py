"""Index-K facts of a profile's SGLang tree, for ``dsv4ctl plan``.

When the profile sets ``sglang.tree`` (a local git checkout, relative to the profile), the plan
reads which patches of the series ``sglang.series`` the tree carries — by ``git patch-id`` — and takes
``index_k_dtype`` / ``index_k_accounting`` from their facts (:func:`series.index_k_facts`).
The profile's own values remain the fallback, and ``--set`` still wins."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import InputError
from .gitio import Git
from .ops import LoadedSeries, load_series, series_status
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
        return f"series {self.loaded.dir.name} applied to {self.tree} @ {self.head[:12]} ({', '.join(names)})"


def tree_facts(sglang) -> Optional[TreeFacts]:
    """Which patches of the profile's series the profile's tree carries (``sglang``: the resolved
    :class:`~dsv4ctl.profile.deployment.SGLangSettings`). None when ``tree`` or ``series`` is unset:
    without a series nothing is shipped on top of ``base_ref``, so the profile's own index-K
    values apply (the same answer ``deploy`` gives).

    InputError (exit 2) when the tree or series cannot be read; the message names the profile key."""
    if sglang.tree is None or sglang.series is None:
        return None
    path = sglang.tree.resolve()
    if not path.is_dir():
        raise InputError(f"sglang.tree: {path}: no such directory")
    try:
        state = read_tree(Git(str(path)), sglang.base_ref)
    except InputError as e:
        raise InputError(f"sglang.tree: {e}") from None
    try:
        ls = load_series(sglang.series.resolve())
    except InputError as e:
        raise InputError(f"sglang.series: {e}") from None
    st = series_status(ls, state)
    return TreeFacts(tree=str(path), head=state.head, loaded=ls, applied=st.applied)
