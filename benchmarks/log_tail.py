#!/usr/bin/env python3
"""Memory benchmark of ``log_tail_cmd`` (the failure text of a group: the last n lines of its log
since the start header): peak RSS of the host-side pipeline (``cut | awk``) on a large generated
log, the former program (every line since the header kept in awk) against the ring buffer of
the last n lines, printed with their ratio.

The log is one start header then SGLang-like lines (``--mb`` MiB; 363 as in the field report),
written to a temporary folder and removed afterwards. Each program runs in a fresh child
process that reports ``RUSAGE_CHILDREN`` ``ru_maxrss`` (the largest of ``sh``, ``cut``, ``awk``:
awk's), so one measurement cannot leak into the other. Not a unit test: it needs the disk space
and a few seconds; tests/test_log_tail.py checks both print the same lines.

    .venv/bin/python benchmarks/log_tail.py            # 363 MiB, n = 50
    .venv/bin/python benchmarks/log_tail.py --mb 64 -n 400
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dsv4ctl.hosts.layout import Paths  # noqa: E402
from dsv4ctl.hosts.service import LOG_LINE_MAX, log_tail_cmd  # noqa: E402
from dsv4ctl.remote.transport import q  # noqa: E402


def before_cmd(p: Paths, group: str, n: int) -> str:
    """``log_tail_cmd`` before the ring buffer: awk stored every line since the start header."""
    lf = q(p.logfile(group))
    return (f"[ -f {lf} ] && cut -b1-{LOG_LINE_MAX} {lf} | awk '/^=== dsv4ctl start /{{buf=\"\"; c=0}} "
            f"{{lines[c++]=$0}} END{{s=c-{n}; if(s<0)s=0; for(i=s;i<c;i++) print lines[i]}}' || true")


PROBE = ("import resource, subprocess, sys\n"
         "r = subprocess.run(['/bin/sh', '-c', sys.argv[1]], stdout=subprocess.PIPE)\n"
         "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, len(r.stdout.splitlines()), r.returncode)\n")


def peak(cmd: str) -> tuple[int, int, float]:
    """(peak RSS in KiB of the command's processes, lines printed, wall seconds)."""
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", PROBE, cmd], capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]), int(out[1]), time.monotonic() - t0


def write_log(path: Path, mib: int) -> int:
    lines = [f"[2026-12-01 16:{i % 60:02d}:{(i * 7) % 60:02d} TP{i % 8}] Decode batch. #running-req: {i % 97}, "
             f"#token: {i * 131 % 99991}, token usage: 0.{i % 100:02d}, gen throughput (token/s): {i % 5000}.{i % 100:02d}, "
             f"#queue-req: {i % 13}\n" for i in range(1000)]
    block = "".join(lines).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"=== dsv4ctl start decode release r0123456789ab at 2026-12-01T16:00:00Z\n")
        left = mib << 20
        while left > 0:
            f.write(block[:left])
            left -= len(block)
    return path.stat().st_size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=363, help="log size in MiB (default 363)")
    ap.add_argument("-n", type=int, default=50, help="lines to keep (default 50, as the engine asks)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dsv4ctl-log-tail-"))
    try:
        p = Paths(str(tmp))
        size = write_log(Path(p.logfile("decode")), args.mb)
        awk = shutil.which("awk")
        print(f"log: {size / 2**20:.0f} MiB, {sum(1 for _ in open(p.logfile('decode'), 'rb'))} lines; "
              f"awk: {Path(awk).resolve() if awk else '?'}; n = {args.n}")
        old_kib, old_lines, old_s = peak(before_cmd(p, "decode", args.n))
        new_kib, new_lines, new_s = peak(log_tail_cmd(p, "decode", args.n))
        print(f"before (every line since the header): peak RSS {old_kib / 1024:8.1f} MiB, {old_lines} lines, {old_s:.1f} s")
        print(f"after  (ring of the last n lines):    peak RSS {new_kib / 1024:8.1f} MiB, {new_lines} lines, {new_s:.1f} s")
        print(f"ratio before/after: {old_kib / max(new_kib, 1):.1f}x; bound of the ring: n x LOG_LINE_MAX = "
              f"{args.n * LOG_LINE_MAX / 2**20:.2f} MiB")
        return 0 if new_lines == old_lines else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
