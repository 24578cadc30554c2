"""``dsv4ctl watch``: the pure parts (targets, alert conditions, bounded labels, durations, SGLang
metrics parsing, the systemd unit) and the process against the stand-in SGLang server (which
serves through SGLang 0.5.23's real DeepSeek-V4 output path): --once, /metrics, SIGTERM, a server
restart under watch, --on-alert, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from dsv4ctl.check import classify as C
from dsv4ctl.commands.options import duration
from dsv4ctl.errors import InputError
from dsv4ctl.profile.deployment import load_deployment
from dsv4ctl.watch import model as M
from dsv4ctl.watch.run import Watcher, WatchOptions
from dsv4ctl.watch.scrape import parse_sglang
from dsv4ctl.watch.unit import render_unit
from tests.conftest import DEFAULT_PROFILE, REPO, loopback, run_cli
from tests.promserver import poll as _wait
from tests.standin.harness import free_port, popen_standin, standin, wait_health, write_config

FAST = ("--ttft-ms", "1", "--itl-ms", "0")


# --- pure ------------------------------------------------------------------------------------
def test_targets_of_the_pd_profile_probe_the_router_and_scrape_every_server():
    ts = M.targets(load_deployment(DEFAULT_PROFILE))
    assert [(t.name, t.role, t.probe, t.source) for t in ts] == [
        ("router", "router", True, "gateway"), ("prefill", "prefill", False, "sglang"),
        ("decode", "decode", False, "sglang")]
    assert ts[0].url == "http://127.0.0.1:8000" and ts[0].metrics_url == "http://127.0.0.1:29000/metrics"
    assert ts[1].metrics_url == "http://127.0.0.1:30000/metrics"


def _profile(tmp: Path, groups: str, port: int = 30000, address: str = "127.0.0.1") -> Path:
    write_config(tmp / "c.yaml", port=port, enable_metrics=True, tp_size=8)
    p = tmp / "p.yaml"
    p.write_text(textwrap.dedent(f"""\
        version: 1
        name: w
        model: deepseek-v4-flash
        hosts:
          - name: local
            address: {address}
            gpus: {{model: NVIDIA B200, count: 8, memory_mib: 183359}}
        groups:
        """) + textwrap.indent(textwrap.dedent(groups), "  "))
    return p


def test_a_pd_profile_without_a_router_has_nothing_to_probe(tmp_path):
    p = _profile(tmp_path, """\
        - {name: prefill, role: prefill, host: local, gpus: [0, 1, 2, 3, 4, 5, 6, 7], tp: 8, serve_config: c.yaml}
        """)
    with pytest.raises(InputError, match="nothing to probe"):
        M.targets(load_deployment(p))
    r = run_cli("watch", str(p), "--once", "--no-releases")
    assert r.code == 2 and "nothing to probe: watch probes through a router group or a colocated" in r.err
    assert "Traceback" not in r.err


def test_probe_sessions_are_known_answer_turns_alternating_stream():
    s0, s1 = M.probe_session(0), M.probe_session(1)
    assert s0.stream and not s1.stream
    for n in range(40):
        spec = M.probe_session(n).spec()
        assert spec.requires_tool and spec.expected_calls, n
        assert spec.max_tokens == M.PROBE_MAX_TOKENS
    assert M.probe_session(7).spec().instruction == M.probe_session(7).spec().instruction


def test_outcome_of_each_class():
    assert M.outcome("ok") == "ok"
    assert M.outcome("http_error") == "failed" and M.outcome("stuck") == "failed"
    assert M.outcome("dsml_in_content") == "corrupted" and M.outcome("wrong_args") == "corrupted"


def test_burn_window_needs_both_windows_and_enough_probes():
    b = M.BurnWindow(slo=0.01, long_s=3600, short_s=300, burn=10, min_probes=10)
    k = ("router", "r1")
    # 9 probes, 5 corrupted: under the minimum
    for i in range(9):
        b.add(k, 1000 + i * 10, i < 5)
    assert b.burning(1090) == []
    b.add(k, 1090, True)
    assert b.burning(1090) == [("router", "r1", pytest.approx(0.6), 10)]
    # 30 clean probes later the short window is clean: no burn although the long window still is
    # (windows are whole 30 s buckets: short / 10)
    for i in range(30):
        b.add(k, 1100 + i * 10, False)
    assert b.bucket_s == 30
    assert b.ratio(k, 1420, 300) == (0, 29)
    assert b.ratio(k, 1420, 3600) == (6, 40)
    assert b.burning(1420) == []
    # the long window forgets what is older than an hour
    assert b.ratio(k, 1120 + 3600, 3600) == (0, 29)
    # memory is buckets, not probes: a day of one probe a second is at most 121 buckets
    d = M.BurnWindow(slo=0.01)
    for t in range(0, 86400, 1):
        d.add(("x", "r1"), float(t), False)
    assert len(d._seen[("x", "r1")]) <= 121
    # a key whose probes all left the long window is dropped (months of releases stay bounded)
    assert d.burning(86400 + 7200) == [] and d._seen == {}


def test_burn_threshold_is_burn_times_slo():
    b = M.BurnWindow(slo=0.01, long_s=600, short_s=60, burn=10, min_probes=10)
    for i in range(100):                  # 10 % corrupted: exactly 10 x 1 %, not above
        b.add(("one", "r1"), i, i % 10 == 0)
    assert b.burning(99) == []
    b.add(("one", "r1"), 99.5, True)
    assert [(t, r) for t, r, _, _ in b.burning(99.5)] == [("one", "r1")]


def test_the_burn_is_per_release_and_only_the_running_release_holds_the_condition(tmp_path):
    """Issue 41: a corrupting release's probes are evidence about that release only. After a fix
    is deployed (the release read says r2), r1's corrupted probes hold no condition, r2's clean
    probes do not burn, and r2's own corruption does (its own ten probes, not r1's)."""
    p = _profile(tmp_path, """\
        - {name: one, role: colocated, host: local, gpus: [0, 1, 2, 3, 4, 5, 6, 7], tp: 8, serve_config: c.yaml}
        """)
    w = Watcher(load_deployment(p), WatchOptions(alert_window=120, on_alert={"corruption": "bad-release"}))
    t = w.targets[0]
    w._set_release(t, "local", "r1", "active")
    now = time.monotonic()
    for i in range(12):
        w.burn.add(("one", "r1"), now - 1 + i * 0.01, True)
    assert w.conditions(now + 1)["corruption"] == "one 100% of probes corrupted (release r1, 12 probes)"
    assert w.evidence["corruption"] == ["r1"]
    w._set_release(t, "local", "r2", "active")          # the fix is deployed
    for i in range(4):
        w.burn.add(("one", "r2"), now + i * 0.01, False)
    assert "corruption" not in w.conditions(now + 1)
    for i in range(5):
        w.burn.add(("one", "r2"), now + 0.5 + i * 0.01, True)
    assert "corruption" not in w.conditions(now + 1)      # 9 probes of r2: r1's 12 do not make up the count
    w.burn.add(("one", "r2"), now + 0.9, True)
    assert w.conditions(now + 1)["corruption"] == "one 60% of probes corrupted (release r2, 10 probes)"


def test_auto_acts_only_on_the_release_every_host_runs_after_it_settled():
    """The decision read under the deploy lock (pure part): evidence about r1 while the hosts run
    r2 is stale; r2 activated 10 s ago by someone else is settling, by this watch's own runbook
    run it is not; mixed releases are stale."""
    from dsv4ctl.hosts.layout import HostFacts
    from dsv4ctl.watch.run import decide_on

    def facts(cur, at="2026-12-01T10:00:00Z"):
        return HostFacts(host="h", root="/r", current=cur,
                         state={"releases": {cur: {"state": "active", "activated_at": at}}})
    import datetime as dt
    t0 = dt.datetime(2026, 12, 1, 10, 0, 0, tzinfo=dt.timezone.utc).timestamp()
    both = {"h0": facts("r2"), "h1": facts("r2")}
    v, why = decide_on(both, ["r1"], [], 300, now=t0 + 3600)
    assert v == "skipped_stale" and why == "the evidence is about release r1; the hosts run h0: r2, h1: r2 now"
    assert decide_on({"h0": facts("r2"), "h1": facts("r1")}, ["r2"], [], 300, now=t0 + 3600)[0] == "skipped_stale"
    assert decide_on(both, ["r1", "r2"], [], 300, now=t0 + 3600)[0] == "skipped_stale"
    v, why = decide_on(both, ["r2"], [], 300, now=t0 + 10)
    assert v == "skipped_settling" and "r2 was activated on h0 at 2026-12-01T10:00:00Z, 10 s ago" in why
    assert decide_on(both, ["r2"], [[t0 - 60, t0 + 5]], 300, now=t0 + 10)[0] == "act"
    assert decide_on(both, ["r2"], [], 300, now=t0 + 301) == ("act", "every host runs r2, the release the evidence is about")


def test_release_labels_keep_a_bounded_history():
    r = M.ReleaseLabels(keep=2)
    assert r.activate("router", "a") == []
    assert r.activate("router", "a") == []
    assert r.activate("router", "b") == []
    assert r.activate("router", "c") == []
    assert r.activate("router", "d") == ["a"]        # a: not active for 2 changes
    assert r.activate("router", "b") == []           # rollback to b keeps it
    assert r.activate("router", "e") == ["c"]
    assert r.activate("decode", "a") == []           # per target


def test_parse_on_alert():
    books = ["toolcall-corruption", "scheduler-stall"]
    assert M.parse_on_alert(["toolcall-corruption"], books) == {"corruption": "toolcall-corruption"}
    assert M.parse_on_alert(["stuck=scheduler-stall", "corruption = toolcall-corruption"], books) == {
        "stuck": "scheduler-stall", "corruption": "toolcall-corruption"}
    with pytest.raises(InputError, match="unknown condition 'latency'"):
        M.parse_on_alert(["latency=scheduler-stall"], books)
    with pytest.raises(InputError, match="no runbook 'nope'"):
        M.parse_on_alert(["nope"], books)
    with pytest.raises(InputError, match="given twice"):
        M.parse_on_alert(["toolcall-corruption", "corruption=scheduler-stall"], books)


def test_action_gate_once_per_window():
    g = M.ActionGate(window_s=600)
    assert g.due("corruption", 0)
    g.ran("corruption", 0)
    assert not g.due("corruption", 599) and g.due("stuck", 599)
    assert g.due("corruption", 600)


@pytest.mark.parametrize("text,secs", [("90s", 90), ("15m", 900), ("2h", 7200), ("1d", 86400), ("500ms", 0.5),
                                       ("2.5", 2.5), (" 10s ", 10)])
def test_duration_spellings(text, secs):
    assert duration(text, "--x") == secs


@pytest.mark.parametrize("text", ["", "10 minutes", "-5s", "1w", "0s", "s"])
def test_duration_refuses(text):
    with pytest.raises(InputError, match="--x"):
        duration(text, "--x")


def test_duration_bounds_in_words():
    with pytest.raises(InputError, match=r"--interval '500ms': expected 1s\.\.1d"):
        duration("500ms", "--interval", lo=1, hi=86400)


SGLANG_TEXT = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 3.0
sglang:num_running_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 2.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{tp_rank="0"} 7.0
# TYPE sglang:token_usage gauge
sglang:token_usage{tp_rank="0"} 0.31
sglang:token_usage{tp_rank="1"} 0.97
# TYPE sglang:generation_tokens counter
sglang:generation_tokens_total{tp_rank="0"} 1200.0
sglang:generation_tokens_total{tp_rank="1"} 34.0
# TYPE sglang:num_transfer_failed_reqs counter
sglang:num_transfer_failed_reqs_total{tp_rank="0"} 2.0
# TYPE sglang:num_bootstrap_failed_reqs counter
sglang:num_bootstrap_failed_reqs_total{tp_rank="0"} 1.0
"""


