"""One grammar for the profile (issue 31): every command that takes a profile takes it the same
way — positional PROFILE where the command has one, and ``-p/--profile PROFILE`` on every such
command (commands whose first argument is something else, a URL or a tree, take only the
option), plus DSV4CTL_PROFILE. Walks the whole command tree."""

from __future__ import annotations

import re

import pytest
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


# ---- one spelling of durations, -v/-q, --json, --dry-run (issue 31, "One grammar") ----------------

#: An option whose name (or help) says it takes a time span: it must parse through the one duration rule.
DURATION_NAME = re.compile(r"-(timeout|interval|window|since|every|duration|wait|delay|period|age|ttl)(-|$)")

#: Commands that print progress while they change things: they take -v/--verbose and -q/--quiet.
PROGRESS = {"deploy", "rollback", "promote", "start", "stop", "restart", "config set", "hicache on", "hicache off",
            "watch", "check load", "runbook run"}

#: Commands that change hosts, trees or files: they take --dry-run (facts: with --write).
MUTATING = {"deploy", "rollback", "promote", "start", "stop", "restart", "lock acquire", "lock release", "config set",
            "hicache on", "hicache off", "facts", "patch apply", "patch revert", "patch export", "runbook run",
            "profile init"}

#: Commands without --json, and why: their result is no document.
NO_JSON = {"logs": "a stream of log lines", "report": "an HTML page", "completion": "a shell script",
           "runbook run": "a run folder with state.json and incident.json"}


def _opts(cmd) -> set[str]:
    return {o for p in cmd.params if p.param_type_name == "option" for o in p.opts + p.secondary_opts}


def _required_args(cmd) -> list[str]:
    """Dummy words for the command's required arguments and options (parsing only)."""
    out: list[str] = []
    for p in cmd.params:
        if p.required:
            out += ([] if p.param_type_name == "argument" else [p.opts[0]]) + ["x"] * max(1, p.nargs)
    return out


def test_every_duration_option_parses_through_the_one_rule():
    from dsv4ctl.commands.options import Duration, Since
    from dsv4ctl.errors import InputError
    seen = []
    for path, cmd in commands():
        for p in cmd.params:
            timed = any(DURATION_NAME.search(o) for o in p.opts) or re.match(r"(seconds|minutes|how long|time)\b",
                                                                                (p.help or "").lower())
            if p.param_type_name != "option" or not timed:
                continue
            func = getattr(p.type, "func", None)
            assert isinstance(func, (Duration, Since)), f"{path} {p.opts}: not parsed by options.duration/since"
            seen.append(f"{path} {max(p.opts, key=len)}")
            ctx = cmd.make_context(path, _required_args(cmd) + [max(p.opts, key=len), "1m"])
            assert ctx.params[p.name] in (60.0, "1m"), (path, p.opts, ctx.params[p.name])
            if isinstance(func, Duration):
                assert func("1m") == 60.0 or func.keep_text
                with pytest.raises(InputError, match=r"expected a duration such as 500ms, 90s, 15m, 2h or 1d"):
                    cmd.make_context(path, _required_args(cmd) + [max(p.opts, key=len), "1 minute"])
    assert {"audit --since", "diagnose --since", "logs --since", "deploy --health-timeout", "check load --max-duration",
            "check load --stall-timeout", "watch --interval", "logs --interval", "diagnose --window", "facts --timeout",
            "status --timeout", "check smoke --timeout", "hicache status --timeout", "config set --health-timeout"} <= set(seen)
    assert len(seen) >= 24


def test_verbose_and_quiet_go_together_and_never_both():
    from dsv4ctl.commands.grammar import VERBOSE_QUIET_ERROR
    from dsv4ctl.errors import InputError
    both = []
    for path, cmd in commands():
        opts = _opts(cmd)
        v, q = {"-v", "--verbose"} <= opts, {"-q", "--quiet"} <= opts
        assert v == q, f"{path}: -v/--verbose and -q/--quiet go together"
        assert not ({"-v", "--verbose", "-q", "--quiet"} & opts) or v, f"{path}: -v is --verbose, -q is --quiet"
        if v:
            both.append(path)
            with pytest.raises(InputError, match=f"^{re.escape(VERBOSE_QUIET_ERROR)}$"):
                cmd.main(_required_args(cmd) + ["-v", "-q"], prog_name=path, standalone_mode=False)
    assert PROGRESS <= set(both)
    r = run_cli("hicache", "off", "/nonexistent.yaml", "--remote", "-q", "--verbose")
    assert (r.code, r.err) == (2, f"dsv4ctl: error: {VERBOSE_QUIET_ERROR}\n")


def test_mutating_commands_take_dry_run_and_results_take_json():
    cmds = dict(commands())
    assert MUTATING <= set(cmds)
    assert [c for c in sorted(MUTATING) if "--dry-run" not in _opts(cmds[c])] == []
    assert [c for c, cmd in sorted(cmds.items()) if "--json" not in _opts(cmd) and c not in NO_JSON] == []
    assert [c for c in NO_JSON if "--json" in _opts(cmds[c])] == []       # the list stays true


def test_profile_init_dry_run_and_json(tmp_path):
    r = run_cli("profile", "init", "prod", "--dry-run", cwd=tmp_path)
    assert r.code == 0 and r.out.splitlines()[:2] == ["dry run: would write prod.yaml",
                                                      "dry run: would write prod/prefill.yaml"], r.out
    assert list(tmp_path.iterdir()) == []
    r = run_cli("profile", "init", "prod", "--json", cwd=tmp_path)
    doc = r.json()
    assert r.code == 0 and doc["schema"] == "dsv4ctl.profile-init/1" and doc["dry_run"] is False
    assert all((tmp_path / f).is_file() for f in doc["files"]) and doc["next"] == f"dsv4ctl plan {doc['profile']}"
    r = run_cli("profile", "init", "prod", "--dry-run", cwd=tmp_path)
    assert r.code == 2 and "already exists (--force overwrites)" in r.err     # the dry run refuses as the run does
