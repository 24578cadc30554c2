"""status / logs / audit against real OpenSSH sshd hosts (launcher backend) after a real deploy,
with --json; their facts' parsers with data; host-acting commands need an explicit profile."""

from __future__ import annotations

import json

import pytest

from dsv4ctl.hosts.day2 import merge_audit, parse_audit, parse_log_read, parse_status, status_command
from tests.conftest import run_cli
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.sshd.promote_world import PromoteWorld
from tests.sshd.world import kill_server


def test_parse_status_and_audit_with_data():
    text = ("@current\nreleases/r1\n@previous\n@state\n{\"releases\": {\"r1\": {\"state\": \"good\"}}}\n@lock\n@rsync\nyes\n"
            "@systemd\n@launch\n@incoming\n@end\n@alive a yes\n@alive b no\n@audit\n"
            '{"ts": "2026-12-01T00:00:00Z", "action": "deploy", "result": "ok"}\n')
    st = parse_status("h0", "/srv", text)
    assert st.facts.current == "r1" and st.facts.recorded("r1") == "good"
    assert st.alive == {"a": True, "b": False} and st.last_audit["action"] == "deploy"
    assert parse_status("h0", "/srv", text.replace('{"ts"', "not json {")).last_audit == \
        {"unreadable": 'not json {: "2026-12-01T00:00:00Z", "action": "deploy", "result": "ok"}'}
    assert parse_log_read("12\nhello\nworld\n") == (12, "hello\nworld\n") and parse_log_read("-1\n") == (-1, "")
    a = parse_audit("h0", '{"ts": "2026-12-01T00:00:02Z", "action": "x"}\nbroken\n')
    b = parse_audit("h1", '{"ts": "2026-12-01T00:00:01Z", "action": "y"}\n')
    assert [r["action"] for r in merge_audit({"h0": a, "h1": b})] == ["?", "y", "x"]
    assert [r["host"] for r in merge_audit({"h0": a, "h1": b}, since="2026-12-01T00:00:02")] == ["h0"]
    from dsv4ctl.hosts.layout import Paths
    from dsv4ctl.hosts.service import Launcher
    assert "@alive g yes" in status_command("/srv", {"g": Launcher().process_cmd(Paths("/srv"), "g")})


def test_a_torn_audit_line_does_not_swallow_the_next_record():
    """Before appends started on a fresh line, a record appended after a torn one joined its
    line: the torn part is unreadable, the record after it is read; deep nesting is unreadable."""
    torn = '{"ts":"2026-12-01T00:00:01Z","who":"a@b","host":"h0","action":"deploy","res'
    whole = '{"ts":"2026-12-01T00:00:02Z","who":"a@b","host":"h0","action":"rollback","result":"ok"}'
    recs = parse_audit("h0", f"{torn}{whole}\n{torn}\n{whole}\n" + "[" * 100000 + "\n")
    assert [(r["action"], r.get("unreadable")) for r in recs] == [
        ("?", torn), ("rollback", None), ("?", torn), ("rollback", None), ("?", "[" * 200)]
    assert recs[1] == json.loads(whole)
    assert [r["action"] for r in merge_audit({"h0": recs}, since="2026-12-01T00:00:02Z")] == ["rollback", "rollback"]


@pytest.mark.parametrize("argv", [["deploy"], ["rollback"], ["releases"], ["promote", "r0123456789ab"], ["status"],
                                  ["logs", "decode"], ["audit"], ["hicache", "off"], ["hicache", "on"]])
def test_host_acting_commands_need_an_explicit_profile(argv):
    r = run_cli(*argv, env={"DSV4CTL_PROFILE": ""})
    assert r.code == 2 and r.err.strip().endswith(
        "this command changes or reads hosts or files: give the profile (argument or DSV4CTL_PROFILE); the "
        "embedded example is only for read-only commands (plan, config lint, hicache status, runbook show)")


