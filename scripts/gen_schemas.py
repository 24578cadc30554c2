#!/usr/bin/env python3
"""Write the JSON Schemas that mirror dsv4ctl's own validators into dsv4ctl/data/schemas/.

    python scripts/gen_schemas.py           # (re)write profile.schema.json and playbook.schema.json
    python scripts/gen_schemas.py --check   # exit 1 naming the stale files; write nothing

``profile`` is :data:`dsv4ctl.profile.model.PROFILE_SCHEMA` and ``playbook``
:data:`dsv4ctl.runbook.engine.PLAYBOOK_SCHEMA`, the dicts the loaders validate with; the output
schemas (``plan``, ``check-load``, …) are written by hand next to them and tested against real
output (tests/test_schemas.py). ``dsv4ctl schema NAME`` prints any of them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "dsv4ctl" / "data" / "schemas"
DRAFT = "https://json-schema.org/draft/2020-12/schema"


def generate() -> dict[str, str]:
    """File name -> text of the generated schemas."""
    sys.path.insert(0, str(REPO))
    from dsv4ctl.profile.model import PROFILE_SCHEMA
    from dsv4ctl.runbook.engine import PLAYBOOK_SCHEMA
    docs = {
        "profile.schema.json": {"$schema": DRAFT, "title": "dsv4ctl profile",
                                "description": "A dsv4ctl deployment profile (profiles/*.yaml; README: Profiles). "
                                               "Cross-references and topology are checked by dsv4ctl on load.",
                                **PROFILE_SCHEMA},
        "playbook.schema.json": {"$schema": DRAFT, "title": "dsv4ctl playbook",
                                 "description": "A dsv4ctl runbook playbook (playbooks/*.yaml; README: dsv4ctl runbook).",
                                 **PLAYBOOK_SCHEMA},
    }
    return {name: json.dumps(doc, indent=2) + "\n" for name, doc in docs.items()}


def main(argv: list[str]) -> int:
    """Write (or with ``--check`` compare) the generated schemas."""
    files = generate()
    if "--check" in argv:
        stale = [n for n, t in files.items() if not (OUT / n).is_file() or (OUT / n).read_text() != t]
        for n in stale:
            print(f"stale: dsv4ctl/data/schemas/{n} (run python scripts/gen_schemas.py)")
        return 1 if stale else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for n, t in files.items():
        (OUT / n).write_text(t)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
