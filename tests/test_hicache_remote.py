"""``hicache off/on --remote`` against a real OpenSSH sshd host running the stand-in SGLang server
under the launcher convention (pid file, own process group): backup, atomic write, restart,
/health, audit log; off then on restores the live file byte for byte."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.conftest import run_cli as _run_cli


def run_cli(*args, **kw):
    kw.setdefault("timeout", 400)      # SSH + restart + /health on a loaded 2-core CI runner
    return _run_cli(*args, **kw)
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401  (fixtures)
from tests.standin.harness import free_port, kill_groups
from tests.standin.harness import wait_health as _wait_health

pytestmark = pytest.mark.sshd
SRC = REPO / "profiles" / "dsv4-flash-8xb200-pd"


def _info(url: str) -> dict:
    with urllib.request.urlopen(url + "/server_info", timeout=5) as r:
        return json.load(r)


def _alive(pid: int) -> bool:
    """Running (a zombie child of this test process is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.fixture
def world(live_cluster, tmp_path):
    """Host h0 (sshd on 127.0.0.2) with a deployed-looking root: releases/r1/configs/{prefill,decode}.yaml,
    current -> releases/r1, and the prefill stand-in started like the launcher does."""
    c = live_cluster
    h = c.hosts[0]
    root = tmp_path / "root"
    rel = root / "releases" / "r1" / "configs"
    rel.mkdir(parents=True)
    for g in ("prefill", "decode"):
        (rel / f"{g}.yaml").write_bytes((SRC / f"{g}.yaml").read_bytes())
    os.symlink("releases/r1", root / "current")
    (root / "run").mkdir()
    (root / "logs").mkdir()
    port = free_port()
    local = tmp_path / "local"
    local.mkdir()
    for g in ("prefill", "decode"):
        (local / f"{g}.yaml").write_bytes((SRC / f"{g}.yaml").read_bytes())
    prof = yaml.safe_load((REPO / "profiles" / "dsv4-flash-8xb200-pd.yaml").read_text())
    prof["sglang"]["series"] = None
    prof["hosts"] = [c.host_yaml(h, root, ram_gib=2048)]
    for g in prof["groups"]:
        g["host"] = h.name
        if g["name"] in ("prefill", "decode"):
            g["serve_config"] = f"local/{g['name']}.yaml"
            g["port"] = port if g["name"] == "prefill" else free_port()
    pfile = tmp_path / "p.yaml"
    pfile.write_text(yaml.safe_dump(prof, sort_keys=False))
    cmd = [sys.executable, "-m", "tests.standin.server", "--config", str(root / "current" / "configs" / "prefill.yaml"),
           "--host", h.address, "--port", str(port)]
    log = open(root / "logs" / "prefill.log", "ab")
    proc = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    pidfile = root / "run" / "prefill.pid"
    pidfile.write_text(str(proc.pid))
    started = {proc.pid}
    try:
        url = f"http://{h.address}:{port}"
        _wait_health(url, timeout=90)
        w = dict(profile=pfile, root=root, live=root / "current" / "configs" / "prefill.yaml", url=url,
                 local=local / "prefill.yaml", pidfile=pidfile, host=h, proc=proc, started=started)
        yield w
    finally:
        # every stand-in this test started: the first one and each one a restart wrote to the pid file
        if pidfile.exists() and pidfile.read_text().strip():
            started.add(int(pidfile.read_text()))
        for line in (root / "audit.jsonl").read_text().splitlines() if (root / "audit.jsonl").exists() else []:
            pid = ((json.loads(line).get("restart") or {}).get("new_pid"))
            if pid:
                started.add(pid)
        kill_groups(started)
        proc.wait(timeout=30)
        log.close()


def _audit(root: Path) -> list[dict]:
    p = root / "audit.jsonl"
    return [json.loads(l) for l in p.read_text().splitlines()] if p.exists() else []


def test_remote_off_then_on_restores_bytes_and_restarts(world):
    orig = world["live"].read_bytes()
    pid0 = int(world["pidfile"].read_text())
    assert _info(world["url"])["enable_hierarchical_cache"] is True

    r = run_cli("hicache", "off", str(world["profile"]), "-g", "prefill", "--remote", "--dry-run")
    assert r.code == 0, r.err
    assert f"dry run: h0: back up {world['live']}" in r.out
    assert "dry run: h0: restart group prefill" in r.out
    assert world["live"].read_bytes() == orig and int(world["pidfile"].read_text()) == pid0

    r = run_cli("hicache", "off", str(world["profile"]), "-g", "prefill", "--remote", "--health-timeout", "120")
    assert r.code == 0, (r.out, r.err)
    assert "-enable-hierarchical-cache: true\n+enable-hierarchical-cache: false\n" in r.out
    assert f"h0: prefill: wrote {world['live']}" in r.out and "restarted (launcher), healthy" in r.out
    assert world["live"].read_bytes() == orig.replace(b"enable-hierarchical-cache: true", b"enable-hierarchical-cache: false")
    assert world["local"].read_bytes() == world["live"].read_bytes()        # the profile copy follows
    pid1 = int(world["pidfile"].read_text())
    assert pid1 != pid0 and not _alive(pid0) and _alive(pid1)
    assert _info(world["url"])["enable_hierarchical_cache"] is False
    (rec,) = _audit(world["root"])
    assert rec["action"] == "hicache-off" and rec["group"] == "prefill" and rec["host"] == "h0"
    assert rec["result"] == "ok" and rec["healthy"] is True and rec["ts"].endswith("Z")
    assert rec["sha256_before"] == hashlib.sha256(orig).hexdigest()
    assert rec["restart"] == {"how": "launcher", "old_pid": pid0, "new_pid": pid1}
    assert Path(rec["backup"]).read_bytes() == orig
    assert "=== dsv4ctl restart prefill (hicache)" in (world["root"] / "logs" / "prefill.log").read_text()
    r = run_cli("hicache", "status", str(world["profile"]), "-g", "prefill", "--remote", "--json")
    assert r.code == 0, r.err
    (st,) = r.json()["groups"]
    assert st["file"] == f"h0:{world['live']}" and st["match"] is True
    assert st["file_says"]["enable_hierarchical_cache"] is False and st["server_says"]["enable_hierarchical_cache"] is False

    r = run_cli("hicache", "on", str(world["profile"]), "-g", "prefill", "--remote", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["remote"] is True and doc["groups"][0]["written"] is True and doc["groups"][0]["healthy"] is True
    assert world["live"].read_bytes() == orig                               # byte for byte
    assert world["local"].read_bytes() == orig
    pid2 = int(world["pidfile"].read_text())
    assert pid2 not in (pid0, pid1) and not _alive(pid1)
    assert _info(world["url"])["enable_hierarchical_cache"] is True
    assert [a["action"] for a in _audit(world["root"])] == ["hicache-off", "hicache-on"]


def test_remote_unhealthy_group_is_rolled_back(world, tmp_path):
    orig = world["live"].read_bytes()
    prof = yaml.safe_load(world["profile"].read_text())
    for g in prof["groups"]:
        if g["name"] == "prefill":
            g["port"] = free_port()          # nothing answers there: /health never 200
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(prof, sort_keys=False))
    (tmp_path / "local").mkdir(exist_ok=True)
    pid0 = int(world["pidfile"].read_text())
    r = run_cli("hicache", "off", str(bad), "-g", "prefill", "--remote", "--health-timeout", "2")
    assert r.code == 1, (r.out, r.err)
    assert "not healthy after the health timeout of 2 s" in r.err and "old file was restored" in r.err
    assert world["live"].read_bytes() == orig
    assert world["local"].read_bytes() == orig                              # local copy untouched
    pid2 = int(world["pidfile"].read_text())
    assert pid2 != pid0 and _alive(pid2)                                    # restarted twice, running the old file
    _wait_health(world["url"], timeout=90)
    assert _info(world["url"])["enable_hierarchical_cache"] is True
    (rec,) = _audit(world["root"])
    assert rec["result"] == "rolled-back" and rec["healthy"] is False and "not healthy after the health timeout of 2 s" in rec["detail"]


def test_remote_group_not_running_exit_3_file_restored(world):
    orig = world["live"].read_bytes()
    pid0 = int(world["pidfile"].read_text())
    os.killpg(pid0, 9)
    world["proc"].wait(timeout=10)
    world["pidfile"].unlink()
    r = run_cli("hicache", "off", str(world["profile"]), "-g", "prefill", "--remote", "--health-timeout", "2")
    assert r.code == 3, (r.out, r.err)
    assert "restart prefill: group prefill is not running under dsv4ctl here" in r.err
    assert world["live"].read_bytes() == orig and world["local"].read_bytes() == orig
    (rec,) = _audit(world["root"])
    assert (rec["result"], rec["detail"]) == ("failed", "old file restored")
    world["pidfile"].write_text(str(pid0))


def test_remote_missing_live_file_exit_2(world):
    world["live"].unlink()
    r = run_cli("hicache", "off", str(world["profile"]), "-g", "prefill", "--remote")
    assert r.code == 2 and r.err.strip().endswith("no such file on the host (deploy a release first)")


def test_remote_refuses_while_a_deploy_holds_the_lock(world):
    orig = world["live"].read_bytes()
    (world["root"] / ".lock").mkdir()
    (world["root"] / ".lock" / "holder.json").write_text('{"who": "ops@box", "what": "deploy"}')
    r = run_cli("hicache", "off", str(world["profile"]), "-g", "prefill", "--remote")
    assert r.code == 3 and "/.lock held by ops@box (deploy, pid ?, since ?); try again when it is done" in r.err
    assert world["live"].read_bytes() == orig and not (world["root"] / "audit.jsonl").exists()
