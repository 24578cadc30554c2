"""CSV exports: ``plan --csv`` (one row per rank), ``check load --csv`` (one row per URL and
level) and ``check load --turns-csv FILE`` (one row per turn). Pure text builders plus a writer
that turns check load's per-turn JSON records into CSV rows as they arrive.

Numbers are written as the JSON has them (GiB with 3 decimals, seconds, fractions 0..1);
booleans as ``true``/``false``; missing values as empty cells; a text cell a spreadsheet would
read as a formula (``=``, ``+``, ``-``, ``@``, tab, CR first) with a leading ``'``."""

from __future__ import annotations

import csv
import io
import json
from typing import Any, Iterable, Optional, Sequence

from .memory import SEGMENTS, rank_segments


#: A text cell starting with one of these is a formula to a spreadsheet (CSV injection): it gets a
#: leading ``'`` (OWASP's advice), so ``=cmd|...`` in a host name or an answer shows as text.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(v: Any) -> Any:
    if isinstance(v, str):
        return "'" + v if v.startswith(_FORMULA_START) else v
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return _cell(";".join(str(x) for x in v))
    return v


def to_csv(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """RFC 4180 CSV text (``\\r\\n`` line ends, quoted where needed) of ``headers`` and ``rows``."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(headers)
    for r in rows:
        w.writerow([_cell(x) for x in r])
    return buf.getvalue()


PLAN_RANK_FIELDS = ("full_max_total_num_tokens", "swa_max_total_num_tokens", "c4_max_total_num_tokens",
                    "c128_max_total_num_tokens", "c4_state_pool_size", "c128_state_pool_size", "max_running_requests",
                    "max_concurrent_requests", "available_bytes", "bytes_per_full_token", "allocated_gib", "headroom_gib")


def plan_csv(doc: dict) -> str:
    """One row per rank of every group of a ``dsv4ctl.plan/2`` document: group, role, rank, the
    node rank and host of a multi-node server's rank (issue 44.5; empty for a what-if rank), GPU,
    TP/PP/DP rank, GPU memory (GiB), each memory segment of the report's bar
    (``<segment>_gib``, :data:`dsv4ctl.report.memory.SEGMENTS`), SGLang's activation reserve,
    the pool sizes (tokens, rows), requests at ``context_length``, index-K dtype and accounting."""
    headers = (["group", "role", "rank", "node", "host", "gpu", "tp_rank", "pp_rank", "dp_rank", "gpu_gib"]
               + [f"{k}_gib" for k, *_ in SEGMENTS] + ["activation_reserve_sglang_gib"]
               + list(PLAN_RANK_FIELDS) + ["context_length", "index_k_dtype", "index_k_accounting",
                                           "index_k_overcommit_gib"])
    rows = []
    for g in doc["groups"]:
        gpu = round(g["gpu_memory_mib"] / 1024, 3) if g.get("gpu_memory_mib") else None
        for r in g["ranks"]:
            rows.append([g["name"], g["role"], r["rank"], r.get("node"), r.get("host"), r.get("gpu"), r.get("tp_rank"),
                         r.get("pp_rank"),
                         r.get("dp_rank"), gpu] + [v for _, v in rank_segments(g, r)]
                        + [g.get("activation_reserve_gib")] + [r.get(k) for k in PLAN_RANK_FIELDS]
                        + [g.get("context_length"), r["index_k"]["dtype"], r["index_k"]["accounting"],
                           r["index_k"].get("overcommit_gib")])
    return to_csv(headers, rows)


def _classes(doc: dict) -> list[str]:
    out: list[str] = []
    for lv in doc["levels"]:
        for k in lv.get("classes") or {}:
            if k not in out:
                out.append(k)
    return out


def load_levels_csv(doc: dict) -> str:
    """One row per URL and concurrency level of a ``dsv4ctl.check.load/1`` document: turns,
    corrupted, rate and its 95 % Wilson bounds (fractions), gate verdict, crash, stuck,
    throughput, TTFT / ITL / end-to-end p50, p90, p99 (seconds), then the count of each class."""
    classes = _classes(doc)
    lat = [f"{m}_{p}_s" for m in ("ttft", "itl", "e2e") for p in ("p50", "p90", "p99")]
    headers = (["url", "concurrency", "turns", "corrupted", "rate", "wilson95_low", "wilson95_high", "pass",
                "crashed", "stuck", "streaming_turns", "duration_s", "requests_per_s", "output_tokens_per_s"]
               + lat + [f"class_{c}" for c in classes])
    rows = []
    for lv in doc["levels"]:
        lo, hi = lv["wilson95"]
        row = [lv["url"], lv["concurrency"], lv["turns"], lv["corrupted"], lv["rate"], lo, hi, lv["pass"],
               lv.get("crashed", False), lv.get("stuck"), lv.get("streaming_turns"), lv.get("duration_s"),
               lv.get("requests_per_s"), lv.get("output_tokens_per_s")]
        row += [(lv.get(f"{m}_s") or {}).get(p) for m in ("ttft", "itl", "e2e") for p in ("p50", "p90", "p99")]
        row += [((lv.get("classes") or {}).get(c) or {}).get("count", 0) for c in classes]
        rows.append(row)
    return to_csv(headers, rows)


TURN_FIELDS = ("run", "url", "concurrency", "session", "turn", "rid", "stream", "requires_tool", "tool",
               "tool_choice", "class", "reason", "http_status", "finish_reason", "t_start", "ttft_s", "e2e_s",
               "chunks", "completion_tokens", "cached_tokens", "connection_error", "notes", "flags")


def turn_row(rec: dict) -> list:
    """The CSV cells of one per-turn record of check load (the ``--records`` JSONL schema,
    docs/check.md), in :data:`TURN_FIELDS` order."""
    return [_cell(rec.get(k)) for k in TURN_FIELDS]


def turns_csv(records: Iterable[dict]) -> str:
    """CSV of per-turn records (one row per turn, :data:`TURN_FIELDS`)."""
    return to_csv(TURN_FIELDS, (turn_row(r) for r in records))


class TurnsCsvWriter:
    """A file-like sink for check load's per-turn records: ``write()`` takes the JSON lines
    check load writes (one record per line) and writes a CSV row for each to ``out``, and
    passes the line on to ``also`` (the ``--records`` file) when given. The header is written
    first."""

    def __init__(self, out, also: Optional[Any] = None):
        self.out, self.also = out, also
        self._w = csv.writer(out)
        self._w.writerow(TURN_FIELDS)

    def write(self, text: str) -> int:
        """Write the CSV row(s) of ``text`` (JSON lines); returns ``len(text)``."""
        if self.also is not None:
            self.also.write(text)
        for line in text.splitlines():
            if line.strip():
                self._w.writerow(turn_row(json.loads(line)))
        return len(text)

    def close(self) -> None:
        """Close ``out`` and ``also`` (both, even when the first fails; then its error is raised)."""
        err = None
        for f in (self.out, self.also):
            try:
                if f is not None:
                    f.close()
            except OSError as e:
                err = err or e
        if err is not None:
            raise err