def test_parse_sglang_sums_ranks_and_takes_the_fullest_pool():
    g = parse_sglang(SGLANG_TEXT)
    assert (g.running, g.queued, g.generated, g.token_usage, g.transfer_failed) == (5.0, 7.0, 1234.0, 0.97, 3.0)
    assert parse_sglang("").token_usage is None
    with pytest.raises(ValueError, match="not Prometheus text"):
        parse_sglang("sglang:num_running_reqs{tp_rank=0 3\n")


def test_unit_runs_this_interpreter_with_the_profile():
    u = render_unit("/etc/dsv4ctl/prod pd.yaml", python="/opt/dsv4ctl/bin/python", extra_args=("--listen", "0.0.0.0:9477"))
    assert 'ExecStart=/opt/dsv4ctl/bin/python -m dsv4ctl watch "/etc/dsv4ctl/prod pd.yaml" --listen 0.0.0.0:9477' in u
    assert "KillSignal=SIGTERM" in u and "Restart=on-failure" in u and "WantedBy=multi-user.target" in u
    assert "systemctl daemon-reload && systemctl enable --now 'dsv4ctl-watch@prod\\x20pd.service'" in u
    with pytest.raises(ValueError, match="control character"):
        render_unit("/p.yaml", extra_args=("--on-alert", "toolcall-corruption\nExecStartPre=/bin/touch /tmp/pwn"))
    u2 = render_unit("/srv/a;rm -rf x%h.yaml", python="/x/python")
    assert "> '/etc/systemd/system/dsv4ctl-watch@a\\x3brm\\x20\\x2drf\\x20x\\x25h.service'" in u2   # as systemd-escape
    assert "Description=dsv4ctl watch: known-answer tool-call probes for a;rm -rf x%%h" in u2
    assert 'ExecStart=/x/python -m dsv4ctl watch "a$$b%%c"' in render_unit("a$b%c", python="/x/python")


