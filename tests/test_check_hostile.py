"""``dsv4ctl check smoke`` / ``check load`` against a hostile test server (tests/hostile/server.py,
not a stand-in: a deliberately broken server on 127.0.0.1): over-size bodies, endless streams,
dripped bytes and wrong JSON shapes are failed lines / classified turns, never a traceback, a
MemoryError or a hang; bad options are one-line input errors."""

from __future__ import annotations

import json

import pytest

from dsv4ctl.check import classify as C
from tests.conftest import run_cli
from tests.hostile.server import hostile_server

LOAD = ("-c", "2", "--turns", "2", "--min-requests", "4", "--no-progress", "--json", "--no-metrics")


@pytest.fixture(scope="module")
def root():
    with hostile_server() as url:
        yield url


def smoke(url: str, *extra: str):
    r = run_cli("check", "smoke", url, "--json", *extra, timeout=60)
    assert "Traceback" not in r.err and "MemoryError" not in r.err, r.err
    return r, {c["check"]: c for c in r.json()["checks"]}


def test_hostile_server_good_mode_passes_smoke(root):
    # the control: the same server in its well-formed mode passes (the chat probes need SGLang tool
    # calls, which this server does not make, so only the first four lines are judged)
    r, lines = smoke(root + "/good")
    assert [lines[k]["status"] for k in ("health", "models", "server_info", "chat")] == ["pass"] * 4


@pytest.mark.parametrize("mode,chat,stream", [
    ("flood", f"response body larger than {C.MAX_JSON_BODY} bytes",
     f"assembled response longer than {C.MAX_CONTENT} characters"),
    ("noline", f"response body larger than {C.MAX_JSON_BODY} bytes", f"SSE line longer than {C.MAX_SSE_LINE} bytes"),
    ("hugejson", f"response body larger than {C.MAX_JSON_BODY} bytes", None),
    ("nullchoice", "choices[0] is NoneType, not an object", "choices[] is NoneType, not an object"),
    ("weird_types", "function.name is int, not a string", "delta.content is list, not a string"),
])
def test_smoke_oversized_and_malformed_answers_fail_their_lines(root, mode, chat, stream):
    r, lines = smoke(root + "/" + mode)
    assert r.code == 1 and r.err.startswith("dsv4ctl: gate failed: check smoke: ")
    assert lines["health"]["status"] == "pass" and lines["models"]["status"] == "pass"
    assert lines["chat"]["status"] == "fail"
    assert lines["chat"]["reason"] == "http_error: protocol: " + chat
    if stream:
        assert lines["tool_call_stream"]["reason"] == "http_error: protocol: " + stream


def test_smoke_usage_of_wrong_type_is_a_protocol_error(root):
    r, lines = smoke(root + "/usage_str")
    assert lines["chat"]["status"] == "fail" and lines["chat"]["reason"] == \
        "http_error: protocol: usage is str, not an object"
    assert lines["tool_call_stream"]["reason"] == "http_error: protocol: usage is str, not an object"


def test_smoke_oversized_get_documents_and_non_utf8_models(root):
    r, lines = smoke(root + "/hugeinfo")
    assert lines["server_info"]["status"] == "fail"
    assert lines["server_info"]["reason"] == (f"{root}/hugeinfo/server_info: response body larger than "
                                              f"{C.MAX_JSON_BODY} bytes")
    r, lines = smoke(root + "/hugemodels")
    assert r.code == 1 and lines["models"]["status"] == "fail"
    assert lines["models"]["reason"].endswith(f"larger than {C.MAX_JSON_BODY} bytes")
    r, lines = smoke(root + "/models_garbage")
    assert r.code == 1 and lines["models"]["reason"] == "HTTP 200, no model listed"


