"""Output helpers shared by the commands: JSON, Markdown tables, rich tables, one-line errors."""

from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Sequence


def dump_json(doc: Any) -> str:
    """Stable JSON: sorted keys are *not* used so documents keep their schema order."""
    return json.dumps(doc, indent=2, default=str)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table; ``|`` in cells is escaped, control characters written
    out (:func:`printable`)."""
    def cell(x: Any) -> str:
        return printable(str(x).replace("|", "\\|").replace("\n", " "))
    out = ["| " + " | ".join(map(cell, headers)) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(map(cell, r)) + " |" for r in rows]
    return "\n".join(out)


# Columns whose text wraps when a table is too wide; every other column keeps its cells on one
# line (a path, file:line, URL, id or number is useless cut in two).
WRAP_COLUMNS = frozenset({"message", "reason", "detail", "details", "description", "summary", "what", "note",
                          "notes", "result", "fix", "fixes", "action", "actions", "error", "warning", "why",
                          "expected", "got", "step", "title", "checks", "last audit"})


def ascii_tables() -> bool:
    """Plain ASCII table borders: stdout is not a terminal (a pipe, a file, CI logs)."""
    return not sys.stdout.isatty()


def rich_table(title: str, headers: Sequence[str], rows: Iterable[Sequence[Any]], right: Sequence[int] = ()):
    """A rich Table (imported lazily to keep start-up fast): ASCII borders when stdout is not a
    terminal; when it is too wide, only the message-like columns (:data:`WRAP_COLUMNS`) wrap."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table
    # cells are data (log lines, reasons, release fields a host wrote): no terminal escapes
    rows = [[printable(str(x)) for x in r] for r in rows]
    wraps = [str(h).strip().lower() in WRAP_COLUMNS for h in headers]
    if any(wraps) and not all(wraps):
        stacked = _stacked(title, headers, rows, wraps)
        if stacked is not None:
            return stacked
    t = Table(title=escape(title), title_justify="left", box=box.ASCII if ascii_tables() else box.HEAVY_HEAD)
    for i, h in enumerate(headers):
        # a wrapping column is never narrower than its longest word (a URL, a class name) up to
        # MAX_WORD: rich then breaks lines at spaces only
        word = max((len(w) for r in rows for w in str(r[i]).split()), default=0) if i < len(headers) else 0
        t.add_column(escape(str(h)), justify="right" if i in right else "left",
                     no_wrap=any(wraps) and not wraps[i], overflow="fold",
                     min_width=min(word, MAX_WORD) or None)
    for r in rows:      # cells are data (log lines, reasons, paths): never rich markup
        t.add_row(*[escape(str(x)) for x in r])
    return t


def _width() -> int:
    import shutil
    return shutil.get_terminal_size((200, 24)).columns if sys.stdout.isatty() else (output_width() or 200)


MIN_MESSAGE_WIDTH = 24
MAX_WORD = 60          # longer words (a URL with a long path) may still fold


def _stacked(title: str, headers: Sequence[str], rows: list, wraps: list[bool]):
    """When a table with message-like columns cannot fit the width with its other cells on one
    line and the messages at least MIN_MESSAGE_WIDTH wide: each row as one line of the other cells
    (paths whole) and its messages below, indented and wrapped. None when the table fits."""
    cells = [[str(x) for x in r] for r in rows]
    fixed = sum(max([len(str(h))] + [len(r[i]) for r in cells]) for i, h in enumerate(headers) if not wraps[i])
    n_wrap = sum(wraps)
    if fixed + n_wrap * MIN_MESSAGE_WIDTH + 3 * len(headers) + 1 <= _width():
        return None
    from rich.console import Group
    from rich.padding import Padding
    from rich.text import Text
    parts = [Text(title, style="italic")] if title else []
    for r in cells:
        parts.append(Text("  ".join(c for i, c in enumerate(r) if not wraps[i])))
        for i, c in enumerate(r):
            if wraps[i] and c:
                parts.append(Padding(Text(f"{headers[i]}: {c}" if n_wrap > 1 else c), (0, 0, 0, 4)))
    return Group(*parts)


def _tty(stream) -> bool:
    import os
    return stream.isatty() and not os.environ.get("NO_COLOR")


_ANSI = {"bold": "1", "italic": "3", "red": "31", "green": "32", "yellow": "33"}


def styled(text: str, style: str, stream=None) -> str:
    """``text`` in ``style`` (words of ``bold italic red green yellow``) as ANSI codes when
    ``stream`` (default stdout) is a terminal and NO_COLOR is unset; else ``text`` unchanged."""
    if not _tty(stream or sys.stdout):
        return text
    codes = ";".join(_ANSI[w] for w in style.split() if w in _ANSI)
    return f"\x1b[{codes}m{text}\x1b[0m" if codes else text


def rgb(text: str, colour: str, stream=None) -> str:
    """``text`` in the 24-bit colour ``colour`` (``#rrggbb``) when ``stream`` (default stdout)
    is a terminal and NO_COLOR is unset; else ``text`` unchanged (the terminal memory bar)."""
    if not _tty(stream or sys.stdout):
        return text
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"\x1b[38;2;{r};{g};{b}m{text}\x1b[0m"


