"""Every place that lists check's classes names each one (issue 45: ``pd_aborted`` and
``language_mix`` were classified but missing from watch's failed-probe lists, its metric HELP,
the dashboard, ``watch --help`` and the README): the lists are read from the code's tuples."""

from __future__ import annotations

import json
import re

from dsv4ctl.check import classify as C
from dsv4ctl.watch.model import FAILED_CLASSES
from tests.conftest import REPO, run_cli


def test_every_failed_class_is_named_where_failed_probes_are_listed():
    from dsv4ctl.watch.metrics import FAILED, WatchMetrics
    (fam,) = [m for m in WatchMetrics().registry.collect() if m.name == FAILED[:-6]]
    readme = (REPO / "README.md").read_text()
    (para,) = re.findall(r"`dsv4ctl_watch_probes_failed_total\{class\}` \(no judged answer: ([^)]*)\)", readme)
    panel = next(p for p in json.loads((REPO / "dsv4ctl/data/watch/dashboard.json").read_text())["panels"]
                 if p.get("title") == "Probes judged and failed")
    help_ = " ".join(run_cli("watch", "--help").out.split())
    for cls in FAILED_CLASSES:
        assert cls in fam.documentation, cls
        assert f"`{cls}`" in para, cls
        assert cls in panel["description"], cls
        assert cls in help_, cls
    assert "language_mix" in help_ and "docs/check.md" in help_


def test_the_readme_and_docs_name_the_new_classes():
    check_md = (REPO / "docs" / "check.md").read_text()
    assert all(f"`{c}`" in check_md for c in C.CLASSES), [c for c in C.CLASSES if f"`{c}`" not in check_md]
    readme = " ".join((REPO / "README.md").read_text().split())
    load = readme[readme.index("Every turn of N concurrent multi-turn agent sessions is classified"):][:900]
    for cls in ("language_mix", "pd_aborted", "pd_transfer_failed", "pd_bootstrap_failed"):
        assert f"`{cls}`" in load, cls
