"""Every shipped runbook validates, and its --dry-run changes nothing anywhere (default profile:
its host is 127.0.0.1 with no sshd, so remote facts fail to connect and are reported as lines)."""

import hashlib

import pytest

from tests.conftest import REPO

PLAYBOOKS = sorted(p.stem for p in (REPO / "playbooks").glob("*.yaml"))


def _digest(root):
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_four_runbooks_ship():
    assert PLAYBOOKS == ["bad-release", "oom-at-startup", "toolcall-corruption", "transfer-wedge"]


@pytest.mark.parametrize("name", PLAYBOOKS)
def test_dry_run_changes_nothing(cli, tmp_path, name):
    before = _digest(REPO / "profiles")
    state = tmp_path / "state"
    r = cli("runbook", "run", name, "--dry-run", env={"DSV4CTL_STATE_DIR": str(state)}, timeout=300)
    assert r.code == 0, r.err
    assert "Traceback" not in r.out + r.err
    assert _digest(REPO / "profiles") == before
    assert not list(state.rglob("state.json")) and not list(state.rglob("incident.json"))
    shown = cli("runbook", "show", name)
    assert shown.code == 0
    steps = [line.split()[1] for line in shown.out.splitlines()[1:]]
    for step in steps:
        assert step in r.out
