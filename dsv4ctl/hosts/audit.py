"""The one audit record and the one timestamp spelling (docs/deploy.md, "audit log").

Every mutating host command (deploy, rollback, promote, hicache --remote, a runbook's restart or
its closing record, --break-lock) appends one JSON line per host to ``<root>/audit.jsonl`` built
by :func:`audit_record`. Records never hold secrets."""

from __future__ import annotations

import time

from ..remote import who


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
