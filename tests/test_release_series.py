"""The release build reads the shipped series through the one series reader (its `base` header
is not a patch) and carries the series identity."""

from dsv4ctl.deploy.release import series_patches
from dsv4ctl.patches.ops import load_series
from tests.conftest import REPO


def test_shipped_series_lists_its_two_patches():
    d = REPO / "patches" / "sglang-0.5.23"
    paths, ident = series_patches(d)
    assert [p.name for p in paths] == ["0001-dsv4-bf16-index-k-exact-accounting.patch", "0002-dsv4-log-pool-plan.patch"]
    assert ident == load_series(d).identity and len(ident) >= 12
