"""GPU facts of a host: one read-only ``nvidia-smi`` command and a pure parser.

The command asks nvidia-smi twice, in CSV with units (the form captured on a real H200 in
``shared/reference/fixtures/h200/nvidia-smi-query.csv``):

* ``--query-gpu=index,uuid,name,memory.total,memory.used,memory.free,utilization.gpu,power.draw,
  power.limit`` — one row per GPU;
* ``--query-compute-apps=gpu_uuid,pid,process_name,used_memory`` — one row per process holding
  memory on a GPU.

Each block is preceded by a marker line (``@gpus`` / ``@apps``) so one SSH round returns both.
``[N/A]``, ``[Not Supported]`` and empty fields parse to ``None`` (shown as ``unknown``,
:func:`mib_text`). Memory values are MiB, as nvidia-smi prints them; power is W; utilisation is %.
The output is bounded: the command cuts it at :data:`MAX_OUTPUT` + 1 bytes on the host and the
parser refuses more than :data:`MAX_OUTPUT` bytes or a line over :data:`MAX_LINE` characters (one
``GpuFactError``); names and UUIDs keep no control character (ESC and the like are written
``\\x1b``, :func:`dsv4ctl.render.printable`).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field

from ..render import printable

GPU_FIELDS = ("index", "uuid", "name", "memory.total", "memory.used", "memory.free",
              "utilization.gpu", "power.draw", "power.limit")
APP_FIELDS = ("gpu_uuid", "pid", "process_name", "used_memory")
#: Most bytes of nvidia-smi output read (8 GPUs and a hundred processes are ~20 kB).
MAX_OUTPUT = 1 << 20
#: Longest line read (a row of nvidia-smi's CSV is ~200 characters).
MAX_LINE = 4096
#: Longest text field kept (a GPU name, UUID or process name).
MAX_TEXT = 200


def mib_text(mib: int | None) -> str:
    """``'143771 MiB'``, or ``'unknown'`` for a field nvidia-smi gave as ``[N/A]`` (never
    ``'None MiB'``)."""
    return "unknown" if mib is None else f"{mib} MiB"


def _text(field_: str) -> str:
    """A text field as shown: stripped, control characters escaped, at most :data:`MAX_TEXT`."""
    t = printable(field_.strip()).replace("\n", "\\n").replace("\t", "\\t")
    return t if len(t) <= MAX_TEXT else t[:MAX_TEXT - 3] + "..."


@dataclass
class GpuProcess:
    """A process holding GPU memory: ``pid``, ``name`` and ``used_mib`` (MiB; None when unknown)."""

    pid: int
    name: str
    used_mib: int | None


@dataclass
class Gpu:
    """One GPU as nvidia-smi reports it. Memory in MiB, utilisation in %, power in W."""

    index: int
    uuid: str
    name: str
    total_mib: int | None
    used_mib: int | None
    free_mib: int | None
    util_pct: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    processes: list[GpuProcess] = field(default_factory=list)

    def memory_text(self) -> str:
        """``total 143771 MiB, used 0 MiB, free 143156 MiB``, ``unknown`` where nvidia-smi said
        ``[N/A]``."""
        return f"total {mib_text(self.total_mib)}, used {mib_text(self.used_mib)}, free {mib_text(self.free_mib)}"

    def as_dict(self) -> dict:
        """JSON-ready form (processes as dicts)."""
        d = dict(self.__dict__)
        d["processes"] = [p.__dict__.copy() for p in self.processes]
        return d


class GpuFactError(ValueError):
    """nvidia-smi output that cannot be read (message names the line)."""


def gpus_command() -> str:
    """The read-only shell command whose output :func:`parse_gpus` reads. Exits 0 with an
    ``@error`` line when nvidia-smi is missing or fails, so a host without GPUs is a fact, not an
    SSH failure. Its output is cut at :data:`MAX_OUTPUT` + 1 bytes on the host (``head -c``; the parser
    refuses more anyway)."""
    gq = ",".join(GPU_FIELDS)
    aq = ",".join(APP_FIELDS)
    return ("dsv4_gpus() { if ! command -v nvidia-smi >/dev/null 2>&1; then echo '@error nvidia-smi not found'; else "
            f"echo @gpus; nvidia-smi --query-gpu={gq} --format=csv 2>&1 || echo '@error nvidia-smi failed'; "
            f"echo @apps; nvidia-smi --query-compute-apps={aq} --format=csv 2>&1 || true; fi; }}; "
            f"if command -v head >/dev/null 2>&1; then dsv4_gpus | head -c {MAX_OUTPUT + 1}; else dsv4_gpus; fi")


#: Largest number a GPU field may hold (MiB, %, W): a field beyond it is unreadable, not a fact.
_FIELD_MAX = 1e9


def _num(text: str, kind=float):
    """'143771 MiB' -> 143771; '[N/A]', '[Not Supported]', '', NaN, infinities and values beyond
    _FIELD_MAX (a broken driver's output) -> None."""
    import math
    t = text.strip()
    if not t or t.startswith("[") or t.upper() in ("N/A", "NONE"):
        return None
    t = t.split()[0]
    try:
        v = float(t)
    except ValueError:
        return None
    if not math.isfinite(v) or abs(v) > _FIELD_MAX:
        return None
    return int(v) if kind is int else v


def _rows(lines: list[str]) -> list[dict[str, str]]:
    lines = [ln for ln in lines if ln.strip()]
    if not lines:
        return []
    reader = csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True)
    try:
        rows = list(reader)
    except csv.Error as e:
        raise GpuFactError(f"unreadable nvidia-smi output ({e})") from None
    head = [h.split(" [")[0].strip() for h in rows[0]]
    return [dict(zip(head, r)) for r in rows[1:] if r]


