"""``check smoke`` judges the release that runs (issue 45 item 1): every supported SGLang release
(0.5.18-0.5.23) passes a clean gate and fails a corrupt one. The expected version comes from the
profile (its tree's version, else ``sglang.version``) or ``--expect-version``; a bare URL accepts
any supported release and reports which it saw, with its output path (0.5.22 and older: the
``DeepSeekV4Detector`` path; 0.5.23: deepseek-recipe). Before: only 0.5.23 could pass
(``EXPECT_VERSION``), so a release of any other supported SGLang failed its promotion gate."""

from __future__ import annotations

import textwrap

import pytest

from dsv4ctl.check.smoke import Worker, judge_server_info, output_path
from tests.conftest import run_cli
from tests.standin.harness import free_port, standin, write_config

FAST = ("--ttft-ms", "1", "--itl-ms", "0")
SMALL = {"context_length": 8192, "max_total_tokens": 4096}   # short over_length / over_pool prompts
RELEASES = ("0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
PATHS = {"0.5.18": "detector", "0.5.19": "detector", "0.5.20": "detector", "0.5.21": "detector",
         "0.5.22": "detector", "0.5.23": "deepseek-recipe"}


def profile(d, port: int, version: str):
    """A colocated profile of release ``version`` whose one server is the stand-in on ``port``."""
    write_config(d / "s.yaml", port=port, **SMALL)
    p = d / f"p-{version}.yaml"
    p.write_text(textwrap.dedent(f"""\
        version: 1
        name: standin-{version.replace('.', '-')}
        model: deepseek-v4-flash
        sglang: {{version: "{version}"}}
        hosts:
          - name: local
            address: 127.0.0.1
            gpus: {{model: NVIDIA B200, count: 8, memory_mib: 183359}}
        groups:
          - {{name: serve, role: colocated, host: local, gpus: [0, 1, 2, 3], tp: 4, serve_config: s.yaml}}
        """))
    return p


@pytest.mark.parametrize("version", RELEASES)
def test_every_release_passes_clean_and_fails_corrupt(tmp_path, version):
    port = free_port()
    prof = profile(tmp_path, port, version)
    with standin(tmp_path / "s.yaml", *FAST, "--sglang-version", version, port=port):
        r = run_cli("check", "smoke", "--profile", str(prof), "--json")
        assert r.code == 0, r.err
        doc = r.json()
        assert doc["pass"] and all(c["status"] == "pass" for c in doc["checks"]), doc["checks"]
        assert doc["sglang"] == {"expected": version, "source": "profile sglang.version", "seen": [version],
                                 "output_paths": {version: PATHS[version]}}
        info = [c for c in doc["checks"] if c["check"] == "server_info"][0]
        assert info["reason"].startswith(f"{version}, parsers deepseekv4/deepseek-v4")
        assert (info["detail"]["version"], info["detail"]["output_path"]) == (version, PATHS[version])
    # corrupt answers on the release's own output path: a DSML block with other bars leaks into
    # content on both paths; a string="false" value that is not JSON breaks the arguments (0.5.23:
    # not JSON; 0.5.18-0.5.22: the detector makes it a string and the known answer has no such key)
    bad = write_config(tmp_path / "bad.yaml", **SMALL)
    for fault, why in (("other_bars", ("dsml_in_content:",)),
                       ("bad_json_value", ("args_not_json:",) if version == "0.5.23" else ("missing_call:", "wrong_args:"))):
        with standin(bad, *FAST, "--sglang-version", version, "--fault", fault) as url:
            r = run_cli("check", "smoke", url, "--json")
            assert r.code == 1 and r.err.startswith("dsv4ctl: gate failed: check smoke: "), r.err
            doc = r.json()
            assert doc["sglang"] == {"expected": None, "source": "any supported release (no profile, no --expect-version)",
                                     "seen": [version], "output_paths": {version: PATHS[version]}}
            st = {c["check"]: (c["status"], c["reason"]) for c in doc["checks"]}
            assert st["server_info"][0] == "pass"
            assert st["tool_call"][0] == "fail" and st["tool_call"][1].startswith(why), (fault, st["tool_call"])
            assert st["tool_call_stream"][0] == "fail" and st["tool_call_stream"][1].startswith(why)


@pytest.mark.parametrize("version", ("0.5.22", "0.5.23"))
def test_markup_sampled_as_text_is_judged_by_the_release_output_path(tmp_path, version):
    """A DSML block sampled as ordinary tokens (the 0.5.23 incident): deepseek-recipe recognizes
    the tags by token ID, so the block reaches content (tool_call fails); 0.5.22 decodes to text and
    its regex detector parses the same characters into the call (tool_call passes). Both fail the
    plain chat probe: there the block is prose's tail on either path."""
    cfg = write_config(tmp_path / "s.yaml", **SMALL)
    with standin(cfg, *FAST, "--sglang-version", version, "--fault", "markup_as_text") as url:
        r = run_cli("check", "smoke", url, "--json")
        st = {c["check"]: (c["status"], c["reason"]) for c in r.json()["checks"]}
    assert r.code == 1 and st["chat"][0] == "fail" and st["chat"][1].startswith("dsml_in_content:")
    if version == "0.5.23":
        assert st["tool_call"][0] == "fail" and st["tool_call"][1].startswith("dsml_in_content:")
    else:
        assert st["tool_call"][0] == "pass" and st["tool_call_stream"][0] == "pass", st


def test_known_answers_are_compared_as_the_release_delivers_them():
    """0.5.18-0.5.22's detector strips string parameters (deepseekv32_detector.py): on that path a
    known answer is compared stripped, exactly on 0.5.23's (and when the path is unknown)."""
    from dsv4ctl.check.classify import ToolCall
    from dsv4ctl.check.expect import compare_calls
    expected = [{"name": "write_file", "arguments": {"path": "a.txt", "content": "line 1\n", "mode": 420}}]
    got = [ToolCall(0, "c1", "write_file", '{"path": "a.txt", "content": "line 1", "mode": 420}')]
    assert compare_calls(expected, got, "detector") == {}
    for path in ("deepseek-recipe", None):
        assert compare_calls(expected, got, path) == {
            "wrong_args": "call 0 'write_file': key 'content': got \"line 1\", expected \"line 1\\n\""}
    got[0] = ToolCall(0, "c1", "write_file", '{"path": "b.txt", "content": "line 1", "mode": 420}')
    assert "wrong_args" in compare_calls(expected, got, "detector")        # stripped, still another value


def test_another_release_than_expected_fails_and_bad_versions_are_usage_errors(tmp_path):
    port = free_port()
    prof = profile(tmp_path, port, "0.5.22")        # the profile ships 0.5.22, the server runs 0.5.23
    with standin(tmp_path / "s.yaml", *FAST, port=port) as url:
        r = run_cli("check", "smoke", "--profile", str(prof), "--json")
        assert r.code == 1
        info = [c for c in r.json()["checks"] if c["check"] == "server_info"][0]
        assert (info["status"], info["reason"]) == ("fail", "version '0.5.23', expected 0.5.22")
        r = run_cli("check", "smoke", url, "--expect-version", "v0.5.23")      # a tag spelling
        assert r.code == 0, r.err
        assert "SGLang seen: 0.5.23 (deepseek-recipe output path); expected: 0.5.23 (--expect-version)" in r.out
    for bad, why in (("0.5.17", "SGLang 0.5.17 is not supported"), ("latest", "'latest' is not an SGLang version")):
        r = run_cli("check", "smoke", "http://127.0.0.1:1", "--expect-version", bad)
        assert r.code == 2 and r.err.startswith("dsv4ctl: error: --expect-version: ") and why in r.err, r.err


def test_judge_server_info_takes_the_release():
    good = {"version": "0.5.20", "tool_call_parser": "deepseekv4", "reasoning_parser": "deepseek-v4"}
    w = Worker("w", "u")
    assert judge_server_info(good, w)["status"] == "pass"                        # any supported release
    assert judge_server_info(good, w, "0.5.20")["status"] == "pass"
    r = judge_server_info(good, w, "0.5.23")
    assert (r["status"], r["reason"]) == ("fail", "version '0.5.20', expected 0.5.23")
    r = judge_server_info({**good, "version": "0.5.24"}, w)
    assert r["status"] == "fail" and r["reason"] == ("version '0.5.24', expected a supported SGLang release "
                                                     "(0.5.18, 0.5.19, 0.5.20, 0.5.21, 0.5.22, 0.5.23)")
    assert [output_path(v) for v in RELEASES] == [PATHS[v] for v in RELEASES]
    assert output_path("0.5.24") is None and output_path(None) is None
