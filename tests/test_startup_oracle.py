"""One start-up validation per SGLang release (issue 44.1): :mod:`dsv4ctl.plan.startup` against
each release's own ``--config`` reader, argparse and argument resolution on CPU
(``tests/oracle/startup.py``, ``driver.run_startup_case``).

* stored (no oracle needed): the 138 generated configs x 6 releases of
  ``tests/data/startup_matrix.json``: dsv4ctl accepts exactly what SGLang accepts and refuses with
  SGLang's message; the stored configs are the generator's (stale data fails);
* live (``oracle`` marker): a seeded subset re-run on every release equals the stored answers.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.oracle import startup
from tests.oracle.fixtures import forked_oracle  # noqa: F401 - the oracle's fork servers
from tests.oracle.runner import ORACLE_PY, VERSIONS_DIR

STORED = Path(__file__).parent / "data" / "startup_matrix.json"
DATA = json.loads(STORED.read_text())


def test_stored_configs_are_the_generated_matrix():
    assert DATA["cases"] == startup.cases()
    assert set(DATA["results"]) == set(startup.VERSIONS)


def test_dsv4ctl_refuses_what_each_release_refuses():
    assert startup.disagreements(DATA) == []


def test_the_matrix_holds_the_issue_cases_and_both_answers():
    """The cases issue 44 names are in it with SGLang's answer; every release accepts some and
    refuses some."""
    by_cfg = {json.dumps(c["config"], sort_keys=True) + str(c["sm100"]): i for i, c in enumerate(DATA["cases"])}

    def answer(cfg, v, sm=True):
        return DATA["results"][v][by_cfg[json.dumps(cfg, sort_keys=True) + str(sm)]].get("error", "ok")
    assert answer({"dsv4-attn-backend": "trtllm"}, "0.5.19").startswith("argparse: unrecognized arguments")
    assert answer({"dsv4-attn-backend": "trtllm"}, "0.5.23") == "ok"
    assert answer({"tp-size": 8, "attn-dp-size": 8}, "0.5.21").startswith("argparse: unrecognized arguments")
    assert "Unsupported config option" in answer({"tp-size": 8, "dp-size": 8, "enable-dp-attention": True}, "0.5.23")
    assert answer({"tp-size": 8, "dp-size": 8, "enable-dp-attention": True}, "0.5.21") == "ok"
    for v, res in DATA["results"].items():
        assert 0 < sum("error" in r for r in res) < len(res), v


def test_the_comparison_catches_a_missing_rule(monkeypatch):
    """Drop the trtllm rules: the stored trtllm x PD refusals of 0.5.20-0.5.23 become disagreements."""
    import dsv4ctl.plan.startup as st
    monkeypatch.setattr(st, "_trtllm", lambda r, mode, sm100: [])
    bad = startup.disagreements(DATA)
    assert bad and any("trtllm" in b for b in bad)


needs = pytest.mark.skipif(not ORACLE_PY.exists() or not VERSIONS_DIR.is_dir(),
                           reason=f"{ORACLE_PY} missing: run bash scripts/oracle-env.sh")


@pytest.mark.oracle
@needs
@pytest.mark.usefixtures("forked_oracle")
def test_live_releases_answer_as_stored():
    """24 seeded configs on the newest release, in the oracle environment the suite builds (an
    older release is its wheel unpacked and imported again: about 60 s of the suite's wall each
    on the 2-core CI machine; the stored answers of every release were made by its own code and
    are checked above); ``DSV4CTL_STARTUP_RELEASES=all`` runs every release."""
    import os
    versions = startup.VERSIONS if os.environ.get("DSV4CTL_STARTUP_RELEASES") == "all" else (startup.VERSIONS[-1],)
    subset = set(random.Random(44).sample(range(len(DATA["cases"])), 24))
    live = startup.run_live(versions=versions, subset=subset)
    for v in versions:
        stored = [DATA["results"][v][i] for i in sorted(subset)]
        assert live["results"][v] == stored, v
