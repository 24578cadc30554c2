"""``dsv4ctl status`` / ``logs`` / ``audit``: what runs, its server logs and its history, from
every host in one parallel round trip each, without SSH-ing in (facts: :mod:`dsv4ctl.hosts.day2`)."""

from __future__ import annotations

import re
import shlex
import sys
import time
from typing import Optional

import typer

from ..errors import EXIT_REMOTE, DsvError, InputError, VerdictError
from ..render import console, dump_json, markdown_table, printable, rich_table
from .options import duration_option, since_option


_P = typer.Argument(None, help="Profile path or shipped name; required (or DSV4CTL_PROFILE): the command reads hosts.")
_ACCEPT = typer.Option(False, "--accept-new-host-keys", help="Add unknown SSH host keys (accept-new).")


def _site(profile, accept_new: bool):
    from ..deploy.site import Options, open_site
    from .common import load_deployment_arg
    dep = load_deployment_arg(profile, acts_on_hosts=True)
    return dep, open_site(dep, Options(accept_new_host_keys=accept_new))


def _http_failure(e: BaseException, timeout: float) -> str:
    """What happened to an HTTP probe, in words (not an exception class name): ``connection
    refused (nothing listens on 10.0.0.2:30000)``, ``no answer within 5 s``, ``the server closed the
    connection``, ``cannot resolve h200-1``, else the class name and message."""
    import asyncio

    import aiohttp
    if isinstance(e, asyncio.TimeoutError):
        return f"no answer within {timeout:g} s"
    if isinstance(e, aiohttp.ClientConnectorError):
        err = e.os_error
        where = f"{e.host}:{e.port}"
        if isinstance(err, ConnectionRefusedError):
            return f"connection refused (nothing listens on {where})"
        if "Name or service not known" in str(err) or "nodename nor servname" in str(err) or \
                isinstance(err, OSError) and err.errno in (-2, -3, -5):
            return f"cannot resolve {e.host}"
        return f"cannot connect to {where} ({getattr(err, 'strerror', None) or err})"
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return "the server closed the connection without an answer"
    return f"{type(e).__name__}: {e}"[:200]


async def _probe(urls: dict[str, str], timeout: float) -> dict[str, tuple[Optional[str], Optional[dict]]]:
    """{group: (health error or None, /server_info or None)} over HTTP, all groups at once."""
    import asyncio

    import aiohttp

    async def one(s, url):
        err, info = None, None
        try:
            async with s.get(url + "/health") as r:
                if r.status != 200:
                    err = f"/health answered {r.status}"
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            return f"/health: {_http_failure(e, timeout)}", None
        try:
            async with s.get(url + "/server_info") as r:
                if r.status == 200:
                    info = await r.json(content_type=None)
            if not isinstance(info, dict):
                info = None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            info = None
        return err, info

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
        res = await asyncio.gather(*(one(s, u) for u in urls.values()))
    return dict(zip(urls, res))


def release_splits(dep, currents: dict[str, str | None]) -> list[str]:
    """``GROUP: cause: evidence`` for every multi-node server whose nodes' hosts (``currents``:
    host -> active release, the hosts that were read) run different releases: diagnose's
    ``release_split`` rule (:func:`dsv4ctl.diagnose.rules.rule_release_split`), its one home."""
    from ..diagnose.rules import Evidence, rule_release_split
    out = []
    for g in dep.groups.values():
        if not g.is_server or g.group.nnodes < 2:
            continue
        for r, nodes in enumerate(g.server_nodes):
            ev = [Evidence(group=g.name, host=n.host, node=i, nnodes=len(nodes), release=currents[n.host])
                  for i, n in enumerate(nodes) if n.host in currents]
            label = g.name + (f" replica {r}" if g.group.replicas > 1 else "")
            out += [f"{label}: {f.cause}: {'; '.join(f.evidence)}" for f in rule_release_split(ev)]
    return out