# --- the process against the stand-in --------------------------------------------------------
@pytest.fixture
def colocated(tmp_path):
    """A colocated profile whose server is a stand-in (metrics on, HiCache on) at this worker's
    loopback address; yields (profile path, url, config path, port)."""
    addr = loopback(31)
    port = free_port()
    p = _profile(tmp_path, """\
        - {name: one, role: colocated, host: local, gpus: [0, 1, 2, 3, 4, 5, 6, 7], tp: 8, serve_config: c.yaml}
        """, port=port, address=addr)
    yield p, f"http://{addr}:{port}", tmp_path / "c.yaml", port, addr


def _standin(cfg: Path, addr: str, port: int, *flags: str):
    proc = popen_standin(["--config", str(cfg), "--host", addr, "--port", str(port), *FAST, *flags], quiet=True)
    wait_health(f"http://{addr}:{port}", timeout=60)
    return proc


def _stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_once_json_judges_a_clean_server_ok(colocated):
    p, url, cfg, port, addr = colocated
    proc = _standin(cfg, addr, port)
    try:
        r = run_cli("watch", str(p), "--once", "--json", "--no-releases")
    finally:
        _stop(proc)
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["schema"] == "dsv4ctl.watch/1" and doc["ok"] is True
    (t,) = doc["targets"]
    assert t["name"] == "one" and t["probe"]["class"] == "ok" and t["probe"]["outcome"] == "ok"
    assert t["scrape"]["up"] is True and t["scrape"]["running"] >= 0 and t["scrape"]["generation_tokens"] > 0
    assert t["release"] == "unknown"
    import jsonschema
    from dsv4ctl.resources import schema_path
    jsonschema.Draft202012Validator(json.loads(schema_path("watch").read_text())).validate(doc)
    r = run_cli("schema", "watch")
    assert r.code == 0 and json.loads(r.out)["title"] == "dsv4ctl watch round"


def test_once_names_the_corruption_class_and_exits_1(colocated):
    p, url, cfg, port, addr = colocated
    proc = _standin(cfg, addr, port, "--fault", "markup_as_text")
    try:
        r = run_cli("watch", str(p), "--once", "--json", "--no-releases")
    finally:
        _stop(proc)
    assert r.code == 1, r.err
    assert "gate failed: 1 of 1 probes not ok: one dsml_in_content" in r.err
    assert r.json()["targets"][0]["probe"]["outcome"] == "corrupted"


def test_once_against_nothing_listening_exits_3(colocated):
    p, url, cfg, port, addr = colocated
    r = run_cli("watch", str(p), "--once", "--no-releases")
    assert r.code == 3 and "no probed target could be reached: one:" in r.err


@pytest.mark.parametrize("args,msg", [
    (["--interval", "500ms"], "--interval '500ms': expected 1s..1d"),
    (["--interval", "fast"], "--interval 'fast': expected a duration"),
    (["--json"], "--json needs --once"),
    (["--auto"], "--auto needs --on-alert"),
    (["--on-alert", "no-such-book"], "no runbook 'no-such-book'"),
    (["--print", "grafana"], "--print 'grafana': expected one of rules, dashboard, unit"),
    (["--listen", "127.0.0.1"], "--listen '127.0.0.1'"),
    (["--log", "/nonexistent/dir/watch.jsonl"], "--log /nonexistent/dir/watch.jsonl"),
    (["--print", "rules", "--runbook-url", "wiki/alerts"], "--runbook-url: runbook URL 'wiki/alerts': expected an http"),
    (["--print", "rules", "--scrape-job", 'w"}'], "--scrape-job: scrape job 'w\"}': expected 1-200 letters"),
    (["--print", "dashboard", "--scrape-job", "w"], "--scrape-job goes with --print rules"),
    (["--runbook-url", "https://wiki.example/a"], "--runbook-url goes with --print rules"),
])
def test_bad_input_is_one_line_exit_2(colocated, args, msg):
    p = colocated[0]
    r = run_cli("watch", str(p), "--no-releases", *args)
    assert r.code == 2, (r.code, r.err)
    assert msg in r.err and r.err.count("\n") == 1 and "Traceback" not in r.err


