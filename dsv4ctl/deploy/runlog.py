"""The local run log, ``<state>/runs.jsonl`` (:func:`dsv4ctl.resources.state_root`): one JSON line
per run that acts on hosts (deploy, promote, rollback, stop/start/restart, hicache on|off and
config set --remote, and every runbook run ``watch --on-alert`` starts, dry or not), secret values
masked. Written by :class:`dsv4ctl.commands.deploy._RunLog` and :mod:`dsv4ctl.watch.run`; read by
completion."""

from __future__ import annotations

import json
import os
from typing import Iterable


def append_run(rec: dict, secrets: Iterable[str] = ()) -> bool:
    """Append ``rec`` (a JSON-able dict; ``ts`` and ``who`` added when missing) as one line,
    the folder created 0700 and the file 0600. Best effort: False when it cannot be written
    (the caller's run is not failed by its log)."""
    from ..hosts.audit import now_iso
    from ..remote import who
    from ..resources import state_root
    from .steps import mask_secrets
    rec = {"ts": rec.get("ts") or now_iso(), "who": rec.get("who") or who(), **rec}
    line = mask_secrets(json.dumps(rec, default=str), set(secrets)) + "\n"
    import stat
    try:
        d = state_root()
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        # never blocks: a FIFO (or a device) there is not the run log (O_NONBLOCK: no wait for a reader)
        fd = os.open(d / "runs.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK, 0o600)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        os.set_blocking(fd, True)
        with os.fdopen(fd, "a") as f:
            fd = -1
            f.write(line)
        return True
    except OSError:
        return False
    finally:
        if fd >= 0:
            os.close(fd)
