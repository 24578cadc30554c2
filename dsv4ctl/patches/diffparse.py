"""Pure helpers over git-format patches: files and hunks, and which hunk fails on a given text.

Used to name the file and hunk of a conflict (``patch apply`` restores the tree, then explains)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")


@dataclass
class Hunk:
    """One hunk: 1-based ``index`` in its file, ``header`` line, ``old_start``, and the lines the
    hunk expects (context and removed) and produces (context and added), without the prefix."""

    index: int
    header: str
    old_start: int
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)


@dataclass
class FilePatch:
    """Diff of one file: ``path`` (the new path; the old one for a deletion) and its hunks."""

    path: str
    old_path: str
    hunks: list[Hunk] = field(default_factory=list)


def subject(patch_text: str) -> str:
    """The ``Subject:`` of a format-patch mail, ``[PATCH n/m]`` prefix removed; '' if none."""
    lines = patch_text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Subject:"):
            s = line[len("Subject:"):].strip()
            j = i + 1
            while j < len(lines) and lines[j].startswith((" ", "\t")):
                s += " " + lines[j].strip()
                j += 1
            return re.sub(r"^\[PATCH[^\]]*\]\s*", "", s)
        if not line.strip():
            break
    return ""


def parse_files(patch_text: str) -> list[FilePatch]:
    """Files and hunks of a unified git diff / format-patch text, in order."""
    files: list[FilePatch] = []
    cur: FilePatch | None = None
    hunk: Hunk | None = None
    remaining = (0, 0)
    for line in patch_text.splitlines():
        if hunk is not None and (remaining[0] > 0 or remaining[1] > 0):
            tag, body = line[:1], line[1:]
            if tag == " " or line == "":
                hunk.old.append(body)
                hunk.new.append(body)
                remaining = (remaining[0] - 1, remaining[1] - 1)
                continue
            if tag == "-":
                hunk.old.append(body)
                remaining = (remaining[0] - 1, remaining[1])
                continue
            if tag == "+":
                hunk.new.append(body)
                remaining = (remaining[0], remaining[1] - 1)
                continue
            if tag == "\\":
                continue
        if line.startswith("diff --git "):
            m = re.match(r"^diff --git a/(.+) b/(.+)$", line)
            a, b = (m.group(1), m.group(2)) if m else ("", "")
            cur = FilePatch(path=b, old_path=a)
            files.append(cur)
            hunk = None
            continue
        if cur is None:
            continue
        if line.startswith("+++ "):
            if line[4:] != "/dev/null":
                cur.path = line[4:].removeprefix("b/")
            else:
                cur.path = cur.old_path
            continue
        m = _HUNK_RE.match(line)
        if m:
            hunk = Hunk(index=len(cur.hunks) + 1, header=line, old_start=int(m.group(1)))
            cur.hunks.append(hunk)
            remaining = (int(m.group(2) or 1), int(m.group(4) or 1))
    return files


def touched_files(patch_text: str) -> list[str]:
    """Paths a patch creates or modifies (not deletions), in order, without duplicates."""
    out: list[str] = []
    for f in parse_files(patch_text):
        if f.path not in out:
            out.append(f.path)
    return out


def failing_hunks(text: str, fp: FilePatch) -> list[Hunk]:
    """Hunks of ``fp`` whose expected lines (context + removed) do not occur, in order, as a
    block of ``text`` — the hunks git cannot place. Hunks are checked against ``text`` with the
    earlier hunks applied, as git applies them top to bottom."""
    lines = text.splitlines()
    bad: list[Hunk] = []
    for h in fp.hunks:
        pos = _find(lines, h.old, max(h.old_start - 1, 0))
        if pos < 0:
            bad.append(h)
            continue
        lines[pos:pos + len(h.old)] = h.new
    return bad


def _find(lines: list[str], block: list[str], hint: int) -> int:
    """Index where ``block`` occurs in ``lines``, the occurrence nearest ``hint``; -1 if none."""
    if not block:
        return min(hint, len(lines))
    n = len(block)
    starts = [i for i in range(len(lines) - n + 1) if lines[i:i + n] == block]
    if not starts:
        return -1
    return min(starts, key=lambda i: abs(i - hint))