def test_listen_address_in_use_exits_3(colocated):
    import socket
    p, url, cfg, port, addr = colocated
    with socket.socket() as s:
        s.bind((addr, 0))
        s.listen()
        busy = s.getsockname()[1]
        r = run_cli("watch", str(p), "--no-releases", "--listen", f"{addr}:{busy}", timeout=60)
    assert r.code == 3 and f"--listen {addr}:{busy}: cannot listen" in r.err


def _metrics(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"
            out[key] = s.value
    return out


def _spawn_watch(p: Path, *args: str, log: Path | None = None, env: dict | None = None):
    env = dict(os.environ, NO_COLOR="1", **(env or {}))
    cmd = [sys.executable, "-m", "dsv4ctl", "watch", str(p), "--no-releases", *args] + (["--log", str(log)] if log else [])
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _end(w: subprocess.Popen) -> None:
    """SIGTERM a watch; SIGKILL its process group if it has not stopped within 30 s."""
    w.send_signal(signal.SIGTERM)
    try:
        w.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(w.pid, signal.SIGKILL)
        w.wait()


def _scrape_or_none(url: str):
    try:
        return _metrics(url)
    except OSError:
        return None


def test_watch_counts_probes_survives_a_restart_and_stops_on_sigterm(colocated, tmp_path):
    p, url, cfg, port, addr = colocated
    mport = free_port()
    murl = f"http://{addr}:{mport}/metrics"
    proc = _standin(cfg, addr, port)
    log = tmp_path / "watch.jsonl"
    w = _spawn_watch(p, "--interval", "1s", "--scrape-every", "1s", "--stall-timeout", "5s",
                     "--listen", f"{addr}:{mport}", log=log)
    try:
        key = "dsv4ctl_watch_probes_total{release=unknown,role=colocated,target=one}"
        _wait(lambda: (_scrape_or_none(murl) or {}).get(key, 0) >= 2, 60, "two probes")
        m = _metrics(murl)
        assert m["dsv4ctl_watch_scrape_up{source=sglang,target=one}"] == 1.0
        assert m["dsv4ctl_watch_sglang_generation_tokens_total{target=one}"] > 0
        with urllib.request.urlopen(murl, timeout=5) as r:
            page = r.read().decode()
        # SGLang's counters are re-exported as counters (issue 45: they were gauges without _total)
        assert "# TYPE dsv4ctl_watch_sglang_generation_tokens_total counter\n" in page
        assert "# TYPE dsv4ctl_watch_sglang_transfer_failed_requests_total counter\n" in page
        assert "dsv4ctl_watch_sglang_transfer_failed_requests_total{target=\"one\"} 0.0\n" in page
        assert m["dsv4ctl_watch_probe_duration_seconds_count{release=unknown,role=colocated,target=one}"] >= 2
        # the server goes away: failed probes and a scrape down, watch keeps running
        _stop(proc)
        fkey = "dsv4ctl_watch_probes_failed_total{class=http_error,release=unknown,role=colocated,target=one}"
        _wait(lambda: (_scrape_or_none(murl) or {}).get(fkey, 0) >= 1, 30, "a failed probe")
        _wait(lambda: (_scrape_or_none(murl) or {}).get("dsv4ctl_watch_scrape_up{source=sglang,target=one}") == 0.0,
              30, "scrape down")
        assert w.poll() is None
        # it comes back: probes are ok again
        proc = _standin(cfg, addr, port)
        before = _metrics(murl)[key]
        _wait(lambda: (_scrape_or_none(murl) or {}).get(key, 0) >= before + 2, 60, "probes after the restart")
        assert _metrics(murl)["dsv4ctl_watch_scrape_up{source=sglang,target=one}"] == 1.0
        w.send_signal(signal.SIGTERM)
        out, err = w.communicate(timeout=30)
        assert w.returncode == 0, err
        assert "watch: stopped after" in err
        with pytest.raises(OSError):
            urllib.request.urlopen(murl, timeout=2)
        events = [json.loads(line) for line in log.read_text().splitlines()]
        assert events[0]["event"] == "started" and events[-1]["event"] == "stopped"
        assert any(e["event"] == "probe" and e["class"] == "http_error" for e in events)
        rec = [e for e in events if e["event"] == "recovered"]
        assert rec and rec[0]["target"] == "one" and rec[0]["after"] >= 1
    finally:
        if w.poll() is None:
            os.killpg(w.pid, signal.SIGKILL)
            w.wait()
        _stop(proc)


def test_on_alert_runs_the_runbook_once_per_window_as_a_dry_run_and_says_how_it_ended(colocated, tmp_path):
    p, url, cfg, port, addr = colocated
    proc = _standin(cfg, addr, port, "--fault", "markup_as_text")
    log = tmp_path / "watch.jsonl"
    mport = free_port()
    w = _spawn_watch(p, "--interval", "1s", "--scrape-every", "5s", "--listen", f"{addr}:{mport}",
                     "--alert-window", "24s", "--on-alert", "toolcall-corruption", log=log,
                     env={"DSV4CTL_STATE_DIR": str(state := tmp_path / "state")})
    try:
        def finished():
            if not log.exists():
                return None
            ev = [json.loads(x) for x in log.read_text().splitlines()]
            return [e for e in ev if e["event"] == "alert_action" and e["outcome"] != "started"] or None
        done = _wait(finished, 90, "the runbook run")
        (e,) = done
        assert e["runbook"] == "toolcall-corruption" and e["mode"] == "dry_run" and e["condition"] == "corruption"
        # the dry run reads the hosts; this one has no sshd, so the dry run says it would stop there
        assert e["outcome"] == "dry_run_would_stop" and e["exit"] == 1, e["output_tail"]
        assert "the run would stop at step hicache_off" in e["output_tail"][-1]
        assert "one 100% of probes corrupted" in e["why"]
        # one run per window: nothing more in the next 5 s (the window is 24 s)
        time.sleep(5)
        assert len(finished()) == 1
        m = _metrics(f"http://{addr}:{mport}/metrics")
        assert m["dsv4ctl_watch_alert_actions_total{alert=corruption,outcome=dry_run_would_stop,runbook=toolcall-corruption}"] == 1
        # the dry run is in the local run log too, with why and how it ended
        (run,) = [json.loads(x) for x in (state / "runs.jsonl").read_text().splitlines()]
        assert run["command"] == "watch --on-alert corruption: runbook run toolcall-corruption --dry-run", run
        assert (run["outcome"], run["exit_code"], run["mode"], run["profile"]) == ("dry_run_would_stop", 1, "dry_run", str(p))
        assert "one 100% of probes corrupted" in run["why"] and run["ts"] and run["who"]
    finally:
        _end(w)
        _stop(proc)


def test_print_artifacts(colocated):
    p = colocated[0]
    r = run_cli("watch", str(p), "--print", "unit")
    assert r.code == 0 and f"-m dsv4ctl watch {p}" in r.out and "[Service]" in r.out
    r = run_cli("watch", str(p), "--print", "dashboard")
    assert r.code == 0 and json.loads(r.out)["panels"]
    r = run_cli("watch", str(p), "--print", "rules")
    assert r.code == 0 and "DSV4ToolCallCorruptionFastBurn" in r.out
    assert f"# Printed by: dsv4ctl watch {p} --print rules" in r.out
    assert f"runbook: dsv4ctl runbook run toolcall-corruption {p}\n" in r.out and " PROFILE" not in r.out
    # the scrape job of watch's own alerts and the runbook page, as given (and in the header to print them again)
    r = run_cli("watch", str(p), "--print", "rules", "--scrape-job", "prom/watch", "--runbook-url", "https://wiki.example/dsv4")
    assert r.code == 0, r.err
    assert f"# Printed by: dsv4ctl watch {p} --print rules --scrape-job prom/watch --runbook-url https://wiki.example/dsv4\n" in r.out
    assert 'expr: up{job="prom/watch"} == 0\n' in r.out and 'expr: absent(up{job="prom/watch"})\n' in r.out
    assert r.out.count("      runbook_url: https://wiki.example/dsv4#dsv4") == 14 and "github.com" not in r.out
    # the install line repeats the options that go into the unit; a profile from DSV4CTL_PROFILE is absolute
    r = run_cli("watch", "--print", "unit", "--listen", "0.0.0.0:9477", cwd=p.parent, env={"DSV4CTL_PROFILE": p.name})
    assert r.code == 0, r.err
    assert f"# Install: dsv4ctl watch {p} --listen 0.0.0.0:9477 --print unit > " in r.out
    assert f"-m dsv4ctl watch {p} --listen 0.0.0.0:9477\n" in r.out


def test_watcher_drops_series_of_releases_long_gone(tmp_path):
    p = _profile(tmp_path, """\
        - {name: one, role: colocated, host: local, gpus: [0, 1, 2, 3, 4, 5, 6, 7], tp: 8, serve_config: c.yaml}
        """)
    w = Watcher(load_deployment(p), WatchOptions(read_releases=False))
    t = w.targets[0]
    for i in range(12):
        w._set_release(t, "local", f"r{i}", "active")
        w._count(w.m.probes, (t.name, t.role, f"r{i}"))
        w._observe(t, f"r{i}", {"ttft_s": 0.2, "e2e_s": 0.5 + i})
    from prometheus_client import generate_latest
    text = generate_latest(w.m.registry).decode()
    kept = [line for line in text.splitlines() if line.startswith("dsv4ctl_watch_probes_total{")]
    # the active one + RELEASE_KEEP (8) before it; 'unknown' (before the first read) is gone too
    assert sorted(k.split('release="')[1].split('"')[0] for k in kept) == sorted(f"r{i}" for i in range(3, 12))
    assert all(k.endswith(" 1.0") for k in kept)
    corrupted = [line for line in text.splitlines() if line.startswith("dsv4ctl_watch_probes_corrupted_total{")]
    assert len(corrupted) == 9 * (len(C.CLASSES) - len(C.NO_ANSWER))    # every corruption class at 0 from the start
    assert all(k.endswith(" 0.0") for k in corrupted)
    rel = [line for line in text.splitlines() if line.startswith("dsv4ctl_watch_release{")]
    assert rel == ['dsv4ctl_watch_release{host="local",release="r11",state="active",target="one"} 1.0']
    # latency by release too, kept and dropped with the release's other series
    sums = {ln.split('release="')[1].split('"')[0]: float(ln.rsplit(" ", 1)[1])
            for ln in text.splitlines() if ln.startswith("dsv4ctl_watch_probe_duration_seconds_sum{")}
    assert sums == {f"r{i}": 0.5 + i for i in range(3, 12)}
    assert sum(ln.startswith("dsv4ctl_watch_probe_ttft_seconds_count{") for ln in text.splitlines()) == 9


def test_probe_series_exist_at_zero_before_the_first_probe(tmp_path):
    """A counter born at 1 is invisible to rate()/increase(): every series a rule sums starts at 0."""
    p = _profile(tmp_path, """\
        - {name: one, role: colocated, host: local, gpus: [0, 1, 2, 3, 4, 5, 6, 7], tp: 8, serve_config: c.yaml}
        """)
    w = Watcher(load_deployment(p), WatchOptions(read_releases=False))
    from prometheus_client import generate_latest
    text = generate_latest(w.m.registry).decode()
    assert 'dsv4ctl_watch_probes_total{release="unknown",role="colocated",target="one"} 0.0' in text
    assert 'dsv4ctl_watch_probes_corrupted_total{class="dsml_in_content",release="unknown",role="colocated",target="one"} 0.0' in text
    assert 'dsv4ctl_watch_probes_failed_total{class="stuck",release="unknown",role="colocated",target="one"} 0.0' in text
    w._set_release(w.targets[0], "local", "r1", "good")
    text = generate_latest(w.m.registry).decode()
    assert 'dsv4ctl_watch_probes_corrupted_total{class="wrong_args",release="r1",role="colocated",target="one"} 0.0' in text


def test_a_wedged_server_makes_probes_stuck(colocated, tmp_path):
    """The stand-in wedges every request after its headers (a decode request stuck in a KV
    transfer, field report P1): each probe ends ``stuck`` after the stall timeout, the stuck gauge
    stays 1, and the ``stuck`` condition names the target."""
    p, url, cfg, port, addr = colocated
    proc = _standin(cfg, addr, port, "--stuck-rate", "1.0")
    mport = free_port()
    murl = f"http://{addr}:{mport}/metrics"
    w = _spawn_watch(p, "--interval", "1s", "--stall-timeout", "2s", "--listen", f"{addr}:{mport}",
                     log=tmp_path / "w.jsonl")
    try:
        key = "dsv4ctl_watch_probes_failed_total{class=stuck,release=unknown,role=colocated,target=one}"
        _wait(lambda: (_scrape_or_none(murl) or {}).get(key, 0) >= 2, 60, "two stuck probes")
        m = _metrics(murl)
        assert m["dsv4ctl_watch_probes_stuck{target=one}"] == 1.0
        assert "dsv4ctl_watch_probes_corrupted_total{class=stuck,release=unknown,role=colocated,target=one}" not in m
        ev = [json.loads(x) for x in (tmp_path / "w.jsonl").read_text().splitlines()]
        stuck = [e for e in ev if e["event"] == "probe" and e["class"] == "stuck"]
        assert stuck and stuck[0]["reason"] == "no progress for 2 s"
    finally:
        _end(w)
        _stop(proc)


class _Hostile:
    """A test-only HTTP server that is not SGLang: chat answers HTTP 500 echoing the request's
    Authorization header (as some proxies do), /metrics serves NaN and infinities."""

    def __init__(self, addr: str):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                body = (b"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs NaN\n"
                        b"# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs +Inf\n")
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.dumps({"error": f"bad request; headers: Authorization: {self.headers.get('Authorization')}"
                                            "\x1b[2J"}).encode()
                self.send_response(500)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
        self.srv = ThreadingHTTPServer((addr, 0), H)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def test_secrets_nan_and_a_full_log_disk(tmp_path):
    """A server that echoes the bearer token: the key is masked in the JSON, the event lines and
    the --log file; NaN/Inf metrics become null (strict JSON); a --log on a full disk is said once
    and the round still prints its document; terminal escapes from a server are not passed on."""
    addr = loopback(32)
    h = _Hostile(addr)
    try:
        p = _profile(tmp_path, """\
            - {name: one, role: colocated, host: local, gpus: [0, 1, 2, 3, 4, 5, 6, 7], tp: 8, serve_config: c.yaml}
            """, port=h.port, address=addr)
        key = "EnvSecretKey789xyz"
        log = tmp_path / "w.jsonl"
        r = run_cli("watch", str(p), "--once", "--json", "--no-releases", "--log", str(log), env={"DSV4CTL_API_KEY": key})
        assert r.code == 1, r.err
        assert key not in r.out + r.err + log.read_text()
        doc = json.loads(r.out)              # strict: no NaN / Infinity tokens
        (t,) = doc["targets"]
        assert "Authorization: Bearer ***" in t["probe"]["reason"] and t["probe"]["class"] == "http_error"
        assert t["scrape"]["running"] is None and t["scrape"]["queued"] is None and t["scrape"]["up"] is True
        assert "\x1b" not in r.err
        r = run_cli("watch", str(p), "--once", "--json", "--no-releases", "--log", "/dev/full", env={"DSV4CTL_API_KEY": key})
        assert r.code == 1 and json.loads(r.out)["schema"] == "dsv4ctl.watch/1"
        assert r.err.count("--log /dev/full: cannot write") == 1 and key not in r.err
    finally:
        h.close()


@pytest.mark.parametrize("args,msg", [
    (["--auto", "--on-alert", "toolcall-corruption", "--no-releases"], "--auto needs the release reads"),
    (["--once", "--on-alert", "toolcall-corruption"], "--on-alert needs the continuous watch"),
    (["--print", "unit", "--on-alert", "toolcall-corruption\nExecStartPre=/bin/touch /tmp/x"], "unknown condition"),
    (["--print", "unit", "--interval", "5s", "--log", "/tmp/a\nExecStartPre=/bin/true"], "no such folder"),
    (["--print", "unit", "--listen", "garbage"], "--listen 'garbage'"),
    (["--print", "unit", "--stall-timeout", "0s"], "--stall-timeout '0s'"),
    (["--print", "unit", "--log", "/nonexistent/dir/w.jsonl"], "--log '/nonexistent/dir/w.jsonl': no such folder"),
    (["--print", "unit", "--interval", "5s\nExecStartPre=/bin/true"], "--interval"),
])
def test_more_bad_input_exit_2(colocated, args, msg):
    r = run_cli("watch", str(colocated[0]), *args)
    assert r.code == 2 and msg in r.err and "Traceback" not in r.err, r.err


def _readme_block(title: str) -> str:
    """The README's fenced block whose first line is ``# TITLE`` (the watch demo's files)."""
    text = (REPO / "README.md").read_text()
    start = text.index(f"```yaml\n# {title}\n") + len("```yaml\n")
    return text[start:text.index("```", start)]


def test_the_readme_demo_runs_as_written(tmp_path):
    """The README's "Trying it without GPUs": its two files as printed (only the address and port
    moved to this worker's), the stand-in started with the README's flags, and its watch line:
    exit 0 with the probe ok and the metrics up; with ``--fault markup_as_text`` exit 1, corrupted."""
    readme = (REPO / "README.md").read_text()
    start = next(ln for ln in readme.splitlines() if ln.startswith(".venv/bin/python -m tests.standin.server --config demo/"))
    line = next(ln for ln in readme.splitlines() if ln.startswith("dsv4ctl watch demo/p.yaml"))
    assert "(exit 0)" in line
    addr, port = loopback(32), free_port()
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "p.yaml").write_text(_readme_block("demo/p.yaml").replace("127.0.0.1", addr))
    (tmp_path / "demo" / "serve.yaml").write_text(_readme_block("demo/serve.yaml").replace("port: 31000", f"port: {port}"))
    flags = start.split(" --config ", 1)[1].rstrip(" &").split()
    flags = [addr if f == "127.0.0.1" else str(port) if f == "31000" else f for f in flags]
    words = line.split("#")[0].split()[1:]
    for fault, code, outcome in (((), 0, "ok"), (("--fault", "markup_as_text"), 1, "corrupted")):
        proc = popen_standin(["--config", str(tmp_path / flags[0]), *flags[1:], *fault], quiet=True)
        try:
            wait_health(f"http://{addr}:{port}", timeout=60)
            r = run_cli(*words, cwd=tmp_path)
            assert r.code == code, (r.out, r.err)
            assert "Traceback" not in r.err
            j = run_cli(*words, "--json", cwd=tmp_path).json()
            (t,) = j["targets"]
            assert (t["name"], t["probe"]["outcome"]) == ("one", outcome), t
        finally:
            _stop(proc)


