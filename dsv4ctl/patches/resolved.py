"""The patch series and the tree of a resolved Deployment, derived once per Deployment.

A command that builds, judges or sizes a release asks for the profile's series (``sglang.series``)
and for what the tree (``sglang.tree``) says in several places: the release inputs
(``deploy/release.py``), the lint input's DSV123 (``serve/lintinput.py series_mismatch``), the
plan's index-K facts (``plan/plan.py``, :func:`dsv4ctl.patches.planfacts.deployment_tree_facts`,
built on these) and the SGLang version (``plan/sglang_version.py``). These functions derive each
once per Deployment (:meth:`dsv4ctl.profile.deployment.Deployment.once`) and answer again from it;
none depends on the serve configs, so :meth:`~dsv4ctl.profile.deployment.Deployment.with_serve_texts`
keeps them (``SERVE_FREE``). ``dep`` is the resolved Deployment (anything with ``sglang`` and ``once``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..errors import DsvError


def loaded_series(dep):
    """The profile's series folder read by :func:`dsv4ctl.patches.ops.load_series` (a
    :class:`~dsv4ctl.patches.ops.LoadedSeries`), once per Deployment; None when ``sglang.series``
    is unset. Raises the reader's own error (InputError, exit 2; OSError) each time it is asked
    when the series cannot be read: callers word it their way (``sglang.series: …``) or pass over
    it (DSV123 says nothing of an unreadable series), as they did reading it themselves."""
    def load():
        from .ops import load_series
        try:
            return load_series(dep.sglang.series), None
        except (DsvError, OSError) as e:
            return None, e
    if dep.sglang.series is None:
        return None
    ls, err = dep.once("series", load)
    if err is not None:
        raise err
    return ls


def tree_version_at(dep, tree: Path, rev: str) -> Optional[str]:
    """:func:`dsv4ctl.patches.tree.tree_version` of ``rev`` in the git checkout ``tree`` (the
    profile's ``sglang.tree``), read once per Deployment and revision (the same
    checkout however its path is spelled). Its errors are not kept (raised again when asked again)."""
    from .gitio import Git
    from .tree import tree_version
    kept = dep.once("tree_versions", dict)
    key = (str(Path(tree).resolve()), rev)
    if key not in kept:
        kept[key] = tree_version(Git(str(tree)), rev)
    return kept[key]

