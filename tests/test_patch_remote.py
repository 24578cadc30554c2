"""dsv4ctl patch on a host's tree through the remote layer: a real OpenSSH sshd (tests/sshd),
known_hosts verified, git run over SSH, patches sent on stdin."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import run_cli
from tests.patchoracle.trees import ENV, fresh_tree, git, snapshot
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401

pytestmark = pytest.mark.sshd


def test_status_apply_revert_over_ssh(live_cluster, tmp_path):
    c = live_cluster
    h = c.hosts[0]
    tree = fresh_tree(tmp_path / "srv" / "sglang")
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump(dict(
        version=1, name="remote-patch", model="deepseek-v4-flash",
        sglang=dict(version="0.5.23"),
        hosts=[c.host_yaml(h, tmp_path / "srv")],
        groups=[dict(name="main", role="colocated", host=h.name, gpus=list(range(8)), tp=8)]),
        sort_keys=False))
    remote = ("--host", h.name, "--profile", str(prof))
    st = run_cli("patch", "status", str(tree), *remote, "--json", env=ENV, timeout=600)
    assert st.code == 0, st.err
    doc = st.json()
    assert doc["tree"] == f"{h.name}:{tree}" and doc["version"] == "0.5.23"
    assert [p["state"] for p in doc["patches"]] == ["missing", "missing"]

    before = snapshot(tree)
    dry = run_cli("patch", "apply", str(tree), *remote, "--dry-run", env=ENV, timeout=600)
    assert dry.code == 0 and dry.out.count("dry-run: git am -3") == 2
    assert snapshot(tree) == before

    r = run_cli("patch", "apply", str(tree), *remote, "--json", env=ENV, timeout=600)
    assert r.code == 0, r.err
    assert len(r.json()["applied"]) == 2
    st = run_cli("patch", "status", str(tree), *remote, "--json", env=ENV, timeout=600).json()
    assert [p["state"] for p in st["patches"]] == ["applied", "applied"]
    assert st["head"] == git(tree, "rev-parse", "HEAD")

    r = run_cli("patch", "revert", str(tree), st["head"], *remote, env=ENV, timeout=600)
    assert r.code == 0, r.err
    st = run_cli("patch", "status", str(tree), *remote, "--json", env=ENV, timeout=600).json()
    assert [p["state"] for p in st["patches"]] == ["applied", "reverted"]


def test_unknown_host_and_unreachable(live_cluster, tmp_path):
    c = live_cluster
    h = c.hosts[1]
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump(dict(
        version=1, name="remote-patch", model="deepseek-v4-flash", sglang=dict(version="0.5.23"),
        hosts=[c.host_yaml(h, tmp_path)],
        groups=[dict(name="main", role="colocated", host=h.name, gpus=list(range(8)), tp=8)]),
        sort_keys=False))
    r = run_cli("patch", "status", "/srv/sglang", "--host", "nope", "--profile", str(prof), env=ENV, timeout=600)
    assert r.code == 2 and "--host nope: not a host of profile remote-patch" in r.err
    r = run_cli("patch", "status", str(tmp_path / "absent"), "--host", h.name, "--profile", str(prof), env=ENV, timeout=600)
    assert r.code == 2 and f"{h.name}:{tmp_path / 'absent'}: not a git work tree" in r.err
