"""Diagnose a deployment: collect (:mod:`.collect`), classify (:mod:`.rules`), one document.

The document (``dsv4ctl.diagnose/1``, documented in the README)::

    {"schema": "dsv4ctl.diagnose/1", "profile": NAME, "since": ISO | null, "window_s": 5.0,
     "ok": bool,                                   # every group healthy (or stopped on purpose) and every host read
     "hosts": {HOST: {"current": RID | null, "state": "good" | ... | null, "error": null | WHY,
                      "gpu_error": null | WHY, "last_audit": {...} | null,
                      "clock_offset_s": S | null,     # the host's clock minus this machine's
                      "clock_unusable": bool}},       # its date printed no usable time (not applied)
     "groups": {SERVER: {"group", "replica",          # SERVER: the group, or GROUP#R for replica R
                         "host", "role", "url", "alive", "exit_status", "restarts", "health",
                         "hicache", "release", "log_source", "log_lines", "gpus": [...],   # node 0's
                         "metrics_delta": {name: after - before} | null,
                         "nodes": [{"node", "host", "alive", "exit_status", "restarts", "release",
                                    "log_source", "log_lines", "gpus"}, ...],       # node-rank order
                         "findings": [FINDING, ...]}},
     "findings": [FINDING, ...],                   # every group's, most severe first
     "runbooks": [NAME, ...]}                      # runbooks the findings name, in that order

    FINDING = {"rule", "cause", "severity", "evidence": [line, ...], "source", "runbook",
               "group", "host", "detail": {...}}
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Optional

from .collect import (DEFAULT_LINES, current_process, host_command, parse_host, probe_groups, process_facts,
                      since_filter)
from .rules import SEVERITY, Evidence, diagnose_server

#: Findings that are no failure: a healthy group, one an operator stopped (dsv4ctl stop).
HEALTHY = frozenset({"healthy", "stopped"})

SCHEMA = "dsv4ctl.diagnose/1"

#: /metrics series whose change over the window the document shows
DELTA_SERIES = ("sglang:generation_tokens_total", "sglang:num_requests_total", "sglang:num_aborted_requests_total",
                "sglang:num_transfer_failed_reqs_total", "sglang:num_bootstrap_failed_reqs_total")
GAUGE_SERIES = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_decode_transfer_queue_reqs",
                "sglang:token_usage")


def _metrics_view(before: Optional[dict], after: Optional[dict]) -> Optional[dict]:
    if before is None or after is None:
        return None
    out = {k: after[k] - before.get(k, 0.0) for k in DELTA_SERIES if k in after}
    out.update({k: after[k] for k in GAUGE_SERIES if k in after})
    return out


@dataclass
class _Read:
    """What the hosts said, for building each node's :class:`.rules.Evidence`: ``res`` (host ->
    :class:`dsv4ctl.remote.ParallelResult` of ``(HostEvidence, clock)``), the hosts' release roots
    ``paths`` (host -> :class:`dsv4ctl.hosts.layout.Paths`) and the ``hosts`` part of the
    document, plus the command's ``since``/``window``."""
    res: dict
    paths: dict
    hosts_doc: dict
    since: Optional[datetime]
    window: float


def _hosts_of(servers: list) -> dict[str, list[str]]:
    """host -> the names of the groups with a node on it (first-seen order) of ``servers``
    (``(group, server nodes)`` pairs)."""
    by_host: dict[str, list[str]] = {}
    for g, srv in servers:
        for node in srv:
            by_host.setdefault(node.host, [])
            if g.name not in by_host[node.host]:
                by_host[node.host].append(g.name)
    return by_host


def _collect(dep, by_host: dict[str, list[str]], lines: int, accept_new_host_keys: bool) -> tuple[dict, dict]:
    """Read every host of ``by_host`` in one SSH round trip each, in parallel (process, ``lines``
    of each group's log, GPUs, the release state, the clock): (host -> ParallelResult of
    ``(HostEvidence, clock)``, host -> Paths). Failures stay in the results, never raised."""
    from ..deploy.service import process_reads
    from ..deploy.site import Options, open_site
    from ..hosts.clock import run_clocked
    from ..remote import run_parallel

    site = open_site(dep, Options(accept_new_host_keys=accept_new_host_keys))
    transports = {h: t for h, t in site.transports.items() if h in by_host}

    def collect(t):
        probes = process_reads(site, t.name, by_host[t.name], containers=False)
        out, clock = run_clocked(t, host_command(site.paths[t.name], probes, lines), timeout=60)
        return parse_host(t.name, site.paths[t.name].root, out.out), clock

    try:
        return run_parallel(transports, collect, timeout=75), dict(site.paths)
    finally:
        site.close()


