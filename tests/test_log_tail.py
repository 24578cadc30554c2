"""``log_tail_cmd`` (the failure text of a group that did not come up): the ring buffer of the
last n lines prints exactly what the former program, which kept every line since the start
header, printed. Its memory is measured by benchmarks/log_tail.py, not here."""

from __future__ import annotations

import subprocess

import pytest

from dsv4ctl.hosts.layout import Paths
from dsv4ctl.hosts.service import LOG_LINE_MAX, log_tail_cmd
from dsv4ctl.remote.transport import q


def before(p: Paths, group: str, n: int) -> str:
    """The program log_tail_cmd ran before the ring buffer (every line since the header in memory)."""
    lf = q(p.logfile(group))
    return (f"[ -f {lf} ] && cut -b1-{LOG_LINE_MAX} {lf} | awk '/^=== dsv4ctl start /{{buf=\"\"; c=0}} "
            f"{{lines[c++]=$0}} END{{s=c-{n}; if(s<0)s=0; for(i=s;i<c;i++) print lines[i]}}' || true")


def sh(cmd: str) -> bytes:
    r = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


HEADER = b"=== dsv4ctl start g release r1 at 2026-12-01T00:00:00Z\n"
LOGS = {
    "empty": b"",
    "no header": b"".join(b"line %d\n" % i for i in range(30)),
    "one start": HEADER + b"".join(b"[2026-12-01 00:00:%02d] step %d\n" % (i % 60, i) for i in range(25)),
    "three starts": b"".join(HEADER.replace(b"r1", b"r%d" % k) + b"".join(b"run %d line %d\n" % (k, i) for i in range(k * 7))
                             for k in range(1, 4)) + b"=== dsv4ctl: g exited with status 3\n",
    "header last": b"old\n" * 50 + HEADER,
    "short after a long run": HEADER + b"x\n" * 500 + HEADER + b"a\nb\n",
    "long lines": HEADER + b"y" * (3 * LOG_LINE_MAX) + b"\nshort\n" + b"z" * (LOG_LINE_MAX + 1) + b"\n",
    "bytes and no final newline": HEADER + b"\xff\xfe caf\xc3\xa9\n\ttab\n\nlast without newline",
    "restart lines are no start": HEADER + b"a\n=== dsv4ctl restart g (hicache) at T\nb\nc\n",
}


@pytest.mark.parametrize("name", sorted(LOGS))
@pytest.mark.parametrize("n", [1, 2, 5, 10, 40, 1000])
def test_the_ring_prints_what_the_full_buffer_printed(tmp_path, name, n):
    p = Paths(str(tmp_path))
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "g.log").write_bytes(LOGS[name])
    got = sh(log_tail_cmd(p, "g", n))
    assert got == sh(before(p, "g", n))
    # and what that means, spelled out: the last n lines since the last start header
    text = LOGS[name]
    lines = [ln[:LOG_LINE_MAX] for ln in text.split(b"\n")]
    if text.endswith(b"\n") or not text:
        lines = lines[:-1]
    starts = [i for i, ln in enumerate(lines) if ln.startswith(b"=== dsv4ctl start ")]
    since = lines[starts[-1]:] if starts else lines
    assert got == b"".join(ln + b"\n" for ln in since[-n:])


def test_no_log_and_no_lines(tmp_path):
    p = Paths(str(tmp_path))
    assert sh(log_tail_cmd(p, "g", 5)) == b""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "g.log").write_bytes(HEADER + b"a\n")
    assert sh(log_tail_cmd(p, "g", 0)) == b"" == sh(before(p, "g", 0))


def test_a_large_log_fits_in_a_small_address_space(tmp_path):
    """32 MiB of lines since the start header, awk limited to 24 MiB of address space (ulimit -v):
    the ring needs n lines; the former program needed every line (awk: out of memory)."""
    p = Paths(str(tmp_path))
    (tmp_path / "logs").mkdir()
    line = b"[2026-12-01 00:00:00 TP0] Decode batch. #running-req: 12, #token: 12345, token usage: 0.12\n"
    with open(tmp_path / "logs" / "g.log", "wb") as f:
        f.write(HEADER + line * ((32 << 20) // len(line)) + b"the last line\n")
    limited = lambda cmd: subprocess.run(["/bin/sh", "-c", f"ulimit -v {24 << 10}; {cmd}"],  # noqa: E731
                                         capture_output=True, timeout=120)
    r = limited(log_tail_cmd(p, "g", 50))
    assert r.returncode == 0 and r.stdout == line * 49 + b"the last line\n", r.stderr[-300:]
    r = limited(before(p, "g", 50))
    assert r.stdout == b"" and b"memory" in r.stderr           # e.g. "awk: run time error: out of memory"
