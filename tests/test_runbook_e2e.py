"""`runbook run toolcall-corruption` end to end: a real sshd host runs the stand-in SGLang server
(HiCache on, so ~15 % of tool calls corrupt at 60 sessions) under the deploy launcher convention;
the shipped runbook measures, turns HiCache off on the host (atomic write, restart, /health),
measures again, and writes the incident report and audit records. --dry-run changes nothing."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, run_cli
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401  (fixtures)
from tests.standin.harness import free_port, kill_groups, wait_health

pytestmark = pytest.mark.sshd

SERVE = """\
# colocated DSV4 server (stand-in) with HiCache
model-path: deepseek-ai/DeepSeek-V4-Flash
served-model-name: deepseek-v4-flash
host: 0.0.0.0
port: {port}
tp-size: 4
enable-hierarchical-cache: true
hicache-ratio: 2.0             # required explicitly for DSV4
hicache-write-policy: write_through
hicache-mem-layout: page_first
reasoning-parser: deepseek-v4
tool-call-parser: deepseekv4
enable-metrics: true
"""


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


@pytest.fixture
def incident(live_cluster, tmp_path):
    h = live_cluster.hosts[0]
    port = free_port()
    root = tmp_path / "root"
    serve = SERVE.format(port=port)
    local = tmp_path / "local"
    local.mkdir()
    (local / "prefill.yaml").write_text(serve)
    # a real release, deployed by dsv4ctl: hicache --remote changes the running release (issue 13)
    from tests.sshd.world import make_tree
    tree = make_tree(tmp_path / "sglang")
    server = (f"env PYTHONPATH={REPO} {{python}} -m tests.standin.server --config {{config}} --host {{address}} "
              "--port {port} --ttft-ms 2 --itl-ms 0")
    prof = {
        "version": 1, "name": "incident", "model": "deepseek-v4-flash",
        "sglang": {"version": "0.5.23", "index_k_dtype": "bf16", "index_k_accounting": "exact",
                   "tree": str(tree), "base_ref": "v0.5.23", "series": None},
        "deploy": {"health_timeout_s": 120, "python": sys.executable, "launch": {"server": server}},
        "check": {"concurrency": 60, "max_corruption": 0.01, "turns": 3},
        "hosts": [live_cluster.host_yaml(h, root, ram_gib=2048)],
        "groups": [{"name": "prefill", "role": "colocated", "host": h.name, "gpus": [0, 1, 2, 3], "tp": 4,
                    "port": port, "serve_config": "local/prefill.yaml",
                    "memory": {"free_gib_before_load": 177.0, "weights_gib_per_rank": 43.66}}],
    }
    pfile = tmp_path / "incident.yaml"
    pfile.write_text(yaml.safe_dump(prof, sort_keys=False))
    r = run_cli("deploy", str(pfile), "--no-preflight", timeout=300)
    assert r.code == 0, r.err
    proc = None
    url = f"http://{h.address}:{port}"
    try:
        wait_health(url, timeout=90)
        yield dict(profile=pfile, root=root, url=url, live=root / "current" / "configs" / "prefill.yaml",
                   local=local / "prefill.yaml", runs=tmp_path / "runs")
    finally:
        pids = set()
        pf = root / "run" / "prefill.pid"
        if pf.exists() and pf.read_text().strip():
            pids.add(int(pf.read_text()))
        kill_groups(pids)


def test_dry_run_changes_nothing(incident):
    before = incident["live"].read_bytes()
    audit0 = (incident["root"] / "audit.jsonl").read_bytes()
    r = run_cli("runbook", "run", "toolcall-corruption", "--profile", str(incident["profile"]), "--dry-run",
                env={"DSV4CTL_STATE_DIR": str(incident["runs"])}, timeout=300)
    assert r.code == 0, r.err
    assert "only if measure.passed == false" in r.out and "enable-hierarchical-cache: false" in r.out
    assert incident["live"].read_bytes() == before and incident["local"].read_bytes() == before
    assert (incident["root"] / "audit.jsonl").read_bytes() == audit0       # only the fixture's deploy
    assert not list(incident["runs"].glob("*/state.json"))
    assert _get(incident["url"] + "/server_info")["enable_hierarchical_cache"] is True


def test_toolcall_corruption_runbook_reproduces_the_seed_story(incident):
    r = run_cli("runbook", "run", "toolcall-corruption", "--profile", str(incident["profile"]), "--yes",
                "--report-dir", str(incident["runs"] / "r"), timeout=900)
    assert r.code == 0, r.out + r.err
    doc = json.loads((incident["runs"] / "r" / "incident.json").read_text())
    res = doc["results"]
    # corruption detected at concurrency 60 with HiCache on
    assert res["measure"]["passed"] is False and res["measure"]["concurrency"] == 60
    assert 0.08 < res["measure"]["corruption_rate"] < 0.25
    # HiCache turned off on the host, group restarted and healthy
    assert res["hicache_off"]["ran"] is True and res["hicache_off"]["ok"] is True
    assert b"enable-hierarchical-cache: false" in incident["live"].read_bytes()
    assert incident["local"].read_bytes() == incident["live"].read_bytes()
    assert _get(incident["url"] + "/server_info")["enable_hierarchical_cache"] is False
    # corruption gone, recorded
    assert res["remeasure"]["passed"] is True and res["remeasure"]["corruption_rate"] == 0
    assert res["record_mitigated"]["ran"] is True and res["record_unresolved"]["ran"] is False
    assert doc["completed"] is True
    md = (incident["runs"] / "r" / "incident.md").read_text()
    assert "hicache_off" in md and "remeasure" in md
    audit = [json.loads(x) for x in (incident["root"] / "audit.jsonl").read_text().splitlines()]
    assert [a["action"] for a in audit] == ["deploy", "hicache-off", "runbook-toolcall-corruption"]
    assert audit[-1]["result"] == "completed" and audit[-1]["run_id"] == doc["run_id"]
