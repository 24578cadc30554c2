"""systemd as PID 1 of a private namespace, with a real sshd inside it: a test host whose commands
run under that systemd (``systemctl`` talks to the namespace's PID 1).

Shape (:func:`booted`, a context manager yielding a :class:`Booted`):

* a cgroup ``dsv4ctl-systemd-test-<pid>`` under the machine's cgroup2 mount; the namespace's first
  process moves itself there, then ``unshare --pid --mount --uts --ipc --cgroup --fork
  --mount-proc --kill-child=SIGKILL`` (no ``--net``: the sshd and the stand-ins it starts listen on
  127.0.0.x of this machine's loopback, which the test reaches directly);
* inside, before ``exec /lib/systemd/systemd``: every mount private (``--make-rprivate /``);
  ``/proc/sys`` and ``/sys`` read-only (no host sysctl or uevent writes); a ``cgroup2`` mount on
  ``/sys/fs/cgroup`` that shows only that cgroup; tmpfs over ``/run``, ``/tmp`` (the test's base
  folder bound back in at its path), ``/var/tmp``, ``/var/log``, ``/var/lib/systemd`` and
  ``/etc/systemd/system``; ``/dev/console`` bound to a file (systemd's console output);
* systemd reads units only from ``/etc/systemd/system`` (``SYSTEMD_UNIT_PATH``) and runs no
  generators: a minimal ``dsv4ctl-test.target`` (``DefaultDependencies=no``) wants the sshd unit;
  stub ``sysinit.target``/``basic.target``/``shutdown.target`` satisfy the default dependencies
  of the units dsv4ctl writes, so no tmpfiles, udev or journald unit exists to start;
* teardown: SIGKILL to the namespace's PID 1 (the kernel kills every process of the namespace,
  its mounts go with it), then the cgroup folders are removed. ``unshare --kill-child`` and a
  parent-death signal on ``unshare`` end the namespace even when the test process dies.

Errors: :class:`Refused` when the kernel or the machine refuses the namespace (the test skips with
its text); RuntimeError when systemd or sshd does not come up (with systemd's console output)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.sshd.harness import Cluster, SshdHost, free_port, keygen, sshd_config

SYSTEMD = "/lib/systemd/systemd"
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"
NSENTER = shutil.which("nsenter") or "/usr/bin/nsenter"
TARGET = "dsv4ctl-test.target"
SSHD_UNIT = "dsv4ctl-test-sshd.service"
CGROUP_PREFIX = "dsv4ctl-systemd-test-"


class Refused(Exception):
    """The machine cannot run systemd in a namespace here (not root, tools or kernel refuse)."""


def cgroup2_mount() -> str | None:
    """Mount point of this machine's cgroup2 hierarchy (``/sys/fs/cgroup`` or ``…/unified``)."""
    with open("/proc/self/mountinfo") as f:
        for ln in f:
            pre, _, post = ln.partition(" - ")
            if post.split()[:1] == ["cgroup2"]:
                return pre.split()[4]
    return None


def probe() -> None:
    """Raise :class:`Refused` (its text: why) unless this machine can boot systemd in a namespace:
    root, systemd 252-like PID 1 binary, unshare/nsenter, a cgroup2 hierarchy, and a kernel that
    lets ``unshare`` create the namespaces (tried for real with ``true``)."""
    if os.geteuid() != 0:
        raise Refused("needs root (namespaces, mounts, cgroups)")
    for tool in (SYSTEMD, UNSHARE, NSENTER):
        if not os.access(tool, os.X_OK):
            raise Refused(f"{tool} not installed (scripts/test.sh installs systemd and util-linux)")
    if not cgroup2_mount():
        raise Refused("no cgroup2 hierarchy mounted on this machine")
    r = subprocess.run([UNSHARE, "--pid", "--mount", "--uts", "--ipc", "--cgroup", "--fork", "--mount-proc",
                        "sh", "-c", "mount -t tmpfs tmpfs /run && mount --bind /sys /sys"],
                       capture_output=True, text=True, timeout=30)
    if r.returncode:
        raise Refused(f"the kernel refuses the namespace: {r.stderr.strip() or r.returncode}")


def _unit_files(sshd_config_path: Path) -> dict[str, str]:
    stub = "[Unit]\nDescription=%s (test stub)\nDefaultDependencies=no\n"
    return {
        TARGET: ("[Unit]\nDescription=dsv4ctl test host\nDefaultDependencies=no\n"
                 f"Wants={SSHD_UNIT}\nAfter={SSHD_UNIT}\n"),
        SSHD_UNIT: ("[Unit]\nDescription=sshd of the dsv4ctl test host\nDefaultDependencies=no\n\n"
                    "[Service]\nType=simple\nRuntimeDirectory=sshd\nRuntimeDirectoryPreserve=yes\n"
                    f"ExecStart=/usr/sbin/sshd -D -e -f {sshd_config_path}\n"),
        "sysinit.target": stub % "sysinit.target",
        "basic.target": stub % "basic.target",
        "shutdown.target": stub % "shutdown.target",
    }