def text_table(title: str, headers: Sequence[str], rows: Iterable[Sequence[Any]],
               right: Sequence[int] = ()) -> str | None:
    """The table :func:`rich_table` draws (heavy head box, one space of padding, ``right``
    columns right-justified), as plain text; None when it is wider than the terminal (or 200
    columns off a terminal), where rich's column shrinking and wrapping is wanted.

    Own code, not rich, for the commands that start often (``plan``): importing rich.console and
    rich.table costs 67 ms, half of ``import typer`` (min of 12 runs on this machine kind,
    benchmarks/startup.py)."""
    import os
    import shutil
    body = [[printable(str(x)) for x in r] for r in rows]
    heads = [str(h) for h in headers]
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(heads)]
    total = sum(widths) + 3 * len(widths) + 1
    limit = shutil.get_terminal_size((200, 24)).columns if sys.stdout.isatty() else int(os.environ.get("COLUMNS") or 200)
    if total > limit:
        return None
    rset = set(right)

    def line(cells, bar, style=""):
        out = []
        for i, c in enumerate(cells):
            c = c.rjust(widths[i]) if i in rset else c.ljust(widths[i])
            out.append(" " + (styled(c, style) if style else c) + " ")
        return bar + bar.join(out) + bar

    def rule(left, mid, rgt, ch):
        return left + mid.join(ch * (w + 2) for w in widths) + rgt
    out = [styled(title, "italic")] if title else []
    if ascii_tables():      # the layout of rich's box.ASCII
        out += [rule("+", "-", "+", "-"), line(heads, "|", "bold"), rule("|", "+", "|", "-")]
        out += [line(r, "|") for r in body]
        out.append(rule("+", "-", "+", "-"))
        return "\n".join(out)
    out += [rule("┏", "┳", "┓", "━"), line(heads, "┃", "bold"), rule("┡", "╇", "┩", "━")]
    out += [line(r, "│") for r in body]
    out.append(rule("└", "┴", "┘", "─"))
    return "\n".join(out)


def output_width() -> int | None:
    """Width for rich output off a terminal: ``$COLUMNS`` when set (at least 40), else 200; None on
    a terminal (rich asks the terminal)."""
    import os
    if sys.stdout.isatty():
        return None
    try:
        return max(40, int(os.environ.get("COLUMNS") or 200))
    except ValueError:
        return 200


def console(stderr: bool = False):
    """A rich Console on stdout (or stderr). No colour with ``NO_COLOR`` set (rich honours it)."""
    import os

    from rich.console import Console
    return Console(stderr=stderr, highlight=False, soft_wrap=False, emoji=False,  # no ":name:" rewriting
                   width=output_width(), no_color=bool(os.environ.get("NO_COLOR")) or None)


def error_line(message: str, label: str = "error") -> None:
    """Print ``dsv4ctl: <label>: <message>`` on stderr, one line (``label``: ``error``, or e.g.
    ``gate failed`` for a verdict, :attr:`dsv4ctl.errors.DsvError.label`)."""
    try:          # a hung-up terminal (EIO) or a closed pipe must not turn an error into a traceback
        print(f"dsv4ctl: {label}: {printable(message.splitlines()[0]) if message else 'failed'}", file=sys.stderr)
    except (OSError, ValueError):
        pass


_CONTROL = {c: f"\\x{c:02x}" for c in list(range(0x00, 0x09)) + list(range(0x0b, 0x20)) + [0x7f]}
_CONTROL.update({c: f"\\u{c:04x}" for c in [*range(0x80, 0xa0), *range(0x202a, 0x202f), *range(0x2066, 0x206a)]})
# a byte that is not UTF-8 in an argument or file name (Python's surrogateescape, U+DC80-DCFF): the
# byte, escaped (raw, 0x9b is an 8-bit CSI; a strict UTF-8 stdout could not write it at all)
_CONTROL.update({0xdc00 + b: f"\\x{b:02x}" for b in range(0x80, 0x100)})


def printable(text: str) -> str:
    """``text`` with C0/C1 control characters (ESC, CSI, OSC, BEL, backspace, carriage return …;
    tab and newline kept), the bidirectional overrides/isolates (U+202A-202E, U+2066-2069) and the
    bytes that were not UTF-8 (surrogateescape's U+DC80-DCFF, as the byte) written as ``\\xNN`` /
    ``\\uNNNN``, so text a server or host sent cannot move the cursor,
    recolour or retitle the operator's terminal, nor reorder what it shows."""
    return text.translate(_CONTROL)


def clip(text: str, n: int) -> str:
    """``text`` when it has at most ``n`` characters; else cut to at most ``n`` characters with
    ``…`` at the end: at the last word or field boundary (a space, ``,`` or ``;``) in the last third
    of the room, else (one long word, a hex id) inside it. Never cuts a word in two when a
    boundary is near; a reason stays readable and says that it was cut."""
    text = str(text)
    if len(text) <= n:
        return text
    head = text[:max(n - 1, 0)]
    cut = max(head.rfind(" "), head.rfind(","), head.rfind(";"))
    if cut >= (2 * len(head)) // 3:
        head = head[:cut]
    return head.rstrip(" ,;:") + "…"
