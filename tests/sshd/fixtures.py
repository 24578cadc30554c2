"""pytest fixtures: a session-wide cluster of real sshd hosts (import into a test module)."""

from __future__ import annotations

import pytest

from . import harness


@pytest.fixture(scope="session")
def sshd_cluster(tmp_path_factory):
    """Four real sshd hosts h0..h3 on 127.0.W.2..5 (W: the xdist worker) (skips when sshd/rsync are missing)."""
    why = harness.available()
    if why:
        pytest.skip(why)
    c = harness.start_cluster(tmp_path_factory.mktemp("sshd"), n=4)
    yield c
    c.stop()


@pytest.fixture
def live_cluster(sshd_cluster):
    """The session cluster with every sshd running again (a fault test may have killed one)."""
    for h in sshd_cluster.hosts:
        if not h.running:
            h.start()
    return sshd_cluster
