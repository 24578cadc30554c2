"""Terminal tables break lines at spaces only (issue 31: URLs and class names were split)."""

from __future__ import annotations

import io

from rich.console import Console

from dsv4ctl.render import rich_table


def _render(rows, width):
    c = Console(file=io.StringIO(), width=width)
    c.print(rich_table("t", ["host", "group", "health", "lock"], rows))
    return c.file.getvalue()


def test_words_are_never_split_across_lines():
    url = "http://127.0.0.1:30001/v1/chat/completions"
    out = _render([["h0", "decode", f"{url} answered tool_call_schema_violation mid-stream", "free"]], 70)
    assert url in out and "tool_call_schema_violation" in out
    for word in ("mid-stream", "answered"):
        assert word in out
    assert max(len(line) for line in out.splitlines()) <= 70