def _host_doc(r) -> dict:
    """The document's ``hosts[H]`` entry of one host's read ``r``."""
    from ..hosts.clock import usable
    if not r.ok:
        return {"current": None, "state": None, "error": r.error, "gpu_error": None, "last_audit": None,
                "clock_offset_s": None, "clock_unusable": False}
    hev, clock = r.value
    f = hev.status.facts
    return {"current": f.current, "state": f.recorded(f.current) if f.current else None, "error": None,
            "gpu_error": hev.gpu_error, "last_audit": hev.status.last_audit,
            "clock_offset_s": round(clock.offset_s, 1) if clock and usable(clock.offset_s) else None,
            "clock_unusable": bool(clock) and not usable(clock.offset_s)}


def _node_log(g, full: str, since: Optional[datetime], clock) -> tuple[str, Optional[int], int]:
    """(log lines judged, exit status, process starts) of group ``g``'s log tail ``full``: the
    current process only, or with ``since`` every line from then (converted to the host's clock)."""
    from ..hosts.clock import host_cutoff
    if since is None:       # the current process only; earlier ones with --since
        exit_status, starts = process_facts(g.name, full)      # restarts count the whole tail read
        return current_process(full, g.name), exit_status, starts
    log = since_filter(full, host_cutoff(since, clock.applied) if clock else since)
    exit_status, starts = process_facts(g.name, log)
    return log, exit_status, starts


def _node_evidence(dep, read: _Read, g, srv, node, pr: Optional[dict]) -> tuple[Evidence, int]:
    """One node's Evidence (``pr``: the HTTP probes, node 0 only) and its log's size (-1: none)."""
    from ..hosts.day2 import stop_record
    h = node.host
    r = read.res[h]
    hev, clock = r.value if r.ok else (None, None)
    size, full = (hev.logs.get(g.name, (-1, "")) if hev else (-1, ""))
    log, exit_status, starts = _node_log(g, full, read.since, clock)
    alive = hev.status.alive.get(g.name) if hev else None
    want = set(node.gpus)
    gpus = [x for x in (hev.gpus or []) if not want or x["index"] in want] if hev else []
    info = pr["server_info"] if pr else None
    hicache = (bool(info.get("enable_hierarchical_cache")) if isinstance(info, dict)
               and "enable_hierarchical_cache" in info else g.hicache_configured)
    a0 = dep.hosts[srv[0].host].address
    dist = f"{f'[{a0}]' if ':' in a0 else a0}:{g.dist_init_port}" if node.nnodes > 1 else None
    return Evidence(group=node.server, host=h, role=g.role, alive=alive,
                    exit_status=exit_status if alive is False else None, restarts=starts, log=log,
                    log_source=f"{h}:{read.paths[h].logfile(g.name)}", health=pr["health"] if pr else None,
                    server_info=info, metrics_before=pr["metrics_before"] if pr else None,
                    metrics_after=pr["metrics_after"] if pr else None, window_s=read.window, gpus=gpus or None,
                    hicache=hicache, node=node.node, nnodes=node.nnodes,
                    release=read.hosts_doc.get(h, {}).get("current"), dist_init=dist,
                    clock_offset_s=read.hosts_doc.get(h, {}).get("clock_offset_s"),
                    stopped=stop_record(hev.status.recent, g.name) if hev and alive is False else None), size


def _server_doc(g, srv, evs: list[tuple[Evidence, int]], url: str, pr: dict, fs: list) -> dict:
    """The document's ``groups[SERVER]`` entry: node 0's view, every node's, the findings ``fs``."""
    ev0, size0 = evs[0]
    return {
        "group": g.name, "replica": srv[0].replica,
        "host": ev0.host, "role": g.role, "url": url, "alive": ev0.alive,
        "exit_status": ev0.exit_status, "restarts": ev0.restarts, "health": ev0.health, "hicache": ev0.hicache,
        "release": ev0.release, "log_source": ev0.log_source if size0 >= 0 else None,
        "log_lines": len(ev0.log.splitlines()), "gpus": ev0.gpus or [],
        "metrics_delta": _metrics_view(pr["metrics_before"], pr["metrics_after"]),
        "nodes": [{"node": e.node, "host": e.host, "alive": e.alive, "exit_status": e.exit_status,
                   "restarts": e.restarts, "release": e.release,
                   "log_source": e.log_source if size >= 0 else None, "log_lines": len(e.log.splitlines()),
                   "gpus": e.gpus or []} for e, size in evs],
        "findings": [x.to_dict() for x in fs]}


