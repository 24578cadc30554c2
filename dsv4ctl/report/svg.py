"""SVG primitives for the report's charts: escaping, a small element builder, nice axis ticks,
the palette. Pure (strings in, strings out); coordinates are SVG user units (CSS pixels)."""

from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence

from ..render import printable

FONT = "system-ui, -apple-system, 'Segoe UI', 'DejaVu Sans', Arial, sans-serif"

#: Series colours (Tableau 10, readable on white, distinguishable in most colour-vision kinds).
SERIES = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f",
          "#bab0ac", "#e15759")
WARN = "#d62728"        # over budget, gate line, failed
OK = "#2ca02c"
SKIP = "#e0a800"
GRID = "#e5e5e5"
AXIS = "#555555"
TEXT = "#222222"


def esc(text: object) -> str:
    """``text`` as SVG/HTML character data or attribute value: ``& < > " '`` escaped, control
    characters written out (``\\x1b``) as :func:`dsv4ctl.render.printable` does, since XML
    forbids them and a server's text may carry them."""
    return (printable(str(text)).replace("\t", " ").replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("'", "&#39;"))


def num(x: float) -> str:
    """A coordinate with at most 2 decimals and no trailing zeros (``12.5``, ``3``)."""
    s = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


class Svg:
    """An SVG document being built: ``w`` × ``h`` user units; elements appended in paint order.

    ``str(svg)`` is the ``<svg>`` element with a ``<title>`` (``label``) and ``role="img"``."""

    def __init__(self, w: float, h: float, label: str, css_class: str = "chart"):
        self.w, self.h, self.label, self.css_class = w, h, label, css_class
        self.parts: list[str] = []
        self.defs: list[str] = []

    def add(self, element: str) -> None:
        """Append raw SVG markup (already escaped)."""
        self.parts.append(element)

    def rect(self, x: float, y: float, w: float, h: float, fill: str, *, stroke: Optional[str] = None,
             title: Optional[str] = None, extra: str = "") -> None:
        """A rectangle; ``title`` becomes its hover tooltip. Negative sizes are clamped to 0."""
        s = f' stroke="{stroke}" stroke-width="1"' if stroke else ""
        body = f"<title>{esc(title)}</title>" if title else ""
        attrs = (f'x="{num(x)}" y="{num(y)}" width="{num(max(0.0, w))}" height="{num(max(0.0, h))}" '
                 f'fill="{fill}"{s}{extra}')
        self.parts.append(f"<rect {attrs}>{body}</rect>" if body else f"<rect {attrs}/>")

    def line(self, x1: float, y1: float, x2: float, y2: float, stroke: str = AXIS, width: float = 1,
             dash: Optional[str] = None) -> None:
        """A straight line; ``dash`` an SVG dasharray (``"6 4"``)."""
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(f'<line x1="{num(x1)}" y1="{num(y1)}" x2="{num(x2)}" y2="{num(y2)}" '
                          f'stroke="{stroke}" stroke-width="{num(width)}"{d}/>')

    def polyline(self, points: Sequence[tuple[float, float]], stroke: str, width: float = 2,
                 dash: Optional[str] = None) -> None:
        """An open line through ``points``."""
        d = f' stroke-dasharray="{dash}"' if dash else ""
        pts = " ".join(f"{num(x)},{num(y)}" for x, y in points)
        self.parts.append(f'<polyline points="{pts}" fill="none" stroke="{stroke}" stroke-width="{num(width)}"{d}/>')

    def circle(self, x: float, y: float, r: float, fill: str, title: Optional[str] = None) -> None:
        """A filled circle (a data point), with a hover tooltip."""
        body = f"<title>{esc(title)}</title>" if title else ""
        self.parts.append(f'<circle cx="{num(x)}" cy="{num(y)}" r="{num(r)}" fill="{fill}" stroke="white" '
                          f'stroke-width="1">{body}</circle>')

    def text(self, x: float, y: float, text: object, *, size: float = 12, anchor: str = "start",
             fill: str = TEXT, weight: str = "normal", rotate: Optional[float] = None,
             css_class: Optional[str] = None) -> None:
        """Text whose baseline starts (``anchor`` start/middle/end) at (x, y)."""
        rot = f' transform="rotate({num(rotate)} {num(x)} {num(y)})"' if rotate is not None else ""
        cls = f' class="{css_class}"' if css_class else ""
        w = f' font-weight="{weight}"' if weight != "normal" else ""
        self.parts.append(f'<text x="{num(x)}" y="{num(y)}" font-size="{num(size)}" text-anchor="{anchor}" '
                          f'fill="{fill}"{w}{rot}{cls}>{esc(text)}</text>')

    def hatch(self, pid: str, colour: str) -> str:
        """Define a diagonal hatch pattern of ``colour`` on white; returns ``url(#pid)``."""
        self.defs.append(f'<pattern id="{pid}" patternUnits="userSpaceOnUse" width="6" height="6" '
                         f'patternTransform="rotate(45)"><rect width="6" height="6" fill="{colour}"/>'
                         f'<line x1="0" y1="0" x2="0" y2="6" stroke="white" stroke-width="2"/></pattern>')
        return f"url(#{pid})"

    def legend(self, x: float, y: float, items: Iterable[tuple[str, str]], max_w: float, size: float = 12) -> float:
        """Swatch + label pairs left to right from (x, y), wrapping at ``max_w``; returns the y
        below the last row. Labels carry ``class="legend"`` (the browser test looks for them)."""
        cx, cy = x, y
        for fill, label in items:
            w = 18 + 0.6 * size * len(label) + 16
            if cx > x and cx + w > x + max_w:
                cx, cy = x, cy + size + 8
            self.rect(cx, cy - size + 2, 12, 12, fill, stroke="#888")
            self.text(cx + 16, cy, label, size=size, css_class="legend")
            cx += w
        return cy + size + 6

    def __str__(self) -> str:
        defs = f"<defs>{''.join(self.defs)}</defs>" if self.defs else ""
        return (f'<svg xmlns="http://www.w3.org/2000/svg" class="{self.css_class}" role="img" '
                f'width="{num(self.w)}" height="{num(self.h)}" viewBox="0 0 {num(self.w)} {num(self.h)}" '
                f'font-family="{esc(FONT)}"><title>{esc(self.label)}</title>{defs}'
                f'<rect width="100%" height="100%" fill="white"/>{"".join(self.parts)}</svg>')


def nice_ticks(hi: float, count: int = 5) -> list[float]:
    """Ticks 0, step, 2·step … covering [0, hi] with step 1, 2, 2.5 or 5 × 10^k, about ``count``
    of them. ``hi`` <= 0 gives [0, 1]."""
    if not (hi > 0 and math.isfinite(hi)):
        return [0.0, 1.0]
    raw = hi / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    n = math.ceil(hi / step - 1e-9)
    return [round(i * step, 10) for i in range(n + 1)]


def fmt_tick(x: float) -> str:
    """Tick label: integers without decimals, else up to 3 significant decimals (``0.25``)."""
    if abs(x - round(x)) < 1e-9:
        return f"{int(round(x)):,}"
    return f"{x:.3g}" if abs(x) < 1 else f"{x:,.2f}".rstrip("0").rstrip(".")
