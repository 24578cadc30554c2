#!/usr/bin/env python3
"""An Alertmanager webhook receiver for the alerts of ``dsv4ctl watch`` (an example; Python 3
standard library only, nothing of dsv4ctl imported).

    python3 docs/alertmanager/receiver.py --listen 127.0.0.1:9478 --out /var/log/dsv4ctl-alerts.jsonl

Alertmanager (docs/alertmanager/alertmanager.yml) POSTs every notification, firing and resolved,
to ``http://HOST:PORT/alerts`` as its webhook JSON (payload ``version`` ``"4"``). For each alert
in it the receiver prints one line on stdout::

    firing DSV4WatchDown page instance=10.0.0.1:9477 job=dsv4ctl-watch: dsv4ctl watch ... is down
      runbook_url: https://github.com/dsv4ctl/dsv4ctl/blob/main/docs/alerts.md#dsv4watchdown

(and ``runbook:`` with the command, where the alert names one) and, with ``--out``, appends one
JSON line: ``received_at`` (UTC), ``receiver``, ``status``, ``alertname``, ``severity``,
``labels``, ``summary``, ``runbook``, ``runbook_url``, ``startsAt``, ``endsAt``,
``fingerprint``. It answers 200; 400 for a body that is not a version 4 webhook document (its
reason on stderr); 404 for another path. ``GET /health`` answers ``ok``.

It never acts on the deployment: it is where a notification lands for a person (or a ticket
system reading the JSON lines). Runbooks run unattended only through ``dsv4ctl watch --on-alert
... --auto``, which checks the deploy lock and the running release first (docs/watch.md).
Exit 2 for a bad ``--listen``, 3 when the address cannot be bound; SIGTERM or Ctrl-C stop it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 4 << 20
"""Bytes of one notification read at most (Alertmanager batches alerts of one group)."""


def alert_records(doc: dict, now: str) -> list[dict]:
    """The records of one webhook document ``doc`` (Alertmanager's payload version 4), received
    at ``now`` (ISO 8601 UTC): one per alert. ValueError for a document of another shape."""
    if not isinstance(doc, dict) or doc.get("version") != "4" or not isinstance(doc.get("alerts"), list):
        raise ValueError("not an Alertmanager webhook document (version 4 with a list of alerts)")
    out = []
    for a in doc["alerts"]:
        if not isinstance(a, dict) or not isinstance(a.get("labels"), dict):
            raise ValueError("an alert without labels")
        labels, ann = a["labels"], a.get("annotations") or {}
        out.append({"received_at": now, "receiver": doc.get("receiver"), "status": a.get("status"),
                    "alertname": labels.get("alertname"), "severity": labels.get("severity"), "labels": labels,
                    "summary": ann.get("summary"), "runbook": ann.get("runbook"), "runbook_url": ann.get("runbook_url"),
                    "startsAt": a.get("startsAt"), "endsAt": a.get("endsAt"), "fingerprint": a.get("fingerprint")})
    return out


def alert_line(r: dict) -> str:
    """The stdout lines of one record (:func:`alert_records`)."""
    where = " ".join(f"{k}={v}" for k, v in sorted(r["labels"].items()) if k not in ("alertname", "severity"))
    text = f"{r['status']} {r['alertname']} {r['severity']} {where}: {r['summary']}"
    for key in ("runbook", "runbook_url"):
        if r.get(key):
            text += f"\n  {key}: {r[key]}"
    return text


def make_handler(out_path: str | None):
    """The request handler class, appending records to ``out_path`` (None: stdout only)."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, code: int, text: str) -> None:
            body = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._answer(200, "ok\n") if self.path == "/health" else self._answer(404, "not found\n")

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/alerts":
                return self._answer(404, "POST /alerts\n")
            try:
                n = int(self.headers.get("Content-Length") or 0)
                if not 0 < n <= MAX_BODY:
                    raise ValueError(f"body of {n} bytes (1..{MAX_BODY})")
                now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
                records = alert_records(json.loads(self.rfile.read(n)), now)
            except (ValueError, UnicodeDecodeError) as e:
                print(f"receiver: refused a notification: {e}", file=sys.stderr, flush=True)
                return self._answer(400, f"{e}\n")
            with lock:
                for r in records:
                    print(alert_line(r), flush=True)
                if out_path:
                    with open(out_path, "a", encoding="utf-8") as f:
                        f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in records)
            self._answer(200, "ok\n")

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - quiet: the lines above say it
            pass

    return Handler


def main(argv: list[str]) -> int:
    """Serve until SIGTERM or SIGINT (exit 0); 2 for a bad ``--listen``, 3 when it cannot bind."""
    ap = argparse.ArgumentParser(description="Alertmanager webhook receiver for dsv4ctl watch's alerts.")
    ap.add_argument("--listen", default="127.0.0.1:9478", help="HOST:PORT (default 127.0.0.1:9478)")
    ap.add_argument("--out", help="append one JSON line per alert to this file")
    a = ap.parse_args(argv)
    host, _, port = a.listen.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        print(f"receiver: --listen {a.listen!r}: expected HOST:PORT", file=sys.stderr)
        return 2
    try:
        server = ThreadingHTTPServer((host.strip("[]"), int(port)), make_handler(a.out))
    except OSError as e:
        print(f"receiver: --listen {a.listen}: cannot listen ({e.strerror or e})", file=sys.stderr)
        return 3
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"receiver: listening on http://{a.listen}/alerts", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
