"""Absurd what-if topologies are input errors, not runaway allocations."""

import pytest


@pytest.mark.parametrize("item", ["tp_size=99999999999999999999", "pp_size=2000", "dp_size=0"])
def test_topology_bounds(cli, item):
    r = cli("plan", "--set", item, timeout=30)
    assert r.code == 2
    assert "must be within 1..1024" in r.err and r.err.count("\n") == 1
