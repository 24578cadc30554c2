"""Pure cores of the promotion pipeline (dsv4ctl.deploy.promote): canary choice, the effective
gate, the check command lines, the verdict from a check child's exit code and JSON."""

from __future__ import annotations

import pytest
import yaml

from dsv4ctl.deploy.promote import (PromoteOptions, canary_check_args, check_argv, check_target, check_verdict, choose_canary,
                                    effective_options, first_deploy_canary, gate_settings)
from dsv4ctl.errors import InputError
from dsv4ctl.profile.model import load_profile

SERVE = {"model-path": "deepseek-ai/DeepSeek-V4-Flash", "tp-size": 8}


def _profile(tmp_path, groups, check=None):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(SERVE))
    prof = {"version": 1, "name": "t", "model": "deepseek-v4-flash",
            "hosts": [{"name": f"h{i}", "address": f"127.0.0.{i + 2}",
                       "gpus": {"model": "B200", "count": 8, "memory_mib": 183359}} for i in range(3)],
            "groups": groups}
    if check is not None:
        prof["check"] = check
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(prof))
    return load_profile(tmp_path / "p.yaml")


def _srv(name, role, host):
    return {"name": name, "role": role, "host": host, "gpus": list(range(8)), "tp": 8, "serve_config": "s.yaml"}


PD = [_srv("prefill", "prefill", "h0"), _srv("decode", "decode", "h1"),
      {"name": "router", "role": "router", "host": "h2", "port": 8000, "prefill": ["prefill"], "decode": ["decode"]}]


def test_canary_default_is_the_decode_groups_host(tmp_path):
    assert choose_canary(_profile(tmp_path, PD)) == ["h1"]


def test_canary_default_without_decode_is_the_first_server_groups_host(tmp_path):
    p = _profile(tmp_path, [_srv("a", "colocated", "h2"), _srv("b", "colocated", "h0")])
    assert choose_canary(p) == ["h2"]


def test_canary_by_group_or_host_and_unknown_name(tmp_path):
    p = _profile(tmp_path, PD)
    assert choose_canary(p, "prefill") == ["h0"]
    assert choose_canary(p, "router") == ["h2"]
    assert choose_canary(p, "h2") == ["h2"]
    with pytest.raises(InputError, match=r"--canary 'nope': not a group \(prefill, decode, router\) or host"):
        choose_canary(p, "nope")


def test_gate_settings_profile_then_options_then_check_defaults(tmp_path):
    p = _profile(tmp_path, PD, check={"concurrency": [20, 60], "max_corruption": 0.02, "turns": 3})
    assert gate_settings(p, PromoteOptions()) == {"concurrency": "20,60", "max_corruption": 0.02, "turns": 3,
                                                  "min_requests": None}
    assert gate_settings(p, PromoteOptions(concurrency="5", max_corruption=0.5, turns=1, min_requests=7)) == {
        "concurrency": "5", "max_corruption": 0.5, "turns": 1, "min_requests": 7}
    q = _profile(tmp_path, PD)
    assert gate_settings(q, PromoteOptions()) == {"concurrency": "64", "max_corruption": 0.01, "turns": 8,
                                                  "min_requests": None}


def test_check_argv_passes_only_overrides():
    assert check_argv("smoke", "/p.yaml", PromoteOptions(turns=2)) == ["check", "smoke", "--profile", "/p.yaml", "--json"]
    assert check_argv("load", "/p.yaml", PromoteOptions()) == ["check", "load", "--profile", "/p.yaml", "--json",
                                                               "--no-progress"]
    assert check_argv("load", "/p.yaml", PromoteOptions(concurrency="60", max_corruption=0.01, turns=2,
                                                         min_requests=0))[-8:] == [
        "--concurrency", "60", "--max-corruption", "0.01", "--turns", "2", "--min-requests", "0"]


def test_check_verdict():
    assert check_verdict("load", 0, {"pass": True}, "") == (True, "pass")
    assert check_verdict("load", 1, {"pass": False}, "dsv4ctl: gate failed: check load: X c=60: corruption 9 %") == (
        False, "check load: X c=60: corruption 9 %")
    # unreachable (exit 2) and a crash fail too; exit 0 with a report that says fail never passes
    assert check_verdict("smoke", 2, None, "dsv4ctl: error: check smoke: http://x unreachable") == (
        False, "check smoke: http://x unreachable")
    assert check_verdict("smoke", 0, {"pass": False}, "") == (False, "check smoke exited 0")
    assert check_verdict("load", -9, None, "") == (False, "check load exited -9")


def test_first_deploy_makes_every_host_the_canary():
    assert first_deploy_canary(["h1"], {"h0": None, "h1": None, "h2": None}) == ["h0", "h1", "h2"]
    assert first_deploy_canary(["h1"], {"h0": "r1", "h1": None, "h2": None}) == ["h1"]


def test_check_target_profile_entry_or_the_canary_url(tmp_path):
    pd = _profile(tmp_path, PD)
    assert check_target(pd, ["h1"]) == "http://127.0.0.4:8000"   # the router reaches the decode canary
    colo = _profile(tmp_path, [dict(_srv("a", "colocated", "h0"), port=31000), dict(_srv("b", "colocated", "h1"), port=32000)])
    assert check_target(colo, ["h0"]) == "http://127.0.0.2:31000"
    assert check_target(colo, ["h1"]) == "http://127.0.0.3:32000"
    assert check_target(colo, None) is None                  # everything switched: the profile
    # checks sent to the router: smoke reads the canary's facts from its workers, load scrapes the gateway
    router = "http://127.0.0.4:8000"
    # a smoke sent to a URL expects the profile's SGLang release (the workers report it)
    assert canary_check_args(pd, "smoke", router, ["h1"]) == ["--expect-version", "0.5.23", "--worker", "http://127.0.0.3:30000"]
    assert canary_check_args(pd, "load", router, ["h1"]) == ["--gateway-metrics", "http://127.0.0.4:29000/metrics"]
    assert canary_check_args(pd, "smoke", None, ["h1"]) == [] and canary_check_args(colo, "load", "http://127.0.0.2:31000", ["h0"]) == []
    assert canary_check_args(colo, "smoke", "http://127.0.0.2:31000", ["h0"]) == ["--expect-version", "0.5.23"]
    assert check_argv("smoke", "/p.yaml", PromoteOptions(), router, canary_check_args(pd, "smoke", router, ["h1"])) == [
        "check", "smoke", router, "--expect-version", "0.5.23", "--worker", "http://127.0.0.3:30000", "--json"]
    po = PromoteOptions(turns=3)
    assert effective_options(colo, po, None) is po
    e = effective_options(colo, po, "http://127.0.0.3:32000")
    assert (e.concurrency, e.max_corruption, e.turns) == ("64", 0.01, 3)
    assert check_argv("smoke", "/p", e, "http://x:1") == ["check", "smoke", "http://x:1", "--json"]
