"""Issue 13, inputs of deploy/rollback/hicache --remote: a health timeout that is not a finite
number of seconds > 0 is refused before anything is read (it used to hang forever holding every
host's lock on ``nan``); a malformed host ``state.json`` (or launch.json / RELEASE.json) is a
one-line error naming the host and the path, exit 3, never a traceback."""

from __future__ import annotations

import json

import pytest

from dsv4ctl.hosts.layout import StateFileError, parse_facts, parse_state
from tests.conftest import REPO, run_cli

PROFILE = str(REPO / "profiles" / "dsv4-flash-8xb200-pd.yaml")


@pytest.mark.parametrize("argv", [
    ["deploy", PROFILE, "--health-timeout", "nan"],
    ["deploy", PROFILE, "--health-timeout", "-5"],
    ["deploy", PROFILE, "--health-timeout", "inf"],
    ["deploy", PROFILE, "--health-timeout", "0", "--dry-run"],
    ["rollback", PROFILE, "--health-timeout", "nan"],
    ["hicache", "off", PROFILE, "--remote", "--health-timeout", "-5"],
])
def test_bad_health_timeout_is_refused_before_anything(argv):
    r = run_cli(*argv, timeout=60)
    assert r.code == 2, (r.out, r.err)
    assert r.err.startswith("dsv4ctl: error: --health-timeout ") and ("expected a duration" in r.err or "expected more than 0s" in r.err)
    assert len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err


@pytest.mark.parametrize("body, why", [
    ("{not json", "not JSON"),
    ("[1, 2]", "a JSON list, not an object"),
    ('{"releases": [1]}', "releases is not {id: {state, ...}}"),
    ('{"releases": {"r1": 5}}', "releases.r1 is not an object"),
    ('{"releases": {"r1": {"state": "good", "activated_at": 5}}}', "releases.r1.activated_at is not text"),
    ('{"releases": {"r1": {"state": ["good"]}}}', "releases.r1.state is not text"),
    ("[" * 100000 + "]" * 100000, "not JSON"),
])
def test_malformed_state_json_names_host_and_path(body, why):
    with pytest.raises(StateFileError) as e:
        parse_state("h3", "/srv/dsv4ctl", body)
    msg = str(e.value)
    assert msg.startswith("h3: /srv/dsv4ctl/state.json is not a dsv4ctl state document (") and why in msg
    assert "\n" not in msg and e.value.exit_code == 3


def test_malformed_launch_and_release_json_are_one_line_errors():
    for sec, body, want in [("launch", "{oops", "/srv/current/launch.json"),
                            ("launch", '{"g": 1}', "/srv/current/launch.json"),
                            ("launch", '[]', "/srv/current/launch.json"),
                            ("release", "[]", "a RELEASE.json under /srv/releases"),
                            ("release", '{"no": "id"}', "a RELEASE.json under /srv/releases")]:
        with pytest.raises(StateFileError) as e:
            parse_facts("h0", "/srv", f"@{sec}\n{body}\n@end\n")
        assert str(e.value).startswith("h0: ") and want in str(e.value)


@pytest.mark.sshd
def test_malformed_state_json_on_a_host_exit_3_one_line(live_cluster, tmp_path):
    from tests.sshd.world import World
    w = World(live_cluster, tmp_path)
    try:
        root = w.roots["h2"]
        root.mkdir(parents=True)
        (root / "state.json").write_text('{"releases": {"r1": {"state": "good", "pushed_at": 17}}}')
        for cmd in (["deploy"], ["rollback"], ["releases"], ["status"], ["verify"]):
            r = run_cli(*cmd, str(w.profile), env=w.env(), timeout=180)
            assert r.code == 3, (cmd, r.out, r.err)
            assert f"h2: {root}/state.json is not a dsv4ctl state document (releases.r1.pushed_at is not text)" in r.err
            errors = [ln for ln in r.err.splitlines() if ln.startswith("dsv4ctl: error:")]
            assert "Traceback" not in r.err and len(errors) == 1 and "state.json" in errors[0], (cmd, r.err)
        assert json.loads((root / "state.json").read_text())["releases"]["r1"]["pushed_at"] == 17   # untouched
        assert not (root / ".lock").exists() and not any(w.roots[h].joinpath(".lock").exists() for h in w.roots)
    finally:
        w.stop_services()


from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: E402,F401
