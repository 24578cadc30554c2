#!/usr/bin/env python3
"""Write the shipped Prometheus rules and Grafana dashboard of ``dsv4ctl watch`` into dsv4ctl/data/watch/.

    python scripts/gen_watch_rules.py           # (re)write rules.yml and dashboard.json
    python scripts/gen_watch_rules.py --check   # exit 1 naming the stale files; write nothing

``rules.yml`` is :func:`dsv4ctl.watch.rules.render_rules` with its defaults (SLO 1 %, real time)
and ``dashboard.json`` :func:`dsv4ctl.watch.dashboard.render_dashboard`; tests/test_watch_rules.py
checks both are current and runs the real promtool on them."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "dsv4ctl" / "data" / "watch"


def generate() -> dict[str, str]:
    """File name -> text of the generated files."""
    sys.path.insert(0, str(REPO))
    from dsv4ctl.watch.dashboard import render_dashboard
    from dsv4ctl.watch.rules import render_rules
    return {"rules.yml": render_rules(), "dashboard.json": render_dashboard()}


def main(argv: list[str]) -> int:
    """Write (or with ``--check`` compare) the generated files."""
    files = generate()
    if "--check" in argv:
        stale = [n for n, t in files.items() if not (OUT / n).is_file() or (OUT / n).read_text() != t]
        for n in stale:
            print(f"stale: dsv4ctl/data/watch/{n} (run python scripts/gen_watch_rules.py)")
        return 1 if stale else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for n, t in files.items():
        (OUT / n).write_text(t)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
