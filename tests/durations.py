"""Write ``tests/data/durations.json`` (seconds per test id, tests of 1 s or more) from the per-test
log a ``DSV4CTL_TEST_CPU=FILE`` run writes (``nodeid<TAB>cpu_s<TAB>wall_s`` lines): the order
``tests/conftest.py`` schedules the suite in (longest first).

Usage: ``python -m tests.durations FILE``"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "data" / "durations.json"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    walls: dict[str, float] = {}
    for line in Path(argv[0]).read_text().splitlines():
        nodeid, _cpu, wall = line.split("\t")
        if float(wall) >= 1.0:
            walls[nodeid] = round(float(wall), 1)
    OUT.write_text(json.dumps(dict(sorted(walls.items(), key=lambda kv: -kv[1])), indent=0) + "\n")
    print(f"{OUT}: {len(walls)} tests")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
