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


# --- bounded, escaped, [N/A] is unknown (issue 41 item 6) ----------------------------------------

H200 = (DATA / "h200-query.csv").read_text().splitlines()      # the real H200 capture


def _fake_smi(bin_: Path, gpu_rows: str) -> None:
    """An ``nvidia-smi`` on PATH that prints ``gpu_rows`` for --query-gpu and a header for apps."""
    (bin_ / "rows.csv").write_bytes(gpu_rows.encode())
    (bin_ / "nvidia-smi").write_text(
        f'#!/bin/sh\ncase "$1" in --query-gpu=*) cat {bin_}/rows.csv;; '
        '*) echo "gpu_uuid, pid, process_name, used_memory [MiB]";; esac\n')
    (bin_ / "nvidia-smi").chmod(0o755)


def _run_command(bin_: Path) -> str:
    import subprocess
    r = subprocess.run(["/bin/sh", "-c", gpus_command()], capture_output=True,
                       env={"PATH": f"{bin_}:/usr/bin:/bin"}, timeout=60)
    assert r.returncode == 0
    return r.stdout.decode("utf-8", "replace")


def test_a_60_mb_field_is_cut_on_the_host_and_one_error(tmp_path):
    """A 60 MB name field: the command returns at most MAX_OUTPUT + 1 bytes and the parser says
    so in one line (was: the whole 60 MB read, then csv's field limit as a traceback)."""
    from dsv4ctl.hosts.gpus import MAX_OUTPUT
    _fake_smi(tmp_path, H200[0] + "\n" + H200[1].replace("NVIDIA H200", "N" * 60_000_000) + "\n")
    out = _run_command(tmp_path)
    assert len(out) == MAX_OUTPUT + 1
    with pytest.raises(GpuFactError) as e:
        parse_gpus(out)
    assert str(e.value) == f"nvidia-smi output over {MAX_OUTPUT:,} bytes: not read"
    # a field over csv's own limit inside the bound: one error too, not csv.Error
    long = H200[1].replace("NVIDIA H200", "N" * 200_000)
    with pytest.raises(GpuFactError, match=rf"nvidia-smi output line 2: over 4,096 characters \({len(long):,}\): not read"):
        parse_gpus(H200[0] + "\n" + long + "\n")
    with pytest.raises(GpuFactError, match=r"unreadable nvidia-smi output \(.*\)"):
        parse_gpus(H200[0] + '\n0, "NVIDIA\n' + "\n".join(["x" * 4000] * 40) + "\n")


def test_control_characters_in_names_are_shown_escaped(tmp_path):
    """An ESC (a terminal colour/title sequence) in the GPU name, the UUID or a process name is
    written \\x1b, never printed raw."""
    _fake_smi(tmp_path, H200[0] + "\n" + H200[1].replace("NVIDIA H200", "NVIDIA\x1b]0;owned\x07 H200\x1b[2J") + "\n")
    (g,) = parse_gpus(_run_command(tmp_path))
    assert g.name == "NVIDIA\\x1b]0;owned\\x07 H200\\x1b[2J" and g.total_mib == 143771
    gpus = parse_gpus("@gpus\n" + H200[0] + "\n" + H200[1] + "\n@apps\ngpu_uuid, pid, process_name, used_memory [MiB]\n"
                      "GPU-00000000-0000-0000-0000-000000000000, 7, \"py\x1b[31m\rthon\", [N/A]\n")
    assert [(p.pid, p.name, p.used_mib) for p in gpus[0].processes] == [(7, "py\\x1b[31m\\nthon", None)]


def test_na_memory_is_unknown_not_none_mib():
    """[N/A] memory (a MIG or vGPU host): 'unknown', and the facts verdict says the free memory is
    unknown, not measured (was: 'total None MiB ... free None MiB', exit 0, no word)."""
    from dsv4ctl.hosts.gpus import mib_text
    from dsv4ctl.plan.facts import server_facts
    row = H200[1].replace("143771 MiB, 0 MiB, 143156 MiB", "[N/A], [N/A], [N/A]")
    (g,) = parse_gpus(H200[0] + "\n" + row + "\n")
    assert (g.total_mib, g.used_mib, g.free_mib) == (None, None, None)
    assert g.memory_text() == "total unknown, used unknown, free unknown"
    assert mib_text(None) == "unknown" and mib_text(143156) == "143156 MiB"
    f = server_facts("decode", [("h0", 0)], {"h0": [g]}, tp=1)
    assert f.free_gib_before_load == [None]
    assert f.notes == ["GPU 0: free memory unknown (nvidia-smi on h0 gives no number, e.g. [N/A]): "
                       "free_gib_before_load not measured"]