def test_smoke_timeout_is_a_total_per_probe(root):
    # one byte every 0.2 s never trips a no-progress timeout; --timeout 1 bounds each probe
    r, lines = smoke(root + "/drip", "--timeout", "1")
    assert r.code == 1
    for k in ("chat", "tool_call", "tool_call_stream"):
        assert lines[k]["status"] == "fail"
        assert lines[k]["reason"] == "stuck: no complete answer within 1 s"


def load(url: str, tmp_path, *extra: str):
    rec = tmp_path / "r.jsonl"
    r = run_cli("check", "load", url, *LOAD, "--records", str(rec), *extra, timeout=90)
    assert "Traceback" not in r.err and "MemoryError" not in r.err, r.err
    return r, [json.loads(x) for x in rec.read_text().splitlines()]


@pytest.mark.parametrize("mode,reason", [
    ("flood", None),
    ("noline", None),
    ("hugejson", None),
    ("nullchoice", "protocol: choices"),
    ("usage_str", "protocol: usage is str, not an object"),
    ("weird_types", "protocol: "),
])
def test_load_classifies_hostile_answers_as_http_error(root, tmp_path, mode, reason):
    r, recs = load(root + "/" + mode, tmp_path, "--stream", "mixed")
    assert r.code == 1, r.err
    lv = r.json()["levels"][0]
    assert (lv["turns"], lv["corrupted"], lv["classes"]["http_error"]["count"]) == (4, 4, 4)
    assert len(recs) == 4 and all(x["class"] == "http_error" for x in recs)
    for x in recs:
        if mode == "flood":
            want = (f"protocol: assembled response longer than {C.MAX_CONTENT} characters" if x["stream"]
                    else f"protocol: response body larger than {C.MAX_JSON_BODY} bytes")
        elif mode in ("noline", "hugejson"):
            want = (f"protocol: SSE line longer than {C.MAX_SSE_LINE} bytes" if x["stream"]
                    else f"protocol: response body larger than {C.MAX_JSON_BODY} bytes")
        else:
            want = reason
        assert x["reason"].startswith(want), x
        assert x["completion_tokens"] is None


def test_load_turn_timeout_catches_dripping_server(root, tmp_path):
    r, recs = load(root + "/drip", tmp_path, "--stall-timeout", "2", "--turn-timeout", "1")
    assert r.code == 1
    doc = r.json()
    assert doc["settings"]["turn_timeout_s"] == 1.0
    lv = doc["levels"][0]
    assert (lv["turns"], lv["stuck"], lv["classes"]["stuck"]["count"]) == (4, 4, 4)
    assert all(x["reason"] == "no complete answer within 1 s" and 0.9 < x["e2e_s"] < 3 for x in recs)


@pytest.mark.parametrize("args,msg", [
    (("--stall-timeout", "nan"), "--stall-timeout 'nan': expected a duration such as 500ms, 90s, 15m, 2h or 1d"),
    (("--stall-timeout", "inf"), "--stall-timeout 'inf': expected a duration such as 500ms, 90s, 15m, 2h or 1d"),
    (("--stall-timeout", "0"), "--stall-timeout '0': expected more than 0s, at most 1d"),
    (("--turn-timeout", "-1"), "--turn-timeout '-1': expected a duration such as 500ms, 90s, 15m, 2h or 1d"),
    (("--turn-timeout", "nan"), "--turn-timeout 'nan': expected a duration such as 500ms, 90s, 15m, 2h or 1d"),
])
def test_load_rejects_non_finite_timeouts(root, args, msg):
    r = run_cli("check", "load", root + "/good", *LOAD, *args)
    assert r.code == 2 and r.err.strip() == "dsv4ctl: error: " + msg


def test_smoke_rejects_non_finite_timeout(root):
    for v in ("nan", "inf", "-3"):
        r = run_cli("check", "smoke", root + "/good", "--timeout", v)
        assert r.code == 2 and "expected a duration such as" in r.err and "Traceback" not in r.err