def status(profile: Optional[str] = _P,
           timeout: float = duration_option(5.0, "--timeout", hi=3600, help="How long per HTTP probe (5, 500ms, 1m; at most 1h)."),
           accept_new: bool = _ACCEPT,
           as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.status/1 JSON document."),
           markdown: bool = typer.Option(False, "--markdown", help="Print Markdown.")) -> None:
    """Per host and group: the state of its server — running, stopped (by whom and when, from
    the audit log: a `dsv4ctl stop` is no fault), crashed, starting (within the health timeout),
    unhealthy, drifted — with its PID, port, uptime and restarts since its release started; the
    active release and its state (and its Python environment), /health, HiCache as running vs
    the serve config, the lock holder, the last audit record. With deploy.backend slurm also each
    server group's Slurm job: id, state, nodes, elapsed time, release and restart count (jobs of
    the release submitted since its deploy), and a job Slurm forgot (MinJobAge) with the final
    state dsv4ctl recorded.
    With sglang.image each running group's container id and image id (JSON: container, image;
    its uptime is the container's).

    A running server whose serve config differs from the profile's is reported with the command
    that applies the file (a deploy: a restart starts the active release's copy again), not
    counted as unhealthy.

    Exit 0 nothing unhealthy (stopped and starting servers included) · 1 something unhealthy (a
    crashed process, /health failing past the health timeout, a failed or drifted active release,
    the nodes of one server on different releases) · 2 bad input · 3 a host unreachable."""
    import asyncio

    from .options import duration
    duration(timeout, "--timeout", hi=3600)
    dep, site = _site(profile, accept_new)
    try:
        res = _read_hosts(dep, site)
    finally:
        site.close()
    urls, undeployed, moved = _probe_urls(dep, res)
    probes = asyncio.run(_probe({k: u for k, u in urls.items() if k not in undeployed}, timeout))
    doc, rows = _status_doc(dep, res, urls, undeployed, moved, probes)
    if as_json:
        print(dump_json(doc))
    else:
        _print_status(dep, doc, rows, markdown)
    if doc["unreachable"]:
        raise DsvError(f"status: {len(doc['unreachable'])} host(s) could not be read: {doc['unreachable'][0]}", EXIT_REMOTE)
    if doc["unhealthy"]:
        bad = doc["unhealthy"]
        more = f" (and {len(bad) - 1} more problem(s))" if len(bad) > 1 else ""
        raise VerdictError(f"status: {bad[0]}{more}", label="unhealthy")


def _groups_by_host(dep) -> dict[str, list[str]]:
    return {h: [g.name for g in dep.groups.values() if g.node_on(h) is not None] for h in dep.hosts}


def _read_hosts(dep, site) -> dict:
    """{host: Result of HostStatus}: one round trip per host (:func:`dsv4ctl.hosts.day2.status_command`);
    whether each group runs is where servers run's answer (:func:`dsv4ctl.deploy.service.process_reads`:
    with deploy.backend slurm its Slurm job's, whose record is read on its node 0 with
    ``scontrol show job -o``, or on the submit host that keeps it,
    :func:`dsv4ctl.deploy.service.submit_units`)."""
    from ..deploy.drift import verify_command
    from ..deploy.service import process_reads, submit_units
    from ..hosts.day2 import parse_status, status_command
    from ..remote import run_parallel
    groups = _groups_by_host(dep)
    sub, units = submit_units(site)      # a Slurm submit host keeps every server's job record

    def one(t):
        probes = process_reads(site, t.name, groups[t.name], kept=list(units) if t.name == sub else [])
        cmd = status_command(site.paths[t.name].root, probes, verify=verify_command(site.python[t.name]))
        return parse_status(t.name, site.paths[t.name].root, t.run(cmd, timeout=600).out)
    res = run_parallel(site.transports, one, timeout=600 + 15)
    for unit, (g, h0) in units.items():       # shown at the server's node 0, as without a submit host
        if sub in res and res[sub].ok and h0 in res and res[h0].ok and unit in res[sub].value.jobs:
            res[h0].value.jobs[g] = res[sub].value.jobs[unit]
    return res


