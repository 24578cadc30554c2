"""Write ``tests/data/versions_answers.json``: each supported SGLang release's own answers
(configurator and argument resolution, run on CPU from its wheel's sources) to the cases of
``tests/test_versions_oracle.py``. The suite runs every release live and requires its answers to
equal the stored ones, so the comparisons between releases (which need all six at once) read this
file instead of running six releases in one test.

Usage: ``.venv/bin/python -m tests.oracle.versions_answers`` (needs ``bash scripts/oracle-env.sh``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

STORED = Path(__file__).resolve().parents[1] / "data" / "versions_answers.json"


def live_answers(version: str, cases: list[dict]) -> dict:
    """``{case id: result}`` of ``cases`` run by SGLang ``version``'s own code."""
    from tests.oracle.runner import run_cases
    res = run_cases([{**c, "sglang_version": version} for c in cases],
                    version=None if version == "0.5.23" else version, timeout=300)
    assert res["sglang_version"] == version, res["sglang_version"]
    return {r["id"]: r for r in res["results"]}


def main() -> None:
    from dsv4ctl.plan.versions import VERSIONS
    from tests.test_versions_oracle import CASES
    doc = {v: live_answers(v, CASES) for v in VERSIONS}
    tmp = STORED.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, STORED)
    print(f"wrote {STORED} ({len(doc)} releases x {len(CASES)} cases)")


if __name__ == "__main__":
    main()