@pytest.mark.parametrize("cmd", [("smoke",), ("load", "-c", "1", "--no-progress")])
def test_api_key_with_control_characters_is_an_input_error(root, cmd):
    secret = "s3cr3t\nInjected: yes"
    r = run_cli("check", *cmd, root + "/good", "--api-key", secret)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1
    assert "--api-key / DSV4CTL_API_KEY: must be printable ASCII" in r.err
    assert "s3cr3t" not in r.err + r.out
    r = run_cli("check", *cmd, root + "/good", env={"DSV4CTL_API_KEY": "k\u00e9y"})
    assert r.code == 2 and "must be printable ASCII" in r.err and "k\u00e9y" not in r.err


def test_unwritable_records_fail_before_the_load(root, tmp_path):
    r = run_cli("check", "load", root + "/good", *LOAD, "--records", "/dev/full")
    assert r.code == 2 and r.err.strip() == "dsv4ctl: error: --records /dev/full: not writable: No space left on device"
    r = run_cli("check", "load", root + "/good", *LOAD, "--records", str(tmp_path / "no" / "dir.jsonl"))
    assert r.code == 2 and "No such file or directory" in r.err and "Traceback" not in r.err
    # a writable path holds this run's records alone (the write probe is taken back; an earlier run's go)
    ok = tmp_path / "ok.jsonl"
    ok.write_text('{"earlier": "run"}\n' * 10)
    run_cli("check", "load", root + "/nullchoice", *LOAD, "--records", str(ok))
    assert ok.read_text().startswith('{"') and "earlier" not in ok.read_text() and len(ok.read_text().splitlines()) == 4


def test_load_rejects_a_model_id_that_is_not_a_string(root):
    r = run_cli("check", "load", root + "/models_weird", *LOAD)
    assert r.code == 2 and r.err.strip() == f"dsv4ctl: error: check load: {root}/models_weird/v1/models: HTTP 200, no model listed"
    r = run_cli("check", "load", root + "/hugemodels", *LOAD)
    assert r.code == 2 and r.err.strip().endswith(f"larger than {C.MAX_JSON_BODY} bytes") and "Traceback" not in r.err


@pytest.mark.parametrize("mode", ["flood", "noline"])
def test_endless_answers_stay_within_a_small_address_space(root, mode):
    # an endless stream used to grow the client until MemoryError; with the limits the real CLI
    # finishes under a 400 MiB address-space cap (RLIMIT_AS) with every turn classified
    import resource
    import subprocess
    import sys

    from tests.conftest import REPO

    cap = 400 << 20

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    p = subprocess.run([sys.executable, "-m", "dsv4ctl.cli", "check", "load", root + "/" + mode, "-c", "4",
                        "--turns", "2", "--min-requests", "8", "--no-progress", "--json", "--no-metrics"],
                       cwd=REPO, capture_output=True, text=True, preexec_fn=limit, timeout=60)
    assert p.returncode == 1 and "MemoryError" not in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]
    lv = json.loads(p.stdout)["levels"][0]
    assert (lv["turns"], lv["classes"]["http_error"]["count"]) == (8, 8)


def test_records_write_failing_mid_run_is_one_line_exit_2(root, tmp_path):
    # the write probe passes, then the file hits RLIMIT_FSIZE (EFBIG; Python ignores SIGXFSZ)
    import resource
    import subprocess
    import sys

    from tests.conftest import REPO

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))
    rec = tmp_path / "r.jsonl"
    p = subprocess.run([sys.executable, "-m", "dsv4ctl.cli", "check", "load", root + "/nullchoice", "-c", "2",
                        "--turns", "2", "--min-requests", "40", "--no-progress", "--json", "--no-metrics",
                        "--records", str(rec)], cwd=REPO, capture_output=True, text=True, preexec_fn=limit, timeout=60)
    assert p.returncode == 2 and p.stderr == f"dsv4ctl: error: --records {rec}: write failed: File too large\n"
    assert p.stdout == "" and rec.stat().st_size <= 3000