def _probe_urls(dep, res) -> tuple[dict, set, dict]:
    """(urls, undeployed, moved): one probe per server (every replica, at its node 0: the only
    node that serves HTTP), at the port its host's active release launched it with (the profile
    may have changed since); ``undeployed`` servers are not in that release, ``moved`` says how
    the port differs from the profile's."""
    from ..profile.deployment import http_url
    urls, undeployed, moved = {}, set(), {}
    for g in dep.groups.values():
        for r, (_, url) in enumerate(g.replica_urls if g.is_server else [(g.name, g.url)]):
            h0 = g.server_nodes[r][0].host
            hv = res.get(h0)
            launch = hv.value.facts.current_launch if hv is not None and hv.ok else None
            if launch is not None and g.name not in launch:
                undeployed.add((g.name, r))
            elif launch is not None and launch[g.name].get("port") is not None:
                running = http_url(dep.hosts[h0].address, launch[g.name]["port"])
                if running != url:
                    moved[(g.name, r)] = f"port: profile {url.rsplit(':', 1)[1]}, running {launch[g.name]['port']}"
                url = running
            urls[(g.name, r)] = url
    return urls, undeployed, moved


def _host_doc(h: str, st, unhealthy: list[str], verify_hint: str) -> dict:
    """A host's part of the status document: release, its state, lock, last audit, drift
    (``verify_hint``: the command that lists the drift)."""
    from ..deploy.drift import bind_report
    from ..hosts.lock import holder_text
    f = st.facts
    cur = f.current
    if cur and f.recorded(cur) == "failed":
        unhealthy.append(f"{h}: the active release {cur} is recorded as failed ({f.state['releases'][cur].get('failed_check', '?')})")
    hdoc = {"root": f.root, "current": cur, "state": f.recorded(cur) if cur else None, "previous": f.previous,
            "lock": holder_text(f.lock) if f.lock else None, "last_audit": st.last_audit, "groups": {},
            "verified": None, "drift": [], "environment": None}
    for link, target in f.foreign.items():
        hdoc["drift"].append(f"{link} -> {target}: outside {f.root}/releases")
        unhealthy.append(f"{h}: {f.root}/{link} points outside its releases ({target}); the next deploy "
                         f"or rollback replaces it ({verify_hint})")
    if cur:
        v = st.verify or {}
        rep = next(iter((v.get("releases") or {}).items()), None)
        rep = bind_report(*rep) if rep is not None and isinstance(rep[1], dict) else None
        if rep is None:
            hdoc["drift"] += [f"not verified: {v.get('error') or 'no report'}"]
        else:
            hdoc["drift"] += rep.get("bad", []) + ([f"+{rep['nbad'] - len(rep['bad'])} more"]
                                                  if rep.get("nbad", 0) > len(rep.get("bad", [])) else [])
            hdoc["environment"] = rep.get("environment")
        hdoc["verified"] = not hdoc["drift"]
        if hdoc["drift"]:
            unhealthy.append(f"{h}: the active release {cur} differs from its manifest: "
                             + ", ".join(hdoc["drift"][:3]) + f" ({verify_hint})")
    return hdoc


def _slurm_job(st, name: str, proc) -> Optional[dict]:
    """The group's Slurm job as status shows it (:func:`dsv4ctl.hosts.slurmrecord.job_view` of
    the line read on its node 0), or None when the group has no job recorded there."""
    from ..hosts.slurmrecord import job_view
    if name not in st.jobs and (proc is None or proc.job is None):
        return None
    return job_view(st.jobs.get(name) or {}, proc.job if proc else None)


def _status_doc(dep, res, urls, undeployed, moved, probes) -> tuple[dict, list]:
    """The ``dsv4ctl.status/1`` document and the table rows (:func:`_group_entry` per node)."""
    hosts, rows, unhealthy, differing, down = {}, [], [], [], []
    groups = _groups_by_host(dep)
    for h, r in res.items():
        if not r.ok:
            down.append(r.error)
            hosts[h] = {"error": r.error, "groups": {}}
            rows.append([h, "-", "ERROR", "", "", "", "", "", "", r.error[:80], "", ""])
            continue
        st = r.value
        hdoc = _host_doc(h, st, unhealthy, f"dsv4ctl verify {shlex.quote(str(dep.path))}")
        for name in groups[h]:
            gdoc, row = _group_entry(dep, h, st, hdoc, name, urls, undeployed, moved, probes, unhealthy, differing)
            hdoc["groups"][name] = gdoc
            rows.append(row)
        hosts[h] = hdoc
    unhealthy[:0] = release_splits(dep, {h: r.value.facts.current for h, r in res.items() if r.ok})
    return {"schema": "dsv4ctl.status/1", "profile": dep.name, "hosts": hosts, "unhealthy": unhealthy,
            "differing": differing, "unreachable": down, "ok": not unhealthy and not down,
            "releases": releases_by_host({h: r.value.facts.current for h, r in res.items() if r.ok})}, rows