#: Runs as the namespace's PID 1 (``sh``), then becomes systemd. $1: the folder to keep visible
#: (the test's base, bound back under the private /tmp when it lives there), $2: the unit files,
#: $3: the console file; further arguments: more folders to keep visible the same way (the
#: checkout and the Python environment the hosts' commands run, which CI may have under /tmp).
SETUP = r'''
set -eu
base=$1 units=$2 console=$3
shift 3
mount --make-rprivate /
mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys
mount --bind /sys /sys && mount -o remount,bind,ro /sys
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs /run
mkdir /run/.tmp && mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /run/.tmp
for keep in "$base" "$@"; do
  case "$keep" in /tmp/*) mkdir -p "/run/.tmp/${keep#/tmp/}" && mount --bind "$keep" "/run/.tmp/${keep#/tmp/}";; esac
done
mount --move /run/.tmp /tmp && rmdir /run/.tmp
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /var/tmp
for d in /var/log /var/lib/systemd /etc/systemd/system; do mkdir -p "$d"; mount -t tmpfs -o mode=755 tmpfs "$d"; done
cp "$units"/* /etc/systemd/system/
mount --bind "$console" /dev/console
export container=unshare SYSTEMD_UNIT_PATH=/etc/systemd/system SYSTEMD_GENERATOR_PATH=/run/no-generators \
       SYSTEMD_ENVIRONMENT_GENERATOR_PATH=/run/no-generators
exec </dev/null >>"$console" 2>&1
exec /lib/systemd/systemd --system --unit=dsv4ctl-test.target --log-target=console --log-level=notice --show-status=no
'''


def _preexec(cgroup: str):
    def f():
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as fh:
            fh.write("0")
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)          # PR_SET_PDEATHSIG: unshare dies with the test process
    return f


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (``unshare --fork``: the namespace's PID 1)."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
        with contextlib.suppress(OSError):
            out += [int(x) for x in open(f"/proc/{pid}/task/{tid}/children").read().split()]
    return out


def _rm_cgroup(path: str) -> None:
    """Remove a cgroup folder tree, deepest first (a cgroup folder is removed with rmdir)."""
    if not os.path.isdir(path):
        return
    for d, subs, _ in os.walk(path, topdown=False):
        for s in subs:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(d, s))
    with contextlib.suppress(OSError):
        os.rmdir(path)


def _remove_stale_cgroups(mount: str) -> None:
    """cgroups of earlier runs whose namespace is gone (a test process killed before teardown)."""
    for name in os.listdir(mount):
        if name.startswith(CGROUP_PREFIX):
            pid = name[len(CGROUP_PREFIX):].split("-")[0]    # <test process pid>-<clock>
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                _rm_cgroup(os.path.join(mount, name))


@dataclass
class Booted:
    """A running systemd namespace. ``pid``: its PID 1 as this machine sees it; ``host``: the sshd
    inside (a :class:`tests.sshd.harness.SshdHost`, already answering); ``cluster``: that one host
    with the user key and known_hosts (for profile entries); ``console``: systemd's output file."""

    pid: int
    host: SshdHost
    cluster: Cluster
    console: Path
    cgroup: str

    def run(self, *argv: str, timeout: float = 30, check: bool = False) -> subprocess.CompletedProcess:
        """Run ``argv`` inside the namespace (its mounts, pids, cgroup: ``systemctl`` reaches PID 1)."""
        return subprocess.run([NSENTER, "-t", str(self.pid), "-m", "-p", "-u", "-i", "-C", "--", *argv],
                              capture_output=True, text=True, timeout=timeout, check=check)

    def path(self, p: str | Path) -> Path:
        """``p`` as the namespace sees it (through ``/proc/<pid>/root``)."""
        return Path(f"/proc/{self.pid}/root") / str(p).lstrip("/")


