"""``--help`` reads whole (issue 46.7): every command list shows each command's whole first
sentence (click cut them with ``...`` at the terminal's width), and no option that takes a value
shows a generic metavar (``<str>``, ``TEXT``, ``INTEGER``...). Walks the whole command tree."""

from __future__ import annotations

import re

import typer

from dsv4ctl.cli import build_app
from dsv4ctl.commands.helptext import GENERIC_METAVARS, first_sentence
from tests.conftest import run_cli


def _tree():
    """(path, click command) of every command and group, the root first."""
    from typer._click.core import Context

    def walk(cmd, path):
        yield path, cmd, Context(cmd, info_name=" ".join(["dsv4ctl", *path]))
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            yield from walk(sub, [*path, name])
    return list(walk(typer.main.get_command(build_app()), []))


def _listed(help_text: str) -> dict[str, str]:
    """The Commands section of a group's --help: {name: its summary, lines joined}."""
    rows: dict[str, str] = {}
    section = help_text.split("\nCommands:\n", 1)[1]
    name = None
    for line in section.splitlines():
        if not line.strip():
            break
        m = re.match(r"  (\S+)\s+(.*)$", line)
        if m and not line.startswith("   "):
            name = m.group(1)
            rows[name] = m.group(2).strip()
        elif name is not None:
            rows[name] += " " + line.strip()
    return rows


def test_every_command_list_shows_whole_first_sentences():
    groups = 0
    for path, cmd, ctx in _tree():
        subs = getattr(cmd, "commands", None)
        if not subs:
            continue
        groups += 1
        rows = _listed(cmd.get_help(ctx))
        assert set(rows) == {n for n, c in subs.items() if not c.hidden}, path
        for name, summary in rows.items():
            assert not summary.endswith("..."), (path, name, summary)
            assert summary == first_sentence(subs[name].help), (path, name)
    assert groups >= 8


def test_no_help_shows_restructuredtext_literals():
    # the module docs write ``x``; --help prints `x` as in the rest of the help (a user read ``git am -3``)
    seen = 0
    for path, cmd, ctx in _tree():
        text = cmd.get_help(ctx)
        seen += "`" in text
        assert "``" not in text, (path, [line for line in text.splitlines() if "``" in line])
    assert seen > 10


def test_no_option_shows_a_generic_metavar():
    seen = 0
    for path, cmd, ctx in _tree():
        for p in cmd.params:
            if getattr(p, "param_type_name", "") != "option" or p.is_flag or p.hidden:
                continue
            rec = p.get_help_record(ctx)
            if rec is None:
                continue
            seen += 1
            shown = rec[0].split(", ")[-1].split(" ", 1)
            assert len(shown) == 2, (path, rec[0])
            assert shown[1] not in GENERIC_METAVARS and not re.fullmatch(r"<\w+>", shown[1]), (path, rec[0])
    assert seen > 100


def test_the_root_help_as_a_user_reads_it():
    r = run_cli("--help")
    assert r.code == 0
    assert "..." not in r.out.split("Commands:", 1)[1]
    assert "  rollback    Switch every host to an older release (atomic), restart, gate on\n              health.\n" in r.out
    r = run_cli("deploy", "--help")
    assert "--base REF " in r.out and "--canary GROUP|HOST " in r.out and "<str>" not in r.out and "<int>" not in r.out
    r = run_cli("patch", "check", "--help")
    assert "--base PACKAGE==VERSION " in r.out


def test_the_top_level_list_is_that_of_the_full_app():
    """``dsv4ctl --help`` / ``-h`` converts the commands without their parameters (start-up,
    issue 48.1): the list must be exactly the full app's (``--help --help`` builds the full app),
    every command and group, in order."""
    full = run_cli("--help", "--help")
    assert full.code == 0 and "\nCommands:\n" in full.out
    assert "plan" in _listed(full.out) and "check" in _listed(full.out)
    for flag in ("--help", "-h"):
        r = run_cli(flag)
        assert (r.code, r.out, r.err) == (0, full.out, full.err), flag


def test_an_abbreviation_does_not_end_the_first_sentence():
    """``config set``'s summary was cut at "serve configs, e.g." (README follower's finding)."""
    assert first_sentence("Set keys in serve configs, e.g.\n``kv-canary=log``: checked.\n\nMore.") == \
        "Set keys in serve configs, e.g. ``kv-canary=log``: checked."
    assert first_sentence("One. Two.") == "One."
    r = run_cli("config", "--help", env={"COLUMNS": "400"})
    line = next(ln for ln in r.out.splitlines() if ln.strip().lstrip("│ ").startswith("set "))
    assert not line.rstrip().endswith("e.g."), line


def test_help_on_a_latin1_or_ascii_terminal_is_written_not_a_traceback():
    # PYTHONIOENCODING=latin-1 dsv4ctl status --help: UnicodeEncodeError on the help's em dash (breaker)
    import os
    import subprocess
    from tests.conftest import REPO
    for enc, args in (("latin-1", ["status", "--help"]), ("ascii", ["plan", "--help"])):
        p = subprocess.run([str(REPO / ".venv" / "bin" / "dsv4ctl"), *args], capture_output=True, timeout=60,
                           env={**os.environ, "PYTHONIOENCODING": enc})
        assert p.returncode == 0 and b"Traceback" not in p.stderr, (enc, p.stderr[-300:])
        assert b"Usage: dsv4ctl " in p.stdout and (b"\\u2014" in p.stdout or enc == "ascii"), (enc, p.stdout[:200])