def releases_by_host(currents: dict[str, str | None]) -> dict[str, list[str]]:
    """{active release: its hosts} of the hosts read (``currents``: host -> current release; a host
    with none under ``"-"``), the releases in order of their first host. More than one key: the
    hosts run different releases (a limited deploy, ``deploy -g/--host``, or one that stopped)."""
    out: dict[str, list[str]] = {}
    for h, c in currents.items():
        out.setdefault(c or "-", []).append(h)
    return out


def _group_entry(dep, h, st, hdoc, name, urls, undeployed, moved, probes, unhealthy, differing) -> tuple[dict, list]:
    """One node of group ``name`` on host ``h``: its JSON entry and table row; appends to
    ``unhealthy`` / ``differing``. The state is :func:`dsv4ctl.hosts.day2.group_state`'s."""
    from ..hosts.day2 import group_state, stop_record, uptime_text
    g = dep.groups[name]
    replica, rank = g.node_on(h)
    url = urls[(name, replica)]
    alive = st.alive.get(name, False)
    proc = st.procs.get(name)
    cur = hdoc["current"]
    launch = (st.facts.current_launch or {}).get(name) or {}
    port = launch.get("port") if launch.get("port") is not None else g.port
    gdoc = {"role": g.role, "url": url, "alive": alive, "port": port,
            "pid": proc.pid if proc is not None and alive else None,
            "uptime_s": proc.uptime_s if proc is not None and alive else None,
            "restarts": proc.restarts if proc is not None else 0,
            "exit_status": proc.exit_status if proc is not None and not alive else None}
    if g.group.nnodes > 1 or g.group.replicas > 1:
        gdoc.update(replica=replica, node=rank, nnodes=g.group.nnodes)
    from ..deploy.service import runs_in_containers
    if runs_in_containers(dep):          # release images: the group's running container
        gdoc.update(container=proc.container if proc is not None and alive else None,
                    image=proc.image if proc is not None and alive else None)
    job = _slurm_job(st, name, proc)
    if job is not None:
        gdoc["slurm"] = job
    label = name if g.group.nnodes == 1 else f"{name} node {rank}"
    rel = f"{cur or '-'} ({hdoc['state'] or '-'}" + (f", env {hdoc['environment']['digest']}" if hdoc["environment"] else "") \
        + (", DRIFT" if hdoc["drift"] else "") + ")"
    err, info, diffs = None, None, []
    if rank == 0 and (name, replica) in undeployed:
        differing.append(f"{h}/{name}: in the profile, not in the active release {cur}")
        gdoc.update(state="undeployed", state_detail=f"not in the active release {cur}", health=None, deployed=False,
                    hicache_differences=[], stopped=None)
        return gdoc, [h, label, "not deployed", rel, "-", port, "-", "-", "-", "-", "-", hdoc["lock"] or "-"]
    if rank == 0:
        err, info = probes[(name, replica)]
        if (name, replica) in moved:
            differing.append(f"{h}/{name}: {moved[(name, replica)]}")
        if g.is_server and info is not None and g.serve is not None:
            from ..serve.argtable import table_for
            from ..serve.hicache import compare, file_view
            from ..serve.lint import check_keys
            _, resolved = check_keys(g.serve, table_for(dep), name)
            want = file_view(resolved.args)
            diffs = compare(want, {k: info.get(k) for k in want})
    stopped = stop_record(st.recent, name) if not alive else None
    state, words, bad = group_state(alive, None if rank > 0 else (err or "ok"), proc, stopped, bool(hdoc["drift"]),
                                    float(dep.deploy.health_timeout_s), rank, g.group.nnodes)
    if bad and state != "drifted":          # a drifted release is the host's problem, said once
        unhealthy.append(f"{h}/{name}: {words}")
    elif not bad and diffs and alive:
        # the server runs the active release's copy: a restart starts that one again; deploy applies it
        differing.append(f"{h}/{name}: {diffs[0]}" + (f" (+{len(diffs) - 1} more)" if len(diffs) > 1 else ""))
    gdoc.update(state=state, state_detail=words, health=None if rank > 0 else (err or "ok"), hicache_differences=diffs,
                stopped={k: stopped.get(k) for k in ("who", "ts", "message")} if stopped else None)
    shown = state
    if job is not None:
        shown += f" (slurm job {job['job']} {job['state']}" + (f" on {job['nodes']}" if job.get("nodes") else "") \
            + (f", {job['elapsed']}" if job.get("elapsed") else "") \
            + (f", exit {job['exit_code']}" if job.get("exit_code") else "") \
            + (f", release {job['release']}" if job.get("release") and job["release"] != cur else "") \
            + f", {job['restarts']} restart(s)" \
            + (f", from {job['source']}" if job.get("source") not in (None, "slurm") else "") + ")"
    if gdoc.get("container"):
        shown += f" (container {gdoc['container'][:12]}, image {(gdoc['image'] or '-')[:12]})"
    health = f"served by node 0 ({url})" if rank > 0 else "-" if state == "stopped" else (err or "ok")
    return gdoc, [h, label, shown, rel, gdoc["pid"] or "-", port, uptime_text(gdoc["uptime_s"]), gdoc["restarts"],
                  health, "; ".join(diffs) or "match" if info is not None else "-", hdoc["lock"] or "-"]