def test_a_failed_release_read_makes_the_lock_unknown_so_auto_waits(tmp_path, monkeypatch):
    """A read that found the deploy lock free, then a read that fails (the host unreachable: an
    operator may hold the lock by now): the lock is unknown again, so an --auto corruption run is
    skipped (skipped_lock), not started on the stale "free"; the failure is said once, and its
    recovery once (breaker's finding)."""
    import asyncio
    import types

    import dsv4ctl.deploy.site as site_mod
    import dsv4ctl.remote as remote_mod
    from dsv4ctl.hosts.layout import HostFacts
    p = _profile(tmp_path, """\
        - {name: one, role: colocated, host: local, gpus: [0, 1, 2, 3, 4, 5, 6, 7], tp: 8, serve_config: c.yaml}
        """)
    events: list = []
    w = Watcher(load_deployment(p), WatchOptions(auto=True, on_alert={"corruption": "toolcall-corruption"},
                                                 alert_window=12, emit=events.append))

    class Site:
        transports = {"local": types.SimpleNamespace(name="local")}
        paths = {"local": types.SimpleNamespace(root="/srv/dsv4ctl")}

        def close(self):
            pass
    monkeypatch.setattr(site_mod, "open_site", lambda *a, **k: Site())
    ok = {"now": True}

    def run_parallel(transports, fn, timeout=None):
        if ok["now"]:
            return {"local": types.SimpleNamespace(ok=True, error=None, value=HostFacts(
                host="local", root="/srv/dsv4ctl", current="r1", lock=None))}
        return {"local": types.SimpleNamespace(ok=False, error="local: cannot connect (connection refused)", value=None)}
    monkeypatch.setattr(remote_mod, "run_parallel", run_parallel)
    ran: list = []

    async def fake_run(cond, book, why, release=None):
        ran.append((cond, book))
    w._run_runbook = fake_run

    async def main():
        w.read_releases()
        assert w.locks == {"local": None}          # read, and free
        ok["now"] = False
        w.read_releases()
        w.read_releases()
        assert w.locks == {}                        # unknown again
        now = time.monotonic()
        for i in range(12):
            w.burn.add(("one", "r1"), now - 0.01 * i, True)
        await w.evaluate()
        await asyncio.sleep(0.05)
    asyncio.run(main())
    assert ran == []
    kinds = [(e["event"], e.get("outcome")) for e in events]
    assert kinds.count(("release_read_failed", None)) == 1, kinds
    assert ("alert_action", "skipped_lock") in kinds
    skipped = next(e for e in events if e.get("outcome") == "skipped_lock")
    assert skipped["lock_unknown"] == ["local"] and skipped["locked"] == []
    ok["now"] = True
    w.read_releases()
    assert w.locks == {"local": None} and events[-1] == {"event": "release_read_recovered", "host": "local"}


