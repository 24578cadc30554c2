"""Output helpers shared by the commands: JSON, Markdown tables, rich tables, one-line errors."""

from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Sequence


def dump_json(doc: Any) -> str:
    """Stable JSON: sorted keys are *not* used so documents keep their schema order."""
    return json.dumps(doc, indent=2, default=str)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table; ``|`` in cells is escaped."""
    def cell(x: Any) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")
    out = ["| " + " | ".join(map(cell, headers)) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(map(cell, r)) + " |" for r in rows]
    return "\n".join(out)


def rich_table(title: str, headers: Sequence[str], rows: Iterable[Sequence[Any]], right: Sequence[int] = ()):
    """A rich Table (imported lazily to keep start-up fast)."""
    from rich.table import Table
    t = Table(title=title, title_justify="left")
    for i, h in enumerate(headers):
        t.add_column(h, justify="right" if i in right else "left")
    for r in rows:
        t.add_row(*[str(x) for x in r])
    return t


def console(stderr: bool = False):
    """A rich Console on stdout (or stderr)."""
    from rich.console import Console
    return Console(stderr=stderr, highlight=False, soft_wrap=False, emoji=False,  # no ":name:" rewriting
                   width=None if sys.stdout.isatty() else 200)


def error_line(message: str) -> None:
    """Print ``dsv4ctl: error: <message>`` on stderr, one line."""
    print(f"dsv4ctl: error: {message.splitlines()[0] if message else 'failed'}", file=sys.stderr)
