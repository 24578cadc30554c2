"""Real sshd hosts whose ``nvidia-smi`` is a stand-in: a script first on the sshd session's PATH
that prints ``gpus.csv`` (``--query-gpu``) or ``apps.csv`` (``--query-compute-apps``) of its folder,
in the real ``--format=csv`` shape (tests/data/gpus/h200-query.csv is a real H200's capture). No GPU
runs here; everything else on the host (SSH, the shell, the files dsv4ctl writes) is real."""

from __future__ import annotations

from pathlib import Path

from tests.sshd import harness

HEADER = ("index, name, uuid, memory.total [MiB], memory.used [MiB], memory.free [MiB], utilization.gpu [%], "
          "temperature.gpu, power.draw [W], pci.bus_id, driver_version")
APPS_HEADER = "gpu_uuid, pid, process_name, used_memory [MiB]"


def start_gpu_cluster(base: Path, n: int = 1) -> tuple[harness.Cluster, Path]:
    """``n`` real sshd hosts (:func:`tests.sshd.harness.start_cluster`) whose sessions find the
    stand-in ``nvidia-smi`` of the returned folder first on PATH. Stop with ``cluster.stop()``."""
    bin_ = base / "bin"
    bin_.mkdir(parents=True)
    smi = bin_ / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncase \"$*\" in *query-gpu*) cat {bin_}/gpus.csv ;; *) cat {bin_}/apps.csv ;; esac\n")
    smi.chmod(0o755)
    c = harness.start_cluster(base / "sshd", n=n)
    for h in c.hosts:
        h.config.write_text(h.config.read_text().replace("SetEnv SHLVL=1", f"SetEnv SHLVL=1 PATH={bin_}:/usr/bin:/bin"))
        h.kill()
        h.start()
    return c, bin_


def idle_gpus(bin_: Path, name: str, count: int, total_mib: int, free_mib: int) -> None:
    """``count`` idle GPUs ``name`` (index 0..count-1) with ``total_mib`` / ``free_mib``, no process."""
    rows = [HEADER] + [f"{i}, {name}, GPU-00000000-0000-0000-0000-00000000000{i}, {total_mib} MiB, "
                       f"{total_mib - free_mib} MiB, {free_mib} MiB, 0 %, 40, 120.00 W, 00000000:00:0{i}.0, 580.159.04"
                       for i in range(count)]
    (bin_ / "gpus.csv").write_text("\n".join(rows) + "\n")
    (bin_ / "apps.csv").write_text(APPS_HEADER + "\n")
