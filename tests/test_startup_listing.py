"""``dsv4ctl --help`` kept in the cache (dsv4ctl/commands/listing.py, issue 48.1): the kept text is
the list typer draws, byte for byte, at every width; a changed module or a foreign entry is a miss."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

RUN = ("import sys; sys.argv[0] = 'dsv4ctl'; from dsv4ctl.cli import main; rc = main(); "
       "print('typer' in sys.modules, file=sys.stderr); sys.exit(rc)")


def help_run(cache, columns: int, *args: str) -> tuple[str, bool]:
    """(stdout, whether typer was imported) of ``dsv4ctl ARGS`` in a new interpreter."""
    env = dict(os.environ, COLUMNS=str(columns), DSV4CTL_CACHE=str(cache))
    p = subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, cwd=REPO, env=env,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout, p.stderr.strip().splitlines()[-1] == "True"


def test_kept_list_is_the_drawn_list_at_every_width_and_imports_no_typer(tmp_path):
    for columns, shown in ((200, 78), (64, 62), (20, 50)):
        drawn, with_typer = help_run(tmp_path / "c", columns, "--help")
        assert with_typer and (tmp_path / "c" / "help" / f"listing-w{shown}").is_file()
        assert drawn.startswith("Usage: dsv4ctl [OPTIONS] COMMAND [ARGS]...") and "plan" in drawn
        for args in (("--help",), ("-h",), ()):
            kept, with_typer = help_run(tmp_path / "c", columns, *args)
            assert (kept, with_typer) == (drawn, False), args
        fresh, _ = help_run(tmp_path / f"other-{columns}", columns, "-h")   # nothing kept: drawn again
        assert fresh == drawn
    assert help_run(tmp_path / "c", 200, "--help")[0] != help_run(tmp_path / "c", 64, "--help")[0]


def test_a_changed_module_or_another_install_is_a_miss(tmp_path, monkeypatch):
    import io

    from dsv4ctl import cli
    from dsv4ctl.commands import listing
    drawn, _ = help_run(tmp_path, 200, "--help")
    entry = tmp_path / "help" / "listing-w78"
    raw = entry.read_text()
    assert f"{REPO}/dsv4ctl/commands/plan.py\t" in raw and "/typer/_click/formatting.py\t" in raw
    os.environ["DSV4CTL_CACHE"] = str(tmp_path)
    try:
        assert listing.cached_listing(78) == drawn
        path = f"{REPO}/dsv4ctl/commands/plan.py"
        line = next(x for x in raw.splitlines() if x.startswith(path + "\t"))
        size, mtime = line.split("\t")[1].split(":")
        for changed in (f"{size}:{int(mtime) + 1}", f"{int(size) + 1}:{mtime}"):      # an edit since
            entry.write_text(raw.replace(line, f"{path}\t{changed}"))
            assert listing.cached_listing(78) is None
        entry.write_text(raw.replace(f"\t{sys.prefix}\t", "\t/elsewhere/venv\t", 1))   # another venv
        assert listing.cached_listing(78) is None
        entry.write_text(raw)
        entry.chmod(0o644)
        (tmp_path / "help").chmod(0o777)            # a folder others can write: never trusted
        assert listing.cached_listing(78) is None
        (tmp_path / "help").chmod(0o700)
        assert listing.cached_listing(78) == drawn
        head, body = raw.split("\n\n", 1)
        for cut in (1, 3000, len(body.encode()) - 1):    # an entry cut short: never a shorter list
            entry.write_bytes(raw.encode()[:-cut])
            assert listing.cached_listing(78) is None
        entry.write_text(raw + "more\n")                   # grown since it was kept
        assert listing.cached_listing(78) is None
        entry.write_text(head.split("\n")[0] + "\n\n" + body)   # names no module it was drawn from
        assert listing.cached_listing(78) is None
        entry.write_text(raw)
        monkeypatch.setenv("COLUMNS", "200")
        out = io.BytesIO()      # PYTHONIOENCODING=ascii: the list has an em dash; drawn by click instead
        monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out, encoding="ascii"))
        assert "\u2014" in drawn and cli._print_kept_listing() is False
        sys.stdout.flush()
        assert out.getvalue() == b""
        monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out, encoding="utf-8"))
        assert cli._print_kept_listing() is True
        sys.stdout.flush()
        assert out.getvalue() == drawn.encode()
    finally:
        del os.environ["DSV4CTL_CACHE"]
