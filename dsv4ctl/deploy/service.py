"""Service backends: how a host's serving groups are stopped, started and watched.

* ``launcher`` (no systemd, the default here): ``setsid`` starts the launch command in its own
  session/process group, with a pid file ``run/<group>.pid`` and an appended log
  ``logs/<group>.log`` (a ``=== dsv4ctl start`` header line before each start); stop sends
  SIGTERM to the process group, waits ``stop_timeout`` s, then SIGKILL.
* ``systemd``: a unit ``dsv4ctl-<group>.service`` per group (written atomically), restarted with
  ``systemctl``; logs appended to the same log file.

Every method returns a shell command (an operation the caller runs or prints)."""

from __future__ import annotations

from ..remote import q
from .layout import Paths


#: ``group_running PGID``: exit 0 while a non-zombie process of process group PGID exists
#: (reads ``/proc/*/stat``: state and pgrp follow the last ``") "``; without /proc, any member
#: counts). POSIX sh, no forks.
GROUP_RUNNING_FN = (  # "kill -SIG -PGID": dash has no "kill --"
    'group_running() { kill -0 -"$1" 2>/dev/null || return 1; [ -r /proc/self/stat ] || return 0; '
    'for s in /proc/[0-9]*/stat; do read -r l 2>/dev/null <"$s" || continue; l=${l##*") "}; '
    'set -- "$1" $l; [ "$4" = "$1" ] && [ "$2" != Z ] && return 0; done; return 1; };')


class Launcher:
    """Supervised launcher with pid and log files (hosts without systemd)."""

    name = "launcher"

    def __init__(self, stop_timeout: float = 10.0):
        self.stop_timeout = stop_timeout

    def stop_cmd(self, p: Paths, group: str) -> str:
        """SIGTERM to the group's process group, wait at least ``stop_timeout`` s (at most one
        more: a clock deadline in whole seconds, however many processes the host runs) while any
        member is still running, then SIGKILL. Zombies do not count as running: a member whose parent
        died first is only reaped by PID 1, which in a container may be slow or never."""
        pf = q(p.pidfile(group))
        n = max(1, int(round(self.stop_timeout)))
        return (f"if [ -f {pf} ]; then pid=$(cat {pf}); {GROUP_RUNNING_FN} "
                f"kill -TERM -$pid 2>/dev/null || kill -TERM $pid 2>/dev/null || true; "
                f"end=$(( $(date +%s) + {n} )); "
                f"while group_running $pid && [ $(date +%s) -le $end ]; do sleep 0.05; done; "
                f"kill -KILL -$pid 2>/dev/null || true; rm -f {pf}; fi")

    def start_cmd(self, p: Paths, group: str, rid: str, command: str, env: dict[str, str]) -> str:
        pf, lf = q(p.pidfile(group)), q(p.logfile(group))
        envs = " ".join(q(f"{k}={v}") for k, v in sorted(env.items()))
        wrapped = f'(\n{command}\n)\nrc=$?; echo "=== dsv4ctl: {group} exited with status $rc"; exit $rc'
        return (f"set -e; mkdir -p {q(p.root + '/run')} {q(p.root + '/logs')}; "
                f"echo \"=== dsv4ctl start {group} release {rid} at $(date -u +%Y-%m-%dT%H:%M:%SZ)\" >> {lf}; "
                f"cd {q(p.release(rid))}; "
                f"setsid env {envs} sh -c {q(wrapped)} </dev/null >>{lf} 2>&1 & "
                f"echo $! > {pf}.tmp; mv -f {pf}.tmp {pf}")

    def alive_cmd(self, p: Paths, group: str) -> str:
        """Exit 0 while the group's process runs (a zombie counts as exited: PID 1 may not reap)."""
        pf = q(p.pidfile(group))
        return (f"[ -f {pf} ] && pid=$(cat {pf}) && kill -0 $pid 2>/dev/null && "
                f"[ \"$(sed 's/.*) //' /proc/$pid/stat 2>/dev/null | cut -c1)\" != Z ]")


class Systemd:
    """One systemd unit per group (hosts running systemd)."""

    name = "systemd"

    def unit_name(self, group: str) -> str:
        return f"dsv4ctl-{group}.service"

    def unit_text(self, p: Paths, group: str, rid: str, command: str, env: dict[str, str]) -> str:
        """The unit file (pure)."""
        lines = ["[Unit]", f"Description=dsv4ctl serving group {group} (release {rid})", "",
                 "[Service]", "Type=simple", f"WorkingDirectory={p.release(rid)}",
                 *[f"Environment={q(f'{k}={v}')}" for k, v in sorted(env.items())],
                 f"ExecStart=/bin/sh -c {q(command)}",
                 f"StandardOutput=append:{p.logfile(group)}", f"StandardError=append:{p.logfile(group)}",
                 "KillMode=control-group", "TimeoutStopSec=30", "Restart=no", "", "[Install]",
                 "WantedBy=multi-user.target", ""]
        return "\n".join(lines)

    def stop_cmd(self, p: Paths, group: str) -> str:
        return f"systemctl stop {q(self.unit_name(group))} 2>/dev/null || true"

    def start_cmd(self, p: Paths, group: str, rid: str, command: str, env: dict[str, str]) -> str:
        unit = f"/etc/systemd/system/{self.unit_name(group)}"
        text = self.unit_text(p, group, rid, command, env)
        return (f"set -e; mkdir -p {q(p.root + '/logs')}; t=$(mktemp {q(unit)}.XXXXXX); "
                f"printf %s {q(text)} > \"$t\"; mv -f \"$t\" {q(unit)}; "
                f"echo \"=== dsv4ctl start {group} release {rid} at $(date -u +%Y-%m-%dT%H:%M:%SZ)\" >> {q(p.logfile(group))}; "
                f"systemctl daemon-reload; systemctl restart {q(self.unit_name(group))}")

    def alive_cmd(self, p: Paths, group: str) -> str:
        return f"systemctl is-active --quiet {q(self.unit_name(group))}"


def backend(kind: str, has_systemd: bool, stop_timeout: float = 10.0):
    """``auto`` → systemd when the host runs it, else the launcher."""
    if kind == "systemd" or (kind == "auto" and has_systemd):
        return Systemd()
    return Launcher(stop_timeout)


def log_tail_cmd(p: Paths, group: str, n: int = 10) -> str:
    """The last ``n`` lines of the group's log since its last start header."""
    lf = q(p.logfile(group))
    return (f"[ -f {lf} ] && awk '/^=== dsv4ctl start /{{buf=\"\"; c=0}} {{lines[c++]=$0}} "
            f"END{{s=c-{n}; if(s<0)s=0; for(i=s;i<c;i++) print lines[i]}}' {lf} || true")
