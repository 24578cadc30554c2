"""The report as a person sees it: rendered by headless Chromium (Debian package ``chromium``;
``scripts/test.sh`` installs it when missing).

1. Every chart builder's SVG, placed at a known spot of a page, is screenshot; the PNG is
   decoded here (zlib, no imaging library) and each chart's box must hold ink, including its
   own colours (the plan's weights and over-budget red, the load points, the class stacks ...),
   while the gaps between boxes stay white.
2. The real report page of every input kind, loaded by Chromium (``--dump-dom``), has each
   chart as SVG with its legend text."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from dsv4ctl.report import charts as CH
from dsv4ctl.report.inputs import load_inputs
from dsv4ctl.report.page import build_html
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "report"
CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser")) if p), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (scripts/test.sh installs it)")
GAP = 40
WHITE = (255, 255, 255)


def chromium(tmp: Path, *args: str, scale: float = 1) -> subprocess.CompletedProcess:
    """Run headless Chromium with a throw-away profile (parallel runs never share one)."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
           f"--force-device-scale-factor={scale}", "--force-color-profile=srgb", f"--user-data-dir={tmp / 'profile'}",
           *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=dict(os.environ, HOME=str(tmp)))


def read_png(data: bytes) -> tuple[int, int, int, list[bytearray]]:
    """(width, height, channels, rows of bytes) of an 8-bit non-interlaced PNG (grey, RGB, RGBA,
    grey+alpha) - what Chromium writes. Filters undone row by row; "Up" rows as one big-integer
    addition (bytewise, no carry)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, []
    while pos < len(data):
        n, typ = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if typ == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and not interlace, (depth, interlace)
            ch = {0: 1, 2: 3, 4: 2, 6: 4}[ctype]
        elif typ == b"IDAT":
            idat.append(body)
        pos += 12 + n
    raw = zlib.decompress(b"".join(idat))
    stride = w * ch
    low7, high1 = int.from_bytes(b"\x7f" * stride, "big"), int.from_bytes(b"\x80" * stride, "big")
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        cur = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for i in range(ch, stride):
                cur[i] = (cur[i] + cur[i - ch]) & 255
        elif f == 2:
            a, b = int.from_bytes(cur, "big"), int.from_bytes(prev, "big")
            cur = bytearray((((a & low7) + (b & low7)) ^ ((a ^ b) & high1)).to_bytes(stride, "big"))
        elif f == 3:
            for i in range(stride):
                cur[i] = (cur[i] + (((cur[i - ch] if i >= ch else 0) + prev[i]) >> 1)) & 255
        elif f == 4:
            for i in range(ch):
                cur[i] = (cur[i] + prev[i]) & 255
            for i in range(ch, stride):
                a, b, c = cur[i - ch], prev[i], prev[i - ch]
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                cur[i] = (cur[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(cur)
        prev = cur
    return w, h, ch, rows


def test_png_reader_on_a_known_image():
    """Two rows, filters None and Up, RGB: the reader gives back the pixels."""
    pix = [bytes([255, 0, 0, 0, 255, 0]), bytes([0, 0, 255, 255, 255, 255])]
    raw = b"\x00" + pix[0] + b"\x02" + bytes((b - a) & 255 for a, b in zip(pix[0], pix[1]))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    assert read_png(png) == (2, 2, 3, [bytearray(pix[0]), bytearray(pix[1])])


def _hex(c: str) -> tuple[int, int, int]:
    return tuple(int(c[i:i + 2], 16) for i in (1, 3, 5))


#: chart -> (builder output, colours it must show with at least N pixels each)
def charts() -> list[tuple[str, str, dict[str, int]]]:
    plan, sweep, cmp_ = json.loads((DATA / "plan.json").read_text()), json.loads((DATA / "load-sweep.json").read_text()), \
        json.loads((DATA / "load-compare.json").read_text())
    inc = json.loads((DATA / "incident" / "incident.json").read_text())
    return [
        ("plan", CH.plan_memory_svg(plan), {"#5b6c8f": 3000, "#76b7b2": 3000, "#d62728": 150, "#f1ce63": 300}),
        ("load rate", CH.load_rate_svg(sweep), {"#4e79a7": 150, "#d62728": 80}),
        ("A/B difference", CH.load_diff_svg(cmp_), {"#d62728": 60, "#4e79a7": 30}),
        ("classes", CH.load_classes_svg(sweep), {"#59a14f": 2000}),
        ("latency", CH.load_latency_svg(cmp_), {"#4e79a7": 100, "#f28e2b": 100, "#b07aa1": 100}),
        ("smoke", CH.smoke_svg(json.loads((DATA / "smoke.json").read_text())), {"#dff0d8": 20000}),
        ("incident", CH.incident_svg(inc), {"#2ca02c": 2000, "#bbbbbb": 40}),
        ("plan vs log", CH.plan_log_svg(json.loads((DATA / "plan-log.json").read_text())), {"#d62728": 3000}),
    ]


def test_each_chart_is_drawn_where_it_should_be(tmp_path):
    items, y, boxes = [], 0, []
    for name, svg, colours in charts():
        h = int(float(re.search(r'height="([0-9.]+)"', svg).group(1)))
        items.append(f'<div style="position:absolute;left:0;top:{y}px;width:960px;height:{h}px">{svg}</div>')
        boxes.append((name, y, h, colours))
        y += h + GAP
    page = tmp_path / "sheet.html"
    page.write_text('<!DOCTYPE html><html><head><meta charset="utf-8"><style>body{margin:0;background:white}'
                    f'</style></head><body>{"".join(items)}</body></html>')
    png = tmp_path / "sheet.png"
    # drawn at half scale: a quarter of the pixels to decode in Python, fills keep their colours
    r = chromium(tmp_path, f"--screenshot={png}", f"--window-size=960,{y}", page.as_uri(), scale=0.5)
    assert png.is_file(), r.stderr[-2000:]
    w, h, ch, rows = read_png(png.read_bytes())
    assert (w, h) == (480, y // 2)

    def pixel(row: bytearray, x: int) -> tuple[int, int, int]:
        return tuple(row[x * ch:x * ch + 3]) if ch >= 3 else (row[x * ch],) * 3

    for name, top, bh, colours in boxes:
        top, bh = top // 2, bh // 2
        counts = {c: 0 for c in colours}
        targets = {c: _hex(c) for c in colours}
        ink = 0
        for yy in range(top, top + bh):
            row = rows[yy]
            for x in range(w):
                p = pixel(row, x)
                if p != WHITE:
                    ink += 1
                    for c, t in targets.items():
                        if abs(p[0] - t[0]) <= 8 and abs(p[1] - t[1]) <= 8 and abs(p[2] - t[2]) <= 8:
                            counts[c] += 1
        assert ink / (bh * w) > 0.02, f"{name}: blank"
        # thresholds are full-scale pixel counts: a quarter of them at half scale
        assert all(counts[c] * 4 >= n for c, n in colours.items()), f"{name}: {counts} (want {colours} / 4)"
        gap = rows[top + bh + GAP // 4] if top + bh + GAP // 4 < h else None
        if gap is not None:                          # nothing bleeds out of the box
            assert all(pixel(gap, x) == WHITE for x in range(w)), f"{name}: ink below its box"


def test_the_report_page_in_the_browser_has_every_chart_and_legend(tmp_path):
    names = ["plan.json", "load-compare.json", "smoke.json", "incident", "plan-log.json"]
    html = build_html(load_inputs([str(DATA / n) for n in names]), generated="2026-12-01T21:00:00Z", version="0.1.0")
    page = tmp_path / "report.html"
    page.write_text(html)
    r = chromium(tmp_path, "--dump-dom", page.as_uri())
    dom = r.stdout
    assert dom.count("<svg") == html.count("<svg") == 13, r.stderr[-2000:]
    legends = re.findall(r'<text [^>]*class="legend"[^>]*>([^<]*)</text>', dom)
    for label in ("weights", "index-K over budget", "headroom: activation reserve (SGLang)",   # plan
                  "A: " + json.loads((DATA / "load-compare.json").read_text())["settings"]["urls"][0],
                  "gate 1.00 %", "significant (p &lt; 0.05)", "dsml_in_content", "p99",        # load
                  "pass", "ran", "skipped", "logged, differs"):                               # smoke, runbook, log
        assert label in legends, label


def test_report_svg_writes_each_chart_as_its_own_file_a_browser_draws(tmp_path):
    """``report --svg DIR`` (issue 46.10): each chart of the page is its own SVG file; Chromium
    opens every file as an image (as a ticket or a chat shows an attachment: no page, no CSS) at
    the size the chart declares, and each draws ink."""
    from xml.etree import ElementTree
    from tests.conftest import run_cli
    names = ["plan.json", "load-compare.json", "smoke.json", "incident", "plan-log.json"]
    r = run_cli("report", *[str(DATA / n) for n in names], "-o", str(tmp_path / "r.html"), "--svg", str(tmp_path / "c"))
    assert r.code == 0, r.err
    files = sorted((tmp_path / "c").glob("*.svg"))
    html = (tmp_path / "r.html").read_text()
    assert len(files) == html.count('<svg xmlns="http://www.w3.org/2000/svg" class="chart"') == 13
    assert r.out.splitlines()[-1] == f"wrote 13 chart(s) as SVG files in {tmp_path / 'c'}"
    assert files[0].name == "01-gpu-memory-per-rank-dsv4-flash-8xb200-pd-deepseek-v4-flash.svg"
    declared = []
    for f in files:
        root = ElementTree.parse(f).getroot()          # standalone XML
        assert root.tag == "{http://www.w3.org/2000/svg}svg", f
        declared.append((int(root.get("width")), int(root.get("height"))))
    tops, y = [], 0
    for _, h in declared:
        tops.append(y)
        y += h + GAP
    imgs = "".join(f'<img src="{f.as_uri()}" style="position:absolute;left:0;top:{t}px">' for f, t in zip(files, tops))
    page = tmp_path / "files.html"
    page.write_text('<!DOCTYPE html><html><head><meta charset="utf-8"><style>body{margin:0;background:white}</style>'
                    f'</head><body>{imgs}<pre id="sizes" style="position:absolute;top:{y}px"></pre><script>'
                    'addEventListener("load", () => { document.getElementById("sizes").textContent = '
                    '[...document.images].map(i => i.naturalWidth + "x" + i.naturalHeight).join(" "); });'
                    '</script></body></html>')
    dom = chromium(tmp_path, "--allow-file-access-from-files", "--virtual-time-budget=5000", "--dump-dom",
                   page.as_uri()).stdout
    sizes = re.search(r'<pre id="sizes"[^>]*>([^<]*)</pre>', dom)
    assert sizes and sizes.group(1).split() == [f"{w}x{h}" for w, h in declared], dom[-2000:]
    png = tmp_path / "files.png"
    chromium(tmp_path, "--allow-file-access-from-files", f"--screenshot={png}", f"--window-size=960,{y}",
             page.as_uri(), scale=0.5)
    w, h, ch, rows = read_png(png.read_bytes())
    assert (w, h) == (480, y // 2)
    for f, top, (_, bh) in zip(files, tops, declared):
        band = rows[top // 2:(top + bh) // 2]
        # colour bytes that are not white (alpha, when there is one, is 255 throughout)
        ink = sum(len(row) - row.count(255) for row in band) / min(ch, 3)
        assert ink / (len(band) * w) > 0.02, f"{f.name}: blank"
