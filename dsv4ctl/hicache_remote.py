"""``hicache on|off --remote``: edit the live serve configs on the groups' hosts and restart them.

Host layout (the deploy layout, ``dsv4ctl/remote`` transport): a group's server runs with
``--config <root>/current/configs/<group>.yaml`` and is supervised either by the launcher
convention (pid file ``<root>/run/<group>.pid``, log ``<root>/logs/<group>.log``, process group of
its own) or by a systemd unit ``dsv4ctl-<group>.service``. ``root`` is the host's ``root``, else
``deploy.root`` (default ``/srv/dsv4ctl``).

A change is a list of :class:`~dsv4ctl.remote.Action` per host (``--dry-run`` prints them):

1. back up the current file to ``<root>/backups/hicache/<group>.<UTC stamp>.yaml`` (atomic write);
2. write the new file (temp file + rename, :func:`dsv4ctl.remote.atomic_write`);
3. restart the group: the launcher's process group is stopped (TERM, then KILL after
   ``stop_timeout``) and the *same* command line is started again in the same folder with the same
   environment (read from ``/proc/<pid>``), a new pid file written; or ``systemctl restart``;
4. (operator side) wait for ``GET /health`` = 200 on the group's port, SGLang's readiness probe
   (ops reference §4.1);
5. append one record to ``<root>/audit.jsonl`` in the deploy schema (``ts``, ``who``, ``host``,
   ``action``, ``result``, ``detail``) plus paths, hashes and pids (no secrets).

A host whose deploy lock ``<root>/.lock`` is held is refused before anything is read or written.

When a group does not become healthy its backup is written back and it is restarted again (the
result is ``rolled-back``, exit 1)."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Optional

from .errors import InputError, RemoteError

RESTART_SCRIPT = r'''
import json, os, signal, subprocess, sys, time
pidfile, logfile, group, unit, stop_timeout = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
def alive_group(pgid):
    # any non-zombie process whose process group is pgid (SGLang's scheduler children included)
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            f = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(f[2]) == pgid and f[0] != "Z":
            return True
    return False
if os.path.exists(pidfile):
    pid = int(open(pidfile).read().strip())
    try:
        argv = [a.decode() for a in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0") if a]
        env = dict(kv.decode().split("=", 1) for kv in open(f"/proc/{pid}/environ", "rb").read().split(b"\0") if b"=" in kv)
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        print(json.dumps({"error": f"group {group}: pid {pid} from {pidfile} is not running"})); sys.exit(3)
    for sig in (signal.SIGTERM,):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass
    deadline = time.time() + stop_timeout
    while alive_group(pid) and time.time() < deadline:
        time.sleep(0.1)
    if alive_group(pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        while alive_group(pid) and time.time() < deadline + 10:
            time.sleep(0.1)
    os.makedirs(os.path.dirname(logfile), exist_ok=True)
    log = open(logfile, "ab")
    log.write(f"=== dsv4ctl restart {group} (hicache) at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n".encode())
    log.flush()
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    tmp = pidfile + ".tmp"
    open(tmp, "w").write(str(p.pid))
    os.replace(tmp, pidfile)
    print(json.dumps({"how": "launcher", "old_pid": pid, "new_pid": p.pid}))
elif unit and os.path.isdir("/run/systemd/system") and subprocess.run(
        ["systemctl", "cat", unit], capture_output=True).returncode == 0:
    r = subprocess.run(["systemctl", "restart", unit], capture_output=True, text=True)
    if r.returncode:
        print(json.dumps({"error": f"systemctl restart {unit}: {r.stderr.strip()[-200:]}"})); sys.exit(3)
    print(json.dumps({"how": "systemd", "unit": unit}))
else:
    print(json.dumps({"error": f"group {group} is not running under dsv4ctl here (no {pidfile}, no unit {unit})"}))
    sys.exit(3)
'''


def host_root(prof, host) -> str:
    """The host's dsv4ctl root: ``hosts[].root``, else ``deploy.root``, else /srv/dsv4ctl."""
    return str(host.root or prof.deploy.get("root") or "/srv/dsv4ctl").rstrip("/")


def live_config(root: str, group: str) -> str:
    """Path of a group's live serve config on its host (what its server was started with)."""
    return f"{root}/current/configs/{group}.yaml"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class RemoteEdit:
    """One group's planned edit on its host."""

    group: str
    host: str
    root: str
    path: str
    url: str
    old: str
    new: str
    diff: str
    backup: str
    findings: list = field(default_factory=list)
    restart: Optional[dict] = None
    healthy: Optional[bool] = None
    rolled_back: bool = False


