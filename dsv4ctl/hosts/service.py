"""Service backends: how a host's serving groups are stopped, started and watched.

* ``launcher`` (no systemd, the default here): ``setsid`` starts the launch command in its own
  session/process group, with a pid file ``run/<group>.pid`` and an appended log
  ``logs/<group>.log`` (a ``=== dsv4ctl start`` header line before each start); stop sends
  SIGTERM to the process group, waits ``stop_timeout`` s, then SIGKILL.
* ``systemd``: a unit ``dsv4ctl-<group>.service`` per group (written atomically), restarted with
  ``systemctl``; logs appended to the same log file (``StandardOutput=append:``, not the journal).

Each backend's stop also stops the group under the other backend (a unit of a host that runs
systemd; a launcher pid file's process group): a profile whose ``service`` changed between two
deploys leaves no server of the old backend running (holding GPUs and ports).

Both backends run the same ``sh -c`` script (:func:`group_script`: the launch command, then an
``=== dsv4ctl: <group> exited with status N`` line). The unit quotes it for systemd
(:func:`systemd_quote`), so ``$$``, ``%``, quotes, backslashes and newlines reach ``sh`` as the
launcher passes them.

Every method returns a shell command (an operation the caller runs or prints)."""

from __future__ import annotations

import json

from ..errors import RemoteError
from ..remote import q
from ..remote.transport import GROUP_RUNNING_FN  # noqa: F401 — its home is the remote layer
from .day2 import LOG_LINE_MAX
from .layout import Paths


def group_script(group: str, command: str) -> str:
    """The ``sh -c`` script a group runs under either backend (pure): ``command`` in a subshell,
    then ``=== dsv4ctl: <group> exited with status N`` and exit N."""
    return f'(\n{command}\n)\nrc=$?; echo "=== dsv4ctl: {group} exited with status $rc"; exit $rc'


def systemd_quote(word: str, dollar: bool = True) -> str:
    """``word`` as one double-quoted word of a unit-file setting that systemd hands on unchanged
    (pure). systemd C-unescapes quoted words, expands ``%`` specifiers (every setting) and ``$VAR``
    / ``$$`` (``ExecStart=`` only), and ends a setting at a newline, so: ``\\`` and ``"`` are
    backslash-escaped, control characters become ``\\n``, ``\\t``, ``\\xNN``, ``%`` becomes
    ``%%`` and, with ``dollar`` (for ``ExecStart=``; not for ``Environment=``), ``$`` becomes ``$$``.
    E.g. ``echo $$ 50%`` -> ``"echo $$$$ 50%%"``."""
    out = []
    for ch in word:
        if ch in '\\"':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        elif ch == "%":
            out.append("%%")
        elif ch == "$" and dollar:
            out.append("$$")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


class Launcher:
    """Supervised launcher with pid and log files (hosts without systemd)."""

    name = "launcher"

    def __init__(self, stop_timeout: float = 10.0):
        self.stop_timeout = stop_timeout

    def stop_cmd(self, p: Paths, group: str) -> str:
        """:meth:`stop_pidfile_cmd`, then — on a host running systemd — the group's unit is
        stopped too (it was started by a deploy with the systemd backend)."""
        return f"{self.stop_pidfile_cmd(p, group)}; {Systemd().stop_unit_cmd(group, only_systemd_hosts=True)}"

    def stop_pidfile_cmd(self, p: Paths, group: str) -> str:
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
        wrapped = group_script(group, command)
        return (f"set -e; mkdir -p {q(p.rundir)} {q(p.logdir)}; "
                f"echo \"=== dsv4ctl start {group} release {rid} at $(date -u +%Y-%m-%dT%H:%M:%SZ)\" >> {lf}; "
                f"cd {q(p.release(rid))}; "
                f"setsid env {envs} sh -c {q(wrapped)} </dev/null >>{lf} 2>&1 & "
                f"echo $! > {pf}.tmp; mv -f {pf}.tmp {pf}")

    def alive_cmd(self, p: Paths, group: str) -> str:
        """Exit 0 while the group's process runs. A zombie counts as exited (PID 1 may not reap),
        and so does a process whose ``/proc`` entry vanishes between ``kill -0`` and the read of
        its state (a zombie reaped in between: an empty state is not "running")."""
        pf = q(p.pidfile(group))
        return (f"[ -f {pf} ] && pid=$(cat {pf}) && kill -0 $pid 2>/dev/null && "
                f"{{ [ ! -r /proc/self/stat ] || {{ st=$(sed 's/.*) //' /proc/$pid/stat 2>/dev/null | cut -c1); "
                f"[ -n \"$st\" ] && [ \"$st\" != Z ]; }}; }}")

    def process_cmd(self, p: Paths, group: str, containers: bool = True) -> str:
        """Status's read of the group (:func:`process_cmd`: the pid file or a unit)."""
        return process_cmd(p, group)