def _print_status(dep, doc: dict, rows: list, markdown: bool) -> None:
    """The status table, then per host its drift and last audit record, then each difference
    from the profile with the command that applies the profile's file."""
    from ..hosts.day2 import last_audit_text
    headers = ["host", "group", "state", "release (state)", "pid", "port", "uptime", "restarts", "/health",
               "HiCache vs config", "lock"]
    if markdown:
        print(markdown_table(headers, rows))
    else:
        console().print(rich_table(f"dsv4ctl status: {dep.name}", headers, rows))
    verify_hint = f"dsv4ctl verify {shlex.quote(str(dep.path))}"
    for h, hd in doc["hosts"].items():
        if hd.get("drift"):
            print(f"{h}: DRIFT in {hd['current']}: {', '.join(hd['drift'][:5])} ({verify_hint})")
        la = hd.get("last_audit")
        if la:
            print(f"{h}: last audit: {last_audit_text(la)}")
    for h, hd in doc["hosts"].items():
        for name, gd in hd.get("groups", {}).items():
            if gd.get("state") not in (None, "running", "drifted", "undeployed"):
                print(f"{h}/{name}: {gd['state']}: {gd['state_detail']}")
    if len(doc["releases"]) > 1:
        print(f"the hosts run {len(doc['releases'])} releases: "
              + "; ".join(f"{r} on {', '.join(hs)}" for r, hs in doc["releases"].items())
              + f" (a limited deploy; dsv4ctl deploy {shlex.quote(str(dep.path))} puts every host on one)")
    for d in doc["differing"]:
        print(f"differs from the profile's serve config: {d}: the server runs the active release's copy (a "
              f"restart starts that one again); to apply the profile's: dsv4ctl deploy {shlex.quote(str(dep.path))}")


def logs(group: str = typer.Argument(..., help="Server group (or the router)."),
         profile: Optional[str] = _P,
         lines: int = typer.Option(50, "-n", "--lines", help="Last lines per host (1..100000)."),
         follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing new lines until Ctrl-C."),
         host: Optional[str] = typer.Option(None, "--host", help="Only this host."),
         grep: Optional[str] = typer.Option(None, "--grep", help="Only lines matching this regular expression."),
         since: Optional[str] = since_option("Of the last -n lines, only those from this time on (taken in each host's clock): this long ago (90s, 30m, 2h, 1d) or an ISO date or time (2026-12-01T16:00:00Z; UTC when no zone)."),
         interval: float = duration_option(1.0, "--interval", lo=0.05, hi=3600, help="With -f: time between reads (1, 500ms, 5s; 50ms..1h)."),
         accept_new: bool = _ACCEPT) -> None:
    """The group's server log from every host it runs on (every node of a multi-node server, every
    replica), each line prefixed with the host (both service backends append to
    <root>/logs/<group>.log). -f follows until Ctrl-C. --since keeps, of the last -n lines, those
    from the first line stamped at or after that time on, in each host's time (its clock is read
    in the same round trip, as audit and diagnose do).

    Exit 0 · 2 bad input (unknown group or host, bad --grep) · 3 a host unreachable."""
    from .options import duration, integer, since as parse_since
    integer(lines, "-n/--lines", 1, 100_000)
    duration(interval, "--interval", lo=0.05, hi=3600)
    when = parse_since(since) if since is not None else None
    try:
        rx = re.compile(grep) if grep else None
    except re.error as e:
        raise InputError(f"--grep {grep!r}: {e}") from None
    _group_before_profile(group, profile)
    dep, site = _site(profile, accept_new)
    try:
        hs = _log_hosts(dep, group, host)
        sel = {h: site.transports[h] for h in hs}
        offsets: dict[str, Optional[int]] = {h: None for h in hs}
        while True:
            _log_round(site, sel, group, offsets, lines, when, rx)
            if not follow:
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        return
    finally:
        site.close()


