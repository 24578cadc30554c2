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
from dataclasses import dataclass, field
from typing import Optional

from ..errors import InputError, RemoteError
from ..hosts.health import wait_health
from ..hosts.service import restart_cmd, run_restart

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


def plan_remote(prof, groups, action: str, opts, tree: Optional[str], transports: dict) -> list[RemoteEdit]:
    # prof: the Deployment; groups: its GroupViews
    """Read each group's live file on its host (a fact), compute and lint the edit. Nothing changes.

    InputError (exit 2) for a missing live file, YAML error, bad option or lint error;
    RemoteError (exit 3) when a host cannot be read."""
    from dataclasses import replace

    from ..profile.serveconfig import parse_serve_config
    from .argtable import load_table
    from .lintinput import build_input, restrict
    from .hicache import changes_for
    from .lint import lint
    from ..remote import read_text
    from .edit import apply_changes, unified_diff

    table = load_table()
    out: list[RemoteEdit] = []
    from ..hosts.audit import file_stamp
    from ..hosts.lock import check_unlocked
    ts = file_stamp()
    for g in groups:
        host = g.group.host
        root = g.root
        path = live_config(root, g.name)
        label = f"{host}:{path}"
        check_unlocked(transports[host], root)
        text = read_text(transports[host], path, default=None)
        if text is None:
            raise InputError(f"{label}: no such file on the host (deploy a release first)")
        cfg = parse_serve_config(text, label)
        changes = changes_for(action, cfg.data, opts, table, label)
        new = apply_changes(text, changes, label) if changes else text
        out.append(RemoteEdit(group=g.name, host=host, root=root, path=path, url=g.url_with(cfg),
                              old=text, new=new, diff=unified_diff(text, new, label),
                              backup=f"{root}/backups/hicache/{g.name}.{ts}.yaml"))
    changed = [e for e in out if e.new != e.old]
    if changed:
        inp = build_input(prof, None, tree, texts={e.group: e.new for e in changed})
        for gi in inp.groups:     # findings on the live text name the host path
            e = next((e for e in changed if e.group == gi.name), None)
            if e is not None and gi.config is not None:
                gi.config = replace(gi.config, path=f"{e.host}:{e.path}")
        findings = restrict(lint(inp, table), inp, [e.group for e in changed])
        for e in changed:
            e.findings = [f for f in findings if f.group == e.group or f.file == f"{e.host}:{e.path}"]
        errs = [f for f in findings if f.severity == "error"]
        if errs:
            raise InputError(f"hicache {action}: not written: {errs[0].format()}"
                             + (f" (+{len(errs) - 1} more error(s))" if len(errs) > 1 else ""))
    return out


def actions(prof, edits: list[RemoteEdit], stop_timeout: float = 30.0) -> list:
    """The host actions of the changed edits: backup, atomic write, restart (per group, in order)."""
    from ..remote import Action, atomic_write
    out = []
    py = prof.deploy.python
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
    """One audit-log line for a group's edit (:func:`dsv4ctl.hosts.audit.audit_record`) plus the
    edit's facts. No secrets."""
    from ..hosts.audit import audit_record as record
    return record(e.host, f"hicache-{action}", result, detail, group=e.group, file=e.path, backup=e.backup,
                  sha256_before=sha256(e.old), sha256_after=sha256(e.new), restart=e.restart, healthy=e.healthy)


def apply_remote(prof, edits: list[RemoteEdit], transports: dict, action: str, health_timeout: float,
                 stop_timeout: float = 30.0, log=print) -> list[RemoteEdit]:
    """Run the actions, wait for health, roll back unhealthy groups, audit every changed group.

    Raises RemoteError (exit 3) when a host step fails (after restoring that group's file and
    restarting it when possible), VerdictError (exit 1) when a group was rolled back."""
    from ..errors import VerdictError
    from ..remote import append_jsonl, atomic_write, run_actions

    changed = [e for e in edits if e.new != e.old]
    if not changed:
        return edits
    py = prof.deploy.python
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
    from ..remote import read_text
    return read_text(t, path, default=None)
