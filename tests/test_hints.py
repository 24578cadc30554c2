"""Every hint dsv4ctl prints works as typed (issue 46.1): the commands its hint builders put in
messages, run as printed from the profile's folder, parse (no usage error, exit 2) and reach the
hosts (here a host that refuses connections: exit 3, the documented "host unreachable"). What they
do on real hosts is checked where they are printed: the first-hour test runs the undo hint of
``hicache off --remote`` and the lock's release hint as typed (tests/test_first_hour.py)."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from tests.conftest import run_cli

#: A ``dsv4ctl ...`` command inside a message: up to the words that end it.
COMMAND = re.compile(r"dsv4ctl [^;()\n]*?(?= when | undoes| \(|[;)\n]|$)")


def commands_in(text: str) -> list[str]:
    """The ``dsv4ctl ...`` commands a message prints, as typed."""
    return [m.group(0).strip() for m in COMMAND.finditer(text)]


@pytest.fixture(scope="module")
def unreachable(tmp_path_factory):
    """A profile of one's own (profile init) whose host refuses SSH connections."""
    d = tmp_path_factory.mktemp("hints")
    r = run_cli("profile", "init", str(d / "prod.yaml"))
    assert r.code == 0, r.err
    text = (d / "prod.yaml").read_text()
    text = re.sub(r"ssh: \{user: sglang, port: 22, key: ~/.ssh/id_ed25519\}",
                  f"ssh: {{user: sglang, port: 9, key: {d}/nokey}}", text)
    assert "port: 9," in text
    (d / "prod.yaml").write_text(text)
    return d / "prod.yaml"


def hints(profile) -> list[str]:
    """Every message the hint builders print, for ``profile`` as the user gave it."""
    from dsv4ctl.commands.serve_change import undo_hint
    from dsv4ctl.hosts.lock import held_error, release_hint
    manual = json.dumps({"who": "ops@x", "what": "lock acquire: disk swap", "pid": 1, "since": "2026-12-01T00:00:00Z",
                         "manual": True, "message": "disk swap"})
    run = json.dumps({"who": "ops@x", "what": "deploy r0123456789ab", "pid": 999999, "since": "2026-12-01T00:00:00Z",
                      "host": {"hostname": "elsewhere", "machine": "m", "boot": "b", "pidns": "p"}})
    return [release_hint(str(profile)), release_hint(str(profile), dead_override=True),
            f"released r1 (from r0123456789ab): healthy; {undo_hint(profile, 'r0123456789ab')} undoes it",
            str(held_error("h0", "/srv/.lock", manual, can_break=False, profile=str(profile))),
            str(held_error("h0", "/srv/.lock", run, can_break=True, profile=str(profile)))]


def test_every_hint_names_its_profile_and_parses_as_typed(unreachable):
    cmds = [c for h in hints(unreachable.name) for c in commands_in(h)]
    assert len(cmds) >= 5 and all(shlex.split(c)[:2][0] == "dsv4ctl" for c in cmds), cmds
    for c in cmds:
        argv = shlex.split(c)[1:]
        assert unreachable.name in argv, c                # the profile in use, never a placeholder
        r = run_cli(*argv, cwd=unreachable.parent, env={"DSV4CTL_PROFILE": ""}, timeout=60)
        assert r.code == 3 and "cannot connect to 127.0.0.1:9" in r.err, (c, r.code, r.err)


def test_logs_with_the_profile_only_says_to_give_the_group_and_that_hint_parses(unreachable):
    r = run_cli("logs", unreachable.name, cwd=unreachable.parent, env={"DSV4CTL_PROFILE": ""})
    assert r.code == 2 and "give the profile" not in r.err
    assert r.err.strip() == (f"dsv4ctl: error: logs takes the group first, then the profile: dsv4ctl logs prefill "
                             f"{unreachable.name} (its groups: prefill, decode, router)")
    (cmd,) = commands_in(r.err.split(": ", 2)[2])
    r = run_cli(*shlex.split(cmd)[1:], cwd=unreachable.parent, env={"DSV4CTL_PROFILE": ""})
    assert r.code == 3 and "cannot connect to 127.0.0.1:9" in r.err, r.err
