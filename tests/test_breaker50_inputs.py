"""Bad inputs to this session's additions, found by trying to break them (one-line errors, exit 2)."""
import subprocess
import sys

import pytest
import yaml

from dsv4ctl.watch.rules import render_rules


@pytest.mark.parametrize("url", ["http://x/a\x01", "http://x/a\x7f", "http://x/a\x9b", "http://x/" + "a" * 2000])
def test_runbook_url_with_control_characters_or_huge_is_refused(url):
    # \x01 was accepted and printed into a rule file YAML (and Prometheus) cannot load
    with pytest.raises(ValueError, match="runbook URL"):
        render_rules(runbook_url=url)


def test_runbook_url_unicode_and_longest_still_load():
    for url in ("http://wiki.example/é", "http://x/" + "a" * 1983):
        yaml.safe_load(render_rules(runbook_url=url))


def test_runbook_url_control_character_cli_one_line_exit_2():
    r = subprocess.run([sys.executable, "-m", "dsv4ctl", "watch", "--print", "rules", "--runbook-url", "http://x/a\x01"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, r
    assert "control characters" in r.stderr


def _report(tmp_path, *args):
    plan = tmp_path / "plan.json"
    if not plan.exists():
        r = subprocess.run([sys.executable, "-m", "dsv4ctl", "plan", "--json"], capture_output=True, text=True,
                           cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        plan.write_text(r.stdout)
    return subprocess.run([sys.executable, "-m", "dsv4ctl", "report", str(plan), "-o", str(tmp_path / "r.html"),
                           *args], capture_output=True, text=True, cwd=tmp_path)


def test_report_svg_bad_folders_fail_before_the_page_is_written(tmp_path):
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    for bad, words in (("dangling", "a link to nothing"), ("", "expected a folder name"),
                       ("file/sub", "Not a directory"), ("file", "not a folder")):
        r = _report(tmp_path, "--svg", bad)
        # dangling/'': the page was written, then exit 2 ('File exists'); '' wrote the charts into the cwd
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and words in r.stderr, (bad, r)
        assert not (tmp_path / "r.html").exists(), bad
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "file", "plan.json"]


def test_report_temporary_names_never_write_through_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "svgs").mkdir()
    r = _report(tmp_path, "--svg", "svgs")
    name = next((tmp_path / "svgs").iterdir()).name
    (tmp_path / "svgs" / f".{name}.tmp").symlink_to(victim)
    (tmp_path / ".r.html.tmp").symlink_to(victim)
    r = _report(tmp_path, "--svg", "svgs")
    assert r.returncode == 0, r
    assert victim.read_text() == "keep"
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE") and not (tmp_path / "r.html").is_symlink()


def test_mask_secrets_is_linear_on_long_words():
    # exec prints each output line through mask_secrets: a 100 kB word took 70 s (the URL
    # userinfo pattern was tried at every letter and scanned the rest of the word each time)
    import time
    from dsv4ctl.deploy.steps import mask_secrets
    t = time.monotonic()
    assert mask_secrets("a" * 200_000) == "a" * 200_000
    assert mask_secrets("a1" * 100_000) == "a1" * 100_000
    assert time.monotonic() - t < 3
    # the same masks as before: the scheme's first letter, after digits or inside a word
    assert mask_secrets("1git+https://tok:pw1@h x://u:p@h 12://u:keep@h") == \
        "1git+https://tok:***@h x://u:***@h 12://u:keep@h"


def test_registry_auth_file_fifo_device_folder_huge_are_refused(tmp_path):
    # a FIFO blocked the deploy forever (open waited for a writer); /dev/zero was read to memory's end
    import os
    from dsv4ctl.deploy.image import auth_bytes
    from dsv4ctl.errors import InputError
    from tests.test_image_core import _img
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "big.json").write_text('{"auths": {}, "x": "' + "a" * (1 << 20) + '"}')
    (tmp_path / "link.json").symlink_to(tmp_path / "fifo")
    for f in ("fifo", "link.json", "big.json", "/dev/zero", str(tmp_path)):
        with pytest.raises(InputError, match="not a regular file of at most 1024 KiB"):
            auth_bytes(_img(registry_auth_file=tmp_path / f))
    (tmp_path / "ok.json").write_text('{"auths": {}}')
    (tmp_path / "ok.json").chmod(0o600)
    (tmp_path / "ok-link.json").symlink_to(tmp_path / "ok.json")
    assert auth_bytes(_img(registry_auth_file=tmp_path / "ok-link.json")) == b'{"auths": {}}'
    deep = tmp_path / "deep.json"        # nested past json's recursion limit: RecursionError escaped (breaker)
    deep.write_text("[" * 100_000 + "]" * 100_000)
    deep.chmod(0o600)
    with pytest.raises(InputError, match="not a containers auth.json"):
        auth_bytes(_img(registry_auth_file=deep))


