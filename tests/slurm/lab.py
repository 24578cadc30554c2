"""A real Slurm cluster on this machine for the tests: munged, slurmctld and N slurmd.

Debian's ``slurm-wlm`` (22.05) runs several nodes on one machine with ``slurmd -N NODE`` and one
``Port`` per node (../shared/reference/slurm-images-kubernetes.md). Each node gets its own
loopback address (``NodeAddr``) of the test worker's network, so a server on node ``n2`` binds
the same ports as one on ``n1``, as on real nodes. slurmctld and slurmd bind every address, so
their ports are picked per worker (:func:`_ports`). Accounting is off (no slurmdbd), as on the
sites the issue measured: ``sacct`` is unavailable, ``scontrol`` forgets a job after
``MinJobAge``.

    lab = SlurmLab.start(root, net=3, nodes=3)
    subprocess.run(["sinfo"], env=lab.env)
    lab.stop()
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel")


def missing() -> str | None:
    """Why a lab cannot start here (a daemon or client not installed), or None."""
    absent = [d for d in DAEMONS if not shutil.which(d) and not Path(f"/usr/sbin/{d}").exists()]
    if absent:
        return f"Slurm not installed ({', '.join(absent)} missing): apt-get install slurm-wlm"
    if os.geteuid() != 0:
        return "the Slurm lab runs its daemons as root"
    return None


def _ports(net: int) -> tuple[int, int]:
    """(slurmctld port, first slurmd port) of worker network ``net``: distinct per worker."""
    return 16800 + 20 * net, 17000 + 20 * net


def _sbin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class SlurmLab:
    """A running lab: its folder, slurm.conf, node names and addresses, and the daemons."""

    root: Path
    sock_dir: Path
    conf: Path
    nodes: dict[str, str]                 # node name -> NodeAddr
    partition: str = "gpu"
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """The environment for Slurm clients (``sbatch``, ``scontrol``...) and dsv4ctl."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this lab (text, captured)."""
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout)

    @classmethod
    def start(cls, root: Path, net: int, nodes: "int | dict[str, str]" = 3, min_job_age: int = 300) -> "SlurmLab":
        """Write slurm.conf under ``root``, start munged, slurmctld and the slurmd of ``nodes``
        (a count: ``n1``.. on ``127.0.NET.201``..; or {node name: address}, e.g. the sshd test
        hosts, so that a node's servers listen where the profile says), and wait until every
        node is idle (about 1 s here). RuntimeError with the daemons' logs when they do not come
        up within 20 s."""
        root.mkdir(parents=True, exist_ok=True)
        for d in ("state", "spool", "log"):
            (root / d).mkdir(exist_ok=True)
        # munge's socket path must fit sockaddr_un (108 bytes): a short folder of its own
        sock_dir = Path(tempfile.mkdtemp(prefix="slab", dir="/tmp"))
        names = (dict(nodes) if isinstance(nodes, dict)
                 else {f"n{k}": f"127.0.{net}.{200 + k}" for k in range(1, nodes + 1)})
        conf = root / "slurm.conf"
        lab = cls(root=root, sock_dir=sock_dir, conf=conf, nodes=names)
        conf.write_text(lab._conf_text(net, min_job_age))
        key = sock_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        try:
            lab._spawn([_sbin("munged"), "-F", "--force", f"--socket={sock_dir}/munge.socket",
                        f"--key-file={key}", f"--pid-file={sock_dir}/munged.pid",
                        f"--log-file={root}/log/munged.log", f"--seed-file={sock_dir}/seed"], "munged")
            lab._wait(lambda: (sock_dir / "munge.socket").exists(), "munged")
            lab._spawn([_sbin("slurmctld"), "-D", "-i", "-f", str(conf)], "slurmctld")
            for n in names:
                lab._spawn([_sbin("slurmd"), "-D", "-N", n, "-f", str(conf)], f"slurmd-{n}")
            lab._wait(lab._all_idle, "the nodes to be idle")
        except BaseException:
            lab.stop()
            raise
        return lab

    def _conf_text(self, net: int, min_job_age: int) -> str:
        ctld, d0 = _ports(net)
        host = socket.gethostname()
        lines = [
            "ClusterName=lab", f"SlurmctldHost={host}(127.0.{net}.200)", f"SlurmctldPort={ctld}",
            "AuthType=auth/munge", f"AuthInfo=socket={self.sock_dir}/munge.socket", "CredType=cred/munge",
            "SlurmUser=root", "SlurmdUser=root", f"StateSaveLocation={self.root}/state",
            f"SlurmdSpoolDir={self.root}/spool/%n", f"SlurmctldPidFile={self.root}/slurmctld.pid",
            f"SlurmdPidFile={self.root}/slurmd-%n.pid", f"SlurmctldLogFile={self.root}/log/slurmctld.log",
            f"SlurmdLogFile={self.root}/log/slurmd-%n.log", "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none", "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none", "SelectType=select/cons_tres",
            "SchedulerParameters=bf_interval=1", "ReturnToService=2", "MpiDefault=none",
            f"MinJobAge={min_job_age}", "KillWait=5", "SlurmdTimeout=30",
        ]
        for k, (n, addr) in enumerate(self.nodes.items()):
            lines.append(f"NodeName={n} NodeHostname={host} NodeAddr={addr} Port={d0 + k} "
                         "CPUs=2 RealMemory=2000")
        lines.append(f"PartitionName={self.partition} Nodes={','.join(self.nodes)} Default=YES "
                     "OverSubscribe=EXCLUSIVE MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _spawn(self, argv: list[str], name: str) -> None:
        out = open(self.root / "log" / f"{name}.out", "ab")
        self.procs.append(subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                           start_new_session=True))
        out.close()

    def _all_idle(self) -> bool:
        r = self.run("sinfo", "-h", "-N", "-o", "%N %t", timeout=10)
        states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
        return r.returncode == 0 and set(states) == set(self.nodes) and set(states.values()) == {"idle"}

    def _wait(self, ok, what: str, timeout: float = 20) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"slurm lab: {p.args[0]} exited {p.returncode} waiting for {what}: "
                                       + self.logs())
            try:
                if ok():
                    return
            except (OSError, subprocess.SubprocessError, ValueError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"slurm lab: timed out waiting for {what}: " + self.logs())

    def logs(self) -> str:
        """The tail of every daemon's log (for a failure message)."""
        parts = []
        for f in sorted((self.root / "log").glob("*")):
            parts.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(parts)

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` of ``job_id`` as a dict ({} once Slurm forgot it)."""
        r = self.run("scontrol", "show", "job", "-o", str(job_id))
        out: dict[str, str] = {}
        for word in r.stdout.split():
            k, sep, v = word.partition("=")
            if sep:
                out[k] = v
        return out

    def wait_state(self, job_id: str, states: set[str], timeout: float = 30) -> dict[str, str]:
        """Wait until the job's JobState is one of ``states``; its record. AssertionError else."""
        end = time.monotonic() + timeout
        rec: dict[str, str] = {}
        while time.monotonic() < end:
            rec = self.job(job_id)
            if rec.get("JobState") in states:
                return rec
            time.sleep(0.1)
        raise AssertionError(f"job {job_id} not in {sorted(states)} after {timeout} s: {rec.get('JobState')}")

    def cancel_all(self) -> None:
        """Cancel every job and wait until the nodes are idle again (between tests)."""
        self.run("scancel", "--partition", self.partition)
        self._wait(self._all_idle, "the nodes to be idle after scancel", timeout=30)

    def stop(self) -> None:
        """Cancel every job (their steps end with them), stop every daemon (their process groups)
        and remove the socket folder."""
        try:
            if any(p.poll() is None for p in self.procs):
                self.run("scancel", "--partition", self.partition, timeout=15)
                end = time.monotonic() + 15
                while time.monotonic() < end and self.run("squeue", "-h", "-o", "%i", timeout=10).stdout.strip():
                    time.sleep(0.2)
        except (OSError, subprocess.SubprocessError):
            pass
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        shutil.rmtree(self.sock_dir, ignore_errors=True)
