"""status's state of one server (issue 46.3, dsv4ctl/hosts/day2.group_state), every state and
what makes it unhealthy (exit 1): ``starting`` within the health timeout is not, past it it is
``unhealthy``; ``drifted`` (files differ from the manifest) is, even with /health ok; ``stopped``
by a dsv4ctl stop is not, ``crashed`` is (node 1 of a two-node server in its own words). The
sshd runs (tests/test_day2.py, tests/test_first_hour.py) see running, stopped and crashed."""

from __future__ import annotations

from dsv4ctl.hosts.day2 import GroupProcess, group_state

STOP = {"who": "ops@x", "ts": "2026-12-07T20:00:00Z", "message": "disk swap"}


def test_every_state_and_which_are_unhealthy():
    young, old = GroupProcess(pid=7, uptime_s=30), GroupProcess(pid=7, uptime_s=3600)
    refused = "/health: connection refused"
    assert group_state(True, "ok", old, None, False, 900) == ("running", "ok", False)
    assert group_state(True, None, old, None, False, 900, node=1, nnodes=2) == ("running", "ok", False)
    assert group_state(True, refused, young, None, False, 900) == \
        ("starting", f"{refused} (started 30 s ago; the health timeout is 900 s)", False)
    assert group_state(True, refused, old, None, False, 900) == ("unhealthy", refused, True)
    assert group_state(True, "ok", old, None, True, 900) == ("drifted", "its release differs from its manifest", True)
    assert group_state(False, refused, None, STOP, False, 900) == \
        ("stopped", 'stopped by ops@x at 2026-12-07T20:00:00Z ("disk swap")', False)
    assert group_state(False, refused, GroupProcess(exit_status=137), None, False, 900) == \
        ("crashed", "process not running (exited with status 137)", True)
    assert group_state(False, None, None, None, False, 900, node=1, nnodes=2)[:2] == \
        ("crashed", "node 1 of 2: process not running (node 0 stalls in its collectives until its watchdog ends it)")
