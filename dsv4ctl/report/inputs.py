"""Read the report's input files: JSON documents of dsv4ctl, classified by their ``schema``;
for a runbook's ``incident.json`` also the evidence files its steps name (next to it in the
run folder). The only module of :mod:`dsv4ctl.report` that touches the file system."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import InputError
from . import kind_of
from .page import Input

#: A dsv4ctl JSON document is kilobytes (a load sweep with examples: ~100 KB): refuse more
#: than this rather than read a mistaken multi-gigabyte file into memory.
MAX_INPUT_BYTES = 64 << 20


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number a dsv4ctl document holds")


def _read_json(path: Path, label: str) -> object:
    from ..resources import read_file_capped     # a FIFO or device: "LABEL: not a regular file (a pipe)"
    return _parse_json(read_file_capped(path, MAX_INPUT_BYTES, label, ": not a dsv4ctl JSON document"), label)


def _parse_json(raw: bytes, label: str) -> object:
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise InputError(f"{label}: nested too deeply: not a dsv4ctl JSON document") from None
    except UnicodeDecodeError:
        raise InputError(f"{label}: not UTF-8 text: not a dsv4ctl JSON document") from None
    except ValueError as e:
        line = getattr(e, "lineno", None)
        raise InputError(f"{label}:{line}: not JSON ({getattr(e, 'msg', e)})" if line else f"{label}: not JSON ({e})") from None


def evidence_names(doc: dict) -> list[str]:
    """File names of the evidence of an incident document, in timeline order, once each: every
    step result's ``evidence`` and ``plan.json`` for a ``plan`` step that ran. Only plain file
    names (no folder part) are kept: evidence lives in the run folder itself."""
    names: list[str] = []
    for e in doc.get("timeline") or []:
        if not isinstance(e, dict) or e.get("status") not in ("ran", "failed"):
            continue
        res = e.get("result") if isinstance(e.get("result"), dict) else {}
        cand = res.get("evidence") or ("plan.json" if e.get("action") == "plan" else None)
        if isinstance(cand, str) and cand and Path(cand).name == cand and cand not in (".", "..") and cand not in names:
            names.append(cand)
    return names


def _read_stdin() -> bytes:
    """Standard input (``-``), at most MAX_INPUT_BYTES. InputError beyond it."""
    import sys
    raw = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
    if len(raw) > MAX_INPUT_BYTES:
        raise InputError(f"-: standard input is over {MAX_INPUT_BYTES:,} bytes: not a dsv4ctl JSON document")
    return raw


def load_input(path: str) -> Input:
    """Read and classify one input file (``-``: standard input, once). InputError (exit 2) when it
    cannot be read, is not JSON, or is not a document kind the report draws (``PATH: schema ...``)."""
    if path == "-":
        doc = _parse_json(_read_stdin(), "-")
        try:
            return Input(name="-", doc=doc, kind=kind_of(doc))
        except ValueError as e:
            raise InputError(f"-: {e}") from None
    p = Path(path).expanduser()
    if p.is_dir() and (p / "incident.json").is_file():
        p = p / "incident.json"             # a runbook's run folder
    doc = _read_json(p, path)
    try:
        kind = kind_of(doc)
    except ValueError as e:
        raise InputError(f"{path}: {e}") from None
    inp = Input(name=path, doc=doc, kind=kind)
    if kind == "incident":
        for name in evidence_names(doc):
            f = p.parent / name
            try:
                edoc = _read_json(f, str(f))
                inp.evidence.append((name, edoc, kind_of(edoc)))
            except (InputError, ValueError):
                continue        # a step that failed before writing JSON: its table row says so
    return inp


def load_inputs(paths: list[str]) -> list[Input]:
    """:func:`load_input` of each path, in order (``-`` at most once: standard input). InputError
    when none is given."""
    if not paths:
        raise InputError("report: give at least one input file")
    if paths.count("-") > 1:
        raise InputError("report: '-' (standard input) can be given once")
    return [load_input(p) for p in paths]


def incident_page(run_dir: Path, *, generated: str, version: str) -> str:
    """The report page of a runbook run folder: its ``incident.json`` timeline and the charts of
    the checks and plans it ran (``incident.html`` next to ``incident.md``). InputError as
    :func:`load_input`."""
    from .page import build_html
    return build_html([load_input(str(run_dir / "incident.json"))], generated=generated, version=version,
                      title=f"dsv4ctl incident report: {run_dir.name}")
