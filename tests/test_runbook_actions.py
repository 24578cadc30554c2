"""Runbook actions without hosts: the child dsv4ctl process runs in its own process group, shows
progress while it runs, and is stopped (TERM to its group) when the runbook is interrupted."""

from __future__ import annotations

import subprocess
import sys
import time

from dsv4ctl.runbook import actions as A


def test_child_progress_lines_and_evidence(tmp_path, monkeypatch):
    monkeypatch.setattr(A, "PROGRESS_S", 0.05)
    said = []
    ctx = A.RunContext(profile=None, run_dir=tmp_path, say=said.append)
    code, doc, err = A._run_cli(ctx, ["--version"], "version")
    assert code == 0 and doc is None and err == ""
    assert (tmp_path / "version.out").read_text().startswith("dsv4ctl ")
    assert said and all(s.startswith("  ... dsv4ctl --version running for ") for s in said)
    assert not ctx.children


def test_stop_child_stops_its_whole_process_group():
    p = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"],
                         start_new_session=True)
    time.sleep(0.5)
    t0 = time.monotonic()
    A.stop_child(p)
    assert p.poll() is not None and time.monotonic() - t0 < 5
    time.sleep(0.2)
    rows = subprocess.run(["ps", "-o", "pid=,stat=", "-g", str(p.pid)], capture_output=True, text=True).stdout.splitlines()
    assert [r for r in rows if not r.split()[1].startswith("Z")] == []      # zombies wait for PID 1 to reap them


def test_numbered_evidence_names(tmp_path):
    ctx = A.RunContext(profile=None, run_dir=tmp_path)
    assert ctx.evidence_name("check-smoke") == "check-smoke"
    (tmp_path / "check-smoke.out").write_text("x")
    assert ctx.evidence_name("check-smoke") == "check-smoke-2"
    ctx.evidence.append("check-smoke-2")
    assert ctx.evidence_name("check-smoke") == "check-smoke-3"


def test_patch_step_tree_of_a_profile_given_by_a_relative_path(tmp_path, monkeypatch):
    """Issue 28: ``sglang.tree: sglang`` in ``cfg/p.yaml`` run as ``runbook run ... cfg/p.yaml``
    gave the patch step ``cfg/cfg/sglang``. The tree is resolved from the profile's folder once."""
    import shutil

    from dsv4ctl.profile.model import load_profile
    from tests.conftest import DEFAULT_PROFILE
    cfg = tmp_path / "cfg"
    shutil.copytree(DEFAULT_PROFILE.parent / DEFAULT_PROFILE.stem, cfg / DEFAULT_PROFILE.stem)
    (cfg / "sglang").mkdir()
    text = DEFAULT_PROFILE.read_text().replace("tree: null", "tree: sglang").replace("../patches/sglang-0.5.23", "null")
    (cfg / "p.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    ctx = A.RunContext(profile=load_profile("cfg/p.yaml"), run_dir=tmp_path)
    run, describe = A._patch("apply")
    line = describe(ctx, {})[0]
    assert f"patch apply {cfg / 'sglang'} " in line + " " and "cfg/cfg" not in line
    line = describe(ctx, {"tree": "sglang"})[0]
    assert f"patch apply {cfg / 'sglang'}" in line


def _facts(current: str, records: dict, built: dict):
    from dsv4ctl.hosts.layout import HostFacts
    return HostFacts(host="h", root="/r", current=current, releases={r: {"id": r, "built_at": b} for r, b in built.items()},
                     state={"releases": {r: {"state": s} for r, s in records.items()}})


def test_bad_release_goes_back_only_to_a_release_marked_good_and_only_from_the_evidence_release():
    """issue 41: the bad-release target is the newest release built before the running one that is
    marked good on every host; a release that only passed its health gate (B, built after the good
    A) is not one; none good, another release running than the evidence's, or mixed releases:
    NotRolledBack, one line (nothing is marked or rolled back)."""
    import pytest

    from dsv4ctl.deploy.mark import NotRolledBack, rollback_choice
    from dsv4ctl.hosts.layout import choose_rollback_target
    built = {"rA": "2026-12-01T01:00:00Z", "rB": "2026-12-01T02:00:00Z", "rC": "2026-12-01T03:00:00Z"}
    facts = {h: _facts("rC", {"rA": "good", "rB": "active", "rC": "active"}, built) for h in ("h0", "h1")}
    assert choose_rollback_target(facts)[0] == "rB"                 # a plain rollback: health gate passed
    assert rollback_choice(facts, "rC") == ("rC", "rA", "the newest release built before the active rC marked "
                                                        "good on every host")
    assert rollback_choice(facts, None)[:2] == ("rC", "rA")
    with pytest.raises(NotRolledBack, match="^the evidence is about release rB, but the hosts run rC now"):
        rollback_choice(facts, "rB")
    facts["h1"] = _facts("rC", {"rA": "failed", "rB": "active", "rC": "active"}, built)
    with pytest.raises(NotRolledBack) as e:
        rollback_choice(facts, "rC")
    assert str(e.value) == ("no release built before the active rC is marked good (passed its promotion gate: deploy "
                            "--promote or dsv4ctl promote) on every host without being marked failed: nothing to roll "
                            "back to (see dsv4ctl releases); rC stays active and is not marked")
    facts["h1"] = _facts("rB", {"rA": "good", "rB": "active"}, built)
    with pytest.raises(NotRolledBack, match=r"^the hosts do not run one release \(h0: rC, h1: rB\)"):
        rollback_choice(facts, None)
