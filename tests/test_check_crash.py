"""``dsv4ctl check load`` when the server crashes (issue 14 item 5) and the gate's per-class
examples (item 7). Real CLI processes, real HTTP on 127.0.0.1: a port with nothing listening,
the stand-in SGLang server killed mid-level, a tiny raw HTTP server that drops connections in a
scripted pattern, and the stand-in with HiCache on for corrupted turns."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from dsv4ctl.check import report as R
from tests.conftest import REPO, run_cli
from tests.standin.harness import free_port, popen_standin, write_config

FAST = ("--ttft-ms", "2", "--itl-ms", "0.1")


def _records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _start_standin(config: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    """The stand-in as a process of its own (so the test can SIGKILL it); (process, base URL)."""
    port = free_port()
    proc = popen_standin(["--config", str(config), "--host", "127.0.0.1", "--port", str(port), *flags], quiet=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120      # an event poll: a loaded 2-core machine may take a while
    try:
        while True:
            assert proc.poll() is None, "stand-in exited"
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return proc, url
            except OSError:
                pass
            assert time.monotonic() < deadline, "stand-in not healthy"
            time.sleep(0.05)
    except BaseException:
        proc.kill()                        # never leave it running behind a failed test
        proc.wait()
        raise


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


# --- a port with nothing listening ------------------------------------------------------------
def test_dead_port_is_a_crash_and_stops_the_ramp(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    rec = tmp_path / "r.jsonl"
    t0 = time.monotonic()
    # --model: no /v1/models discovery (that would be a connection error up front, exit 2)
    r = run_cli("check", "load", dead, "-c", "3,40", "--model", "m", "--records", str(rec), "--json", "--no-progress")
    assert time.monotonic() - t0 < 30
    assert r.code == 1, r.err
    assert "dsv4ctl: gate failed: check load: crashed at concurrency 3 (" + dead + ")" in r.err
    assert "levels not run: 40" in r.err and f"records in {rec}" in r.err and "Traceback" not in r.err
    doc = r.json()
    assert doc["pass"] is False and doc["not_run"] == [40]
    assert [lv["concurrency"] for lv in doc["levels"]] == [3]          # the second level never ran
    lv = doc["levels"][0]
    assert lv["crashed"] is True and lv["pass"] is False
    assert "ClientConnectorError" in lv["crash_reason"] and "8 consecutive turns" in lv["crash_reason"]
    # stopped after K = max(8, 3) = 8 refused turns (+ the ones in flight), not the 381-turn target
    assert 8 <= lv["turns"] <= 8 + 3
    assert lv["crash_turn"] == 1 and lv["crash_turns"] == lv["turns"]
    # crash turns are errors, not corruption: out of the rate, the classes and the examples
    assert (lv["corrupted"], lv["rate"], lv["examples"]) == (0, None, {})
    assert sum(c["count"] for c in lv["classes"].values()) == 0
    recs = _records(rec)
    assert len(recs) == lv["turns"]
    assert all(x["class"] == "http_error" and x["connection_error"] is True and x["http_status"] is None
               for x in recs)
    assert lv["crash_rid"] == recs[0]["rid"] and lv["crash_started_at"] == recs[0]["t_start"]
    assert doc["crash"] == {"url": dead, "concurrency": 3, "reason": lv["crash_reason"],
                            "started_at": lv["crash_started_at"], "turn": 1, "rid": lv["crash_rid"]}
    assert doc["settings"]["records"] == str(rec)

    # the terminal and Markdown reports say it too, and name the records file
    for fmt in ((), ("--markdown",)):
        r = run_cli("check", "load", dead, "-c", "3,40", "--model", "m", "--records", str(rec), "--no-progress", *fmt)
        assert r.code == 1, r.err
        assert "crashed at concurrency 3 (" + dead + ")" in r.out
        assert "level(s) not run: 40" in r.out and f"records: {rec}" in r.out
        assert "FAIL (crashed at concurrency 3)" in r.out and "CRASHED" in r.out


def test_fewer_than_k_refused_turns_are_a_crash_when_health_cannot_connect(tmp_path):
    # 3 turns in all (< K = 8): the level ends, GET /health cannot connect either -> crash
    dead = f"http://127.0.0.1:{free_port()}"
    r = run_cli("check", "load", dead, "-c", "1,2", "--turns", "1", "--min-requests", "3", "--model", "m",
                "--json", "--no-progress")
    assert r.code == 1 and "crashed at concurrency 1" in r.err
    lv = r.json()["levels"][0]
    assert (lv["turns"], lv["crashed"], lv["crash_turns"]) == (3, True, 3)
    assert "GET /health: ClientConnectorError" in lv["crash_reason"]
    assert r.json()["not_run"] == [2]


# --- a server killed mid-level ----------------------------------------------------------------
def test_server_killed_mid_level_is_a_crash_at_that_level(tmp_path):
    cfg = write_config(tmp_path / "serve.yaml")
    proc, url = _start_standin(cfg, *FAST)
    rec = tmp_path / "r.jsonl"
    cli = None
    try:
        cli = subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", "check", "load", url, "-c", "6,12",
                                "--turns", "4", "--answer-words", "20", "--min-requests", "1000000",
                                "--records", str(rec), "--json", "--no-progress"],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, NO_COLOR="1"))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not rec.exists() or len(rec.read_text().splitlines()) < 150):
            time.sleep(0.05)
        assert len(rec.read_text().splitlines()) >= 150
        proc.send_signal(signal.SIGKILL)                # the server dies with turns in flight
        out, err = cli.communicate(timeout=60)
    finally:
        _stop(proc)
        if cli is not None and cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode == 1, err
    assert f"crashed at concurrency 6 ({url})" in err and "levels not run: 12" in err
    doc = json.loads(out)
    assert [lv["concurrency"] for lv in doc["levels"]] == [6] and doc["not_run"] == [12]
    lv = doc["levels"][0]
    recs = _records(rec)
    assert lv["crashed"] and len(recs) == lv["turns"] < 1_000_000
    first = lv["crash_turn"] - 1
    assert first >= 150 and lv["crash_rid"] == recs[first]["rid"]
    # before the crash the server answered every turn; from its first failing turn on, all failed
    assert all(x["class"] == "ok" for x in recs[:first])
    assert all(x["connection_error"] and x["class"] == "http_error" for x in recs[first:])
    assert lv["crash_turns"] == len(recs) - first >= 8
    # the turns answered before the crash make up the rate (HiCache off: 0 corrupted)
    assert (lv["corrupted"], lv["rate"], lv["pass"]) == (0, 0.0, False)
    assert doc["crash"]["concurrency"] == 6 and doc["pass"] is False


# --- a server that drops connections but comes back -------------------------------------------
class FlakyServer:
    """A raw HTTP/1.1 server on 127.0.0.1 (its own thread and event loop) that answers
    ``POST /v1/chat/completions`` with a plain ``chat.completion`` (SGLang's JSON wire format,
    ``Connection: close``) or closes the connection without a byte, as ``drop(n)`` says for the
    n-th request (0-based); ``GET /health`` is answered unless ``health_dead``."""

    def __init__(self, drop, health_dead: bool = False):
        import asyncio
        self.drop, self.health_dead, self.n = drop, health_dead, 0
        self.loop = asyncio.new_event_loop()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        ready = threading.Event()

        async def handle(reader, writer):
            try:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length) if length else b""
                if head.startswith(b"GET /health"):
                    if not self.health_dead:
                        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    return
                if not head.startswith(b"POST /v1/chat/completions"):   # /server_info, /v1/models: not served
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    return
                n, self.n = self.n, self.n + 1
                if self.drop(n):
                    return                              # close without answering
                rid = json.loads(body).get("rid") or "x"
                doc = json.dumps({"id": rid, "object": "chat.completion", "model": "m",
                                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "done."},
                                               "finish_reason": "stop"}],
                                  "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                             b"Content-Length: " + str(len(doc)).encode() + b"\r\n\r\n" + doc)
                await writer.drain()
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                pass
            finally:
                writer.close()

        def run():
            asyncio.set_event_loop(self.loop)
            self.server = self.loop.run_until_complete(asyncio.start_server(handle, sock=self.sock))
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        ready.wait(10)

    def close(self) -> None:
        def stop():
            self.server.close()
            self.loop.stop()
        self.loop.call_soon_threadsafe(stop)
        self.thread.join(10)


def test_a_server_that_comes_back_is_not_a_crash(tmp_path):
    # runs of 7 dropped connections (< K = 8), each followed by an answer: never K in a row
    srv = FlakyServer(lambda n: n % 8 != 7)
    try:
        rec = tmp_path / "r.jsonl"
        r = run_cli("check", "load", srv.url, "-c", "1", "--turns", "1", "--stream", "off", "--min-requests", "40",
                    "--model", "m", "--no-metrics", "--records", str(rec), "--json", "--no-progress")
    finally:
        srv.close()
    assert r.code == 1 and "dsv4ctl: gate failed: check load: http" in r.err and "crashed" not in r.err
    doc = r.json()
    lv = doc["levels"][0]
    assert (lv["turns"], lv["crashed"], lv["crash_turns"], doc["crash"]) == (40, False, 0, None)
    # intermittent connection errors are http_error corruption, as any failed turn; the answers
    # reset the run of connection errors although they are wrong (a one-turn session asks for a
    # tool and the server answers in text): an answer, any answer, means the server is alive
    assert (lv["classes"]["http_error"]["count"], lv["classes"]["no_tool_call"]["count"], lv["corrupted"]) == (35, 5, 40)
    ex = lv["examples"]["http_error"]
    recs = _records(rec)
    first_bad = next(x for x in recs if x["class"] == "http_error")
    assert ex["rid"] == first_bad["rid"] and ex["got"]["http_status"] is None
    assert "ServerDisconnectedError" in ex["reason"] or "ClientOSError" in ex["reason"]


def test_a_server_that_stops_answering_after_flaking_crashes_where_the_run_began(tmp_path):
    # flaky for 24 requests, then every connection is dropped; /health dead too
    srv = FlakyServer(lambda n: n >= 24 or n % 4 != 3, health_dead=True)
    try:
        r = run_cli("check", "load", srv.url, "-c", "1,2", "--turns", "1", "--stream", "off", "--min-requests", "200",
                    "--model", "m", "--no-metrics", "--json", "--no-progress")
    finally:
        srv.close()
    assert r.code == 1 and "crashed at concurrency 1" in r.err
    lv = r.json()["levels"][0]
    # request 23 was the last answered; the crash run starts at the 25th turn and lasts K = 8
    assert (lv["crash_turn"], lv["crash_turns"], lv["turns"]) == (25, 8, 32)
    assert lv["classes"]["http_error"]["count"] == 18        # the 18 drops before it (+ 6 text answers)
    assert lv["corrupted"] == 18 + 6
    assert r.json()["not_run"] == [2]


# --- healthy and corrupted runs: no crash, examples per class ------------------------------------
@pytest.fixture(scope="module")
def hicache_on(tmp_path_factory):
    cfg = write_config(tmp_path_factory.mktemp("crash") / "on.yaml", enable_hierarchical_cache=True)
    proc, url = _start_standin(cfg, *FAST, "--corruption-scale", "2.5", "--seed", "3")
    try:
        yield url
    finally:
        _stop(proc)


def test_corrupted_run_has_one_example_per_class(hicache_on, tmp_path):
    rec = tmp_path / "r.jsonl"
    r = run_cli("check", "load", hicache_on, "-c", "48", "--turns", "4", "--answer-words", "20",
                "--min-requests", "300", "--records", str(rec), "--json", "--no-progress", timeout=300)
    assert r.code == 1 and "dsv4ctl: gate failed: check load: http" in r.err and "crashed" not in r.err
    doc = r.json()
    lv = doc["levels"][0]
    assert (lv["crashed"], lv["crash_reason"], lv["crash_turns"]) == (False, None, 0)
    assert (doc["crash"], doc["not_run"]) == (None, [])
    recs = {x["rid"]: x for x in _records(rec)}
    seen = {c for c, v in lv["classes"].items() if v["count"]}
    assert len(seen) >= 3 and set(lv["examples"]) == seen
    for cls, ex in lv["examples"].items():
        x = recs[ex["rid"]]                                  # a real request id of a real turn
        assert x["class"] == cls and ex["response_id"] == x["rid"] == ex["rid"]      # the stand-in echoes rid
        assert ex["expected"]["requires_tool"] == x["requires_tool"] and ex["expected"]["tool"] == x["tool"]
        assert ("expected_calls" in ex["expected"]) == ("expected_calls" in x)
        assert ex["got"]["finish_reason"] == x["finish_reason"] and ex["got"]["tool_calls"] == x["tool_calls"]
        assert ex["got"]["content_excerpt"] == x.get("content_excerpt") and ex["reason"] == x["reason"]
        # the first turn of that class, in finishing order
        assert ex["rid"] == next(y["rid"] for y in recs.values() if y["class"] == cls)
    if "dsml_in_content" in lv["examples"]:
        assert "\uff5cDSML\uff5c" in lv["examples"]["dsml_in_content"]["got"]["content_excerpt"]
    # the terminal report prints them under the table, with the records file
    r = run_cli("check", "load", hicache_on, "-c", "48", "--turns", "4", "--answer-words", "20",
                "--min-requests", "300", "--records", str(rec), "--markdown", "--no-progress", timeout=300)
    assert r.code == 1
    assert "### one example per class" in r.out and f"records: {rec}" in r.out
    ex_rows = [ln for ln in r.out.splitlines() if ln.startswith(f"| {hicache_on} | 48 | ")]
    rids = {x["rid"] for x in _records(rec)}
    assert any(cell.strip() in rids for ln in ex_rows for cell in ln.split("|"))
    r = run_cli("check", "load", hicache_on, "-c", "48", "--turns", "4", "--answer-words", "20",
                "--min-requests", "300", "--records", str(rec), "--no-progress", timeout=300)
    assert r.code == 1 and f"records: {rec}" in r.out
    lv = r.out[r.out.index("one example per class"):]
    shown = [ln for ln in lv.splitlines() if " c=48 " in ln and ": rid " in ln]
    assert len(shown) >= 3
    for ln in shown:                                       # whole request ids, never cut by a column
        rid = ln.split(": rid ")[1].split(",")[0]
        assert rid in {x["rid"] for x in _records(rec)}


def test_healthy_run_is_not_crashed(tmp_path):
    cfg = write_config(tmp_path / "off.yaml")
    proc, url = _start_standin(cfg, *FAST)
    try:
        r = run_cli("check", "load", url, "-c", "8,16", "--turns", "4", "--answer-words", "20", "--json",
                    "--no-progress", timeout=300)
    finally:
        _stop(proc)
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["pass"] and doc["crash"] is None and doc["not_run"] == [] and doc["settings"]["records"] is None
    assert [lv["concurrency"] for lv in doc["levels"]] == [8, 16]
    for lv in doc["levels"]:
        assert (lv["crashed"], lv["crash_turns"], lv["examples"], lv["corrupted"], lv["turns"]) == (False, 0, {}, 0, 381)


# --- pure summaries -------------------------------------------------------------------------------
def test_summarize_level_leaves_crash_turns_out_of_the_rate():
    def rec(cls="ok", conn=False, i=0, **kw):
        return {"class": cls, "stream": False, "ttft_s": None, "e2e_s": 0.1, "completion_tokens": 1,
                "connection_error": conn, "rid": f"r{i}", "response_id": None if conn else f"r{i}",
                "requires_tool": True, "tool": "read_file", "reason": "x", "t_start": 100.0 + i, **kw}
    recs = ([rec(i=i) for i in range(90)] + [rec("http_error", True, 90)] + [rec(i=91)]
            + [rec("no_tool_call", i=92, expected_calls=[{"name": "read_file"}], finish_reason="stop",
                   content_excerpt="sure")]
            + [rec("http_error", True, i) for i in range(93, 103)])
    crash = {"reason": "10 consecutive", "started_at": 193.0, "turn": 94, "rid": "r93", "streak": 10, "probe": None}
    s = R.summarize_level(recs, url="u", concurrency=4, duration_s=1.0, itl_gaps=[], max_corruption=0.5, crash=crash)
    assert (s["turns"], s["crash_turns"], s["corrupted"], s["rate"]) == (103, 10, 2, round(2 / 93, 6))
    assert s["classes"]["http_error"]["count"] == 1 and s["pass"] is False       # crashed: fails at any rate
    assert (s["crashed"], s["crash_turn"], s["crash_rid"], s["crash_started_at"]) == (True, 94, "r93", 193.0)
    assert s["examples"]["no_tool_call"] == {
        "rid": "r92", "response_id": "r92", "reason": "x",
        "expected": {"requires_tool": True, "tool": "read_file", "expected_calls": [{"name": "read_file"}]},
        "got": {"http_status": None, "finish_reason": "stop", "tool_calls": [], "content_excerpt": "sure",
                "stream": False}}
    assert s["examples"]["http_error"]["rid"] == "r90"
    same = R.summarize_level(recs, url="u", concurrency=4, duration_s=1.0, itl_gaps=[], max_corruption=0.5)
    assert (same["crashed"], same["corrupted"], same["pass"]) == (False, 12, True)
    doc = R.build_doc([s], max_corruption=0.5, settings={"records": "t.jsonl"}, not_run=[8])
    assert doc["pass"] is False and doc["crash"]["concurrency"] == 4 and doc["not_run"] == [8]
    assert R.crash_lines(doc)[0] == "crashed at concurrency 4 (u): 10 consecutive"
    assert R.level_rows(doc)[1][0][6] == "CRASHED"
    assert [row[2] for row in R.example_rows(doc)[1]] == ["http_error", "no_tool_call"]


def test_a_server_that_stops_answering_is_a_crash_and_stops_the_ramp(tmp_path):
    """SIGSTOP: the port accepts connections, nothing answers; stalls + a silent /health = crash."""
    import os
    import signal
    import sys
    import threading
    import time
    from tests.standin.harness import REPO, free_port, wait_health, write_config
    cfg = write_config(tmp_path / "serve.yaml")
    port = free_port()
    p = popen_standin(["--config", str(cfg), "--host", "127.0.0.1", "--port", str(port), "--ttft-ms", "5",
                       "--itl-ms", "1"], quiet=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_health(url, 60)
        rec = tmp_path / "r.jsonl"
        done = threading.Event()

        def stop_when_running() -> None:
            # SIGSTOP once turns are being answered (a fixed delay raced the client's start-up on a
            # loaded machine: discovery itself then timed out, exit 2)
            while not done.is_set():
                if rec.exists() and rec.stat().st_size > 0:
                    os.kill(p.pid, signal.SIGSTOP)
                    return
                time.sleep(0.05)
        t = threading.Thread(target=stop_when_running, daemon=True)
        t.start()
        r = run_cli("check", "load", url, "-c", "4,8", "--turns", "4", "--min-requests", "100000",
                    "--stall-timeout", "2", "--no-progress", "--no-metrics", "--json", "--records", str(rec),
                    timeout=240)
        done.set()
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    assert r.code == 1, r.err
    doc = r.json()
    assert doc["crash"]["concurrency"] == 4 and doc["not_run"] == [8]
    assert "stall" in doc["crash"]["reason"] and "GET /health: no answer" in doc["crash"]["reason"]
    assert "crashed at concurrency 4" in r.err


def test_too_few_file_descriptors_is_a_usage_error_not_a_crash(tmp_path):
    import resource
    import subprocess
    import sys
    from tests.standin.harness import REPO
    p = subprocess.run([sys.executable, "-m", "dsv4ctl.cli", "check", "load", "http://127.0.0.1:9", "-c", "400",
                        "--model", "m", "--no-progress"], cwd=REPO, capture_output=True, text=True, timeout=60,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200)))
    assert p.returncode == 2 and "ulimit -n" in p.stderr and "Traceback" not in p.stderr


def test_credentials_in_the_url_are_refused_without_echo():
    r = run_cli("check", "load", "http://admin:s3cretpw@127.0.0.1:9", "--no-progress")
    assert r.code == 2 and "s3cretpw" not in r.err + r.out and "--api-key" in r.err
