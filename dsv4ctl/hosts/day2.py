"""Day-2 facts of a host, each one read-only command and a pure parser: what runs (``status``),
the server logs (``logs``) and the audit log (``audit``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..remote import q
from .layout import HostFacts, Paths, facts_command, parse_facts
from .service import backend


@dataclass
class HostStatus:
    """One host: its facts, which of its groups' processes are alive, its last audit record."""

    facts: HostFacts
    alive: dict[str, bool] = field(default_factory=dict)
    last_audit: dict | None = None
    verify: dict | None = None       # the current release against its manifest (verify-only report)


#: Bytes at the end of ``audit.jsonl`` that ``status`` reads for the last record; a last line
#: this long or longer arrives cut and is reported as an unreadable last record.
AUDIT_TAIL_MAX = 65536


def status_command(root: str, groups: list[str], service: str, systemd: bool | None = None,
                   verify: str | None = None) -> str:
    """One shell command: the host's facts (:func:`facts_command`), then ``@alive G yes|no`` per
    group (the service backend's alive check: both backends are asked when ``systemd`` is not
    known yet, launcher first), then with ``verify`` (a command that reads a verify job on stdin,
    :func:`dsv4ctl.deploy.drift.verify_command`) ``@verify`` and its report on the current release,
    then ``@audit`` and the last line of ``audit.jsonl`` (of its last :data:`AUDIT_TAIL_MAX` bytes:
    a huge last line costs neither the host nor this machine more)."""
    p = Paths(root)
    lines = [facts_command(root)]
    for g in groups:
        kinds = [backend(service, systemd)] if systemd is not None else [backend("launcher", False),
                                                                          backend("systemd", True)]
        test = " || ".join(f"( {k.alive_cmd(p, g)} )" for k in kinds)
        lines.append(f"if {test}; then echo {q('@alive ' + g + ' yes')}; else echo {q('@alive ' + g + ' no')}; fi")
    if verify:
        # environment files by RECORD size here (a multi-GB torch environment hashed on every
        # status would make it slow); verify and every switch hash them
        job = q('{"verify": ["' + p.current.replace("\\", "\\\\").replace('"', '\\"') + '"], "env_hash": false}')
        lines.append(f"echo @verify; if [ -d {q(p.current)} ]; then printf '%s' {job} | {verify} 2>&1 || true; fi")
    lines.append(f"echo @audit; tail -c {AUDIT_TAIL_MAX} {q(p.audit)} 2>/dev/null | tail -n 1 || true")
    return "\n".join(lines)


def parse_status(host: str, root: str, text: str) -> HostStatus:
    """HostStatus from :func:`status_command`'s output (pure). A last audit line that is no JSON
    object is ``{"unreadable": its first 200 characters}``, plus ``"cut": true`` when it filled the
    :data:`AUDIT_TAIL_MAX` bytes read (longer than that on the host)."""
    lines = text.splitlines()
    i = lines.index("@audit") if "@audit" in lines else len(lines)
    head, tail = lines[:i], lines[i + 1:]
    alive: dict[str, bool] = {}
    keep = []
    ver = None
    if "@verify" in head:
        j = head.index("@verify")
        head, vlines = head[:j], [ln for ln in head[j + 1:] if ln.strip()]
        try:
            ver = json.loads(vlines[-1]) if vlines else None
        except ValueError:
            ver = {"error": vlines[-1][:200]}
        if ver is not None and not isinstance(ver, dict):
            ver = {"error": str(ver)[:200]}
    for ln in head:
        if ln.startswith("@alive "):
            _, g, v = ln.split(" ", 2)
            alive[g] = v == "yes"
        else:
            keep.append(ln)
    last = None
    tail = [ln for ln in tail if ln.strip()]
    if tail:
        # the host sent at most AUDIT_TAIL_MAX bytes (one replacement character per bad byte)
        if len(tail[-1].encode("utf-8", "surrogateescape")) >= AUDIT_TAIL_MAX - 1:
            last = {"unreadable": tail[-1][:200], "cut": True}
        else:
            last = _record(tail[-1])
            if last is None:
                last = {"unreadable": tail[-1][:200]}
    return HostStatus(parse_facts(host, root, "\n".join(keep)), alive, last, ver)


def last_audit_text(rec: dict) -> str:
    """One printable line for a host's last audit record (pure): ``ts who action release
    result``, or ``unreadable last record`` (and why) with its start. Control characters and
    lone surrogates (a ``\\udcff`` escape in the JSON) are written out, never sent to the terminal."""
    from ..render import clip, printable

    def show(v) -> str:
        return printable(str(v).encode("utf-8", "backslashreplace").decode("utf-8"))
    if "unreadable" in rec:
        why = f" (longer than {AUDIT_TAIL_MAX} bytes: cut)" if rec.get("cut") else ""
        return f"unreadable last record{why}: {clip(show(rec['unreadable']), 80)}"
    words = [rec.get("ts", "?"), rec.get("who", "?"), rec.get("action", "?"), rec.get("release", ""),
             rec.get("result", "?")]
    return " ".join(clip(show(w), 120) for w in words if w not in ("", None))