def restart_cmd(python: str, root: str, group: str, stop_timeout: float) -> str:
    """The host command that restarts ``group`` in place (see module docstring, step 3)."""
    from .remote import q
    return (f"{q(python)} - {q(f'{root}/run/{group}.pid')} {q(f'{root}/logs/{group}.log')} {q(group)} "
            f"{q(f'dsv4ctl-{group}.service')} {stop_timeout:g}")


def run_restart(t, python: str, root: str, group: str, stop_timeout: float = 30.0) -> dict:
    """Restart ``group`` on the host behind transport ``t``. RemoteError naming the host on failure."""
    res = t.run(restart_cmd(python, root, group, stop_timeout), input=RESTART_SCRIPT.encode(),
                timeout=stop_timeout + 60, check=False)
    lines = [ln for ln in res.out.strip().splitlines() if ln.startswith("{")]
    info = json.loads(lines[-1]) if lines else {}
    if res.code != 0 or "error" in info:
        raise RemoteError(f"{t.name}: restart {group}: {info.get('error') or res.error_text()}")
    return info


async def _wait_health(urls: dict[str, str], timeout: float, poll: float = 0.5) -> dict[str, Optional[str]]:
    """{group: None when /health answered 200 within ``timeout`` s, else the last failure}."""
    import asyncio

    import aiohttp

    async def one(session, url):
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                async with session.get(url + "/health") as r:
                    if r.status == 200:
                        return None
                    last = f"HTTP {r.status}"
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                last = type(e).__name__
            await asyncio.sleep(poll)
        return f"not healthy after {timeout:g} s ({last})"

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        res = await asyncio.gather(*(one(s, u) for u in urls.values()))
    return dict(zip(urls, res))


def wait_health(urls: dict[str, str], timeout: float) -> dict[str, Optional[str]]:
    """Blocking :func:`_wait_health`."""
    import asyncio
    return asyncio.run(_wait_health(urls, timeout))


def stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def plan_remote(prof, groups, action: str, opts, tree: Optional[str], transports: dict) -> list[RemoteEdit]:
    """Read each group's live file on its host (a fact), compute and lint the edit. Nothing changes.

    InputError (exit 2) for a missing live file, YAML error, bad option or lint error;
    RemoteError (exit 3) when a host cannot be read."""
    from .argtable import load_table
    from .commands.hicache import group_url
    from .configs import build_input, parse_config_text, restrict
    from .hicache import changes_for
    from .lint import lint
    from .remote import read_text
    from .serve_edit import apply_changes, unified_diff

    table = load_table()
    out: list[RemoteEdit] = []
    ts = stamp()
    for g in groups:
        host = prof.hosts[g.host]
        root = host_root(prof, host)
        path = live_config(root, g.name)
        label = f"{g.host}:{path}"
        check_unlocked(transports[g.host], root)
        text = read_text(transports[g.host], path, default=None)
        if text is None:
            raise InputError(f"{label}: no such file on the host (deploy a release first)")
        cfg = parse_config_text(text, label)
        changes = changes_for(action, cfg.data, opts, table, label)
        new = apply_changes(text, changes, label) if changes else text
        out.append(RemoteEdit(group=g.name, host=g.host, root=root, path=path, url=group_url(prof, g, cfg.data),
                              old=text, new=new, diff=unified_diff(text, new, label),
                              backup=f"{root}/backups/hicache/{g.name}.{ts}.yaml"))
    changed = [e for e in out if e.new != e.old]
    if changed:
        inp = build_input(prof, None, tree, texts={e.group: e.new for e in changed})
        for gi in inp.groups:     # findings on the live text name the host path
            e = next((e for e in changed if e.group == gi.name), None)
            if e is not None and gi.config is not None:
                gi.config.path = f"{e.host}:{e.path}"
        findings = restrict(lint(inp, table), inp, [prof.group(e.group) for e in changed])
        for e in changed:
            e.findings = [f for f in findings if f.group == e.group or f.file == f"{e.host}:{e.path}"]
        errs = [f for f in findings if f.severity == "error"]
        if errs:
            raise InputError(f"hicache {action}: not written: {errs[0].format()}"
                             + (f" (+{len(errs) - 1} more error(s))" if len(errs) > 1 else ""))
    return out