class Systemd:
    """One systemd unit per group (hosts running systemd)."""

    name = "systemd"

    def unit_name(self, group: str) -> str:
        return f"dsv4ctl-{group}.service"

    def unit_text(self, p: Paths, group: str, rid: str, command: str, env: dict[str, str]) -> str:
        """The unit file (pure): ``ExecStart=/bin/sh -c`` :func:`group_script` (as the launcher
        runs it), quoted with :func:`systemd_quote`; ``Environment=`` likewise (``$`` kept:
        systemd does not expand it there); ``%`` doubled in the paths and the description."""
        pct = lambda s: str(s).replace("%", "%%")  # noqa: E731
        lines = ["[Unit]", pct(f"Description=dsv4ctl serving group {group} (release {rid})"), "",
                 "[Service]", "Type=simple", f"WorkingDirectory={pct(p.release(rid))}",
                 *[f"Environment={systemd_quote(f'{k}={v}', dollar=False)}" for k, v in sorted(env.items())],
                 f"ExecStart=/bin/sh -c {systemd_quote(group_script(group, command))}",
                 f"StandardOutput=append:{pct(p.logfile(group))}", f"StandardError=append:{pct(p.logfile(group))}",
                 "KillMode=control-group", "TimeoutStopSec=30", "Restart=no", "", "[Install]",
                 "WantedBy=multi-user.target", ""]
        return "\n".join(lines)

    def __init__(self, stop_timeout: float = 10.0):
        self.stop_timeout = stop_timeout

    def stop_cmd(self, p: Paths, group: str) -> str:
        """``systemctl stop`` of the group's unit, then the launcher's stop of a pid file the group
        may still have (started by a deploy with the launcher backend)."""
        return f"{self.stop_unit_cmd(group)}; {Launcher(self.stop_timeout).stop_pidfile_cmd(p, group)}"

    def stop_unit_cmd(self, group: str, only_systemd_hosts: bool = False) -> str:
        """``systemctl stop`` of the group's unit (never fails; ``only_systemd_hosts``: nothing
        on a host not running systemd)."""
        cmd = f"systemctl stop {q(self.unit_name(group))} 2>/dev/null || true"
        if only_systemd_hosts:
            return f"if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then {cmd}; fi"
        return cmd

    def start_cmd(self, p: Paths, group: str, rid: str, command: str, env: dict[str, str]) -> str:
        unit = f"/etc/systemd/system/{self.unit_name(group)}"
        text = self.unit_text(p, group, rid, command, env)
        return (f"set -e; mkdir -p {q(p.logdir)}; t=$(mktemp {q(unit)}.XXXXXX); "
                f"printf %s {q(text)} > \"$t\"; mv -f \"$t\" {q(unit)}; "
                f"echo \"=== dsv4ctl start {group} release {rid} at $(date -u +%Y-%m-%dT%H:%M:%SZ)\" >> {q(p.logfile(group))}; "
                f"systemctl daemon-reload; systemctl restart {q(self.unit_name(group))}")

    def alive_cmd(self, p: Paths, group: str) -> str:
        return f"systemctl is-active --quiet {q(self.unit_name(group))}"

    def process_cmd(self, p: Paths, group: str, containers: bool = True) -> str:
        """Status's read of the group (:func:`process_cmd`: the unit or a launcher pid file)."""
        return process_cmd(p, group)


