"""Runbook check actions against the SGLang stand-in over real HTTP: a corrupted server trips the
gate and the mitigation branch runs; the evidence (JSON, per-turn records) lands in the run dir."""

import json
import socket
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.standin.harness import popen_standin, wait_health


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def standin(tmp_path):
    """The stand-in SGLang DSV4 server (tests/standin), HiCache on: corrupts ~15 % at 60 sessions."""
    port = _free_port()
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("served-model-name: deepseek-v4-flash\ntool-call-parser: deepseekv4\n"
                   "reasoning-parser: deepseek-v4\nenable-hierarchical-cache: true\nhicache-ratio: 2.0\n")
    proc = popen_standin(["--config", str(cfg), "--port", str(port), "--ttft-ms", "2", "--itl-ms", "0"], quiet=True)
    url = f"http://127.0.0.1:{port}"
    wait_health(url, timeout=120)      # a loaded machine takes many seconds to start it
    yield url
    proc.terminate()
    proc.wait(10)


def test_gate_failure_drives_the_mitigation_branch(cli, tmp_path, standin):
    pb = tmp_path / "measure.yaml"
    pb.write_text(f"""\
name: measure
steps:
  - id: measure
    action: check.load
    args: {{url: "{standin}", concurrency: 60, turns: 3, min_requests: 240, answer_words: 20}}
  - id: mitigate
    action: note
    when: measure.passed == false and measure.corruption_upper > 0.01
    args: {{text: over the gate}}
""")
    run = tmp_path / "run"
    r = cli("runbook", "run", str(pb), "--report-dir", str(run), timeout=300)
    assert r.code == 0, r.err
    doc = json.loads((run / "incident.json").read_text())
    m = doc["results"]["measure"]
    assert m["passed"] is False and m["concurrency"] == 60 and m["turns"] >= 240
    assert 0.05 < m["corruption_rate"] < 0.30 and m["corruption_upper"] > 0.01
    assert doc["results"]["mitigate"]["ran"] is True
    records = (run / "check-load-1.jsonl").read_text().splitlines()
    assert len(records) == m["turns"]
    load = json.loads((run / "check-load-1.out").read_text())
    assert load["schema"] == "dsv4ctl.check.load/1" and load["pass"] is False


def test_a_failed_final_verification_is_exit_1_not_completed(cli, tmp_path, standin):
    """A run whose steps all ran but whose last ``verifies`` check failed did not fix anything:
    exit 1 naming the step, the incident report and the audit say so (issue 28: scheduler-stall
    exited 0 "completed" after its final smoke failed)."""
    pb = tmp_path / "verify.yaml"
    pb.write_text(f"""\
name: verify
steps:
  - id: mitigate
    action: note
    args: {{text: pretend something was changed}}
  - id: verify
    action: check.load
    verifies: true
    args: {{url: "{standin}", concurrency: 60, turns: 3, min_requests: 240, answer_words: 20}}
""")
    run = tmp_path / "run"
    r = cli("runbook", "run", str(pb), "--report-dir", str(run), timeout=300)
    assert r.code == 1, r.err
    assert r.err.strip() == (f"dsv4ctl: gate failed: runbook verify completed, but its final verification failed: "
                             f"step verify (check.load); see {run / 'incident.md'}")
    doc = json.loads((run / "incident.json").read_text())
    assert doc["completed"] is True and doc["verification"] == {"step": "verify", "action": "check.load", "passed": False}
    assert "- outcome: completed, but the final verification (step verify, check.load) failed" in \
        (run / "incident.md").read_text()


def test_every_steps_output_is_kept_and_the_report_points_at_each(cli, tmp_path, standin):
    """Issue 28: a runbook that runs smoke twice kept only the last output while incident.md
    pointed both steps at it. Each run of a command keeps its own numbered file."""
    pb = tmp_path / "twice.yaml"
    pb.write_text(f"""\
name: twice
steps:
  - id: before
    action: check.smoke
    args: {{url: "{standin}"}}
  - id: after
    action: check.smoke
    args: {{url: "{standin}"}}
""")
    run = tmp_path / "run"
    r = cli("runbook", "run", str(pb), "--report-dir", str(run), timeout=300)
    assert r.code == 0, r.err
    doc = json.loads((run / "incident.json").read_text())
    assert doc["results"]["before"]["evidence"] == "check-smoke.out"
    assert doc["results"]["after"]["evidence"] == "check-smoke-2.out"
    assert doc["results"]["before"]["evidence_files"] == ["check-smoke.out"]
    assert doc["results"]["after"]["evidence_files"] == ["check-smoke-2.out"]
    for f in ("check-smoke.out", "check-smoke-2.out"):
        assert json.loads((run / f).read_text())["schema"].startswith("dsv4ctl.check.smoke")
    md = (run / "incident.md").read_text()
    assert "[check-smoke.out](check-smoke.out)" in md and "[check-smoke-2.out](check-smoke-2.out)" in md
