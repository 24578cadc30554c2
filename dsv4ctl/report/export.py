"""Each chart of a report page as its own SVG file (``dsv4ctl report --svg DIR``), for a ticket or
a chat: the very ``<svg>`` element the page inlines (it carries its size, fonts, colours and a
white background; the page's CSS only places it), as a standalone XML document."""

from __future__ import annotations

import os
import re
from pathlib import Path
from xml.etree import ElementTree

from ..errors import InputError

#: A chart of the page: :class:`dsv4ctl.report.svg.Svg` with its default class (charts hold no
#: nested ``<svg>``).
_CHART = re.compile(r'<svg xmlns="http://www.w3.org/2000/svg" class="chart"[^>]*>.*?</svg>', re.S)
_TITLE = re.compile(r"<title>([^<]*)</title>")
_ENTITIES = {"&amp;": "&", "&lt;": "<", "&gt;": ">", "&quot;": '"', "&#39;": "'"}


def slug(text: str, limit: int = 60) -> str:
    """``text`` as a file-name part: lower case ASCII letters, digits and ``-`` (``GPU memory per
    rank: decode`` -> ``gpu-memory-per-rank-decode``), at most ``limit`` characters; ``chart``
    when nothing is left."""
    for e, c in _ENTITIES.items():
        text = text.replace(e, c)
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit].strip("-")
    return s or "chart"


def chart_svgs(html: str) -> list[tuple[str, str]]:
    """(file name, SVG document) of every chart of the report page ``html``, in page order: the
    name is ``NN-<its title>.svg`` (NN from 01), the document an XML declaration and the chart's
    ``<svg>`` element. ValueError when a chart is not well-formed XML (never written half)."""
    out = []
    for n, m in enumerate(_CHART.finditer(html), 1):
        svg = m.group(0)
        ElementTree.fromstring(svg)         # a standalone file must parse as XML on its own
        t = _TITLE.search(svg)
        out.append((f"{n:02d}-{slug(t.group(1) if t else '')}.svg",
                    '<?xml version="1.0" encoding="utf-8"?>\n' + svg + "\n"))
    return out


def prepare(folder: Path, html: str) -> list[tuple[str, str]]:
    """The chart files of ``html`` (:func:`chart_svgs`) for ``folder``, checked before anything is
    written, and the folder made when missing: InputError (exit 2) when ``folder`` exists and is not
    a folder, is a link to nothing or cannot be made, or a chart is not well-formed XML."""
    if folder.exists() and not folder.is_dir():
        raise InputError(f"--svg {folder}: not a folder")
    if folder.is_symlink() and not folder.exists():
        raise InputError(f"--svg {folder}: a link to nothing ({os.readlink(folder)})")
    try:
        files = chart_svgs(html)
    except ValueError as e:
        raise InputError(f"--svg {folder}: a chart is not well-formed SVG ({e})") from None
    try:                                # made now: a folder that cannot be made fails before the page is written
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"--svg {folder}: {e.strerror or e}") from None
    return files


def write_chart_files(folder: Path, files: list[tuple[str, str]]) -> list[Path]:
    """Write ``files`` (:func:`prepare`) into ``folder`` (created with its parents when missing;
    a file of the same name is replaced, each written whole through a temporary name). Returns
    the paths written. InputError (exit 2) when ``folder`` cannot be written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, text in files:
            p = folder / name
            tmp = folder / f".{name}.tmp"
            tmp.unlink(missing_ok=True)     # 'x': never through a link left at the temporary name
            with open(tmp, "x", encoding="utf-8") as f:
                f.write(text)
            tmp.replace(p)
            paths.append(p)
        return paths
    except OSError as e:
        raise InputError(f"--svg {folder}: {e.strerror or e}") from None