# --- connection-level attacks (tests/hostile/server.py raw_server) and client-side failures ------
from tests.hostile.server import RAW_MODES, closed_port, raw_server  # noqa: E402

RAW_MESSAGES = {
    "disconnect": "{hp} closed the connection without an HTTP answer (GET /disconnect/v1/models)",
    "badstatus": "{hp}: GET /badstatus/v1/models: broken HTTP answer (Bad status line)",
    "bigheader": "{hp}: GET /bigheader/v1/models: broken HTTP answer (Got more than 8190 bytes when reading)",
    "badchunk": "{hp}: GET /badchunk/v1/models: broken HTTP answer (Invalid character in chunk size)",
    "redirect": "{hp}: GET /redirect/v1/models: too many redirects (a redirect loop)",
    "reset": "{hp} reset the connection (GET /reset/v1/models)",
    "garbage": "{hp}: GET /garbage/v1/models: broken HTTP answer (Bad status line)",
}


@pytest.fixture(scope="module")
def raw_root():
    with raw_server() as url:
        yield url


def test_every_raw_mode_has_a_message():
    assert set(RAW_MESSAGES) == set(RAW_MODES)


@pytest.mark.parametrize("cmd", ["smoke", "load"])
@pytest.mark.parametrize("mode", sorted(RAW_MODES))
def test_broken_http_at_discovery_is_one_line_exit_2(raw_root, mode, cmd):
    hp = raw_root.removeprefix("http://")
    extra = ("--timeout", "10") if cmd == "smoke" else LOAD
    r = run_cli("check", cmd, f"{raw_root}/{mode}", *extra, timeout=60)
    want = f"dsv4ctl: error: check {cmd}: " + RAW_MESSAGES[mode].format(hp=hp)
    assert (r.code, r.err) == (2, want + "\n")


@pytest.mark.parametrize("cmd", ["smoke", "load"])
def test_connection_refused_speaks_operator(cmd):
    port = closed_port()
    r = run_cli("check", cmd, f"http://127.0.0.1:{port}", *(() if cmd == "smoke" else LOAD))
    assert (r.code, r.err) == (2, f"dsv4ctl: error: check {cmd}: cannot connect to 127.0.0.1:{port} (connection refused)\n")


def test_a_load_that_cannot_connect_leaves_the_records_files_as_they_were(tmp_path):
    # a header-only --turns-csv was left behind, as if a run had been recorded; and an earlier run's
    # --records file was emptied (then removed): a run that sent no turn destroyed the last one's records
    port = closed_port()
    rec, csv_ = tmp_path / "r.jsonl", tmp_path / "t.csv"
    earlier = '{"turn": 1, "class": "ok"}\n' * 3
    rec.write_text(earlier)
    r = run_cli("check", "load", f"http://127.0.0.1:{port}", *LOAD, "--records", str(rec), "--turns-csv", str(csv_))
    assert r.code == 2 and "cannot connect" in r.err, r.err
    assert rec.read_text() == earlier and not csv_.exists()


def _no_dns(monkeypatch, name: str) -> None:
    """Name resolution of ``name`` fails as for a name that does not exist (no resolver traffic)."""
    import socket
    real = socket.getaddrinfo

    def fake(host, *a, **kw):
        if host == name:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *a, **kw)
    monkeypatch.setattr(socket, "getaddrinfo", fake)


@pytest.mark.parametrize("cmd,extra", [
    ("smoke", ()),
    ("load", LOAD),
    # with --model there is no discovery: the turns hit it. Before: every turn an http_error, the
    # gate failed (exit 1) on a server never reached
    ("load", LOAD + ("--model", "m")),
])
def test_dns_failure_is_client_side_exit_2_not_corruption(monkeypatch, capsys, tmp_path, cmd, extra):
    from dsv4ctl.cli import main
    _no_dns(monkeypatch, "dsv4ctl-nxdomain.test")
    rec = tmp_path / "r.jsonl"
    args = ["check", cmd, "http://dsv4ctl-nxdomain.test:8000", *extra] + (["--records", str(rec)] if cmd == "load" else [])
    code = main(args)
    out, err = capsys.readouterr()
    assert (code, err) == (2, f"dsv4ctl: error: check {cmd}: cannot resolve dsv4ctl-nxdomain.test "
                              "(name or service not known)\n")
    if cmd == "load":
        assert out == "" and not rec.exists()       # no turn recorded (no file left), no report


