"""Pictures in the terminal: ``plan``'s per-rank memory bar and ``check load``'s corruption
sparkline. Pure text builders; colour only through :func:`dsv4ctl.render.rgb` /
:func:`dsv4ctl.render.styled` (ANSI on a terminal without NO_COLOR, plain text otherwise).

No rich here: ``plan`` draws its table without rich to keep start-up fast (rich.console and
rich.table cost 67 ms; tests/test_startup_imports.py), and the bar follows suit."""

from __future__ import annotations

from typing import Optional

from ..render import rgb, styled
from .memory import COLOURS, LABELS, SEGMENTS, plan_bars

#: Plain-text glyph per segment (no colour: every segment needs its own letter).
PLAIN = {"before_load": "·", "weights": "W", "other": "o", "swa_latent": "S", "c4_latent": "4",
         "c128_latent": "1", "states": "s", "index_k_budget": "k", "index_k_over": "!",
         "req_to_token": "r", "headroom_reserved": "a", "headroom_free": "-"}


def _cells(segments: list[tuple[str, float]], top: float, width: int) -> list[tuple[str, int]]:
    """[(segment key, characters)] with boundaries at round(cumulative GiB × width / top): the
    characters add up to the bar's length; a segment under half a character may get none."""
    out, cum, prev = [], 0.0, 0
    for key, v in segments:
        cum += max(0.0, v)
        end = int(round(cum * width / top))
        out.append((key, end - prev))
        prev = end
    return out


def plan_bar_lines(doc: dict, width: int = 60, stream=None) -> list[str]:
    """The memory bar of each group and set of identical ranks of a ``dsv4ctl.plan/2``
    document (``stream``: where it is printed, default stdout), ``width`` characters for the largest of the GPU memory and the bars' sums (GiB):
    a title line, then per bar one line of segments (colour blocks on a terminal, a letter per
    segment otherwise) ending at ``|`` (the GPU's memory) and one line of requests at context,
    index-K over budget and headroom vs SGLang's activation reserve; then the legend. Empty
    when no group has ranks."""
    bars = plan_bars(doc)
    if not bars:
        return []
    top = max([b.gpu_gib or 0.0 for b in bars] + [b.total_gib for b in bars]) or 1.0
    colour = styled("x", "bold", stream) != "x"     # a terminal without NO_COLOR
    name_w = max(len(b.title) for b in bars)
    out = [styled(f"GPU memory per rank (1 character = {top / width:.2f} GiB; | = the GPU's memory)", "italic",
                  stream)]
    used: list[str] = []

    def draw(ks: list[str]) -> str:
        if colour:
            return "".join(rgb("█", COLOURS[k], stream) for k in ks)
        return "".join(PLAIN[k] for k in ks)
    for b in bars:
        keys = [key for key, n in _cells(b.segments, top, width) for _ in range(max(0, n))]
        used += [k for k in dict.fromkeys(keys) if k not in used]
        gpu_at = int(round((b.gpu_gib or top) * width / top))
        # the GPU's memory is the "|": a bar that does not fit runs past it
        text = draw(keys[:gpu_at]) + " " * max(0, gpu_at - len(keys)) + "|" + draw(keys[gpu_at:])
        out.append(f"{b.title.ljust(name_w)} {text} {b.gpu_gib if b.gpu_gib else '-'} GiB")
        facts = [f"{b.requests:,} requests @ {b.context_length:,} tokens"]
        over = b.value("index_k_over")
        if over > 0:
            facts.append(styled(f"index-K {over:.3f} GiB over budget", "bold red", stream))
        head = f"headroom {b.headroom_gib:.3f} GiB"
        if b.headroom_gib < 0:
            facts.append(styled(f"{head}: over the GPU by {-b.headroom_gib:.3f} GiB, no room for SGLang's "
                                f"{b.reserve_gib:g} GiB activation reserve", "bold red", stream))
        elif b.reserve_short_gib > 0:
            head += f", {b.reserve_short_gib:.3f} GiB short of SGLang's {b.reserve_gib:g} GiB activation reserve"
            facts.append(styled(head, "yellow", stream))
        else:
            facts.append(head + (f" (SGLang's activation reserve {b.reserve_gib:g} GiB)" if b.reserve_gib else ""))
        out.append(" " * (name_w + 1) + " · ".join(facts))
    legend = []
    for key, *_ in SEGMENTS:
        if key in used:
            mark = rgb("█", COLOURS[key], stream) if colour else PLAIN[key]
            legend.append(f"{mark} {LABELS[key]}")
    out.append("  ".join(legend))
    return out


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(rates: list[Optional[float]], top: Optional[float] = None) -> str:
    """One character per value in 0..``top`` (default the largest): ``▁`` for 0, ``▂``..``█``
    for the rest in proportion, ``·`` for None (a level not run)."""
    vals = [r for r in rates if r is not None]
    hi = top if top else max(vals + [0.0])
    out = []
    for r in rates:
        if r is None:
            out.append("·")
        elif r <= 0 or hi <= 0:
            out.append(SPARKS[0])
        else:
            out.append(SPARKS[1 + min(6, int(r / hi * 6.999))])
    return "".join(out)


def load_spark_lines(doc: dict, stream=None) -> list[str]:
    """One line per URL of a ``dsv4ctl.check.load/1`` document: the corruption rate per
    concurrency level as a sparkline (all URLs on one scale; red on a terminal where the
    level fails the gate; ``×`` a level that crashed, ``·`` one not run), the levels, and the
    rates in % (``-`` where there is none)."""
    settings = doc.get("settings") or {}
    urls = list(settings.get("urls") or [])
    levels = list(settings.get("concurrency") or [])
    for lv in doc["levels"]:
        if lv["url"] not in urls:
            urls.append(lv["url"])
        if lv["concurrency"] not in levels:
            levels.append(lv["concurrency"])
    by = {(lv["url"], lv["concurrency"]): lv for lv in doc["levels"]}
    top = max([lv["rate"] for lv in doc["levels"] if lv["rate"] is not None] + [0.0])
    name_w = max(len(u) for u in urls) if len(urls) > 1 else 0
    out = []
    for i, u in enumerate(urls):
        line = ""
        for c in levels:
            lv = by.get((u, c))
            # a crashed level has no rate (its turns are errors, not corruption): ×
            ch = "×" if lv and lv.get("crashed") else sparkline([lv["rate"] if lv else None], top)
            line += styled(ch, "red", stream) if lv and not lv["pass"] else ch
        rates = " ".join(f"{by[(u, c)]['rate'] * 100:.2f}" if by.get((u, c), {}).get("rate") is not None
                         else "-" for c in levels)
        who = (f"{'AB'[i] if len(urls) == 2 else i + 1}: {u.ljust(name_w)} " if len(urls) > 1 else "")
        out.append(f"corruption per level {who}{line}  c={','.join(map(str, levels))}: {rates} %")
    return out