def test_short_or_cut_keys_never_show_and_never_bend_the_document():
    """Masking (breaker's findings): a key cut short by an error text's length limit is masked by
    what is left of it (8 characters or more); a short key that spells one of the document's own
    words (``ok``) leaves the document's keys and fixed values alone, while a server string with it
    is still masked."""
    from dsv4ctl.commands.check import check_secrets, masked
    key = "sk-proj-A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0U1v2W3x4Y5z6"
    reason = "HTTP 401: bad token: https://gw/x?region=eu-west-1&token=" + key[:31] + "…"
    out = masked({"probe": {"class": "auth_refused", "reason": reason}}, check_secrets(key))
    assert key[:8] not in json.dumps(out) and out["probe"]["reason"].endswith("&token=***…"), out
    doc = {"schema": "dsv4ctl.watch/1", "ok": True, "targets": [{"probe": {"class": "ok", "outcome": "ok",
                                                                          "reason": "said ok to Bearer ok"}}]}
    # only a cut (the secret stops at a token's end) is masked: a key sharing a word's first 8
    # characters leaves the word alone; linear time on a big text
    assert masked("model deepseek-v4-flash", check_secrets("deepseek-secret-key-1")) == "model deepseek-v4-flash"
    assert masked("sk-proj-x " * 3, check_secrets(key)) == "sk-proj-x " * 3
    m = masked(doc, check_secrets("ok"))
    assert m["schema"] == "dsv4ctl.watch/1" and m["ok"] is True
    probe = m["targets"][0]["probe"]
    assert (probe["class"], probe["outcome"]) == ("ok", "ok") and probe["reason"] == "said *** to Bearer ***"


