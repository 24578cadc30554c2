"""A server that echoes the request's Authorization header and puts terminal escapes in what it
returns: check smoke/load never print the bearer key and never pass control characters to the
terminal (tables, Markdown, JSON, error lines)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import run_cli

KEY = "sk-echo-123456"


class Echo(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, code, obj):
        b = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def do_GET(self):
        auth = self.headers.get("Authorization", "")
        if self.path.startswith("/v1/models"):
            self._send(200, {"object": "list", "data": [{"id": "m\x1b]0;PWNED\x07\x1b[31m" + auth, "object": "model"}]})
        elif self.path.startswith("/health"):
            self._send(200, {})
        else:
            self._send(500, {"error": "echo " + auth})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._send(400, {"error": {"message": "you sent " + self.headers.get("Authorization", "") + "\x1b[2J"}})


@pytest.fixture(scope="module")
def echo():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


@pytest.mark.parametrize("fmt", [(), ("--markdown",), ("--json",)])
def test_smoke_never_prints_the_key_or_escapes(echo, fmt):
    r = run_cli("check", "smoke", echo, *fmt, env={"DSV4CTL_API_KEY": KEY}, timeout=120)
    assert r.code == 1                   # the chat probes fail: a verdict, not a crash
    both = r.out + r.err
    assert KEY not in both and "\x1b" not in both and "\x07" not in both
    assert "Bearer ***" in both          # the echo is shown, masked


def test_load_never_prints_the_key_or_escapes(echo):
    r = run_cli("check", "load", echo, "-c", "1", "--turns", "1", "--min-requests", "2", "--no-progress",
                "--no-metrics", env={"DSV4CTL_API_KEY": KEY}, timeout=120)
    both = r.out + r.err
    assert r.code == 1 and KEY not in both and "\x1b" not in both