def _log_hosts(dep, group: str, host: Optional[str]) -> list[str]:
    """The hosts whose log of ``group`` ``logs`` reads: every node of every server of the group,
    or only ``host``. InputError (exit 2) for an unknown group, a host not in the profile or
    one the group does not run on."""
    hs = dep.group(group).group.hosts
    if host is not None:
        if host not in dep.hosts:
            raise InputError(f"--host {host!r}: not a host of {dep.path} ({', '.join(dep.hosts)})")
        if host not in hs:
            raise InputError(f"--host {host!r}: group {group} does not run there ({', '.join(hs)})")
        hs = [host]
    return hs


_RANK = re.compile(r"\b(?:TP|tp|DP|dp|PP|pp)(\d+)\b")
"""A parallel rank in a server's log line (``TP3``, ``dp0``): printed after the host."""


def _show_log(h: str, text: str, rx) -> None:
    """Print the lines of ``text`` (those matching ``rx``, if any) prefixed with host ``h`` and the
    line's rank, each cut to the service's longest log line and made printable."""
    from ..deploy.service import LOG_LINE_MAX
    for ln in text.splitlines():
        if rx is None or rx.search(ln):
            m = _RANK.search(ln)
            print(f"{h}{'/' + m.group(0) if m else ''}: {printable(ln[:LOG_LINE_MAX])}")
    sys.stdout.flush()


def _log_round(site, sel: dict, group: str, offsets: dict[str, Optional[int]], lines: int, when, rx) -> None:
    """One read of every host's log (in parallel) and what is new printed. ``offsets`` (per host:
    None before the first read, then the byte offset read up to) is updated: the first read
    prints the last ``lines`` lines (with ``when``, those from that time on in the host's clock,
    warning of a skewed clock), later reads the whole lines added since; a log rotated or
    truncated is read from its start. DsvError (exit 3) for a host that does not answer."""
    from ..hosts.day2 import follow_offset, log_read_command, parse_log_read
    from ..remote import run_parallel

    def read(t):
        cmd = log_read_command(site.paths[t.name], group, offsets[t.name], lines)
        if when is not None and offsets[t.name] is None:     # the first read: the host's clock too
            from ..hosts.clock import run_clocked
            out, clock = run_clocked(t, cmd, timeout=60)
            return parse_log_read(out.out), clock
        return parse_log_read(t.run(cmd, timeout=60).out), None

    res = run_parallel(sel, read, timeout=75)
    for h, r in res.items():
        if not r.ok:
            raise DsvError(f"logs: {r.error}", EXIT_REMOTE)
        (size, text), clock = r.value
        if when is not None and offsets[h] is None:
            from ..diagnose.collect import since_filter
            from ..hosts.clock import host_cutoff, skew_warning
            warn = skew_warning(h, clock.offset_s if clock else None)
            if warn:
                print(warn, file=sys.stderr)
            text = since_filter(text, host_cutoff(when, clock.applied) if clock else when)
        if size < 0:
            if offsets[h] is None:
                print(f"{h}: no log for group {group} yet ({site.paths[h].logfile(group)})", file=sys.stderr)
            offsets[h] = 0
            continue
        if offsets[h] is not None and size < offsets[h]:     # rotated or truncated: from the start
            offsets[h] = 0
            continue
        if offsets[h] is None:
            _show_log(h, text, rx)
            offsets[h] = size
            continue
        offsets[h], whole = follow_offset(offsets[h], text.encode("utf-8", "surrogateescape"))
        if whole:
            _show_log(h, whole.decode("utf-8", "surrogateescape"), rx)