def backend(kind: str, has_systemd: bool, stop_timeout: float = 10.0):
    """``auto`` → systemd when the host runs it, else the launcher."""
    if kind == "systemd" or (kind == "auto" and has_systemd):
        return Systemd(stop_timeout)
    return Launcher(stop_timeout)


# -- is it running, which process, how often restarted (status, diagnose) --------------------

#: awk over the dsv4ctl header lines of a group's log (``grep '^=== dsv4ctl'``): ``RESTARTS EXIT``
#: — start/restart headers of group ``g`` since release ``r`` was last started after another
#: release (a stop + start of the same release counts), and the exit status after the last one.
_PROC_AWK = ('$2=="dsv4ctl" && $3=="start" && $4==g { if ($6==r && cur==r) n++; else n=0; cur=$6; ex="-"; next } '
             '$2=="dsv4ctl" && $3=="restart" && $4==g { n++; ex="-"; next } '
             '$2=="dsv4ctl:" && $3==g && $4=="exited" { ex=$7 } '
             'END { printf "%d %s\\n", n, (ex == "" ? "-" : ex) }')


def proc_command(p: Paths, group: str) -> str:
    """Shell: ``@proc G PID UPTIME RESTARTS EXIT JOB`` (``-`` for unknown) of one group
    (:class:`dsv4ctl.hosts.day2.GroupProcess`): the pid from the launcher's pid file, else the systemd unit's
    MainPID; its age from ``ps -o etimes``; the header counts from the log; a Slurm group's job
    id from ``run/<group>.job``."""
    pf, lf, jf = q(p.pidfile(group)), q(p.logfile(group)), q(f"{p.root}/run/{group}.job")
    unit = q(Systemd().unit_name(group))
    return (f"pid=$(cat {pf} 2>/dev/null || systemctl show -p MainPID --value {unit} 2>/dev/null); "
            f"pid=$(printf %s \"$pid\" | head -n 1 | tr -dc 0-9); [ \"$pid\" = 0 ] && pid=; et=; "
            f"[ -n \"$pid\" ] && et=$(ps -o etimes= -p \"$pid\" 2>/dev/null | tr -dc 0-9); "
            f"rid=$(readlink {q(p.current)} 2>/dev/null); rid=${{rid##*/}}; "
            f"lg=$( {{ grep -a '^=== dsv4ctl' {lf} 2>/dev/null || true; }} | awk -v g={q(group)} -v r=\"$rid\" "
            f"{q(_PROC_AWK)}); job=$( {{ tr -dc 0-9 < {jf}; }} 2>/dev/null); "
            f"echo \"@proc {group} ${{pid:--}} ${{et:--}} ${{lg:-0 -}} ${{job:--}}\"")


def process_cmd(p: Paths, group: str, alive: str | None = None) -> str:
    """Shell printing ``@alive G yes|no`` and ``@proc`` (:func:`proc_command`) of one group: the
    launcher's and systemd's answer to "is it running, which process, how often restarted"
    (``Launcher.process_cmd``, ``Systemd.process_cmd``). ``alive``: the test that exits 0 while it
    runs; default the launcher's, then systemd's (a group started under the other backend before
    the profile's ``service`` changed still counts)."""
    test = alive or " || ".join(f"( {k.alive_cmd(p, group)} )" for k in (Launcher(), Systemd()))
    return "\n".join([f"if {test}; then echo {q('@alive ' + group + ' yes')}; else echo {q('@alive ' + group + ' no')}; fi",
                      proc_command(p, group)])


