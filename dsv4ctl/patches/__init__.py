"""Patch series on SGLang trees (``dsv4ctl patch``).

* :mod:`.series` — the ``series`` file format, per-patch facts, series identity (pure).
* :mod:`.diffparse` — files and hunks of a patch; which hunk fails on a text (pure).
* :mod:`.tree` — reading a tree: base, commits, patch-ids, dirty files; matching (pure core).
* :mod:`.ops` — changes as action lists: apply (``git am -3``), revert, export; exact restore.
* :mod:`.pristine` — pristine trees built from a released wheel; :mod:`.check` — ``patch check``.
* :mod:`.gitio` — the git runner (local subprocess or a ``dsv4ctl.remote`` transport).
* :mod:`.planfacts` — index-K facts of a profile's tree for ``dsv4ctl plan``.
"""
