"""Write ``tests/data/durations.json`` (seconds per test id, tests of 1 s or more) from the per-test
log a ``DSV4CTL_TEST_CPU=FILE`` run writes (``nodeid<TAB>cpu_s<TAB>wall_s[<TAB>worker<TAB>start]``
lines): the order ``tests/conftest.py`` schedules the suite in (longest first). With
``--schedule`` it writes nothing and prints, per xdist worker, when it went idle, its busy seconds
and its longest tests: where the critical path of the run is.

Usage: ``python -m tests.durations FILE [--schedule]``"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parent / "data" / "durations.json"


def _rows(path: str) -> list[tuple[str, float, float, int, float]]:
    rows = []
    for line in Path(path).read_text().splitlines():
        f = line.split("\t")
        rows.append((f[0], float(f[1]), float(f[2]), int(f[3]) if len(f) > 3 else 0,
                     float(f[4]) if len(f) > 4 else 0.0))
    return rows


def schedule(rows) -> str:
    """Per worker: tests run, busy wall seconds, the second it finished (from the first start of
    the run) and its five longest tests."""
    t0 = min(r[4] for r in rows)
    by = defaultdict(list)
    for r in rows:
        by[r[3]].append(r)
    out = []
    for w in sorted(by):
        rs = by[w]
        end = max(r[4] + r[2] for r in rs) - t0
        out.append(f"gw{w}: {len(rs)} tests, busy {sum(r[2] for r in rs):.0f} s, "
                   f"done at {end:.0f} s, CPU {sum(r[1] for r in rs):.0f} s")
        for r in sorted(rs, key=lambda r: -r[2])[:5]:
            out.append(f"    {r[2]:7.1f} s at {r[4] - t0:6.0f} s  {r[0]}")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or (len(argv) == 2 and argv[1] != "--schedule"):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    rows = _rows(argv[0])
    if len(argv) == 2:
        print(schedule(rows))
        return 0
    walls = {nodeid: round(wall, 1) for nodeid, _cpu, wall, _w, _s in rows if wall >= 1.0}
    OUT.write_text(json.dumps(dict(sorted(walls.items(), key=lambda kv: -kv[1])), indent=0) + "\n")
    print(f"{OUT}: {len(walls)} tests")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
