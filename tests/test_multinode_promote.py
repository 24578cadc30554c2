"""Multi-node servers through the promotion gate and a remote HiCache change (issue 25 item 6):
four real sshd hosts, group ``a`` one SGLang server over h0 (node 0) and h1, group ``b`` over h2
and h3 (``--nnodes 2``, TP16), each node started by the deploy launcher as the DSV4 stand-in of
tests/standin (SGLang's multi-node start: node 0 serves HTTP once node 1 joined; a lost node
stalls node 0 until its watchdog ends it, tests/standin/multinode.py), real check smoke/load."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.conftest import REPO, run_cli
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.sshd.promote_world import SHORT_CONTEXT, PromoteWorld

pytestmark = pytest.mark.sshd

HOSTS = ("h0", "h1", "h2", "h3")


@pytest.fixture
def world(live_cluster, tmp_path):
    w = PromoteWorld(live_cluster, tmp_path, nnodes=2, extra=SHORT_CONTEXT)
    yield w
    w.stop_services()


def cli(w: PromoteWorld, *args, timeout=300):
    return run_cli(*args, env=w.env(), timeout=timeout)


def starts(w: PromoteWorld, host: str, group: str) -> list[str]:
    log = w.roots[host] / "logs" / f"{group}.log"
    return [ln.split(" release ")[1].split()[0] for ln in log.read_text().splitlines()
            if ln.startswith(f"=== dsv4ctl start {group} release ")] if log.exists() else []


def test_hicache_off_as_a_release_then_node_1_killed_during_the_promotion_gate(world):
    w = world
    prof = str(w.profile)
    # 1. HiCache on everywhere, a plain deploy: every node of both servers runs r1
    w.hicache(True)
    r = cli(w, "deploy", prof, "--json")
    assert r.code == 0, r.err
    r1 = r.json()["release"]
    assert w.currents() == {h: r1 for h in HOSTS}

    # 2. hicache off on group a is one release on all four hosts; only a's two nodes restart
    r = cli(w, "hicache", "off", prof, "-g", "a", "--remote", "--json")
    assert r.code == 0, r.err
    rep = r.json()
    r2 = rep["release"]
    assert [g["group"] for g in rep["groups"] if g["changed"]] == ["a"] and rep["previous"] == r1 and r2 != r1
    assert w.currents() == {h: r2 for h in HOSTS}
    assert starts(w, "h0", "a") == [r1, r2] and starts(w, "h1", "a") == [r1, r2]
    assert starts(w, "h2", "b") == [r1] and starts(w, "h3", "b") == [r1]
    for h in ("h0", "h1"):
        live = yaml.safe_load((w.roots[h] / "current" / "configs" / "a.yaml").read_text())
        assert live["enable-hierarchical-cache"] is False and live["nnodes"] == 2
    live_b = yaml.safe_load((w.roots["h3"] / "current" / "configs" / "b.yaml").read_text())
    assert live_b["enable-hierarchical-cache"] is True
    assert "all 2 nodes joined" in (w.roots["h0"] / "logs" / "a.log").read_text().split(f"release {r2}")[1]

    # 3. a release through the promotion gate; the canary is the whole server a (h0 and h1); node
    #    1 of a is killed while check load runs: node 0 stalls, then exits on its watchdog; the
    #    gate fails and both nodes of a go back to r2; b's nodes were never switched
    w.extra = {**SHORT_CONTEXT, "max-running-requests": 256}
    w.hicache(False)
    proc = subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", "deploy", "--promote", "--json", "--turns", "400",
                             "--concurrency", "4", prof], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, **w.env()))
    # read stderr unbuffered (a text wrapper's readline would buffer lines the selector cannot see)
    fd, buf = proc.stderr.fileno(), b""
    deadline = time.monotonic() + 120
    while b"check load: dsv4ctl check load" not in buf and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 65536) if ready else b""
        if not chunk:
            break                                      # the deadline holds even when the child is quiet
        buf += chunk
    err = buf.decode()
    assert "check load: dsv4ctl check load" in err, err
    canary = [ln for ln in err.splitlines() if ln.startswith("dsv4ctl: canary:")]
    assert canary and "h0" in canary[0] and "h1" in canary[0] and "h2" not in canary[0], err
    time.sleep(1.0)                                   # the load is running against node 0 of a
    os.killpg(int((w.roots["h1"] / "run" / "a.pid").read_text()), signal.SIGKILL)
    out, rest = proc.communicate(timeout=240)
    err += rest
    assert proc.returncode == 1, err
    r3 = next(x.name for x in (w.cache / "releases").iterdir() if x.name not in (r1, r2) and x.name.startswith("r"))
    assert w.currents() == {h: r2 for h in HOSTS}, err
    assert starts(w, "h0", "a") == [r1, r2, r3, r2] and starts(w, "h1", "a") == [r1, r2, r3, r2]
    assert starts(w, "h2", "b") == [r1] and starts(w, "h3", "b") == [r1]
    a0 = (w.roots["h0"] / "logs" / "a.log").read_text().split(f"release {r3}")[1]
    assert "node 1 lost" in a0 and "Watchdog caught collective operation timeout" in a0
    for h in ("h0", "h1"):
        assert w.state(h)["releases"][r3]["state"] == "failed", w.state(h)["releases"][r3]
    # whether check load saw node 0 stall or find it gone, the verdict names the dead node
    assert f"host h1 group a: the server process of node 1 (of 2) exited" in err, err
    # the server a is whole again on r2: node 0 serves once node 1 re-joined
    from tests.sshd.world import http_status, wait_for
    assert wait_for(lambda: http_status(f"http://{w.hosts[0].address}:{w.ports['a']}/health") == 200, 30)
