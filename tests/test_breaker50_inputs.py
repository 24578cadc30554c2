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
