"""The release build reads the shipped series file (its `base` header is not a patch)."""

from dsv4ctl.deploy.release import parse_series, series_patches
from tests.conftest import REPO


def test_shipped_series_lists_its_two_patches():
    d = REPO / "patches" / "sglang-0.5.23"
    names = parse_series((d / "series").read_text())
    assert names == ["0001-dsv4-bf16-index-k-exact-accounting.patch", "0002-dsv4-log-pool-plan.patch"]
    assert [p.name for p in series_patches(d)] == names