def test_dsv4ctl_profile_stands_in_for_the_argument(tmp_path):
    import shutil
    from tests.conftest import DEFAULT_PROFILE
    shutil.copy(DEFAULT_PROFILE, tmp_path / "mine.yaml")
    shutil.copytree(DEFAULT_PROFILE.with_suffix(""), tmp_path / DEFAULT_PROFILE.stem)
    text = (tmp_path / "mine.yaml").read_text().replace("name: dsv4-flash-8xb200-pd", "name: mine")
    (tmp_path / "mine.yaml").write_text(text.replace("series: ../patches/sglang-0.5.23", "series: null"))
    r = run_cli("plan", "--json", env={"DSV4CTL_PROFILE": str(tmp_path / "mine.yaml")})
    assert r.code == 0 and r.json()["profile"] == "mine"


def test_audit_since_is_normalised_and_checked():
    from dsv4ctl.commands.day2 import _since
    from dsv4ctl.errors import InputError
    assert _since("2026-12-01T17Z") == _since("2026-12-01T17:00") == "2026-12-01T17:00:00Z"
    assert _since("2026-12-01") == "2026-12-01T00:00:00Z"
    assert _since("2026-12-01 17:00") == "2026-12-01T17:00:00Z"      # ISO 8601's space separator (one --since rule)
    for bad in ("2026-13-45", "2026-12-01T99:99:99Z", "yesterday", "17:00", "2026-12-01T17:00+99:00"):
        with pytest.raises(InputError):
            _since(bad)


def test_logs_follow_reads_each_byte_once(tmp_path):
    """The log read command takes exactly [offset, size): appends between reads are never doubled."""
    import subprocess
    from dsv4ctl.hosts.day2 import log_read_command, parse_log_read
    from dsv4ctl.hosts.layout import Paths
    p = Paths(str(tmp_path))
    (tmp_path / "logs").mkdir()
    log = tmp_path / "logs" / "g.log"
    log.write_text("a\nb\n")
    size, text = parse_log_read(subprocess.run(["sh", "-c", log_read_command(p, "g", None, 10)],
                                               capture_output=True, text=True).stdout)
    assert (size, text) == (4, "a\nb\n")
    with log.open("a") as f:
        f.write("c\npart")
    size, text = parse_log_read(subprocess.run(["sh", "-c", log_read_command(p, "g", 4, 10)],
                                               capture_output=True, text=True).stdout)
    assert (size, text) == (10, "c\npart")


def test_runaway_log_lines_are_cut_on_the_host(tmp_path):
    """A 40 MB server log line reaches dsv4ctl as LOG_LINE_MAX bytes, from ``logs`` and from the
    tail ``diagnose`` and the gate read (the host's awk never holds it whole either)."""
    import subprocess
    from dsv4ctl.hosts.day2 import LOG_CHUNK_MAX, follow_offset, log_read_command
    from dsv4ctl.hosts.layout import Paths
    from dsv4ctl.hosts.service import LOG_LINE_MAX, log_tail_cmd
    p = Paths(str(tmp_path))
    (tmp_path / "logs").mkdir()
    log = tmp_path / "logs" / "g.log"
    with log.open("w") as f:
        f.write("=== dsv4ctl start g release r1 at T\nfirst\n" + "x" * (40 << 20) + "\nlast\n")
    for cmd in (log_read_command(p, "g", None, 3), log_tail_cmd(p, "g", 3)):
        # 32 MiB of address space for the host's tools: holding the 40 MB line would fail
        r = subprocess.run(["sh", "-c", f"ulimit -v 32768; {cmd}"], capture_output=True)
        lines = r.stdout.split(b"\n")
        assert r.returncode == 0 and b"out of memory" not in r.stderr, (cmd, r.stderr)
        assert max(len(x) for x in lines) == LOG_LINE_MAX, cmd
        assert b"last" in lines and len(r.stdout) < 3 * LOG_LINE_MAX
    # -f: the line comes in LOG_CHUNK_MAX pieces, each byte once
    start = off = len("=== dsv4ctl start g release r1 at T\nfirst\n")
    got = 0
    while True:
        out = subprocess.run(["sh", "-c", log_read_command(p, "g", off, 3)], capture_output=True).stdout
        size, chunk = int(out.split(b"\n", 1)[0]), out.split(b"\n", 1)[1]
        assert len(chunk) <= LOG_CHUNK_MAX
        off, whole = follow_offset(off, chunk)
        got += len(whole)
        if off >= size:
            break
    # every byte once, plus the newline that ends each of the 10 newline-free 4 MiB pieces
    assert off == log.stat().st_size and got == log.stat().st_size - start + (40 << 20) // LOG_CHUNK_MAX


