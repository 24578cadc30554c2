"""Start-up: ``dsv4ctl --help`` (the command list) rendered once and kept in the cache.

The list is a pure function of the code that draws it: dsv4ctl's command modules (names, help,
the whole first sentences of :mod:`.helptext`), typer and its click, and the help width click
takes from the terminal (``max(min(columns, 80) - 2, 50)``, ``typer/_click/formatting.py``).
Building it imports every command module and converts 41 commands (benchmarks/startup.py: about
40 ms of CPU over ``import typer``); printing the kept text imports neither typer nor a command.

An entry, ``<cache>/help/listing-w<width>``, holds the text and the identity (path, size,
``st_mtime_ns``) of every dsv4ctl and typer module that was loaded when the text was drawn and of
their folders, with the interpreter's prefix and dsv4ctl's own path: a changed or removed module,
a module added to one of those folders, another install or another venv is a miss, and the list
is drawn again and kept. The header also holds the text's length in bytes: an entry cut short (or
grown) since it was kept, or one that names none of the modules (this one among them), is a miss.
It is read under the cache folders' trust rules (:func:`dsv4ctl.resources.read_cache_entry`)."""

from __future__ import annotations

import os
import sys

FORMAT = "dsv4ctl-listing/2"
MAX_ENTRY_BYTES = 1 << 20
FOLDER = "help"


def help_width() -> int:
    """The width click formats help to: ``max(min(columns, 80) - 2, 50)``, columns as
    ``shutil.get_terminal_size()`` finds them (``COLUMNS``, else the terminal of stdout, else 80;
    CPython ``Lib/shutil.py``, written out here so the cached path imports no shutil)."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    try:
        lines = int(os.environ["LINES"])
    except (KeyError, ValueError):
        lines = 0
    if columns <= 0 or lines <= 0:
        try:
            size = os.get_terminal_size(sys.__stdout__.fileno())
        except (AttributeError, ValueError, OSError):
            size = os.terminal_size((80, 24))
        if columns <= 0:
            columns = size.columns or 80
    return max(min(columns, 80) - 2, 50)


def _name(width: int) -> str:
    return f"listing-w{width}"


def _identity(path: str) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{st.st_size}:{st.st_mtime_ns}"


def _header(size: int) -> str:
    return f"{FORMAT}\t{sys.prefix}\t{os.path.dirname(os.path.abspath(__file__))}\t{size}"


def cached_listing(width: int) -> str | None:
    """The kept ``dsv4ctl --help`` text for ``width`` (with its final newline), or None: no entry,
    an untrusted or unreadable one, or any module it was drawn from changed since."""
    from ..resources import read_cache_entry
    raw = read_cache_entry(FOLDER, _name(width), MAX_ENTRY_BYTES, planted="help text")
    if raw is None:
        return None
    head, _, body = raw.partition(b"\n\n")
    try:
        lines, text = head.decode().split("\n"), body.decode()
    except UnicodeDecodeError:
        return None
    if not text or lines[0] != _header(len(body)):
        return None                                 # another venv or install, or cut short / grown
    if not any(line.startswith(os.path.abspath(__file__) + "\t") for line in lines[1:]):
        return None                                 # names no module it was drawn from
    for line in lines[1:]:
        path, _, ident = line.rpartition("\t")
        if not path or _identity(path) != ident:
            return None
    return text


def keep_listing(width: int, text: str) -> bool:
    """Keep ``text`` (the list as printed, final newline included) for ``width``, with the identity
    of every dsv4ctl and typer module loaded now (best effort: False when nothing was kept)."""
    roots = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in
                  (sys.modules.get("dsv4ctl"), sys.modules.get("typer")) if m is not None and getattr(m, "__file__", None))
    files = {os.path.abspath(f) for f in (getattr(m, "__file__", None) for m in list(sys.modules.values()))
             if f and os.path.abspath(f).startswith(roots)}
    files = sorted(files | {os.path.dirname(f) for f in files})     # a folder's mtime: a module added
    body = text.encode()
    rows = [_header(len(body))]
    for path in files:
        ident = _identity(path)
        if ident is None or "\n" in path or "\t" in path:
            return False
        rows.append(f"{path}\t{ident}")
    from ..resources import write_cache_entry
    data = ("\n".join(rows) + "\n\n").encode() + body
    return len(data) <= MAX_ENTRY_BYTES and write_cache_entry(FOLDER, _name(width), data, planted="help text")


def listing_text(application) -> str:
    """The text ``dsv4ctl --help`` prints for the typer app ``application`` (click's help option:
    ``echo(ctx.get_help())``, so with a final newline)."""
    import typer.main
    command = typer.main.get_command(application)
    with command.make_context("dsv4ctl", [], resilient_parsing=True) as ctx:
        return ctx.get_help() + "\n"


__all__ = ["cached_listing", "keep_listing", "listing_text", "help_width"]