def log_tail_cmd(p: Paths, group: str, n: int = 10) -> str:
    """The last ``n`` lines of the group's log since its last start header, each cut to
    LOG_LINE_MAX bytes on the host. awk keeps a ring of the last ``n`` lines (reset at each start
    header), so its memory is bounded by ``n`` x LOG_LINE_MAX whatever the log's size
    (benchmarks/log_tail.py)."""
    lf = q(p.logfile(group))
    n = max(0, int(n))
    if n == 0:
        return "true"
    return (f"[ -f {lf} ] && cut -b1-{LOG_LINE_MAX} {lf} | awk -v n={n} '/^=== dsv4ctl start /{{c=0}} "
            f"{{lines[c % n]=$0; c++}} END{{s=c-n; if(s<0)s=0; for(i=s;i<c;i++) print lines[i % n]}}' || true")


# -- restart in place (hicache --remote, runbook service.restart) ------------------------------

#: Host-side restart of one group with the command line, environment and folder it runs with now
#: (launcher: read from /proc/<pid>; systemd: ``systemctl restart`` of the unit as written). Both
#: append ``=== dsv4ctl restart <group> (hicache) at <UTC>`` to the group's log first.
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
def header():
    # the restart line both backends write before the group starts again
    os.makedirs(os.path.dirname(logfile), exist_ok=True)
    log = open(logfile, "ab")
    log.write(f"=== dsv4ctl restart {group} (hicache) at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n".encode())
    log.flush()
    return log
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
    log = header()
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    tmp = pidfile + ".tmp"
    open(tmp, "w").write(str(p.pid))
    os.replace(tmp, pidfile)
    print(json.dumps({"how": "launcher", "old_pid": pid, "new_pid": p.pid}))
elif unit and os.path.isdir("/run/systemd/system") and subprocess.run(
        ["systemctl", "cat", unit], capture_output=True).returncode == 0:
    def main_pid():
        r = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value", unit], capture_output=True, text=True)
        return int(r.stdout.strip()) if r.stdout.strip().isdigit() else 0
    old = main_pid()
    header().close()
    r = subprocess.run(["systemctl", "restart", unit], capture_output=True, text=True)
    if r.returncode:
        print(json.dumps({"error": f"systemctl restart {unit}: {r.stderr.strip()[-200:]}"})); sys.exit(3)
    print(json.dumps({"how": "systemd", "unit": unit, "old_pid": old, "new_pid": main_pid()}))
else:
    print(json.dumps({"error": f"group {group} is not running under dsv4ctl here (no {pidfile}, no unit {unit})"}))
    sys.exit(3)
'''


def restart_cmd(python: str, root: "str | Paths", group: str, stop_timeout: float) -> str:
    """The host command (script on stdin: :data:`RESTART_SCRIPT`) that restarts ``group`` in place:
    the launcher's process group is stopped (TERM, then KILL after ``stop_timeout`` s) and the same
    command line is started again with the same folder and environment; or ``systemctl restart``.
    ``root``: the deploy root, or the host's :class:`Paths` (a node of a shared root: its own
    ``run/<node>/`` and ``logs/<node>/``)."""
    p = root if isinstance(root, Paths) else Paths(root)
    return (f"{q(python)} - {q(p.pidfile(group))} {q(p.logfile(group))} {q(group)} "
            f"{q(Systemd().unit_name(group))} {stop_timeout:g}")


def run_restart(t, python: str, root: str, group: str, stop_timeout: float = 30.0) -> dict:
    """Restart ``group`` on the host behind transport ``t``: ``{"how": "launcher", "old_pid",
    "new_pid"}`` or ``{"how": "systemd", "unit", "old_pid", "new_pid"}`` (the unit's MainPID before
    and after; 0: none). RemoteError naming the host on failure."""
    res = t.run(restart_cmd(python, root, group, stop_timeout), input=RESTART_SCRIPT.encode(),
                timeout=stop_timeout + 60, check=False)
    lines = [ln for ln in res.out.strip().splitlines() if ln.startswith("{")]
    info = json.loads(lines[-1]) if lines else {}
    if res.code != 0 or "error" in info:
        raise RemoteError(f"{t.name}: restart {group}: {info.get('error') or res.error_text()}")
    return info


