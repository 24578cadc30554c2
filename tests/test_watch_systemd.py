"""``dsv4ctl watch`` as the systemd service it prints, under real systemd: systemd 252 as PID 1 of
a private namespace (tests/systemd/namespace.py) runs the unit that ``dsv4ctl watch PROFILE
--print unit --listen … --no-releases --interval 1s`` writes, installed as its own comment says
(``> /etc/systemd/system/dsv4ctl-watch@NAME.service``, ``daemon-reload``, ``enable --now``),
against a stand-in SGLang server on this worker's loopback address (the namespace shares this
machine's network). Checked: ``systemd-analyze verify`` accepts the unit; it becomes active and
its /metrics counts probes; ``systemctl stop`` ends it cleanly (SIGTERM → exit 0: result
success, not a kill); ``Restart=on-failure`` starts it again after ``kill -9`` of its main PID.

Skipped, with the kernel's or the machine's reason, only where the namespace cannot be made."""

from __future__ import annotations

import re
import shutil
import time
import urllib.request

import pytest

from tests.conftest import loopback, run_cli
from tests.standin.harness import free_port
from tests.test_watch import _metrics, _profile, _standin, _stop

PROBES = "dsv4ctl_watch_probes_total{release=unknown,role=colocated,target=one}"


@pytest.fixture(scope="module")
def sysd(tmp_path_factory):
    """One booted systemd namespace (its sshd on this worker's loopback address); always torn down."""
    from tests.systemd.namespace import Refused, booted
    base = tmp_path_factory.mktemp("watch-systemd")
    try:
        cm = booted(base, address=loopback(40))
        b = cm.__enter__()
    except Refused as e:
        pytest.skip(f"systemd in a namespace: {e}")
    try:
        yield b
    finally:
        cm.__exit__(None, None, None)