def _group_before_profile(group: str, profile: Optional[str]) -> None:
    """``logs PROFILE`` (the group left out, so the profile landed in GROUP): InputError (exit 2)
    saying so, with the profile's groups, instead of "give the profile"."""
    import os
    from pathlib import Path
    if profile is not None or os.environ.get("DSV4CTL_PROFILE"):
        return
    if not (group.endswith((".yaml", ".yml")) or Path(group).is_file()):
        return
    from .common import load_deployment_arg
    try:
        names = list(load_deployment_arg(group, acts_on_hosts=True).groups)
    except DsvError:
        names = []
    raise InputError(f"logs takes the group first, then the profile: dsv4ctl logs {names[0] if names else 'GROUP'} "
                     f"{shlex.quote(group)}" + (f" (its groups: {', '.join(names)})" if names else ""))


def _result_text(r: dict) -> str:
    """An audit record's result as what it was: ``ok`` of a --force-failed activation is
    ``ok (forced: failed before)``, of a --no-preflight deploy ``ok (no preflight)``."""
    res = str(r.get("result", ""))
    marks = (["forced: failed before"] if r.get("forced_failed") else []) + \
        (["no preflight"] if r.get("preflight") == "skipped" else []) + (["promoted"] if r.get("promote") and res == "ok" else [])
    return res + (f" ({', '.join(marks)})" if marks else "")


#: Audit actions of a serve-config change on the hosts (``--remote``): a release of its own.
SERVE_CHANGES = ("hicache-on", "hicache-off", "config-set")


def _detail_text(r: dict) -> str:
    """The record's detail, after its ``-m`` message (quoted) when it has one; a serve-config
    change's says what it changed first (``serve config of prefill, decode (from r…)``)."""
    d = str(r.get("detail", ""))
    if r.get("action") in SERVE_CHANGES and isinstance(r.get("groups"), list):
        what = f"serve config of {', '.join(map(str, r['groups']))}" + (f" (from {r['from']})" if r.get("from") else "")
        d = what + (f"; {d}" if d else "")
    return (f'"{r["message"]}"' + (f"; {d}" if d else "")) if r.get("message") else d


def audit(profile: Optional[str] = _P,
          since: Optional[str] = since_option("Only records at or after this time (2026-12-01, 2026-12-01T16:00:00Z; taken in each host's clock) or this long ago (90s, 30m, 2h, 1d)."),
          host: Optional[str] = typer.Option(None, "--host", help="Only this host."),
          accept_new: bool = _ACCEPT,
          as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.audit/1 JSON document."),
          markdown: bool = typer.Option(False, "--markdown", help="Print Markdown.")) -> None:
    """Every host's audit log merged by time: when, who, host, what, release, result, detail.
    Each host's clock is read in the same round trip: --since is taken in each host's time and
    a host more than a minute off gets a warning line.

    Exit 0 · 2 bad input · 3 a host unreachable (the others are still printed)."""
    from ..hosts.clock import run_clocked, skew_warning, usable
    from ..hosts.day2 import audit_command, merge_audit, parse_audit
    from ..remote import run_parallel

    if since is not None:
        since = _since(since)
    dep, site = _site(profile, accept_new)
    if host is not None and host not in dep.hosts:
        site.close()
        raise InputError(f"--host {host!r}: not a host of {dep.path} ({', '.join(dep.hosts)})")
    # a shared root (deploy.slurm.shared_root) holds one audit log: read once, at its owner
    sel = {h: t for h, t in site.root_transports.items() if host in (None, h) or dep.root_owner(host) == h}

    def read(t):
        out, clock = run_clocked(t, audit_command(site.paths[t.name]), timeout=60)
        return parse_audit(t.name, out.out), clock

    try:
        res = run_parallel(sel, read, timeout=75)
    finally:
        site.close()
    down = [r.error for r in res.values() if not r.ok]
    clocks = {h: r.value[1] for h, r in res.items() if r.ok}
    for h, c in clocks.items():
        warn = skew_warning(h, c.offset_s if c else None)
        if warn:
            print(warn, file=sys.stderr)
    recs = merge_audit({h: r.value[0] for h, r in res.items() if r.ok}, since, host,
                       offsets={h: c.applied for h, c in clocks.items() if c})
    if as_json:
        print(dump_json({"schema": "dsv4ctl.audit/1", "profile": dep.name, "records": recs, "unreachable": down,
                         "clock_offsets_s": {h: round(c.offset_s, 1) if c and usable(c.offset_s) else None
                                             for h, c in clocks.items()}}))
    else:
        headers = ["when", "who", "host", "action", "release", "result", "detail"]
        rows = [[r.get("ts", ""), r.get("who", ""), r.get("host", ""), r.get("action", ""), r.get("release", ""),
                 _result_text(r), _detail_text(r)[:100]] for r in recs]
        if markdown:
            print(markdown_table(headers, rows))
        else:
            console().print(rich_table(f"dsv4ctl audit: {dep.name}", headers, rows))
    if down:
        raise DsvError(f"audit: {len(down)} host(s) unreachable: {down[0]}", EXIT_REMOTE)