def parse_gpus(text: str) -> list[Gpu]:
    """GPUs, sorted by index, from :func:`gpus_command`'s output (pure).

    Raises GpuFactError when the output carries an ``@error`` line, is longer than
    :data:`MAX_OUTPUT` bytes or has a line over :data:`MAX_LINE` characters, or a GPU row is
    unreadable."""
    if len(text) > MAX_OUTPUT:
        raise GpuFactError(f"nvidia-smi output over {MAX_OUTPUT:,} bytes: not read")
    blocks: dict[str, list[str]] = {"": []}
    cur = ""
    for n, ln in enumerate(text.splitlines(), 1):
        if len(ln) > MAX_LINE:
            raise GpuFactError(f"nvidia-smi output line {n}: over {MAX_LINE:,} characters ({len(ln):,}): not read")
        if ln.startswith("@error"):
            raise GpuFactError(_text(ln[len("@error"):]) or "nvidia-smi failed")
        if ln in ("@gpus", "@apps"):
            cur = ln[1:]
            blocks[cur] = []
            continue
        blocks.setdefault(cur, []).append(ln)
    gpu_lines = blocks.get("gpus", blocks[""])
    gpus: dict[str, Gpu] = {}
    out: list[Gpu] = []
    for r in _rows(gpu_lines):
        try:
            idx = int(r["index"])
            if not 0 <= idx < 4096:
                raise ValueError
        except (KeyError, ValueError):
            raise GpuFactError(f"unreadable nvidia-smi row: {_text(','.join(r.values()))[:120]}") from None
        g = Gpu(index=idx, uuid=_text(r.get("uuid", "")), name=_text(r.get("name", "")),
                total_mib=_num(r.get("memory.total", ""), int), used_mib=_num(r.get("memory.used", ""), int),
                free_mib=_num(r.get("memory.free", ""), int), util_pct=_num(r.get("utilization.gpu", "")),
                power_w=_num(r.get("power.draw", "")), power_limit_w=_num(r.get("power.limit", "")))
        gpus[g.uuid] = g
        out.append(g)
    for r in _rows(blocks.get("apps", [])):
        g = gpus.get(_text(r.get("gpu_uuid", "")))
        pid = _num(r.get("pid", ""), int)
        if g is None or pid is None:
            continue
        g.processes.append(GpuProcess(pid, _text(r.get("process_name", "")), _num(r.get("used_memory", ""), int)))
    return sorted(out, key=lambda g: g.index)
