"""A newcomer's first hour (issue 31 item 4), as one test: every command the README walks a new
operator through, in order, each with the exit code the README and ``--help`` document.

    profile init -> plan -> (edit the profile for the real hosts) -> facts --write -> deploy
    -> check load -> promote -> hicache off --remote -> rollback -> lock -> exec, limited deploys
    -> stop/status/start -> report

Real parts: one real OpenSSH sshd host (127.0.W.2, throwaway keys, known_hosts verified), real
rsync and git, the release launcher, real HTTP. Stand-ins, for what cannot run here (no GPU):
``nvidia-smi`` prints eight idle B200 rows (tests/sshd/gpuhost.py), the SGLang servers are the
DeepSeek-V4 stand-in (tests/standin: SGLang's real output path), the router the sshd stand-in
router, and the SGLang tree is a small git tree tagged v0.5.23 (tests/sshd/world.py; it cannot take
the real patch series, so the operator's edit sets ``series: null`` and, as a stock tree stores
the index-K in fp8, ``index_k_dtype: fp8``: with bf16 and HiCache on, ``config lint`` asks the tree
whether its index-K reads wait for HiCache's layer loads, and this tree has no SGLang sources). The operator's edits are
the ones the README asks for (hosts, tree, deploy root) plus the launch commands of the stand-ins
and free ports, made as text edits that keep every comment, as in an editor."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys

import pytest
import yaml

from tests.conftest import run_cli
from tests.sshd.gpuhost import idle_gpus, start_gpu_cluster
from tests.sshd.harness import free_port
from tests.sshd.world import REPO, STANDIN as ROUTER_STANDIN, http_status, make_tree

pytestmark = pytest.mark.sshd

SERVER = (f"env PYTHONPATH={REPO} {{python}} -m tests.standin.server --config {{config}} --host {{address}} "
          f"--port {{port}} --ttft-ms 2 --itl-ms 0")
B200_MIB, B200_FREE_MIB = 183359, 181760       # nvidia-smi memory.total / memory.free of an idle B200 (stand-in)


@pytest.fixture
def host(tmp_path):
    from tests.sshd import harness
    why = harness.available()
    if why:
        pytest.skip(why)
    c, bin_ = start_gpu_cluster(tmp_path / "hosts")
    idle_gpus(bin_, "NVIDIA B200", 8, B200_MIB, B200_FREE_MIB)
    yield c
    c.stop()


def replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def test_first_hour(tmp_path, host):
    h = host.hosts[0]
    env = {"DSV4CTL_CACHE": str(tmp_path / "cache"), "DSV4CTL_STATE_DIR": str(tmp_path / "state")}
    prof = tmp_path / "ops" / "prod.yaml"
    prof.parent.mkdir()
    root = tmp_path / "srv"

    def cli(*args, timeout=300):
        return run_cli(*args, env=env, timeout=timeout)

    try:
        # 1. a profile of one's own, from the shipped one (the README's first command)
        r = cli("profile", "init", str(prof))
        assert r.code == 0, r.err
        assert (prof.parent / "prod" / "prefill.yaml").is_file() and (prof.parent / "prod" / "decode.yaml").is_file()
        assert str(REPO) not in prof.read_text()          # portable: no path of this installation in it

        # 2. plan it: ok (both groups tight: SGLang's activation heuristic), exit 0
        r = cli("plan", str(prof), "--json")
        assert r.code == 0, r.err
        (tmp_path / "plan.json").write_text(r.out)
        assert r.json()["ok"] is True
        assert {g["name"]: g["verdict"]["level"] for g in r.json()["groups"]} == {"prefill": "tight", "decode": "tight"}

        # 3. the operator's edits: the real host, the SGLang tree, where releases go; here also how
        #    the stand-ins start and free ports (the shipped 30000/30001/8998/8000 may be taken)
        tree = make_tree(tmp_path / "sglang", files=8)
        ports = {k: free_port(h.address) for k in ("prefill", "decode", "bootstrap", "router")}
        text = prof.read_text()
        text = replace_once(text, "    address: 127.0.0.1 ", f"    address: {h.address} ")
        text = replace_once(text, "    ssh: {user: sglang, port: 22, key: ~/.ssh/id_ed25519}",
                            f"    ssh: {{user: {host.user}, port: {h.port}, key: {host.user_key}, "
                            f"known_hosts: {host.known_hosts}}}")
        text = replace_once(text, "  tree: null ", f"  tree: {tree} ")
        text = re.sub(r"(?m)^  series: \S+", "  series: null", text)
        text = re.sub(r"(?m)^  index_k_dtype: bf16", "  index_k_dtype: fp8", text)     # a stock tree: fp8
        text = replace_once(text, "  root: /srv/dsv4ctl", f"  root: {root}\n  python: {sys.executable}\n"
                            f"  launch:\n    server: \"{SERVER}\"\n"
                            f"    router: \"{ROUTER_STANDIN} --host {{address}} --port {{port}} --router "
                            f"http://{h.address}:{ports['decode']}\"")
        text = replace_once(text, "  health_timeout_s: 900", "  health_timeout_s: 60")
        text = replace_once(text, "  concurrency: 64", "  concurrency: 16\n  turns: 2")
        text = replace_once(text, "    port: 8000", f"    port: {ports['router']}")
        prof.write_text(text)
        for g, shipped_port in (("prefill", 30000), ("decode", 30001)):
            cfg = prof.parent / "prod" / f"{g}.yaml"
            t = replace_once(cfg.read_text(), f"\nport: {shipped_port}\n", f"\nport: {ports[g]}\n")
            cfg.write_text(replace_once(t, "disaggregation-bootstrap-port: 8998", f"disaggregation-bootstrap-port: {ports['bootstrap']}"))
        r = cli("config", "lint", str(prof))
        assert r.code == 0, r.out + r.err

        # 4. measure the GPUs and write what was measured into the profile
        r = cli("facts", str(prof), "--write", "--json")
        assert r.code == 0, r.err
        assert r.json()["written"] == ["prefill", "decode"]
        measured = round(B200_FREE_MIB / 1024 - 1.0, 3)
        assert "# measured by dsv4ctl facts" in prof.read_text()
        mem = [g["memory"]["free_gib_before_load"] for g in yaml.safe_load(prof.read_text())["groups"][:2]]
        assert all(len(m) == 4 and abs(m[0] - measured) < 1.5 for m in mem), mem

        # 5. the first deploy: a release, pushed, switched, started, health-gated
        r = cli("deploy", str(prof), "--json")
        assert r.code == 0, r.err
        first = r.json()["release"]
        assert http_status(f"http://{h.address}:{ports['router']}/health") == 200

        # 6. the load check through the router, at the profile's gate
        r = cli("check", "load", "-p", str(prof), "--json", "--turns", "2", "-c", "16", timeout=600)
        assert r.code == 0, r.err
        (tmp_path / "load.json").write_text(r.out)
        assert r.json()["pass"] is True and [lv["concurrency"] for lv in r.json()["levels"]] == [16]

        # 7. promote the release by hand: smoke + the profile's load gate, evidence kept
        r = cli("promote", first, str(prof), "--json", timeout=600)
        assert r.code == 0, r.err
        st = json.loads((root / "state.json").read_text())
        assert st["releases"][first]["state"] == "good"

        # 8. HiCache off on the running deployment: a new release with the edited serve configs,
        #    with a reason; releases says what that release changed
        r = cli("hicache", "off", str(prof), "--remote", "-m", "KV pressure test")
        assert r.code == 0, r.err
        changed = (root / "current").resolve().name
        assert changed != first
        assert "enable-hierarchical-cache: false" in (prof.parent / "prod" / "prefill.yaml").read_text()
        undo = [ln for ln in r.out.splitlines() if ln.startswith(f"released {changed} (from {first})")]
        assert len(undo) == 1 and undo[0].endswith(f"dsv4ctl rollback {prof} --to {first} undoes it"), r.out
        heads = [ln for ln in r.out.splitlines() if ln.startswith(("--- ", "+++ "))]
        assert len(heads) == 2 and all(ln.endswith(f"({first})" if ln[0] == "-" else f"({changed})") for ln in heads)
        r = cli("releases", str(prof))
        row = next(ln for ln in r.out.splitlines() if changed in ln)
        assert r.code == 0 and "hicache-off prefill,decode (from " in row and '"KV pressure test"' in row, r.out

        # 9. the undo hint, as printed, in the profile's folder: back on the promoted release
        argv = shlex.split(undo[0][undo[0].index("dsv4ctl rollback "):-len(" undoes it")])
        assert argv[0] == "dsv4ctl"
        r = run_cli(*argv[1:], env=env, cwd=prof.parent, timeout=300)
        assert r.code == 0, r.err
        assert (root / "current").resolve().name == first
        assert json.loads((root / "state.json").read_text())["releases"][first]["state"] == "good"
        assert http_status(f"http://{h.address}:{ports['router']}/health") == 200

        # 9b. a lock taken by hand: the deploy it refuses prints the release hint, which works as typed
        r = cli("lock", "acquire", str(prof), "-m", "disk swap")
        assert r.code == 0, r.err
        r = cli("restart", str(prof), "--break-lock")
        assert r.code == 3 and f"dsv4ctl lock release {prof} when the work it names is done" in r.err, r.err
        r = run_cli("lock", "release", str(prof), "-m", "swap done", env=env, cwd=prof.parent)
        assert r.code == 0 and "released the lock" in r.out, r.err
        assert not (root / ".lock").exists()

        # 9c. one command on the decode group's host, in its release; a limited deploy: this host runs
        #     every group, so -g decode alone is refused and --host lists that host's steps
        name = yaml.safe_load(prof.read_text())["hosts"][0]["name"]
        r = cli("exec", "decode", str(prof), "-m", "where", "--", 'pwd -P; echo "$DSV4CTL_RELEASE"')
        assert r.code == 0 and r.out.splitlines() == [f"{name}: {root.resolve()}/releases/{first}", f"{name}: {first}"], \
            r.out + r.err
        r = cli("deploy", str(prof), "-g", "decode", "--dry-run")
        assert r.code == 2 and f"host {name} also runs prefill, router" in r.err, r.err
        r = cli("deploy", str(prof), "--host", name, "--dry-run")
        assert r.code == 0 and f"only (--host {name}) (nothing changed)" in r.out.splitlines()[0], r.out + r.err

        # 9d. the decode group stopped on purpose is "stopped" (by whom, when, why: from the audit),
        #     not a crash; started again it is "running" with its pid, port, uptime and restarts
        r = cli("stop", str(prof), "-g", "decode", "-m", "disk swap")
        assert r.code == 0, r.err
        r = cli("status", str(prof), "--json")
        g = r.json()["hosts"][name]["groups"]["decode"]
        assert (g["state"], g["alive"], g["pid"], g["stopped"]["message"]) == ("stopped", False, None, "disk swap"), g
        assert g["state_detail"].startswith("stopped by ") and "crashed" not in r.err, r.err
        r = cli("status", str(prof))
        assert f"{name}/decode: stopped: stopped by " in r.out and '("disk swap")' in r.out, r.out
        r = cli("start", str(prof), "-g", "decode", "-m", "swap done")
        assert r.code == 0, r.err
        r = cli("status", str(prof), "--json")
        assert r.code == 0, r.err
        g = r.json()["hosts"][name]["groups"]["decode"]
        pid = int((root / "run" / "decode.pid").read_text())
        assert (g["state"], g["pid"], g["port"], g["stopped"]) == ("running", pid, ports["decode"], None), g
        assert g["restarts"] >= 1 and 0 <= g["uptime_s"] < 300, g

        # 10. one HTML report of the plan and the load check
        out = tmp_path / "report.html"
        r = cli("report", str(tmp_path / "plan.json"), str(tmp_path / "load.json"), "-o", str(out))
        assert r.code == 0, r.err
        html = out.read_text()
        assert "<svg" in html and "tight" in html
    finally:                          # the servers the launcher started, whatever step failed
        for pf in (root / "run").glob("*.pid") if (root / "run").exists() else []:
            try:
                os.killpg(int(pf.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError, PermissionError):
                pass