@pytest.mark.parametrize("profile_extra,env,args,msg", [
    ("check: {max_corruption: 0}\n", {}, ["--print", "rules"], "check.max_corruption 0: the corruption burn alerts need"),
    ("check: {max_corruption: 1}\n", {}, ["--print", "rules"], "check.max_corruption 1: the corruption burn alerts need"),
    ("check: {max_corruption: 0.2}\n", {}, ["--on-alert", "toolcall-corruption"], "below 0.1 (they fire at 10x it)"),
    ("", {"DSV4CTL_API_KEY": "k\ney"}, ["--once"], "must be printable ASCII without spaces or control characters"),
])
def test_an_slo_the_burn_cannot_use_or_a_key_no_header_can_carry_is_exit_2(tmp_path, profile_extra, env, args, msg):
    p = _profile(tmp_path, """\
        - {name: one, role: colocated, host: local, gpus: [0, 1, 2, 3, 4, 5, 6, 7], tp: 8, serve_config: c.yaml}
        """, address=loopback(33))
    p.write_text(p.read_text().replace("groups:\n", profile_extra + "groups:\n"))
    r = run_cli("watch", str(p), "--no-releases", *args, env=env)
    assert r.code == 2 and msg in r.err and r.err.count("\n") == 1 and "Traceback" not in r.err, r.err
    assert "k\ney" not in r.err


