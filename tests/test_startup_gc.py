"""The cyclic collector around a console run (dsv4ctl/cli.py, issue 48.1): off during start-up, on
(with start-up's objects frozen) while the command runs, everything frozen after it; a call of
main(argv), as tests make, leaves the collector alone."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

PROBE = r"""
import functools, gc, json, sys
import dsv4ctl.commands.plan as cmd
seen = {}
real = cmd.plan

@functools.wraps(real)
def plan(**kw):
    seen.update(enabled=gc.isenabled(), frozen=gc.get_freeze_count())
    return real(**kw)

cmd.plan = plan
from dsv4ctl.cli import main
sys.argv = ["dsv4ctl"] + json.loads(sys.argv[1])
before = gc.get_freeze_count()
rc = main(None if sys.argv[1:2] != ["in-process"] else ["plan", "--json"])
print(json.dumps({"rc": rc, **seen, "before": before, "after": gc.get_freeze_count(), "on_after": gc.isenabled()}),
      file=sys.stderr)
"""


def run(args: list[str]) -> dict:
    p = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True, cwd=REPO,
                       timeout=120)
    return json.loads(p.stderr.strip().splitlines()[-1])


def test_a_command_runs_with_the_collector_on_and_start_up_frozen():
    doc = run(["plan", "--json"])
    assert doc["rc"] == 0 and doc["before"] == 0
    assert doc["enabled"] is True and doc["frozen"] > 10000       # modules, classes, the typer app
    assert doc["after"] > doc["frozen"] and doc["on_after"] is True


def test_a_usage_error_or_help_leaves_the_collector_on():
    for args in (["plan", "--no-such-option"], ["plan", "--help"], ["--help"]):
        doc = run(args)
        assert doc["on_after"] is True, args


def test_main_with_argv_leaves_the_collector_alone():
    doc = run(["in-process"])
    assert doc["rc"] == 0 and doc["enabled"] is True and doc["frozen"] == 0 and doc["after"] == 0
