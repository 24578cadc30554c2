"""The systemd service backend for real: systemd 252 as PID 1 of a private namespace
(tests/systemd/namespace.py) with a real sshd inside, deployed to with ``deploy.service: systemd``
(start, in-place restart, stop, health gate, gate failure with rollback, ``dsv4ctl logs``), and
the ``$``/``%`` quoting of the unit (pure, and end to end under that systemd).

Skipped, with the kernel's or the machine's reason, only where the namespace cannot be made."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dsv4ctl.hosts.layout import Paths
from dsv4ctl.hosts.service import Launcher, Systemd, group_script, systemd_quote
from tests.conftest import run_cli
from tests.sshd.world import MEMORY, STANDIN, http_status, make_patch, make_tree, wait_for


#: What a launch command prints first (then it starts the stand-in): ``$$``, ``$VAR``, an
#: escaped ``\$``, ``%`` specifiers systemd would expand (``%n`` unit name, ``%s`` shell, ``%%``),
#: both quotes, a backslash and a tab.
TRICKY = ("printf '%s|%s|%s\\n' \"marker pid=$$ var=[$DSV4_UNSET_VAR] lit=\\$x\" "
          "\"spec=%n %s %% 50%\" \"q='s' dq=\\\"d\\\" bs=a\\\\b tab=\tend\"")


# -- pure ------------------------------------------------------------------------------------

def test_systemd_quote_escapes_dollar_percent_quotes_and_newlines():
    assert systemd_quote("echo $$ 50%") == '"echo $$$$ 50%%"'
    assert systemd_quote("a $HOME %n") == '"a $$HOME %%n"'
    assert systemd_quote('say "hi" \\ there') == '"say \\"hi\\" \\\\ there"'
    assert systemd_quote("one\ntwo\tthree\x01") == '"one\\ntwo\\tthree\\x01"'
    assert systemd_quote("K=$v 5%", dollar=False) == '"K=$v 5%%"'   # Environment=: no $ expansion there
    assert "\n" not in systemd_quote(group_script("g", "a\nb"))


def test_both_backends_run_the_same_group_script():
    p = Paths("/srv/d")
    cmd = "echo $$ 50% 'x'"
    unit = Systemd().unit_text(p, "decode", "r1", cmd, {"A": "x$y%z"})
    exec_line = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    assert exec_line == "ExecStart=/bin/sh -c " + systemd_quote(group_script("decode", cmd))
    assert 'Environment="A=x$y%%z"' in unit
    from dsv4ctl.remote import q
    assert q(group_script("decode", cmd)) in Launcher().start_cmd(p, "decode", "r1", cmd, {})
    pct = Systemd().unit_text(Paths("/srv/50%"), "decode", "r1", "x", {})
    assert "WorkingDirectory=/srv/50%%/releases/r1" in pct and "append:/srv/50%%/logs/decode.log" in pct


# -- the namespace ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sysd(tmp_path_factory):
    """One booted systemd namespace (with its sshd) for the module; always torn down."""
    from tests.systemd.namespace import Refused, booted
    base = tmp_path_factory.mktemp("systemd")
    try:
        cm = booted(base)
        b = cm.__enter__()
    except Refused as e:
        pytest.skip(f"systemd in a namespace: {e}")
    try:
        yield b
    finally:
        cm.__exit__(None, None, None)


class SysWorld:
    """One host ``s0`` (the sshd inside the systemd namespace) running prefill, decode and the
    router, ``deploy.service: systemd``; files under ``base`` (visible inside at the same path)."""

    def __init__(self, b, base: Path):
        from tests.sshd.harness import free_port
        self.b, self.base = b, base
        self.h = b.host
        self.root = base / "root"
        self.tree = make_tree(base / "sglang", files=5)
        self.patch = make_patch(self.tree, base / "0001-index-k.patch")
        self.cfgdir = base / "profile"
        self.cfgdir.mkdir()
        self.ports = {g: free_port(self.h.address) for g in ("prefill", "decode", "router")}
        self.extra: dict = {"prefill": {}, "decode": {}}
        self.server_prefix = ""
        self.service = "systemd"
        self.groups = ("prefill", "decode", "router")
        self.profile = self.cfgdir / "profile.yaml"
        self.write()

    def write(self) -> None:
        for g in ("prefill", "decode"):
            cfg = {"model-path": "deepseek-ai/DeepSeek-V4-Flash", "served-model-name": "deepseek-v4-flash",
                   "host": "0.0.0.0", "port": self.ports[g], "tp-size": 1, "disaggregation-mode": g,
                   "disaggregation-bootstrap-port": 8998, "reasoning-parser": "deepseek-v4",
                   "tool-call-parser": "deepseekv4", **({"base-gpu-id": 1} if g == "decode" else {}),
                   **self.extra[g]}      # decode runs on GPU 1 of the host, as the profile says
            (self.cfgdir / f"{g}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        a = self.h.address
        groups = [{"name": "prefill", "role": "prefill", "host": "s0", "gpus": [0], "tp": 1,
                   "serve_config": "prefill.yaml", "memory": MEMORY},
                  {"name": "decode", "role": "decode", "host": "s0", "gpus": [1], "tp": 1,
                   "serve_config": "decode.yaml", "memory": MEMORY},
                  {"name": "router", "role": "router", "host": "s0", "port": self.ports["router"],
                   "prefill": ["prefill"], "decode": ["decode"]}]
        prof = {
            "version": 1, "name": "systemd-test", "model": "deepseek-v4-flash",
            "sglang": {"version": "0.5.23", "tree": str(self.tree), "base_ref": "v0.5.23", "series": None},
            "deploy": {"root": "/nonexistent", "keep_releases": 3, "service": self.service, "health_timeout_s": 20,
                       "python": sys.executable,
                       "launch": {"server": self.server_prefix + STANDIN + " --config {config} --host {address} --port {port}",
                                  "router": STANDIN + f" --host {{address}} --port {{port}} --router http://{a}:{self.ports['decode']}"}},
            "hosts": [self.b.cluster.host_yaml(self.h, self.root)],
            "groups": [g for g in groups if g["name"] in self.groups],
        }
        self.profile.write_text(yaml.safe_dump(prof, sort_keys=False))

    def cli(self, *args, timeout=180):
        return run_cli(*args, str(self.profile), env={"DSV4CTL_CACHE": str(self.base / "cache"),
                                                      "DSV4CTL_STATE_DIR": str(self.base / "state")}, timeout=timeout)

    def deploy_ok(self, *extra) -> str:
        r = self.cli("deploy", "--json", *extra)
        assert r.code == 0, r.err + self.console()
        return r.json()["release"]

    def current(self) -> str | None:
        p = self.root / "current"
        return p.resolve().name if p.is_symlink() else None

    def systemctl(self, *args) -> str:
        return self.b.run("systemctl", *args).stdout.strip()

    def unit(self, g: str, prop: str) -> str:
        return self.systemctl("show", "-p", prop, "--value", f"dsv4ctl-{g}.service")

    def main_pid(self, g: str) -> int:
        return int(self.unit(g, "MainPID") or 0)

    def serving(self) -> bool:
        return all(http_status(f"http://{self.h.address}:{self.ports[g]}/health") == 200 for g in ("prefill", "decode"))

    def console(self) -> str:
        return "\n--- systemd console:\n" + self.b.console.read_text()[-1500:]

    def launcher_pid(self, g: str) -> int:
        f = self.root / "run" / f"{g}.pid"
        return int(f.read_text()) if f.exists() else 0

    def running(self, pid: int) -> bool:
        """``pid`` (of the namespace) is a live process (not a zombie)."""
        try:
            return pid > 0 and self.b.path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
        except (OSError, IndexError):
            return False

    def stop_all(self) -> None:
        for g in ("prefill", "decode", "router"):
            self.b.run("systemctl", "stop", f"dsv4ctl-{g}.service")
            pid = self.launcher_pid(g)
            if pid:
                self.b.run("kill", "-KILL", f"-{pid}")


@pytest.fixture
def world(sysd, request):
    # under the namespace's base folder: the one folder of this machine's /tmp visible inside
    w = SysWorld(sysd, sysd.cluster.base / request.node.name[5:40])
    yield w
    w.stop_all()


@pytest.mark.sshd
@pytest.mark.systemd
def test_deploy_restart_stop_and_logs_under_real_systemd(world):
    w = world
    r = w.cli("deploy", "--dry-run", "--verbose")
    assert r.code == 0 and "start decode, prefill, router (systemd)" in r.out, r.out + r.err
    rid = w.deploy_ok()
    assert w.current() == rid and json.loads((w.root / "state.json").read_text())["releases"][rid]["state"] == "active"
    for g in w.groups:
        assert w.unit(g, "ActiveState") == "active", w.systemctl("status", f"dsv4ctl-{g}.service")
        assert w.unit(g, "WorkingDirectory") == str(w.root / "releases" / rid)
        # a child of the namespace's systemd, in the unit's own cgroup
        assert w.b.run("cat", f"/proc/{w.main_pid(g)}/cgroup").stdout.strip().endswith(f"/system.slice/dsv4ctl-{g}.service")
    assert w.serving()
    st = w.cli("status", "--json")
    assert st.code == 0, st.err
    groups = st.json()["hosts"]["s0"]["groups"]
    assert {g: (d["alive"], d["health"]) for g, d in groups.items()} == {g: (True, "ok") for g in w.groups}

    # logs: what systemd appended for the unit, read by dsv4ctl logs
    r = w.cli("logs", "decode", "-n", "20")
    assert r.code == 0, r.err
    assert f"s0: === dsv4ctl start decode release {rid} at " in r.out
    assert "stand-in" in r.out.lower() or "listening" in r.out.lower() or "running on" in r.out.lower(), r.out

    # in-place restart (hicache --remote, runbook service.restart): systemctl restart of the unit
    from dsv4ctl.hosts.service import run_restart
    from dsv4ctl.profile.model import load_profile
    from dsv4ctl.remote import connect
    prof = load_profile(w.profile)
    t = connect(prof.hosts["s0"], hosts=prof.hosts)
    try:
        old = w.main_pid("decode")
        info = run_restart(t, sys.executable, str(w.root), "decode", stop_timeout=10)
    finally:
        t.close()
    assert info["how"] == "systemd" and info["unit"] == "dsv4ctl-decode.service"
    assert info["old_pid"] == old and info["new_pid"] == w.main_pid("decode") != old
    assert wait_for(w.serving, timeout=30)
    assert "=== dsv4ctl restart decode (hicache) at " in (w.root / "logs" / "decode.log").read_text()

    # a new release: the old units are stopped and started again from the new release folder
    pids = {g: w.main_pid(g) for g in w.groups}
    rid2 = w.deploy_ok("--patch", str(w.patch))
    assert rid2 != rid and w.current() == rid2
    for g in w.groups:
        assert w.unit(g, "WorkingDirectory") == str(w.root / "releases" / rid2)
        assert w.main_pid(g) not in (0, pids[g]) and not w.b.path(f"/proc/{pids[g]}").exists()
    assert w.serving()

    # stop: a release without the router stops its unit (and the router's port closes)
    w.groups = ("prefill", "decode")
    w.write()
    w.deploy_ok("--no-preflight")
    assert w.unit("router", "ActiveState") == "inactive" and w.main_pid("router") == 0
    assert http_status(f"http://{w.h.address}:{w.ports['router']}/v1/models") == 0
    assert w.unit("decode", "ActiveState") == "active" and w.serving()


@pytest.mark.sshd
@pytest.mark.systemd
def test_gate_failure_rolls_back_under_real_systemd(world):
    w = world
    good = w.deploy_ok()
    w.extra["decode"] = {"standin-crash": "CUDA out of memory. Tried to allocate 2.00 GiB"}
    w.write()
    r = w.cli("deploy", "--no-preflight")   # a stand-in control key: lint would refuse it
    assert r.code == 1, r.err + w.console()
    err = r.err.strip().splitlines()[-1]
    assert f"rolled back to {good} on all hosts" in err and "host s0 group decode: server process exited" in err
    assert "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB" in err
    assert "=== dsv4ctl: decode exited with status 1" in (w.root / "logs" / "decode.log").read_text()
    bad = err.split("deploy of ")[1].split()[0]
    assert w.current() == good and json.loads((w.root / "state.json").read_text())["releases"][bad]["state"] == "failed"
    for g in w.groups:
        assert w.unit(g, "ActiveState") == "active" and w.unit(g, "WorkingDirectory") == str(w.root / "releases" / good)
    assert w.serving()
    # never healthy: the gate times out, the old release runs again
    w.extra["decode"] = {"standin-never-healthy": True}
    w.write()
    r = w.cli("deploy", "--health-timeout", "3", "--no-preflight")
    assert r.code == 1 and "host s0 group decode: not healthy after the health timeout of 3 s" in r.err, r.err
    assert w.current() == good and w.serving()
    assert w.unit("decode", "WorkingDirectory") == str(w.root / "releases" / good)


@pytest.mark.sshd
@pytest.mark.systemd
def test_dollar_and_percent_reach_sh_as_under_the_launcher(world):
    """A launch command with ``$$``, ``$VAR``, ``%`` specifiers, quotes, a backslash and a tab
    prints under systemd what ``sh -c`` prints for it (the launcher's semantics): read back with
    ``dsv4ctl logs``."""
    w = world
    w.server_prefix = TRICKY + "; "
    w.groups = ("prefill", "decode")
    w.write()
    w.deploy_ok("--no-preflight")
    r = w.cli("logs", "decode", "--grep", "marker")
    assert r.code == 0, r.err
    got = [ln.split(": ", 1)[1] for ln in r.out.splitlines() if "marker" in ln]
    want = subprocess.run(["sh", "-c", TRICKY], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}).stdout
    want_line = want.splitlines()[0]
    assert len(got) == 1, r.out
    pid = w.main_pid("decode")
    # $$ is the shell's pid (the unit's main process), nothing else differs
    assert re.sub(r"pid=\d+", "pid=N", got[0]) == re.sub(r"pid=\d+", "pid=N", want_line), (got[0], want_line)
    assert f"pid={pid} " in got[0]
    assert "spec=%n %s %% 50%" in got[0] and "lit=$x" in got[0] and "var=[] " in got[0] and "bs=a\\b" in got[0]


@pytest.mark.sshd
@pytest.mark.systemd
@pytest.mark.parametrize("first,then", [("launcher", "systemd"), ("systemd", "launcher")])
def test_backend_switch_stops_old_servers(world, first, then):
    """``deploy.service`` changes between two deploys on a host running systemd: the switch stops
    the groups the old backend runs (launcher pid file process groups, or the units) before the
    new backend starts them. Before: the old backend's servers kept running next to the new
    ones (holding their GPUs and ports), in both directions."""
    w = world
    w.service = first
    w.write()
    w.deploy_ok()
    assert w.serving()
    old = {g: w.launcher_pid(g) if first == "launcher" else w.main_pid(g) for g in w.groups}
    assert all(w.running(pid) for pid in old.values()), old
    w.service = then
    w.write()
    rid2 = w.deploy_ok("--patch", str(w.patch))
    assert w.current() == rid2
    for g in w.groups:
        assert not w.running(old[g]), f"{g}: the {first} backend's server {old[g]} still runs"
        if then == "systemd":
            assert w.unit(g, "ActiveState") == "active" and w.unit(g, "WorkingDirectory") == str(w.root / "releases" / rid2)
            assert not (w.root / "run" / f"{g}.pid").exists()
        else:
            assert w.unit(g, "ActiveState") in ("inactive", "failed") and w.main_pid(g) == 0
            assert w.running(w.launcher_pid(g))
            assert os.readlink(w.b.path(f"/proc/{w.launcher_pid(g)}/cwd")) == str(w.root / "releases" / rid2)
    assert w.serving()
