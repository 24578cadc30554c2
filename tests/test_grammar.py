"""One grammar for the profile (issue 31): every command that takes a profile takes it the same
way — positional PROFILE where the command has one, and ``-p/--profile PROFILE`` on every such
command (commands whose first argument is something else, a URL or a tree, take only the
option), plus DSV4CTL_PROFILE. Walks the whole command tree."""

from __future__ import annotations

import typer

from dsv4ctl.cli import build_app
from tests.conftest import run_cli


def commands():
    root = typer.main.get_command(build_app())

    def walk(cmd, path):
        if hasattr(cmd, "commands"):         # a group (typer's click, vendored or not)
            for name, sub in cmd.commands.items():
                yield from walk(sub, path + [name])
        else:
            yield " ".join(path), cmd
    yield from walk(root, [])


def test_every_command_that_takes_a_profile_takes_dash_p():
    takes, missing = [], []
    for path, cmd in commands():
        names = {p.name for p in cmd.params}
        opts = {o for p in cmd.params if p.param_type_name == "option" for o in p.opts}
        if names & {"profile", "profile_opt"}:
            takes.append(path)
            if not {"-p", "--profile"} <= opts:
                missing.append(path)
    assert missing == []
    assert len(takes) >= 28 and {"deploy", "plan", "logs", "status", "check load", "runbook run", "config set"} <= set(takes)


def test_dash_p_is_the_positional_profile():
    a = run_cli("plan", "dsv4-pro-4xh200-pd", "--json")
    b = run_cli("plan", "-p", "dsv4-pro-4xh200-pd", "--json")
    c = run_cli("plan", "--json", "--profile=dsv4-pro-4xh200-pd")
    assert a.code == b.code == c.code == 0 and a.out == b.out == c.out
    assert b.json()["profile"] == "dsv4-pro-4xh200-pd"
    r = run_cli("plan", "dsv4-pro-4xh200-pd", "-p", "dsv4-flash-8xb200-pd")
    assert r.code == 2 and r.err.strip() == ("dsv4ctl: error: the profile is given twice (dsv4-pro-4xh200-pd and "
                                             "-p dsv4-flash-8xb200-pd): give it once")
    r = run_cli("config", "lint", "-p", "dsv4-pro-4xh200-pd", "--json")
    assert r.code == 0 and r.json()["profile"] == "dsv4-pro-4xh200-pd"