def test_table_cells_and_log_lines_cannot_drive_the_terminal():
    from dsv4ctl.render import markdown_table, printable, text_table
    evil = "id\x1b[2J\x1b]0;owned\x07\x1b]8;;http://x\x1b\\link"
    assert "\x1b" not in printable(evil) and "\\x1b[2J" in printable(evil)
    assert "\x1b" not in markdown_table(["release"], [[evil]])
    assert "\x1b" not in (text_table("releases", ["release"], [[evil]]) or "")




@pytest.fixture
def deployed(live_cluster, tmp_path):
    w = PromoteWorld(live_cluster, tmp_path)
    r = run_cli("deploy", str(w.profile), "--json", env=w.env(), timeout=300)
    assert r.code == 0, r.err
    w.rid = r.json()["release"]
    yield w
    w.stop_services()


@pytest.mark.sshd
def test_status_logs_audit_on_sshd_hosts(deployed):
    w = deployed
    r = run_cli("status", str(w.profile), "--json", env=w.env(), timeout=120)
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["schema"] == "dsv4ctl.status/1" and doc["ok"] is True
    for h, hd in doc["hosts"].items():
        assert hd["current"] == w.rid and hd["state"] == "active" and hd["lock"] is None
        assert hd["last_audit"]["action"] == "deploy" and hd["last_audit"]["result"] == "ok"
        assert all(g["alive"] and g["health"] == "ok" and g["hicache_differences"] == [] for g in hd["groups"].values())
    group, host = next((g, h) for h, hd in doc["hosts"].items() for g in hd["groups"])
    # each server's state, pid, port, uptime and restarts (issue 46.3)
    g0 = doc["hosts"][host]["groups"][group]
    pid = int((w.roots[host] / "run" / f"{group}.pid").read_text())
    assert (g0["state"], g0["pid"], g0["port"], g0["restarts"], g0["stopped"]) == ("running", pid, w.ports[group], 0, None)
    assert 0 <= g0["uptime_s"] < 300

    r = run_cli("logs", group, str(w.profile), "-n", "5", env=w.env(), timeout=120)
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert 1 <= len(lines) <= 5 and all(ln.startswith(f"{host}") for ln in lines)
    r = run_cli("logs", group, str(w.profile), "--grep", "no such text anywhere", env=w.env(), timeout=120)
    assert r.code == 0 and r.out == ""
    # --since, as audit and diagnose take it (issue 31): the start header is stamped
    r = run_cli("logs", group, str(w.profile), "-n", "5", "--since", "1d", env=w.env(), timeout=120)
    assert r.code == 0 and r.out.splitlines() == lines, r.err
    r = run_cli("logs", group, str(w.profile), "--since", "2999-01-01", env=w.env(), timeout=120)
    assert r.code == 0 and r.out == "", r.err
    r = run_cli("logs", "nosuch", str(w.profile), env=w.env())
    assert r.code == 2 and "no group 'nosuch'" in r.err

    r = run_cli("audit", str(w.profile), "--json", env=w.env(), timeout=120)
    assert r.code == 0, r.err
    recs = r.json()["records"]
    assert {x["host"] for x in recs} == set(w.roots) and all(x["action"] == "deploy" for x in recs)
    assert [x["ts"] for x in recs] == sorted(x["ts"] for x in recs)
    r = run_cli("audit", str(w.profile), "--since", "2999-01-01", "--json", env=w.env(), timeout=120)
    assert r.code == 0 and r.json()["records"] == []

    # the profile's serve config changed, not deployed: a difference with the command that
    # applies it (a restart would start the active release's copy again), not "unhealthy"
    w.hicache(True)
    r = run_cli("status", str(w.profile), env=w.env(), timeout=120)
    assert r.code == 0, r.err
    assert f"differs from the profile's serve config: {host}/{group}: " in r.out
    assert f"a restart starts that one again); to apply the profile's: dsv4ctl deploy {w.profile}" in r.out
    assert "restart the group" not in r.out            # the table agrees with the footnote (issue 46.4)
    doc = run_cli("status", str(w.profile), "--json", env=w.env(), timeout=120).json()
    assert doc["ok"] is True and doc["unhealthy"] == [] and len(doc["differing"]) == len(w.groups)
    w.hicache(False)
    # the profile moved a server to another port, not deployed: probed where it runs, the move is
    # a difference (it was "connection refused", exit 1)
    old_port = w.ports[group]
    w.ports[group] = old_port + 1 if old_port < 65535 else old_port - 1
    w.hicache(False)
    doc = run_cli("status", str(w.profile), "--json", env=w.env(), timeout=120).json()
    assert doc["ok"] is True and doc["hosts"][host]["groups"][group]["health"] == "ok"
    assert f"{host}/{group}: port: profile {w.ports[group]}, running {old_port}" in doc["differing"]
    w.ports[group] = old_port
    w.hicache(False)

    # a stopped server: status says which, exit 1, in words
    pidfile = w.roots[host] / "run" / f"{group}.pid"
    kill_server(pidfile)
    r = run_cli("status", str(w.profile), "--json", env=w.env(), timeout=120)
    assert r.code == 1 and r.err.strip() == f"dsv4ctl: unhealthy: status: {host}/{group}: process not running"
    g = r.json()["hosts"][host]["groups"][group]
    assert g["alive"] is False and (g["state"], g["pid"], g["uptime_s"]) == ("crashed", None, None)
    assert g["health"].startswith("/health: connection refused (nothing listens on ") and "Error" not in g["health"]

    # started again, then stopped on purpose: "stopped" by whom and when (from the audit), exit 0;
    # the start counts as a restart of the release
    r = run_cli("start", str(w.profile), "-g", group, "-m", "after the kill", env=w.env(), timeout=120)
    assert r.code == 0, r.err
    r = run_cli("stop", str(w.profile), "-g", group, "-m", "disk swap", env=w.env(), timeout=120)
    assert r.code == 0, r.err
    r = run_cli("status", str(w.profile), "--json", env=w.env(), timeout=120)
    assert r.code == 0, r.err
    g = r.json()["hosts"][host]["groups"][group]
    rec = [json.loads(x) for x in (w.roots[host] / "audit.jsonl").read_text().splitlines()][-1]
    assert (rec["action"], rec["groups"], rec["message"]) == ("stop", [group], "disk swap")
    assert (g["state"], g["restarts"], g["stopped"]) == ("stopped", 1, {"who": rec["who"], "ts": rec["ts"],
                                                                         "message": "disk swap"})
    assert g["state_detail"] == f'stopped by {rec["who"]} at {rec["ts"]} ("disk swap")'
    r = run_cli("status", str(w.profile), env=w.env(), timeout=120)
    assert r.code == 0 and f'{host}/{group}: stopped: stopped by {rec["who"]} at {rec["ts"]} ("disk swap")' in r.out, r.out
    r = run_cli("audit", str(w.profile), env=w.env(), timeout=120)
    assert r.code == 0 and '"after the kill"' in r.out and '"disk swap"' in r.out, r.out
    # diagnose agrees: stopped on purpose is no crash (a runbook must not mark the release failed)
    r = run_cli("diagnose", str(w.profile), "-g", group, "--json", env=w.env(), timeout=120)
    assert r.code == 0, r.out + r.err
    [f] = [f for f in r.json()["groups"][group]["findings"]]
    assert (f["rule"], f["severity"], f["runbook"]) == ("stopped", "ok", None), f
    assert f'stopped on purpose by {rec["who"]} at {rec["ts"]} ("disk swap")' in f["cause"]


