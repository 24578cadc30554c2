"""Operations: actions (printed by --dry-run, executed by the real run), atomic writes, audit log."""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
import socket
from dataclasses import dataclass, field
from typing import Any, Callable

from .parallel import HostResult, run_parallel
from .transport import Transport, q


@dataclass
class Action:
    """One change on one host. ``summary`` is what ``--dry-run`` prints; ``fn(transport)`` does it.

    ``cmd`` (optional) is the exact shell command, shown by ``--dry-run --verbose``."""

    host: str
    summary: str
    fn: Callable[[Transport], Any] = field(repr=False)
    cmd: str | None = None

    def describe(self) -> str:
        return f"{self.host}: {self.summary}"


def describe_actions(actions: list[Action]) -> list[str]:
    """The ``--dry-run`` lines of an action list, grouped by host in first-seen order."""
    hosts: dict[str, list[str]] = {}
    for a in actions:
        hosts.setdefault(a.host, []).append(a.describe())
    return [line for lines in hosts.values() for line in lines]


def run_actions(transports: dict[str, Transport], actions: list[Action], *,
                timeout: float | None = None) -> dict[str, HostResult]:
    """Execute actions: hosts in parallel, each host's actions in order, stopping that host at
    its first failure. Returns {host: HostResult(value=[results])} for hosts with actions."""
    per_host: dict[str, list[Action]] = {}
    for a in actions:
        per_host.setdefault(a.host, []).append(a)

    def body(t: Transport):
        return [a.fn(t) for a in per_host[t.name]]

    return run_parallel({h: transports[h] for h in per_host}, body, timeout=timeout)


def who() -> str:
    """``user@machine`` of the operator (for locks and the audit log)."""
    try:
        user = getpass.getuser()
    except Exception:
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def framed(data: bytes) -> bytes:
    """``data`` preceded by the header line ``<byte count> <sha256 hex>`` that an
    :func:`atomic_write_cmd` built with ``size=None`` reads first from stdin (a command built
    before its data are known, e.g. a close step that ``--dry-run`` lists)."""
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}\n".encode() + data


