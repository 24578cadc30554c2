"""pytest fixtures of the oracle tests (imported by the test modules, never by the oracle
environment, which has no pytest)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def forked_oracle():
    """The oracle's fork servers of this pytest process (:mod:`tests.oracle.zygote`), stopped when
    the session ends. A test that runs the oracle uses it, which also makes every such test one
    unit of work (tests/conftest.py ``unit_of``: ``session:forked_oracle``, sorted before the
    patch fixtures' ``session:oracle_runs`` / ``session:patched_tree``): they run on one xdist
    worker, so torch and transformers are imported once per stub set for the whole run instead of
    once per oracle run (about 6 of the 8 CPU-s a run cost as a new process)."""
    from tests.oracle import zygote
    yield zygote
    zygote.close_all()
