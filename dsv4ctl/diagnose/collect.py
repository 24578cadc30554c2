"""Collect diagnosis evidence: one SSH round per host (in parallel) and one HTTP round per group.

Per host, one read-only shell command (:func:`host_command`) prints, between marker lines, the
day-2 status fact (:func:`dsv4ctl.hosts.day2.status_command`: active release, process alive per
group as where servers run answers it, last audit record), the tail of each group's server log (:func:`dsv4ctl.hosts.day2.log_read_command`;
both service backends append to ``logs/<group>.log``) and the GPU fact
(:func:`dsv4ctl.hosts.gpus.gpus_command`). :func:`parse_host` splits it back (pure).

Per group over HTTP (:func:`probe_groups`): ``/health``, ``/server_info`` and ``/metrics``
twice, ``window`` seconds apart (``dsv4ctl.check.driver`` fetchers). The ``/metrics`` delta
shows progress (generated tokens), a frozen transfer queue, transfer failures and aborts."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

from ..errors import InputError
from ..hosts.day2 import HostStatus, log_read_command, parse_log_read, parse_status, status_command
from ..hosts.gpus import GpuFactError, gpus_command, parse_gpus
from ..hosts.layout import Paths

MARK = "@@dsv4ctl-diagnose"
#: log lines read per group
DEFAULT_LINES = 400


def host_command(root: "str | Paths", probes: dict[str, str], lines: int = DEFAULT_LINES) -> str:
    """One read-only shell command for a host: status with each group's process read ``probes``
    ({group: command}, where servers run answers it: :func:`dsv4ctl.deploy.service.process_reads`),
    each group's log tail (``lines`` lines), nvidia-smi. ``root``: the host's deploy root, or its
    :class:`Paths` (a node of a shared root reads its own ``logs/<node>/``)."""
    p = root if isinstance(root, Paths) else Paths(root)
    parts = [f"echo '{MARK} status'", status_command(p.root, probes)]
    for g in probes:
        parts += [f"echo '{MARK} log {g}'", log_read_command(p, g, None, lines)]
    parts += [f"echo '{MARK} gpus'", gpus_command()]
    return "\n".join(parts)


@dataclass
class HostEvidence:
    """One host's collected facts: status, {group: (log size, log text)}, GPUs (dicts) or the
    nvidia-smi error."""

    status: HostStatus
    logs: dict[str, tuple[int, str]] = field(default_factory=dict)
    gpus: Optional[list[dict]] = None
    gpu_error: Optional[str] = None


def parse_host(host: str, root: str, text: str) -> HostEvidence:
    """:class:`HostEvidence` from :func:`host_command`'s output (pure)."""
    blocks: dict[str, list[str]] = {}
    cur = None
    for ln in text.split("\n"):
        if ln.startswith(MARK + " "):
            cur = ln[len(MARK) + 1:]
            blocks[cur] = []
        elif cur is not None:
            blocks[cur].append(ln)
    ev = HostEvidence(parse_status(host, root, "\n".join(blocks.get("status", []))))
    for key, body in blocks.items():
        if key.startswith("log "):
            ev.logs[key[4:]] = parse_log_read("\n".join(body))
    try:
        ev.gpus = [g.as_dict() for g in parse_gpus("\n".join(blocks.get("gpus", [])))]
    except GpuFactError as e:
        ev.gpu_error = str(e)
    return ev


_EXIT = re.compile(r"^=== dsv4ctl: (\S+) exited with status (\d+)")
_START = re.compile(r"^=== dsv4ctl (?:start|restart) (\S+)")


def process_facts(group: str, log: str) -> tuple[Optional[int], int]:
    """(exit status after the last start header or None, number of start/restart headers) of
    ``group`` in its log text (pure)."""
    status, starts = None, 0
    for ln in log.splitlines():
        if (m := _START.match(ln)) and m[1] == group:
            starts += 1
            status = None
        elif (m := _EXIT.match(ln)) and m[1] == group:
            status = int(m[2])
    return status, starts


def current_process(log: str, group: str) -> str:
    """The part of ``group``'s log written by its current (last started) process: from the last
    ``=== dsv4ctl start|restart GROUP`` header on (pure). A log without a header is kept whole.
    What ``diagnose`` judges by default: a crash before a recovery is history, not the cause."""
    lines = log.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = _START.match(lines[i])
        if m and m[1] == group:
            return "\n".join(lines[i:]) + "\n"
    return log

_TS = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})")


def since_filter(log: str, since: Optional[datetime]) -> str:
    """The lines of ``log`` from the first line stamped at or after ``since`` on (SGLang's
    ``[YYYY-MM-DD HH:MM:SS …]`` and dsv4ctl's ``… at YYYY-MM-DDTHH:MM:SSZ``; unstamped lines go
    with the stamped line before them). A log without any stamp is kept whole (pure)."""
    if since is None:
        return log
    lines = log.splitlines()
    stamped = False
    for i, ln in enumerate(lines):
        m = _TS.search(ln)
        if not m:
            continue
        try:
            t = datetime.fromisoformat(f"{m[1]}T{m[2]}+00:00")
        except ValueError:          # a stamp-shaped field that is no date (month 13): unstamped
            continue
        stamped = True
        if t >= since:
            return "\n".join(lines[i:]) + "\n"
    return "" if stamped else log


async def _probe_one(http, base: str, window: float) -> dict[str, Any]:
    from ..check.driver import BadResponse, ConnectError, fetch_json, scrape_metrics
    out: dict[str, Any] = {"health": None, "server_info": None, "metrics_before": None, "metrics_after": None}
    try:
        st, _ = await fetch_json(http, base + "/health", timeout=5)
        out["health"] = "ok" if st == 200 else f"GET /health: HTTP {st}"
    except (ConnectError, BadResponse) as e:
        out["health"] = str(e)
        return out
    try:
        st, doc = await fetch_json(http, base + "/server_info", timeout=5)
        out["server_info"] = doc if st == 200 and isinstance(doc, dict) else None
    except (ConnectError, BadResponse):
        pass
    out["metrics_before"] = await scrape_metrics(http, base)
    if out["metrics_before"] is not None and window > 0:
        await asyncio.sleep(window)
        out["metrics_after"] = await scrape_metrics(http, base)
    return out


def probe_groups(urls: dict[str, str], window: float, api_key: Optional[str] = None) -> dict[str, dict]:
    """{group: {health, server_info, metrics_before, metrics_after}} for every URL at once;
    ``health`` is ``"ok"``, ``"GET /health: HTTP N"`` or why it could not connect."""
    import aiohttp

    from ..check.driver import auth_headers

    async def run():
        async with aiohttp.ClientSession(headers=auth_headers(api_key)) as http:
            res = await asyncio.gather(*(_probe_one(http, u.rstrip("/"), window) for u in urls.values()))
        return dict(zip(urls, res))
    return asyncio.run(run())
