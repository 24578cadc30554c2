"""Release images, the parts that need no podman: the base's local OCI layout is checked before
anything is built or pushed (follower's finding: a missing base was found after the push, exit 3)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dsv4ctl.deploy.image import check_base, split_pin
from dsv4ctl.errors import InputError


def test_a_missing_local_base_is_exit_2_before_anything(tmp_path):
    with pytest.raises(InputError, match=r"no OCI image layout at /nonexistent \(its index.json is missing\): "
                                         r"nothing was built or pushed"):
        check_base(SimpleNamespace(base="oci:/nonexistent"))
    layout = tmp_path / "base"
    layout.mkdir()
    with pytest.raises(InputError, match="index.json is missing"):
        check_base(SimpleNamespace(base=f"oci:{layout}:latest@sha256:" + "a" * 64))
    (layout / "index.json").write_text("{}")
    check_base(SimpleNamespace(base=f"oci:{layout}@sha256:" + "a" * 64))      # there: the pull judges the rest
    check_base(SimpleNamespace(base="lmsysorg/sglang:v0.5.23"))                # a registry name: checked at pull


def test_split_pin():
    assert split_pin("oci:/x@sha256:" + "b" * 64) == ("oci:/x", "sha256:" + "b" * 64)
    assert split_pin("oci:/x") == ("oci:/x", None)