def atomic_write_cmd(path: str, mode: int | None = None, like: str | None = None, *,
                     size: int | None, sha256: str | None = None) -> str:
    """The shell command :func:`atomic_write` runs (data on stdin), for composing one round
    trip out of several steps: a subshell whose exit status is non-zero when any step fails
    (mkdir, mktemp, writing the data, the size/hash check, chmod, fsync, rename), with the temp
    file removed and the old file untouched.

    ``size`` is the byte count the data must have (and ``sha256``, when given, their hex digest;
    checked where the host has ``sha256sum``): a stdin that ends early (the SSH stream cut) leaves
    a shorter temp file, which is removed instead of renamed (exit 1, a line on stderr). With
    ``size=None`` the expected count and digest come first on stdin as one header line
    (:func:`framed`), so the command text does not depend on the data.

    Every step is chained with ``&&``: ``set -e`` is not used, because POSIX shells ignore it
    inside a subshell that is itself part of an ``&&`` list (a full disk then renamed a truncated
    temp file over the previous contents)."""
    d = os.path.dirname(path) or "."
    if mode is not None:
        perm = f"chmod {mode:o} \"$t\""
    else:                         # keep the mode of ``like`` (default: the file being replaced)
        ref = q(like or path)
        # GNU and busybox stat; when the mode cannot be read, fail closed (0600), never wider
        # (-L: the mode of a symlink's target, never the link's own 0777)
        perm = (f"if [ -e {ref} ]; then m=$(stat -L -c %a {ref} 2>/dev/null) || m=600; chmod \"$m\" \"$t\"; "
                f"else chmod 644 \"$t\"; fi")
    if size is None:              # the header line of :func:`framed` (read byte by byte: the data stay on stdin)
        expect = "IFS=' ' read -r n h && case $n in ''|*[!0-9]*) echo 'atomic write: no size header on stdin' >&2; false;; esac"
    else:
        if int(size) < 0 or (sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", sha256)):
            raise ValueError(f"atomic_write_cmd: bad size {size!r} or sha256 {sha256!r}")
        expect = f"n={int(size)} h={sha256 or ''}"
    # the data are what was promised: the byte count (wc -c: everywhere), then the digest where
    # sha256sum exists; a short stdin never reaches mv
    what = f"\"atomic write \"{q(path)}\":"
    check = (f"g=$(wc -c < \"$t\") && {{ [ $g -eq \"$n\" ] || {{ echo {what} got $g of $n bytes "
             f"(input cut short): not written\" >&2; false; }}; }} && "
             f"{{ [ -z \"$h\" ] || ! command -v sha256sum >/dev/null 2>&1 || "
             f"[ \"$(sha256sum < \"$t\" | cut -d' ' -f1)\" = \"$h\" ] || "
             f"{{ echo {what} sha256 differs from the data sent: not written\" >&2; false; }}; }}")
    # fsync: coreutils sync FILE (>= 8.24) reports EIO/ENOSPC of the write-back: a failure stops the write
    return (f"(mkdir -p {q(d)} && t=$(mktemp {q(path)}.tmp.XXXXXX) || exit 1; "
            f"trap 'rm -f \"$t\"' EXIT; {expect} && cat > \"$t\" && {check} && {{ {perm}; }} && "
            f"sync \"$t\" && mv -fT \"$t\" {q(path)} && trap - EXIT)")


def atomic_write(t: Transport, path: str, data: bytes | str, *, mode: int | None = None,
                 like: str | None = None, timeout: float | None = 60) -> None:
    """Write ``data`` to ``path`` on the host atomically: a temp file in the same folder,
    checked against the size and sha256 of ``data`` (a cut stream is never installed), fsync,
    chmod, then ``mv -f`` (rename(2)); readers see the old or the new file, never a part. Parent
    folders are created. Permissions: ``mode`` when given, else those of ``like`` (default: of
    ``path`` itself, so a 0600 serve config holding an API key stays 0600), else 0644 for a new
    file. RemoteError on failure (the temp file is removed)."""
    if isinstance(data, str):
        data = data.encode()
    t.run(atomic_write_cmd(path, mode, like, size=len(data), sha256=hashlib.sha256(data).hexdigest()),
          input=data, timeout=timeout)


def fresh_line_cmd(path: str) -> str:
    """Shell: end ``path`` with a newline when it is not empty and does not end with one (a line
    torn by a full disk or a killed writer), so the next appended line starts on a line of its own
    instead of joining the torn one. Exit status non-zero only when that newline cannot be written."""
    f = q(path)
    return f"{{ [ ! -s {f} ] || [ $(tail -c 1 {f} | wc -l) -eq 1 ] || printf '\\n' >> {f}; }}"


def append_jsonl_cmd(path: str, record: dict) -> str:
    """The shell command appending ``record`` as one JSON line to ``path`` (no stdin needed),
    on a fresh line (:func:`fresh_line_cmd`); non-zero when the line cannot be written whole."""
    line = json.dumps(record, sort_keys=False, default=str, separators=(",", ":"))
    d = os.path.dirname(path) or "."
    return f"(mkdir -p {q(d)} && {fresh_line_cmd(path)} && printf '%s\\n' {q(line)} >> {q(path)})"


def append_jsonl(t: Transport, path: str, record: dict, *, timeout: float | None = 30) -> None:
    """Append one JSON object as one line to ``path`` on the host (O_APPEND; the file is created
    if missing, never rewritten; a torn last line is ended first, :func:`fresh_line_cmd`).
    Records must not contain secrets. RemoteError when the line cannot be written (full disk)."""
    line = json.dumps(record, sort_keys=False, default=str, separators=(",", ":")) + "\n"
    d = os.path.dirname(path) or "."
    t.run(f"mkdir -p {q(d)} && {fresh_line_cmd(path)} && cat >> {q(path)}", input=line.encode(), timeout=timeout)


def read_text(t: Transport, path: str, *, default: str | None = None, timeout: float | None = 30) -> str | None:
    """Contents of ``path`` on the host, or ``default`` when it does not exist (a fact, no change)."""
    res = t.run(f"if [ -e {q(path)} ]; then cat {q(path)}; else exit 44; fi", timeout=timeout, check=False)
    if res.code == 44:
        return default
    if res.code != 0:
        raise t.fail(res, f"read {path}")
    return res.out