def _since(text: str) -> str:
    """``--since`` (:func:`dsv4ctl.commands.options.since`: an ISO date or time, or a duration
    back from now like ``1h``) as the audit log spells time (``2026-12-01T16:00:00Z``)."""
    from datetime import timezone

    from .options import since
    t = since(text).astimezone(timezone.utc)
    return f"{t.year:04d}-" + t.strftime("%m-%dT%H:%M:%SZ")      # %Y is not zero-padded before 1000


def verify(profile: Optional[str] = _P,
           release: list[str] = typer.Option([], "--release", "-r", help="Only this release id (repeatable; default: every release on every host)."),
           accept_new: bool = _ACCEPT,
           as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.verify/1 JSON document."),
           markdown: bool = typer.Option(False, "--markdown", help="Print Markdown.")) -> None:
    """Hash every file of every release on every host against its MANIFEST.json and report drift
    per host, release and file (an in-place edit of a hard link shared by several releases shows
    in each of them); a release's Python environment is checked against its lock (versions, RECORD
    hashes, unclaimed files). Read-only. Each file's inode is hashed once per host.

    Exit 0 every release intact · 1 drift found · 2 bad input · 3 a host could not be read."""
    from ..deploy.drift import verify_fleet
    from ..deploy.site import Options
    from .common import load_deployment_arg
    dep = load_deployment_arg(profile, acts_on_hosts=True)
    for r in release:
        if not re.fullmatch(r"r[0-9a-f]{12}", r):
            raise InputError(f"--release {r!r}: expected a release id (r + 12 hex digits)")
    doc = verify_fleet(dep, Options(accept_new_host_keys=accept_new), release or None)
    doc["profile"] = dep.name
    if as_json:
        print(dump_json(doc))
    else:
        headers = ["host", "release", "role", "files", "verdict"]
        rows = []
        for h, hd in doc["hosts"].items():
            if "error" in hd:
                rows.append([h, "-", "", "", "UNREACHABLE: " + hd["error"][:80]])
                continue
            if not hd["releases"]:
                rows.append([h, "-", "", "", "no releases"])
            name = f"{h} (shared root of {', '.join(hd['shared_by'])})" if hd.get("shared_by") else h
            for rid, v in hd["releases"].items():
                role = "current" if rid == hd["current"] else "previous" if rid == hd["previous"] else ""
                rows.append([name, rid, role, v["checked"], "ok" if v["ok"] else
                             "DRIFT: " + ", ".join(v["problems"][:3]) + (f" (+{v['nbad'] - 3} more)" if v["nbad"] > 3 else "")])
        if markdown:
            print(markdown_table(headers, rows))
        else:
            console().print(rich_table(f"dsv4ctl verify: {dep.name}", headers, rows))
        for line in doc["drift"]:
            print(f"drift: {line}")
    if doc["unreachable"]:
        raise DsvError(f"verify: {len(doc['unreachable'])} host(s) could not be read: {doc['unreachable'][0]}",
                       EXIT_REMOTE)
    if doc["drift"]:
        raise VerdictError(f"verify: {len(doc['drift'])} release(s) differ from their manifest: {doc['drift'][0]}",
                           label="drift")


def register(app: typer.Typer) -> None:
    """Add ``status``, ``logs`` and ``audit`` to the root app."""
    app.command("status")(status)
    app.command("logs")(logs)
    app.command("audit")(audit)
    app.command("verify")(verify)
