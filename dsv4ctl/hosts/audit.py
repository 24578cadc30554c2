"""The one audit record and the one timestamp spelling (docs/deploy.md, "audit log").

Every mutating host command (deploy, rollback, promote, hicache --remote, a runbook's restart or
its closing record, --break-lock) appends one JSON line per host to ``<root>/audit.jsonl`` built
by :func:`audit_record`. Records never hold secrets."""

from __future__ import annotations

import json
import os
import time

from ..remote import q, who
from ..remote.ops import fresh_line_cmd

#: The host's UTC clock in :func:`now_iso`'s spelling (POSIX ``date``).
HOST_NOW = "$(date -u +%Y-%m-%dT%H:%M:%SZ)"


def now_iso(t: float | None = None) -> str:
    """UTC time as ``2026-12-01T16:18:04Z`` (records, state files, lock holders)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def file_stamp(t: float | None = None) -> str:
    """UTC time as ``20261201T161804Z`` (backup and evidence file names: sortable, no colons)."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))


def audit_record(host: str, action: str, result: str, detail: str = "", **extra) -> dict:
    """One audit line: ``ts``, ``who`` (operator ``user@machine``), ``host``, ``action``,
    ``result`` (ok / failed / rolled-back / …), ``detail``, then ``extra`` fields in order."""
    return {"ts": now_iso(), "who": who(), "host": host, "action": action, "result": result,
            "detail": detail, **extra}


def stamped_json_cmd(doc: dict, key: str = "ts") -> str:
    """Shell words printing ``doc`` as one JSON line with ``key`` first, set to the host's UTC time
    when the command runs: the command text is the same whenever it is built (a dry run lists
    exactly what the run executes) and the time is the host's own."""
    body = json.dumps({k: v for k, v in doc.items() if k != key}, sort_keys=False, default=str,
                      separators=(",", ":"))
    rest = body[1:] if body == "{}" else "," + body[1:]
    return f"printf '{{\"{key}\":\"%s\"%s\\n' \"{HOST_NOW}\" {q(rest)}"


def append_cmd(path: str, record: dict) -> str:
    """Shell: append ``record`` (an :func:`audit_record` without its ``ts``, or with it: the
    host's time replaces it) as one line to the audit log ``path``; the folder is created. A torn
    last line (a full disk cut an earlier append) is ended first, so this record is a line of its
    own (:func:`dsv4ctl.remote.ops.fresh_line_cmd`). Exit status non-zero when the line could
    not be written whole."""
    d = os.path.dirname(path) or "."
    return f"(mkdir -p {q(d)} && {fresh_line_cmd(path)} && {stamped_json_cmd(record)} >> {q(path)})"


def record_fields(host: str, action: str, result: str, detail: str = "", **extra) -> dict:
    """:func:`audit_record` without ``ts`` (for :func:`append_cmd`, which stamps it on the host)."""
    rec = audit_record(host, action, result, detail, **extra)
    rec.pop("ts")
    return rec