def _judge_server(dep, read: _Read, g, srv, url: str, pr: dict) -> tuple[dict, list]:
    """(``groups[SERVER]`` entry, findings) of one server: every node's evidence judged by
    :func:`.rules.diagnose_server`, a host that was not read and the Slurm job added as evidence."""
    evs = [_node_evidence(dep, read, g, srv, node, pr if node.node == 0 else None) for node in srv]
    fs = diagnose_server([e for e, _ in evs])
    for x in fs:
        bad = read.res[x.host] if x.host in read.res else None
        if bad is not None and not bad.ok:
            x.evidence.append(f"{x.host}: host not read ({bad.error})")
    job = _slurm_job(read.res.get(srv[0].host), srv[0].host, g.name, fs)
    doc = _server_doc(g, srv, evs, url, pr, fs)
    if job is not None:
        doc["slurm"] = job
    return doc, fs


def diagnose_deployment(dep, groups: Optional[list[str]] = None, *, since: Optional[datetime] = None,
                        window: float = 5.0, lines: int = DEFAULT_LINES, accept_new_host_keys: bool = False,
                        api_key: Optional[str] = None) -> dict:
    """Collect and classify every server of ``dep``'s server groups (or of ``groups``): the module
    docstring's document, one ``groups`` entry per server (a replica R of group G is ``G#R``).
    A server over several hosts is read on every node (process, log, GPUs, the host's release)
    and probed over HTTP at node 0; :func:`.rules.diagnose_server` judges it. SSH failures are
    recorded per host (``hosts[H].error``), never raised. Each host's clock is read in the same
    round trip (:mod:`dsv4ctl.hosts.clock`): ``since`` (this machine's time) is converted to the
    host's time before its log lines are filtered."""
    chosen = [dep.groups[n] for n in (groups or [g.name for g in dep.servers()])]
    servers = [(g, srv) for g in chosen for srv in g.server_nodes]
    by_host = _hosts_of(servers)
    res, paths = _collect(dep, by_host, lines, accept_new_host_keys)
    urls = {srv[0].server: url for g in chosen for srv, (_, url) in zip(g.server_nodes, g.replica_urls)}
    probes = probe_groups(urls, window, api_key)
    read = _Read(res=res, paths=paths, hosts_doc={h: _host_doc(res[h]) for h in by_host}, since=since, window=window)
    groups_doc: dict[str, dict] = {}
    found = []
    for g, srv in servers:
        groups_doc[srv[0].server], fs = _judge_server(dep, read, g, srv, urls[srv[0].server], probes[srv[0].server])
        found += fs
    found.sort(key=lambda x: -SEVERITY[x.severity])
    runbooks = list(dict.fromkeys(x.runbook for x in found if x.runbook))
    ok = all(x.rule in HEALTHY for x in found) and not any(d["error"] for d in read.hosts_doc.values())
    return {"schema": SCHEMA, "profile": dep.name, "since": since.isoformat() if since else None, "window_s": window,
            "ok": ok, "hosts": read.hosts_doc, "groups": groups_doc, "findings": [x.to_dict() for x in found],
            "runbooks": runbooks}


def _slurm_job(r, host: str, group: str, findings: list) -> Optional[dict]:
    """With ``deploy.backend: slurm``: the server's job (:func:`dsv4ctl.hosts.slurmrecord.job_view`)
    as its node 0 ``host``'s read ``r`` says, its line added to the evidence of each finding (a job that
    ended says how, from Slurm or, once Slurm forgot it, from dsv4ctl's record); None without a
    job."""
    from ..hosts.slurmrecord import job_text, job_view
    st = r.value[0].status if r is not None and r.ok else None
    if st is None or group not in st.jobs:
        return None
    job = job_view(st.jobs[group])
    for x in findings:
        x.evidence.append(f"{host}: {job_text(job)}")
    return job


def diagnosis_lines(doc: dict, profile: str = "PROFILE") -> list[str]:
    """Human lines: one per finding (group, cause, runbook: the command with ``profile``, as
    typed) with its evidence indented."""
    out = []
    for h, hd in doc["hosts"].items():
        if hd.get("error"):
            out.append(f"{h}: host not read: {hd['error']}")
    for f in doc["findings"]:
        rb = f" -> dsv4ctl runbook run {f['runbook']} {profile}" if f["runbook"] else ""
        out.append(f"{f['host']}/{f['group']}: [{f['severity']}] {f['cause']}{rb}")
        for e in f["evidence"]:
            out.append(f"    {e}")
        if f["source"] and f["source"] != "-":
            out.append(f"    source: {f['source']}")
    return out
