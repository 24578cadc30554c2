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
    # the same release with every turn's DSML block sampled as plain text: markup in content
    bad = write_config(tmp_path / "bad.yaml", **SMALL)
    with standin(bad, *FAST, "--sglang-version", version, "--fault", "markup_as_text") as url:
        r = run_cli("check", "smoke", url, "--json")
        assert r.code == 1 and r.err.startswith("dsv4ctl: gate failed: check smoke: "), r.err
        doc = r.json()
        assert doc["sglang"] == {"expected": None, "source": "any supported release (no profile, no --expect-version)",
                                 "seen": [version], "output_paths": {version: PATHS[version]}}
        st = {c["check"]: (c["status"], c["reason"]) for c in doc["checks"]}
        assert st["server_info"][0] == "pass"
        assert st["tool_call"][0] == "fail" and st["tool_call"][1].startswith("dsml_in_content:")


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