def actions(prof, edits: list[RemoteEdit], stop_timeout: float = 30.0) -> list:
    """The host actions of the changed edits: backup, atomic write, restart (per group, in order)."""
    from .remote import Action, atomic_write
    out = []
    py = prof.deploy.get("python", "python3")
    for e in edits:
        if e.new == e.old:
            continue
        out.append(Action(e.host, f"back up {e.path} to {e.backup}",
                          lambda t, e=e: atomic_write(t, e.backup, e.old, like=e.path)))
        out.append(Action(e.host, f"write {e.path} (temp file + rename; sha256 {sha256(e.new)[:12]})",
                          lambda t, e=e: atomic_write(t, e.path, e.new)))
        out.append(Action(e.host, f"restart group {e.group} (launcher pid file or systemd unit)",
                          lambda t, e=e: setattr(e, "restart", run_restart(t, py, e.root, e.group, stop_timeout)),
                          cmd=restart_cmd(py, e.root, e.group, stop_timeout)))
    return out


def audit_record(action: str, e: RemoteEdit, result: str, detail: str = "") -> dict:
    """One audit-log line for a group's edit, in the deploy audit schema (``ts``, ``who``, ``host``,
    ``action``, ``result``, ``detail``; docs/deploy.md) plus the edit's facts. No secrets."""
    from .remote import who
    return {"ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "who": who(), "host": e.host,
            "action": f"hicache-{action}", "result": result, "detail": detail, "group": e.group, "file": e.path,
            "backup": e.backup, "sha256_before": sha256(e.old), "sha256_after": sha256(e.new),
            "restart": e.restart, "healthy": e.healthy}


def check_unlocked(t, root: str) -> None:
    """RemoteError when a deploy holds the host's lock (``<root>/.lock``, docs/deploy.md)."""
    from .remote import q
    res = t.run(f"if [ -d {q(root + '/.lock')} ]; then cat {q(root + '/.lock/holder.json')} 2>/dev/null || echo '{{}}'; "
                f"exit 45; fi", check=False, timeout=30)
    if res.code == 45:
        try:
            h = json.loads(res.out or "{}")
        except ValueError:
            h = {}
        raise RemoteError(f"{t.name}: {root} is locked by {h.get('who', 'an unknown holder')} "
                          f"({h.get('what', 'deploy')}); try again when it is done")


def apply_remote(prof, edits: list[RemoteEdit], transports: dict, action: str, health_timeout: float,
                 stop_timeout: float = 30.0, log=print) -> list[RemoteEdit]:
    """Run the actions, wait for health, roll back unhealthy groups, audit every changed group.

    Raises RemoteError (exit 3) when a host step fails (after restoring that group's file and
    restarting it when possible), VerdictError (exit 1) when a group was rolled back."""
    from .errors import VerdictError
    from .remote import append_jsonl, atomic_write, run_actions

    changed = [e for e in edits if e.new != e.old]
    if not changed:
        return edits
    py = prof.deploy.get("python", "python3")
    res = run_actions(transports, actions(prof, changed, stop_timeout))
    failed_hosts = {h: r for h, r in res.items() if not r.ok}
    for e in changed:
        if e.host in failed_hosts:
            t = transports[e.host]
            result, detail = "failed", "old file restored"
            try:    # put the old file back; restart again only if the failed step came before the restart
                if read_back(t, e.path) != e.old:
                    atomic_write(t, e.path, e.old)
                    if e.restart is not None:
                        e.restart = run_restart(t, py, e.root, e.group, stop_timeout)
            except RemoteError as x:
                detail = f"restore incomplete: {x}"
            try:
                append_jsonl(t, f"{e.root}/audit.jsonl", audit_record(action, e, result, detail))
            except RemoteError:
                pass
    if failed_hosts:
        h, r = next(iter(failed_hosts.items()))
        raise RemoteError(f"hicache {action}: {h}: {r.error} (old file restored where reachable)")
    log(f"waiting for /health of {', '.join(e.group for e in changed)} (timeout {health_timeout:g} s)")
    health = wait_health({e.group: e.url for e in changed}, health_timeout)
    bad = []
    for e in changed:
        e.healthy = health[e.group] is None
        t = transports[e.host]
        result, detail = "ok", ""
        if not e.healthy:
            bad.append((e, health[e.group]))
            atomic_write(t, e.path, e.old)
            e.restart = run_restart(t, py, e.root, e.group, stop_timeout)
            e.rolled_back = True
            result, detail = "rolled-back", health[e.group]
        append_jsonl(t, f"{e.root}/audit.jsonl", audit_record(action, e, result, detail))
    if bad:
        e, why = bad[0]
        raise VerdictError(f"hicache {action}: {e.group} on {e.host}: {why}; the old file was restored and the "
                           f"group restarted")
    return edits


def read_back(t, path: str) -> Optional[str]:
    from .remote import read_text
    return read_text(t, path, default=None)