def _wait(pred, timeout: float, what: str, b=None):
    """Poll ``pred`` until it returns something true; AssertionError naming ``what`` (and systemd's
    console output) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            tail = "\n--- systemd console:\n" + b.console.read_text()[-2000:] if b is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{tail}")
        time.sleep(0.1)


def _probes(url: str) -> float:
    try:
        return _metrics(url).get(PROBES, 0.0)
    except OSError:
        return 0.0


def _closed(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).close()
    except OSError:
        return True
    return False


@pytest.mark.sshd
@pytest.mark.systemd
def test_printed_unit_runs_stops_cleanly_and_restarts_on_failure_under_real_systemd(sysd):
    b = sysd
    base = b.cluster.base / "watch"          # under the namespace's base folder: visible inside
    base.mkdir()
    addr = loopback(41)
    port, mport = free_port(), free_port()
    p = _profile(base, """\
        - {name: one, role: colocated, host: local, gpus: [0, 1, 2, 3, 4, 5, 6, 7], tp: 8, serve_config: c.yaml}
        """, port=port, address=addr)
    murl = f"http://{addr}:{mport}/metrics"

    r = run_cli("watch", str(p), "--print", "unit", "--listen", f"{addr}:{mport}", "--no-releases",
                "--interval", "1s")
    assert r.code == 0, r.err
    unit = r.out
    exec_start = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    assert exec_start.endswith(f"-m dsv4ctl watch {p} --interval 1s --listen {addr}:{mport} --no-releases"), exec_start
    # installed exactly as the unit's own comment says
    m = re.search(r"> (/etc/systemd/system/(dsv4ctl-watch@p\.service))\n", unit)
    assert m, unit
    path, name = m.group(1), m.group(2)
    assert f"systemctl daemon-reload && systemctl enable --now {name}" in unit
    b.path(path).write_text(unit)
    if shutil.which("systemd-analyze"):                # the unit as printed, before the drop-in below
        v = b.run("systemd-analyze", "verify", path, timeout=60)
        assert v.returncode == 0, v.stdout + v.stderr
        assert name not in v.stderr, v.stderr            # no warning about the unit itself
    # observation only (the namespace has no journald, and systemd forgets an inactive unit's exit
    # status when it unloads it): a drop-in records each stop's result and keeps watch's stderr
    ends, err = base / "ends.txt", base / "watch.err"
    b.path(f"{path}.d").mkdir()
    b.path(f"{path}.d/observe.conf").write_text(
        f"[Service]\nStandardError=append:{err}\n"
        f"ExecStopPost=/bin/sh -c 'echo \"$$SERVICE_RESULT $$EXIT_CODE $$EXIT_STATUS\" >> {ends}'\n")

    def ends_seen() -> list[str]:
        return ends.read_text().splitlines() if ends.exists() else []

    def show(prop: str) -> str:
        return b.run("systemctl", "show", "-p", prop, "--value", name).stdout.strip()

    def props(*names: str) -> dict[str, str]:
        return {k: show(k) for k in names}

    proc = _standin(base / "c.yaml", addr, port)
    try:
        assert b.run("systemctl", "daemon-reload").returncode == 0
        e = b.run("systemctl", "enable", "--now", name)
        assert e.returncode == 0, e.stderr
        assert b.path(f"/etc/systemd/system/multi-user.target.wants/{name}").is_symlink()

        # active, and its /metrics counts probes of the stand-in (one a second)
        _wait(lambda: show("ActiveState") == "active", 30, "the unit active", b)
        _wait(lambda: _probes(murl) >= 2, 60, "two probes counted on the unit's /metrics", b)
        pid = int(show("MainPID"))
        cg = b.run("cat", f"/proc/{pid}/cgroup").stdout.strip()
        # a child of the namespace's systemd, in the unit's own cgroup (an instance: under its template's slice)
        assert cg.endswith(f"/system.slice/system-dsv4ctl\\x2dwatch.slice/{name}"), cg

        # systemctl stop: SIGTERM, watch exits 0 on its own (well before TimeoutStopSec=30 would kill it)
        t0 = time.monotonic()
        s = b.run("systemctl", "stop", name, timeout=60)
        took = time.monotonic() - t0
        assert s.returncode == 0, s.stderr
        assert ends_seen() == ["success exited 0"]       # SIGTERM handled: exit 0, not killed
        assert took < 20, took
        assert re.search(r"watch: stopped after \d+ probes\n$", err.read_text()), err.read_text()[-500:]
        assert _closed(murl)
        assert not b.path(f"/proc/{pid}").exists()

        # kill -9 of the main PID: a failure, so Restart=on-failure starts it again (after RestartSec=15)
        assert b.run("systemctl", "start", name).returncode == 0
        _wait(lambda: show("ActiveState") == "active" and _probes(murl) >= 1, 60, "the unit active again", b)
        pid = int(show("MainPID"))
        assert show("NRestarts") == "0"
        assert b.run("kill", "-9", str(pid)).returncode == 0
        _wait(lambda: show("SubState") == "auto-restart", 10, "auto-restart after kill -9", b)
        assert props("Result", "ExecMainCode", "ExecMainStatus") == {
            "Result": "signal", "ExecMainCode": "2", "ExecMainStatus": "9"}   # CLD_KILLED by SIGKILL
        assert ends_seen()[1:] == ["signal killed KILL"]
        _wait(lambda: show("NRestarts") == "1" and show("ActiveState") == "active", 40, "the restart", b)
        new = int(show("MainPID"))
        assert new not in (0, pid)
        _wait(lambda: _probes(murl) >= 1, 60, "probes counted by the restarted watch", b)

        # and the restarted one stops cleanly too
        assert b.run("systemctl", "stop", name, timeout=60).returncode == 0
        assert ends_seen()[2:] == ["success exited 0"]
        assert show("ActiveState") == "inactive"
    finally:
        b.run("systemctl", "disable", "--now", name, timeout=60)
        shutil.rmtree(b.path(f"{path}.d"), ignore_errors=True)
        b.path(path).unlink(missing_ok=True)
        b.run("systemctl", "daemon-reload")
        _stop(proc)


def test_print_unit_carries_the_watch_options_of_the_command_line(tmp_path, monkeypatch):
    """Every watch option given with ``--print unit`` goes into ExecStart (repeated ones repeated,
    ``--log`` and a relative profile path made absolute: the unit runs from /); options left at
    their defaults stay out; ``--once`` is refused (a unit is the continuous watch)."""
    p = _profile(tmp_path, """\
        - {name: one, role: colocated, host: local, gpus: [0, 1, 2, 3, 4, 5, 6, 7], tp: 8, serve_config: c.yaml}
        """)

    def exec_start(*args: str, cwd=None) -> str:
        r = run_cli("watch", *args, "--print", "unit", cwd=cwd)
        assert r.code == 0, r.err
        return next(ln for ln in r.out.splitlines() if ln.startswith("ExecStart=")).split(" -m dsv4ctl ", 1)[1]

    assert exec_start(str(p)) == f"watch {p}"
    assert exec_start("p.yaml", "--no-releases", "--log", "w.jsonl", "--on-alert", "toolcall-corruption",
                      "--on-alert", "stuck=scheduler-stall", "-q", "--interval", "30s", "--listen", "0.0.0.0:9477",
                      cwd=tmp_path) == (
        f"watch {p} --interval 30s --listen 0.0.0.0:9477 --no-releases --on-alert toolcall-corruption "
        f"--on-alert stuck=scheduler-stall --log {tmp_path / 'w.jsonl'} --quiet")
    assert exec_start("-p", str(p), "--stall-timeout", "2m", "--auto", "--on-alert", "toolcall-corruption") == (
        f"watch {p} --stall-timeout 2m --on-alert toolcall-corruption --auto")
    r = run_cli("watch", str(p), "--print", "unit", "--once")
    assert r.code == 2 and "--print unit writes the continuous watch as a service: --once" in r.err
