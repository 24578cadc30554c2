"""nvidia-smi GPU fact: the pure parser on real H200 output and a B200 fixture written after it."""

from pathlib import Path

import pytest

from dsv4ctl.hosts.gpus import GpuFactError, gpus_command, parse_gpus

DATA = Path(__file__).parent / "data" / "gpus"


def test_real_h200_query_csv():
    (g,) = parse_gpus((DATA / "h200-query.csv").read_text())
    assert (g.index, g.name, g.total_mib, g.used_mib, g.free_mib) == (0, "NVIDIA H200", 143771, 0, 143156)
    assert g.util_pct == 0.0 and g.power_w == 123.27 and g.processes == []


def test_busy_b200_with_processes_and_na():
    gpus = parse_gpus((DATA / "b200x8-busy.txt").read_text())
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[0].free_mib == 11520 and gpus[0].util_pct == 100.0 and gpus[0].power_limit_w == 1000.0
    assert [(p.pid, p.name, p.used_mib) for p in gpus[0].processes] == [(41211, "sglang::scheduler_TP0", 171180)]
    assert gpus[6].util_pct is None and gpus[6].power_w is None
    assert gpus[6].processes[0].used_mib == 20460
    assert gpus[4].processes == []
    assert gpus[3].as_dict()["processes"][0]["pid"] == 41214


def test_errors_are_facts():
    with pytest.raises(GpuFactError, match="nvidia-smi not found"):
        parse_gpus("@error nvidia-smi not found\n")
    with pytest.raises(GpuFactError, match="unreadable"):
        parse_gpus("@gpus\nindex, uuid\nx, GPU-1\n")
    assert parse_gpus("@gpus\n@apps\n") == []


def test_command_is_read_only_and_runs_without_nvidia_smi(tmp_path):
    import subprocess
    cmd = gpus_command()
    assert "--query-gpu=index,uuid,name,memory.total" in cmd and "--query-compute-apps=" in cmd
    out = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True, env={"PATH": str(tmp_path)})
    assert out.returncode == 0 and out.stdout.strip() == "@error nvidia-smi not found"


def test_nan_infinite_and_absurd_fields_are_unknown_not_a_traceback():
    head = "@gpus\nindex, uuid, name, memory.total [MiB], memory.used [MiB], memory.free [MiB]\n"
    g = parse_gpus(head + "0, GPU-1, H200, nan MiB, 1e400 MiB, 99999999999999999999 MiB\n")[0]
    assert (g.index, g.total_mib, g.used_mib, g.free_mib) == (0, None, None, None)
    with pytest.raises(GpuFactError, match="unreadable nvidia-smi row"):
        parse_gpus(head + "99999999999999999999999, GPU-2, H200, 1 MiB, 1 MiB, 1 MiB\n")