def _wait_running(pid: int, console: Path, timeout: float) -> None:
    end = time.monotonic() + timeout
    state = ""
    while time.monotonic() < end:
        if not os.path.exists(f"/proc/{pid}"):
            break
        r = subprocess.run([NSENTER, "-t", str(pid), "-m", "-p", "--", "systemctl", "is-system-running"],
                           capture_output=True, text=True, timeout=30)
        state = r.stdout.strip()
        if state == "running":
            return
        if state in ("degraded", "maintenance", "stopping"):
            failed = subprocess.run([NSENTER, "-t", str(pid), "-m", "-p", "--", "systemctl", "--failed", "--no-legend"],
                                    capture_output=True, text=True, timeout=30).stdout
            raise RuntimeError(f"systemd is {state}: {failed.strip()}\n{console.read_text()[-2000:]}")
        time.sleep(0.05)
    raise RuntimeError(f"systemd did not reach running (last: {state or 'no answer'}):\n"
                       f"{console.read_text()[-2000:] if console.exists() else ''}")


def _wait_ssh(h: SshdHost, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with socket.create_connection((h.address, h.port), timeout=0.5) as s:
                if s.recv(4).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd in the systemd namespace did not answer on {h.address}:{h.port}:\n"
                       f"{(h.dir / 'sshd.log').read_text()[-1000:] if (h.dir / 'sshd.log').exists() else ''}")


def _keep_visible() -> list[str]:
    """Folders the namespace's commands need besides the test's base: the checkout (tests run
    ``python -m tests.…`` from it) and the Python environment (``sys.prefix``, its real path),
    which may live under ``/tmp`` (a CI clone) that the namespace replaces with its own tmpfs."""
    import sys
    repo = Path(__file__).resolve().parents[2]
    out = []
    for p in (repo, Path(sys.prefix).resolve(), Path(sys.executable).resolve().parent.parent):
        if str(p) not in out:
            out.append(str(p))
    return out


@contextlib.contextmanager
def booted(base: Path, address: str = "127.0.0.20", name: str = "s0", timeout: float = 30):
    """Boot systemd in a private namespace with an sshd for host ``name`` on ``address`` (a free
    port); yield :class:`Booted`; always kill the namespace and remove its cgroup. Files of the
    test live under ``base`` (visible inside at the same path). Raises :class:`Refused` when the
    machine cannot do it (see :func:`probe`), RuntimeError when systemd or sshd does not start."""
    probe()
    base.mkdir(parents=True, exist_ok=True)
    mount = cgroup2_mount()
    _remove_stale_cgroups(mount)
    c = Cluster(base=base, user="root")
    c.user_key = base / "id_user"
    keygen(c.user_key)
    auth = base / "authorized_keys"
    auth.write_text(Path(str(c.user_key) + ".pub").read_text())
    auth.chmod(0o600)
    d = base / name
    d.mkdir(exist_ok=True)
    hk = d / "ssh_host_ed25519_key"
    keygen(hk)
    h = SshdHost(name=name, address=address, port=free_port(address), dir=d, root=d / "root", host_key=hk)
    h.config = d / "sshd_config"
    h.config.write_text(sshd_config(h, auth))
    c.hosts.append(h)
    c.known_hosts = base / "known_hosts"
    c.write_known_hosts()
    units = base / "units"
    units.mkdir(exist_ok=True)
    for fn, text in _unit_files(h.config).items():
        (units / fn).write_text(text)
    console = base / "systemd-console.log"
    console.write_text("")

    cgroup = os.path.join(mount, f"{CGROUP_PREFIX}{os.getpid()}-{time.monotonic_ns()}")
    os.mkdir(cgroup)
    proc = None
    pid1 = 0
    try:
        proc = subprocess.Popen([UNSHARE, "--pid", "--mount", "--uts", "--ipc", "--cgroup", "--fork", "--mount-proc",
                                 "--kill-child=SIGKILL", "sh", "-c", SETUP, "setup", str(base), str(units), str(console),
                                 *_keep_visible()],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(base / "unshare.err", "wb"),
                                preexec_fn=_preexec(cgroup))
        end = time.monotonic() + 10
        while not pid1 and time.monotonic() < end:
            kids = _children(proc.pid)
            pid1 = kids[0] if kids else 0
            if proc.poll() is not None:
                raise RuntimeError(f"unshare exited {proc.returncode}: {(base / 'unshare.err').read_text()[-1000:]}"
                                   f"{console.read_text()[-1000:]}")
            time.sleep(0.01)
        if not pid1:
            raise RuntimeError("the namespace's first process did not appear")
        _wait_running(pid1, console, timeout)
        _wait_ssh(h, timeout)
        yield Booted(pid1, h, c, console, cgroup)
    finally:
        if pid1:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid1, signal.SIGKILL)
        if proc is not None:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        end = time.monotonic() + 10
        while os.path.isdir(cgroup) and time.monotonic() < end:
            _rm_cgroup(cgroup)
            if os.path.isdir(cgroup):
                time.sleep(0.05)