#: Bytes one follow read (``logs -f``) takes at most; the rest comes with the next reads.
LOG_CHUNK_MAX = 4 << 20


def log_read_command(p: Paths, group: str, offset: int | None, lines: int) -> str:
    """Shell: print the size S of the group's log, then its last ``lines`` lines (``offset``
    None; each cut to :data:`dsv4ctl.hosts.service.LOG_LINE_MAX` bytes on the host), or the bytes
    [offset, min(S, offset + LOG_CHUNK_MAX)) — bytes not read now are read next time, never
    twice (:func:`follow_offset`). Both service backends append to ``logs/<group>.log``."""
    from .service import LOG_LINE_MAX
    lf = q(p.logfile(group))
    off = int(offset or 0)
    body = (f"tail -n {int(lines)} {lf} | cut -b1-{LOG_LINE_MAX}" if offset is None else
            f"n=$((s - {off})); [ $n -gt {LOG_CHUNK_MAX} ] && n={LOG_CHUNK_MAX}; tail -c +{off + 1} {lf} | head -c $n")
    return f"if [ -f {lf} ]; then s=$(wc -c < {lf}); echo $s; {body}; else echo -1; fi"


def follow_offset(offset: int, chunk: bytes) -> tuple[int, bytes]:
    """(next offset, the complete lines of ``chunk`` to show) after a follow read at ``offset``:
    an unterminated last line waits for its end, unless the chunk is a full LOG_CHUNK_MAX of one
    line (a runaway line is shown in pieces rather than never)."""
    done, nl, partial = chunk.rpartition(b"\n")
    if not nl:
        if len(chunk) >= LOG_CHUNK_MAX:
            return offset + len(chunk), chunk + b"\n"
        return offset, b""
    return offset + len(done) + 1, done + b"\n"


def parse_log_read(text: str) -> tuple[int, str]:
    """(log size in bytes, or -1 when there is no log; the text) from :func:`log_read_command`."""
    first, _, rest = text.partition("\n")
    try:
        return int(first.strip()), rest
    except ValueError:
        return -1, ""


def audit_command(p: Paths) -> str:
    """Shell: the host's whole audit log (empty when there is none)."""
    return f"cat {q(p.audit)} 2>/dev/null || true"


#: Where a record begins: every audit record is one JSON object whose first key is ``ts``
#: (:func:`dsv4ctl.hosts.audit.audit_record`, :func:`dsv4ctl.hosts.audit.stamped_json_cmd`); inside a
#: JSON string the quotes are escaped, so this text starts a record and nothing else.
_RECORD_START = '{"ts":'


def _record(text: str) -> dict | None:
    """One JSON object, or None (not JSON, not an object, nested too deep)."""
    try:
        rec = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return rec if isinstance(rec, dict) else None


def parse_audit(host: str, text: str) -> list[dict]:
    """Audit records of one host (JSON lines). An unreadable line is kept as a record with
    ``unreadable`` (its first 200 characters) and action ``?``. A line torn by a full disk that
    the next append continued (``{"ts":…,"act{"ts":…}``, written before appends started on a
    fresh line) is split: the torn part is the unreadable record, the whole record after it is
    read as usual."""
    def bad(ln: str) -> dict:
        return {"ts": "", "host": host, "action": "?", "result": "?", "unreadable": ln[:200]}

    out = []
    for ln in text.splitlines():
        if not ln.strip():
            continue
        rec = _record(ln)
        if rec is None:
            # the last whole record appended onto a torn one (at most a few tries per line)
            i, tries = ln.find(_RECORD_START, 1), 0
            while i > 0 and tries < 8:
                rec = _record(ln[i:])
                if rec is not None:
                    out.append(bad(ln[:i]))
                    break
                i, tries = ln.find(_RECORD_START, i + 1), tries + 1
            if rec is None:
                rec = bad(ln)
        rec.setdefault("host", host)
        out.append(rec)
    return out


def merge_audit(per_host: dict[str, list[dict]], since: str | None = None, host: str | None = None,
                offsets: dict[str, float] | None = None) -> list[dict]:
    """Every host's records merged by time (``ts``, ISO 8601 UTC), optionally from ``since`` on
    and of one ``host``. ``offsets`` ({host: seconds its clock is ahead of this machine's,
    :attr:`dsv4ctl.hosts.clock.ClockReading.applied`}): ``since`` (this machine's time) is compared
    with each host's records in that host's time, and records are ordered by this machine's time
    (a record keeps the ``ts`` its host wrote)."""
    from .clock import host_cutoff_iso
    offsets = offsets or {}
    pairs = [(h, r) for h, rs in per_host.items() if host in (None, h) for r in rs]
    if since:
        cut = {h: host_cutoff_iso(since, offsets[h]) if offsets.get(h) else since for h in per_host}
        pairs = [(h, r) for h, r in pairs if str(r.get("ts", "")) >= cut[h]]

    def when(h: str, r: dict) -> str:
        ts = str(r.get("ts", ""))
        return host_cutoff_iso(ts, -offsets[h]) if offsets.get(h) else ts
    pairs.sort(key=lambda p: (when(*p), p[1].get("host", "")))
    return [r for _, r in pairs]
