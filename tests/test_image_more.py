"""Releases as OCI images (issue 47), the items after tests/test_image_deploy.py: a registry auth
file others can read is refused (dry runs too), the control machine's OCI copies of the images
are pruned with the releases, and the ``systemd`` service backend runs the containers. Real
parts: rootful podman with runc, real sshd hosts (tests/test_image_deploy.py's world), systemd
as PID 1 of a private namespace (tests/test_systemd.py's)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import run_cli
from tests.sshd.fixtures import sshd_cluster  # noqa: F401
from tests.test_image_deploy import ImageWorld

pytestmark = pytest.mark.sshd


# -- 1. the registry auth file ---------------------------------------------------------------------

def test_a_registry_auth_file_others_can_read_is_refused(sshd_cluster, tmp_path):
    """``sglang.image.registry.auth_file`` readable by others (0644, the default umask's) or
    writable by its group (0660) is exit 2 with one line naming the file and its mode, before
    anything is built, shipped or connected to, ``--dry-run`` included; the credentials are
    never shown. 0600 and 0640 (a team's group may read it) pass that check (the test's base,
    an OCI layout that is not there, then stops the run: no host was needed)."""
    secret = "QWxpY2U6SHVudGVyMlNlY3JldA=="
    w = ImageWorld(sshd_cluster, tmp_path, "oci:" + str(tmp_path / "no-base"), nhosts=3)
    auth = w.cfgdir / "registry-auth.json"
    auth.write_text(json.dumps({"auths": {"registry.example:5000": {"auth": secret}}}))
    prof = yaml.safe_load(w.profile.read_text())
    prof["sglang"]["image"]["registry"] = {"repository": "registry.example:5000/dsv4ctl",
                                           "auth_file": "registry-auth.json"}
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
    run = lambda *a: run_cli("deploy", str(w.profile), "--accept-new-host-keys", "--no-preflight", *a, env=w.env(),
                             timeout=120)
    for mode, what in ((0o644, "others read"), (0o604, "others read"), (0o660, "its group write")):
        auth.chmod(mode)
        for args in (("--dry-run",), ()):
            r = run(*args)
            assert r.code == 2, (mode, args, r.err)
            assert r.err.strip().splitlines() == [
                f"dsv4ctl: error: sglang.image.registry.auth_file {auth}: mode {mode:04o} lets {what} the registry "
                f"credentials: chmod 600 {auth}"], r.err
            assert secret not in r.out + r.err
    assert not any((w.roots[h] / "releases").exists() for h in w.roots)       # no host was touched
    for mode in (0o600, 0o640):
        auth.chmod(mode)
        r = run("--dry-run")
        assert r.code == 2 and "no OCI image layout at" in r.err and "registry.auth_file" not in r.err, r.err