_EMFILE_CHILD = r'''
import os, resource, sys
import dsv4ctl.check.driver as D
D.ensure_fd_limit = lambda c, spare=64: 0     # as if the limit fitted at start, then ran out
from dsv4ctl.cli import main
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[1])))
sys.exit(main(sys.argv[2:]))
'''


def test_out_of_descriptors_mid_run_is_exit_2_never_corruption(root, tmp_path):
    # Before: turns whose connect failed with EMFILE were http_error corruption and failed the gate
    # (exit 1: "67.83 % corruption" on a healthy server). Now the run stops, exit 2, no verdict.
    import subprocess
    import sys

    from tests.conftest import REPO
    rec = tmp_path / "r.jsonl"
    p = subprocess.run([sys.executable, "-c", _EMFILE_CHILD, "48", "check", "load", root + "/good", "-c", "64",
                        "--turns", "2", "--min-requests", "128", "--model", "m", "--no-progress", "--json",
                        "--no-metrics", "--records", str(rec)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stdout == "", (p.returncode, p.stderr[-2000:])
    assert p.stderr.startswith("dsv4ctl: error: check load: cannot connect to 127.0.0.1:") and p.stderr.endswith(
        ": this machine is out of file descriptors (raise the limit with ulimit -n or use fewer sessions)\n")
    recs = [json.loads(x) for x in rec.read_text().splitlines()]
    # the turns that were answered are recorded as judged (this server makes no tool calls); none
    # is an http_error: the EMFILE turn is no turn
    assert all(x["class"] != "http_error" and x["http_status"] == 200 for x in recs), [x["reason"] for x in recs][:3]


def test_descriptors_already_in_use_count_against_the_limit(root):
    # the limit check counts descriptors already open: 200 held of 300 leave no room for 100
    # sessions (before: 100 + 64 <= 300 passed, then the run ran out of descriptors)
    import subprocess
    import sys

    from tests.conftest import REPO
    child = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300)); "
             "held = [os.open('/dev/null', os.O_RDONLY) for _ in range(200)]; "
             "from dsv4ctl.cli import main; sys.exit(main(sys.argv[1:]))")
    p = subprocess.run([sys.executable, "-c", child, "check", "load", root + "/good", "-c", "100", "--model", "m",
                        "--no-progress", "--no-metrics"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("dsv4ctl: error: check load: 100 sessions need about "), p.stderr
    assert "in use), but the limit is 300 (raise it with ulimit -n)" in p.stderr


def test_sigterm_during_load_is_exit_130_with_the_records_kept(root, tmp_path):
    # before: SIGTERM killed check load at once (exit -15, no message); now like Ctrl-C
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO
    rec = tmp_path / "r.jsonl"
    p = subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", "check", "load", root + "/nullchoice", "-c", "2",
                          "--turns", "2", "--min-requests", "10000000", "--no-progress", "--no-metrics",
                          "--records", str(rec)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    # a complete record line (the --records writability probe writes and truncates one "\n" first)
    while not (rec.exists() and rec.read_text().strip()):
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert (p.returncode, err) == (130, f"dsv4ctl: error: interrupted (records so far in {rec})\n")
    assert all(json.loads(x)["class"] == "http_error" for x in rec.read_text().splitlines())


# --- the API key: a refused key is the client's problem (exit 2), never a verdict ---------------
AUTH_HINT = "set DSV4CTL_API_KEY or the serve config's api-key"


@pytest.mark.parametrize("mode,status", [("auth401", 401), ("auth403", 403), ("authchat", 401)])
@pytest.mark.parametrize("cmd", [("smoke",), ("load", *LOAD, "--model", "m"), ("load", *LOAD)])
def test_a_refused_api_key_is_exit_2_not_a_verdict(root, mode, status, cmd, tmp_path):
    # before: every turn an http_error, "corruption 100 %", exit 1 (smoke: failed lines, exit 1)
    base = root + "/" + mode
    hp = base.split("://")[1].split("/")[0]
    recs = tmp_path / "r.jsonl"
    extra = ("--records", str(recs)) if cmd[0] == "load" else ()
    r = run_cli("check", *cmd, base, *extra, "--api-key", "wrong-key-1234", timeout=60)
    assert r.code == 2, r.err + r.out
    err = r.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"dsv4ctl: error: check {cmd[0]}: {hp} refuses the API key "
                                                         f"(HTTP {status} for ")
    assert err.endswith(f"): {AUTH_HINT}") and "wrong-key-1234" not in r.err + r.out
    assert r.out == ""          # no report: nothing was judged
    if cmd[0] == "load":
        assert not recs.exists()    # no turn recorded: the file the run made is gone
    r = run_cli("check", *cmd, base, *extra, timeout=60)
    assert r.code == 2 and f"{hp} needs an API key (HTTP {status} for " in r.err


def test_some_refused_turns_after_the_key_was_taken_are_counted(root, tmp_path):
    # the server took the key, then refuses some turns (a worker behind a gateway with another
    # key): the server's answer, counted as http_error turns (a verdict, exit 1)
    r = run_cli("check", "load", root + "/authsome", "-c", "1", "--turns", "2", "--min-requests", "4",
                "--no-progress", "--json", "--no-metrics", "--model", "m", timeout=60)
    assert r.code == 1, r.err
    lv = r.json()["levels"][0]
    assert lv["turns"] == 4 and lv["classes"]["http_error"]["count"] == 2


def test_records_and_reports_mask_echoed_keys_and_authorization_headers(root, tmp_path):
    # before: --records held the key the server echoed back (Authorization: Bearer KEY)
    key = "s3cret-token-9876"
    recs, csvf = tmp_path / "r.jsonl", tmp_path / "t.csv"
    r = run_cli("check", "load", root + "/echo", *LOAD, "--model", "m", "--records", str(recs),
                env={"DSV4CTL_API_KEY": key}, timeout=60)
    assert r.code == 1, r.err
    text = recs.read_text()
    assert key not in text and key not in r.out + r.err
    rows = [json.loads(x) for x in text.splitlines()]
    assert len(rows) == 4 and all("'Authorization': 'Bearer ***'" in x["reason"] for x in rows), rows[0]["reason"]
    r = run_cli("check", "load", root + "/echo", *LOAD, "--model", "m", "--turns-csv", str(csvf),
                "--api-key", key, timeout=60)
    assert key not in csvf.read_text() + r.out + r.err and "Bearer ***" in csvf.read_text()
    r = run_cli("check", "smoke", root + "/echo", "--json", "--api-key", key, timeout=60)
    assert r.code == 1 and key not in r.out + r.err and "Bearer ***" in r.out


def test_long_failure_reasons_are_cut_at_a_word_with_an_ellipsis(root):
    # before: the server's error body was cut at 200 characters, mid-word, with no sign of the cut
    import re
    r, lines = smoke(root + "/longerror")
    assert r.code == 1
    reason = lines["chat"]["reason"]
    assert reason.startswith('http_error: HTTP 500: {"error": {"message": "word000 word001 ') and reason.endswith("…")
    assert re.fullmatch(r"word\d{3}", reason[:-1].split()[-1]), reason
    assert len(reason) <= len("http_error: HTTP 500: ") + 200