def test_error_lines_cannot_drive_the_terminal(capsys):
    from dsv4ctl.render import error_line
    error_line("h0: deploy lock held by mallory\x1b]0;PWNED\x07\x1b[2J\u202e (deploy r1)")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "\u202e" not in err
    assert err.startswith("dsv4ctl: error: h0: deploy lock held by mallory\\x1b]0;PWNED\\x07")


def test_status_reads_a_bounded_last_audit_line(tmp_path):
    """``status`` reads the last audit line from the last AUDIT_TAIL_MAX bytes: a huge last line
    arrives cut and is an unreadable last record (said so), never a traceback nor megabytes."""
    import subprocess
    from dsv4ctl.hosts.day2 import AUDIT_TAIL_MAX, last_audit_text

    def status_of(audit: bytes):
        (tmp_path / "audit.jsonl").write_bytes(audit)
        out = subprocess.run(["/bin/sh", "-c", status_command(str(tmp_path), {})],
                             capture_output=True, timeout=60).stdout
        return len(out), parse_status("h0", str(tmp_path), out.decode("utf-8", "replace")).last_audit

    good = b'{"ts":"2026-12-01T00:00:00Z","who":"a@b","action":"deploy","release":"r0123456789ab","result":"ok"}\n'
    huge = b'{"ts":"2026-12-01T00:00:01Z","action":"deploy","detail":"' + b"x" * (8 << 20) + b'"}\n'
    size, last = status_of(good + huge)
    assert size < AUDIT_TAIL_MAX + 4096
    assert last == {"unreadable": "x" * 200, "cut": True}
    assert last_audit_text(last) == f"unreadable last record (longer than {AUDIT_TAIL_MAX} bytes: cut): " + "x" * 79 + "…"
    # a huge line before a normal last one costs nothing either
    size, last = status_of(huge + good)
    assert size < AUDIT_TAIL_MAX + 4096 and last["action"] == "deploy"
    assert last_audit_text(last) == "2026-12-01T00:00:00Z a@b deploy r0123456789ab ok"
    # no final newline, a line just under the window, JSON nested too deep, not an object
    assert status_of(good + huge[:-1])[1]["cut"] is True
    line = b'{"ts":"t","detail":"' + b"y" * (AUDIT_TAIL_MAX - 100) + b'"}\n'
    assert status_of(good + line)[1]["detail"] == "y" * (AUDIT_TAIL_MAX - 100)
    assert status_of(good + b"[" * 50000 + b"\n")[1] == {"unreadable": "[" * 200}
    assert status_of(good + b"[1, 2]\n")[1] == {"unreadable": "[1, 2]"}
    assert status_of(b"")[1] is None


def test_the_last_audit_line_cannot_drive_the_terminal():
    from dsv4ctl.hosts.day2 import last_audit_text
    rec = json.loads('{"ts": "\\udcff", "who": "\\u001b]0;owned\\u0007", "action": "deploy\\u001b[2J", "result": 1}')
    text = last_audit_text(rec)
    assert text == "\\udcff \\x1b]0;owned\\x07 deploy\\x1b[2J 1"
    text.encode("utf-8")                                  # printable on any UTF-8 terminal
    assert last_audit_text({"unreadable": "bad \x1b[2J"}) == "unreadable last record: bad \\x1b[2J"
