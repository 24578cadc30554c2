"""``dsv4ctl report INPUT... -o report.html``: one self-contained HTML file of charts and tables
from dsv4ctl's JSON documents (thin CLI over :mod:`dsv4ctl.report`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import InputError


def report(
    inputs: list[str] = typer.Argument(..., metavar="INPUT...",
                                       help="JSON documents of dsv4ctl: plan --json, check load --json (also --compare), check smoke --json, a runbook's incident.json (or its run folder), plan --from-log --json; '-' reads one from standard input."),
    output: str = typer.Option("report.html", "--output", "-o", help="The HTML file to write ('-': standard output)."),
    title: Optional[str] = typer.Option(None, "--title", help="Page title (default: dsv4ctl report)."),
    svg: Optional[str] = typer.Option(None, "--svg", metavar="DIR", help="Also write each chart as its own SVG file in DIR (NN-title.svg; the folder is made when missing), for a ticket or a chat."),
) -> None:
    """One HTML file (inline SVG, no script, no network) with a chart and a table per input:
    per-rank GPU memory of a plan, corruption per concurrency level with Wilson intervals and the
    gate (A/B difference for --compare), classes and latency of a load check, smoke results, a
    runbook's timeline with the charts of the checks it ran, planned vs logged pool sizes.
    With --svg DIR, each chart is also its own SVG file (open it in a browser, attach it; no PNG:
    that needs a rasterizer, e.g. rsvg-convert FILE.svg -o FILE.png).

    Exit 0 written, 2 an input unreadable or not a dsv4ctl document."""
    from .. import __version__
    from ..hosts.audit import now_iso
    from ..report.inputs import load_inputs
    from ..report.page import BadDocument, build_html

    if output != "-":
        out = Path(output).expanduser()
        if not out.name or out.name in (".", "..") or out.is_dir():
            raise InputError(f"--output {output!r}: not a file name")
        for i in inputs:
            p = Path(i).expanduser()
            if p.is_file() and out.exists() and out.resolve() == p.resolve():
                raise InputError(f"--output {output}: is one of the inputs; it would be overwritten")
    docs = load_inputs(inputs)
    try:
        html = build_html(docs, generated=now_iso(), version=__version__, title=title)
    except BadDocument as e:
        raise InputError(str(e)) from None
    except (OverflowError, ValueError, TypeError, ZeroDivisionError, RecursionError) as e:
        # numbers no dsv4ctl document holds (10**400, a float that overflows): one line, exit 2
        raise InputError(f"an input holds a value the report cannot draw ({type(e).__name__}: {e})") from None
    files = None
    if svg is not None:                 # refused before anything is written
        from ..report.export import prepare
        if not svg:
            raise InputError("--svg '': expected a folder name (--svg . for this folder)")
        files = prepare(Path(svg).expanduser(), html)
    if output == "-":
        if files is not None:
            _write_svgs(svg, files, to_stderr=True)
        print(html, end="")
        return
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.unlink(missing_ok=True)     # 'x': never through a link left at the temporary name
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(html)
        tmp.replace(out)
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise InputError(f"--output {output}: {e.strerror or e}") from None
    charts = html.count('<svg xmlns="http://www.w3.org/2000/svg" class="chart"')
    print(f"wrote {out} ({len(html.encode()) / 1024:.0f} KiB, {charts} chart(s) from {len(docs)} input(s))")
    if files is not None:
        _write_svgs(svg, files)


def _write_svgs(folder: str, files: list, to_stderr: bool = False) -> None:
    """``--svg DIR``: each chart as its own file (:mod:`dsv4ctl.report.export`), and a line
    saying so (on stderr when the page goes to stdout). InputError (exit 2) as it raises."""
    import sys
    from ..report.export import write_chart_files
    paths = write_chart_files(Path(folder).expanduser(), files)
    print(f"wrote {len(paths)} chart(s) as SVG files in {folder}", file=sys.stderr if to_stderr else sys.stdout)


def register(app: typer.Typer) -> None:
    """Add ``report`` to the root app."""
    app.command("report")(report)