def test_the_run_log_is_never_waited_on():
    """A FIFO where the run log goes (no reader): the record is not written and nothing blocks
    (was: watch hung in open() on its event loop, deaf to SIGTERM; breaker's finding)."""
    import tempfile
    from dsv4ctl.deploy.runlog import append_run
    with tempfile.TemporaryDirectory() as d:
        os.mkfifo(os.path.join(d, "runs.jsonl"))
        r = subprocess.run([sys.executable, "-c", "from dsv4ctl.deploy.runlog import append_run as a; "
                            "print(a({'command': 'x'}))"], cwd=REPO, env=dict(os.environ, DSV4CTL_STATE_DIR=d),
                           capture_output=True, text=True, timeout=20)
        assert r.stdout == "False\n", r.stderr
    with tempfile.TemporaryDirectory() as d:
        old = os.environ.get("DSV4CTL_STATE_DIR")
        os.environ["DSV4CTL_STATE_DIR"] = d
        try:
            assert append_run({"command": "x"}) and append_run({"command": "y"})
        finally:
            os.environ.pop("DSV4CTL_STATE_DIR") if old is None else os.environ.update(DSV4CTL_STATE_DIR=old)
        recs = [json.loads(x) for x in open(os.path.join(d, "runs.jsonl"))]
        assert [r["command"] for r in recs] == ["x", "y"] and all(r["ts"] and r["who"] for r in recs)
        assert oct(os.stat(os.path.join(d, "runs.jsonl")).st_mode & 0o777) == "0o600"


def test_upstream_counters_are_served_as_counters():
    # SGLang's and the gateway's counters, re-exported with their value as read (issue 45: gauges before)
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from dsv4ctl.watch.metrics import GATEWAY_RETRIES, GATEWAY_RETRIES_EXHAUSTED, SGLANG_GENERATED, \
        SGLANG_TRANSFER_FAILED, UpstreamCounter, WatchMetrics
    m = WatchMetrics()
    m.generated.labels("one").set(1234)
    m.generated.labels("one").set(17)              # the server restarted: a reset, served as read
    m.transfer_failed.labels("one").set(3)
    m.gw_retries.labels("router", "decode").set(2)
    m.gw_exhausted.labels("router", "decode").set(0)
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(m.registry).decode())}
    for name in (SGLANG_GENERATED, SGLANG_TRANSFER_FAILED, GATEWAY_RETRIES, GATEWAY_RETRIES_EXHAUSTED):
        assert name.endswith("_total") and fams[name[:-6]].type == "counter", name
    assert [(s.name, s.labels, s.value) for s in fams[SGLANG_GENERATED[:-6]].samples] == \
        [(SGLANG_GENERATED, {"target": "one"}, 17.0)]
    assert [(s.labels, s.value) for s in fams[GATEWAY_RETRIES[:-6]].samples] == \
        [({"target": "router", "worker_type": "decode"}, 2.0)]
    m.gw_retries.remove("router", "decode")
    assert "dsv4ctl_watch_gateway_retries_total{" not in generate_latest(m.registry).decode()
    with pytest.raises(ValueError, match="expected labels"):
        m.generated.labels("one", "two")
    with pytest.raises(ValueError, match="ends in _total"):
        UpstreamCounter("dsv4ctl_watch_x", "x", [], registry=m.registry)
