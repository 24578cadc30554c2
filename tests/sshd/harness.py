"""Start real OpenSSH ``sshd`` processes on 127.0.W.2 … 127.0.W.N (W: the pytest-xdist worker, 0
without xdist), one per simulated host.

Each host gets a throwaway ed25519 host key, its own port, pid file and deploy root; one
throwaway user key logs in as the current user (root in CI). ``known_hosts`` lists every host
key in OpenSSH's ``[addr]:port`` form. Nothing outside ``base`` is touched except
``/run/sshd`` (sshd's privilege-separation folder, created when missing)."""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def available() -> str | None:
    """None when sshd can run here, else the reason to skip."""
    if not os.path.exists(SSHD):
        return "OpenSSH sshd not installed (scripts/test.sh installs openssh-server)"
    for tool in ("ssh", "ssh-keygen", "rsync"):
        if not shutil.which(tool):
            return f"{tool} not installed"
    return None


#: ports this process handed out (a world asks for several before anything binds them)
_GIVEN: set[int] = set()


def _ephemeral() -> tuple[int, int]:
    try:
        lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_port(addr: str) -> int:
    """A port free on ``addr`` now, in 20000-29899: below the kernel's ephemeral range, above the
    Slurm labs' (16800-17400) and under the fixed 30000/30001 of the local worlds. A port the
    kernel picks for ``bind(0)`` is ephemeral, and an outgoing connection from ``addr`` (a Slurm
    node's RPCs) could take it as its local port before the server binds it (a router's bind
    failed "address already in use" in a CI run). Never the same port twice in one process."""
    import random
    hi = min(_ephemeral()[0], 29900)
    for _ in range(500):
        port = random.randrange(20000, hi)
        if port in _GIVEN:
            continue
        try:
            with socket.socket() as s:
                s.bind((addr, port))
        except OSError:
            continue
        _GIVEN.add(port)
        return port
    with socket.socket() as s:      # the range is full: the kernel's pick
        s.bind((addr, 0))
        return s.getsockname()[1]


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path), "-C", "dsv4ctl-test"],
                   check=True, capture_output=True)
    return path.with_suffix(".pub").read_text().strip() if path.suffix else Path(str(path) + ".pub").read_text().strip()


def descendants(pid: int) -> list[int]:
    """Pids of all descendants of ``pid`` (from /proc)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in kids.get(p, []):
            out.append(c)
            todo.append(c)
    return out


@dataclass
class SshdHost:
    name: str
    address: str
    port: int
    dir: Path
    root: Path
    host_key: Path
    proc: subprocess.Popen | None = None
    config: Path | None = None

    @property
    def host_pub(self) -> str:
        return Path(str(self.host_key) + ".pub").read_text().strip()

    def start(self) -> None:
        """Start (or restart) this host's sshd and wait until it accepts connections."""
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)],
                                     stdout=subprocess.DEVNULL, stderr=open(self.dir / "sshd.log", "ab"),
                                     start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd for {self.name} exited: {(self.dir / 'sshd.log').read_text()[-500:]}")
            try:
                with socket.create_connection((self.address, self.port), timeout=0.5) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd for {self.name} did not start")

    def kill(self) -> None:
        """SIGKILL the sshd listener and every connection it serves (a host dropping off)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pids = descendants(self.proc.pid)
        for p in [self.proc.pid] + pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=10)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Cluster:
    """N sshd hosts + a user key + a known_hosts file listing them."""

    base: Path
    hosts: list[SshdHost] = field(default_factory=list)
    user: str = ""
    user_key: Path | None = None
    known_hosts: Path | None = None

    def write_known_hosts(self, path: Path | None = None, hosts=None) -> Path:
        path = path or self.known_hosts
        lines = [f"[{h.address}]:{h.port} {' '.join(h.host_pub.split()[:2])}" for h in (hosts or self.hosts)]
        path.write_text("\n".join(lines) + "\n")
        return path

    def stop(self) -> None:
        for h in self.hosts:
            h.kill()

    def host_yaml(self, h: SshdHost, root: Path | str, known_hosts: Path | None = None, **extra) -> dict:
        """A profile ``hosts[]`` entry for ``h``."""
        d = {"name": h.name, "address": h.address, "root": str(root),
             "ssh": {"user": self.user, "port": h.port, "key": str(self.user_key),
                     "known_hosts": str(known_hosts or self.known_hosts)},
             "gpus": {"model": "stand-in", "count": 8, "memory_mib": 183359}}
        d.update(extra)
        return d


def sshd_config(h: "SshdHost", auth: Path) -> str:
    """The sshd_config text of test host ``h`` (listen address/port, host key, pid file in its
    folder; ``auth``: the authorized_keys file of the throwaway user key)."""
    return "\n".join([
        f"ListenAddress {h.address}:{h.port}",
        f"HostKey {h.host_key}",
        f"PidFile {h.dir / 'sshd.pid'}",
        f"AuthorizedKeysFile {auth}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "StrictModes no",
        "UsePAM no",
        "AllowTcpForwarding yes",
        "MaxStartups 100:30:200",
        "MaxSessions 100",
        "LogLevel ERROR",
        # the simulated hosts share this machine's root account: keep its interactive ~/.bashrc
        # (pyenv init, with a global rehash lock) out of every remote command, as on a clean host
        "SetEnv SHLVL=1",
        "Subsystem sftp internal-sftp",
    ]) + "\n"


def start_cluster(base: Path, n: int = 4) -> Cluster:
    """Start ``n`` sshd hosts on 127.0.W.2 … 127.0.W.(n+1) under ``base`` (W: the xdist worker)."""
    base.mkdir(parents=True, exist_ok=True)
    os.makedirs("/run/sshd", exist_ok=True) if os.geteuid() == 0 else None
    c = Cluster(base=base, user=getpass.getuser())
    c.user_key = base / "id_user"
    keygen(c.user_key)
    auth = base / "authorized_keys"
    auth.write_text(Path(str(c.user_key) + ".pub").read_text())
    os.chmod(auth, 0o600)
    from tests.conftest import loopback
    for i in range(n):
        addr = loopback(i + 2)
        d = base / f"h{i}"
        d.mkdir(exist_ok=True)
        hk = d / "ssh_host_ed25519_key"
        keygen(hk)
        port = free_port(addr)
        h = SshdHost(name=f"h{i}", address=addr, port=port, dir=d, root=d / "root", host_key=hk)
        h.config = d / "sshd_config"
        h.config.write_text(sshd_config(h, auth))
        h.start()
        c.hosts.append(h)
    c.known_hosts = base / "known_hosts"
    c.write_known_hosts()
    return c