def test_upgrade_gate_sizing_refuses_what_it_cannot_run(tmp_path):
    # delta 0.0001 over 1 % sized for hours (deploy --promote --dry-run never ended); pairs 10**23
    # was accepted and gave check load a --turns it refuses (after the canary's switch)
    import time
    from pathlib import Path
    from dsv4ctl.check.paired import plan_pairs
    from dsv4ctl.commands.options import MAX_TURNS
    from dsv4ctl.deploy.promote import MAX_AB_TURNS, PromoteOptions, compare_sizing
    from dsv4ctl.errors import InputError
    from dsv4ctl.profile.model import load_profile
    assert MAX_AB_TURNS == MAX_TURNS
    t = time.monotonic()
    with pytest.raises(ValueError, match="needs more than 200,000 pairs"):
        plan_pairs(0.01, 0.0001)
    assert time.monotonic() - t < 5
    assert plan_pairs() == 1984
    src = Path(__file__).parent.parent / "profiles"
    text = (src / "dsv4-flash-8xb200-pd.yaml").read_text().replace("series: ../patches", f"series: {src.parent}/patches")
    import shutil
    shutil.copytree(src / "dsv4-flash-8xb200-pd", tmp_path / "dsv4-flash-8xb200-pd")
    for compare, words in (("{delta: 0.0001}", "needs more than 200,000 pairs"),
                           ("{pairs: 100000000000000000000000}", "check load runs at most 10,000")):
        p = tmp_path / "p.yaml"
        p.write_text(text.replace("  max_corruption: 0.01\n", f"  max_corruption: 0.01\n  compare: {compare}\n"))
        with pytest.raises(InputError, match=words):
            compare_sizing(load_profile(p), ["b200-0"], PromoteOptions())


@pytest.mark.parametrize("words", [[""], ["  ", "\t"]])
def test_exec_empty_command_is_usage(words):
    # -- '' ran sh -c '' on every host (exit 0, an audit line of nothing); no host is reached now
    from tests.conftest import REPO, run_cli
    r = run_cli("exec", "decode", str(REPO / "profiles/dsv4-flash-8xb200-pd.yaml"), "--dry-run", "--", *words)
    assert r.code == 2 and "give the command after --" in r.err and r.out == "", r


def test_csv_text_cells_never_start_a_formula():
    # a host named =cmd|x was written as is: a spreadsheet opening plan --csv runs it
    from dsv4ctl.report.csvout import to_csv
    text = to_csv(["host", "n", "x"], [["=cmd|' /C calc'!A0", -1.5, "+1"], ["@SUM(1)", 0, "-x"], ["ok", 2, "a=b"]])
    assert text.splitlines() == ["host,n,x", "'=cmd|' /C calc'!A0,-1.5,'+1", "'@SUM(1),0,'-x", "ok,2,a=b"]


def test_exec_dry_run_shows_control_characters_escaped():
    # ESC/BEL in the command went raw to the operator's terminal in the dry run (recolour, retitle)
    from tests.conftest import REPO, run_cli
    # a byte that is not UTF-8 (0x9b, an 8-bit CSI) went raw too, or, on a strict UTF-8 stdout
    # (PYTHONIOENCODING=utf-8), was a UnicodeEncodeError traceback (exit 1)
    from dsv4ctl.render import printable
    assert printable("a\udc9bb\udcff") == "a\\x9bb\\xff"
    r = run_cli("exec", "decode", str(REPO / "profiles/dsv4-flash-8xb200-pd.yaml"), "--dry-run", "--",
                "echo", "a\x1b[31mred\x07", "\udc9b", env={"PYTHONIOENCODING": "utf-8"})
    assert r.code == 0, r.err
    assert "\x1b" not in r.out and "\x07" not in r.out
    assert "as group decode: echo a\\x1b[31mred\\x07 \\x9b" in r.out, r.out
