"""``dsv4ctl check smoke`` and profile targets, end to end against stand-in servers over real HTTP."""

from __future__ import annotations

import json
import re
import textwrap
import urllib.request

import pytest

from dsv4ctl.check.smoke import Worker, judge_server_info
from tests.conftest import run_cli
from tests.standin.harness import free_port, standin, write_config

FAST = ("--ttft-ms", "1", "--itl-ms", "0")

PROBES = ["replay", "tool_choice_none", "tool_choice_required", "tool_choice_named", "over_length", "over_pool",
          "prompt_tokens"]
POOL = {"max_total_tokens": 16384}     # a KV pool smaller than the context length (65,536): the over_pool band
# Lines the clean stand-in fails (none: it honours tool_choice, the known-answer contract and the
# context length).
STANDIN_FAILS: dict[str, str] = {}
OK_CODE = 1 if STANDIN_FAILS else 0


def assert_all_pass_but_standin_fails(checks: list[dict]) -> None:
    for c in checks:
        if c["check"] in STANDIN_FAILS:
            assert c["status"] == "fail" and c["reason"].startswith(STANDIN_FAILS[c["check"]]), c
        elif c["check"] == "over_pool" and c["status"] == "skip":
            # a config without max-total-tokens: the stand-in's pool holds a full-context request
            assert "holds a full-context request" in c["reason"], c
        else:
            assert c["status"] == "pass", c


def statuses(doc: dict) -> dict:
    return {(c["check"], c["target"]): c["status"] for c in doc["checks"]}


def test_smoke_url_all_pass(tmp_path):
    cfg = write_config(tmp_path / "s.yaml", enable_hierarchical_cache=True, hicache_ratio=2.0,
                       disaggregation_mode="prefill", disaggregation_bootstrap_port=free_port(), **POOL)
    with standin(cfg, *FAST) as url:
        r = run_cli("check", "smoke", url, "--json")
        assert r.code == OK_CODE, r.err
        doc = r.json()
        assert doc["pass"] == (not STANDIN_FAILS) and [c["check"] for c in doc["checks"]] == [
            "health", "models", "server_info", "chat", "tool_call", "tool_call_stream"] + PROBES[:1] + ["load_back"] + PROBES[1:]
        assert_all_pass_but_standin_fails(doc["checks"])
        info = [c for c in doc["checks"] if c["check"] == "server_info"][0]
        assert info["reason"] == ("0.5.23, parsers deepseekv4/deepseek-v4, disaggregation prefill, "
                                  "HiCache on (ratio 2.0, write_through)")
        tc = [c for c in doc["checks"] if c["check"] == "tool_call_stream"][0]
        assert tc["reason"].startswith("read_file(") and tc["detail"]["rid"].startswith("dsv4ctl-smoke-")
        r = run_cli("check", "smoke", url, "--markdown")
        assert r.code == OK_CODE and "| tool_call | " + url + " | pass |" in r.out
        r = run_cli("check", "smoke", url)
        assert r.code == OK_CODE and "dsv4ctl check smoke" in r.out


def test_smoke_without_tool_call_parser_fails(tmp_path):
    # field report T1 / reference §8.5: no parser → raw DSML in content, no tool_calls
    cfg = write_config(tmp_path / "s.yaml", tool_call_parser=None)
    with standin(cfg, *FAST) as url:
        r = run_cli("check", "smoke", url, "--json")
        assert r.code == 1
        doc = r.json()
        st = statuses(doc)
        assert st[("health", url)] == "pass" and st[("chat", url)] == "pass"
        assert st[("server_info", url)] == "fail" and st[("tool_call", url)] == "fail"
        reasons = {c["check"]: c["reason"] for c in doc["checks"]}
        assert "tool_call_parser None, expected 'deepseekv4'" in reasons["server_info"]
        assert reasons["tool_call"].startswith("dsml_in_content:")
        assert reasons["tool_call_stream"].startswith("dsml_in_content:")
        assert reasons["tool_choice_required"].startswith("dsml_in_content:")      # forced calls are not parsed either
        assert reasons["tool_choice_named"].startswith("dsml_in_content:")
        assert st[("prompt_tokens", url)] == "pass"
        assert re.match(r"dsv4ctl: gate failed: check smoke: \d+ check\(s\) failed: server_info", r.err)


def test_smoke_unreachable_and_usage_exit_2():
    port = free_port()
    dead = f"http://127.0.0.1:{port}"
    r = run_cli("check", "smoke", dead)
    assert r.code == 2 and r.err == f"dsv4ctl: error: check smoke: cannot connect to 127.0.0.1:{port} (connection refused)\n"
    assert "fail" in r.out and "Traceback" not in r.err
    r = run_cli("check", "smoke")
    assert r.code == 2 and "give a URL or --profile" in r.err
    r = run_cli("check", "smoke", "ftp://x")
    assert r.code == 2 and "must start with http://" in r.err


def test_judge_server_info_pure():
    good = {"version": "0.5.23", "tool_call_parser": "deepseekv4", "reasoning_parser": "deepseek-v4",
            "disaggregation_mode": "null", "enable_hierarchical_cache": False}
    assert judge_server_info(good, Worker("w", "u"))["status"] == "pass"
    assert judge_server_info(good, Worker("w", "u", hicache_configured=False))["status"] == "pass"
    r = judge_server_info(good, Worker("w", "u", hicache_configured=True))
    assert r["status"] == "fail" and r["reason"] == "HiCache running off but the serve config says on"
    # the release that runs is expected (issue 45 item 1: before, 0.5.23 whatever the release)
    r = judge_server_info({**good, "version": "0.5.22", "reasoning_parser": None}, Worker("w", "u"), "0.5.23")
    assert r["reason"] == "version '0.5.22', expected 0.5.23; reasoning_parser None, expected 'deepseek-v4'"
    assert judge_server_info([], Worker("w", "u"))["status"] == "fail"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """Three stand-ins as a PD deployment: prefill (HiCache on), decode, and one as the router."""
    d = tmp_path_factory.mktemp("pd")
    pp, dp, rp = free_port(), free_port(), free_port()
    pcfg = write_config(d / "prefill.yaml", port=pp, disaggregation_mode="prefill", enable_hierarchical_cache=True,
                        hicache_ratio=2.0, disaggregation_bootstrap_port=free_port(), **POOL)
    dcfg = write_config(d / "decode.yaml", port=dp, disaggregation_mode="decode", **POOL)
    rcfg = write_config(d / "router.yaml", port=rp, **POOL)
    write_config(d / "decode-claims-hicache.yaml", port=dp, disaggregation_mode="decode", enable_hierarchical_cache=True)
    profile = textwrap.dedent(f"""\
        version: 1
        name: standin-pd
        model: deepseek-v4-flash
        check: {{concurrency: 8, turns: 2, max_corruption: 0.1}}
        hosts:
          - name: local
            address: 127.0.0.1
            gpus: {{model: NVIDIA B200, count: 8, memory_mib: 183359}}
        groups:
          - {{name: prefill, role: prefill, host: local, gpus: [0, 1, 2, 3], tp: 4, serve_config: prefill.yaml}}
          - {{name: decode, role: decode, host: local, gpus: [4, 5, 6, 7], tp: 4, serve_config: DECODE}}
          - {{name: router, role: router, host: local, port: {rp}, prefill: [prefill], decode: [decode]}}
        """)
    (d / "pd.yaml").write_text(profile.replace("DECODE", "decode.yaml"))
    (d / "pd-mismatch.yaml").write_text(profile.replace("DECODE", "decode-claims-hicache.yaml"))
    (d / "pd-two-routers.yaml").write_text(profile.replace("DECODE", "decode.yaml") + f"  - {{name: router-b, role: router, "
                                           f"host: local, port: {free_port()}, prefill: [prefill], decode: [decode]}}\n")
    with standin(pcfg, *FAST, port=pp), standin(dcfg, *FAST, port=dp), standin(rcfg, *FAST, port=rp) as router:
        yield {"dir": d, "router": router, "prefill": f"http://127.0.0.1:{pp}", "decode": f"http://127.0.0.1:{dp}"}


def test_smoke_profile(deployment):
    r = run_cli("check", "smoke", "--profile", str(deployment["dir"] / "pd.yaml"), "--json")
    assert r.code == OK_CODE, r.err
    doc = r.json()
    assert doc["entry"] == deployment["router"]
    st = statuses(doc)
    assert st == {("health", "prefill"): "pass", ("health", "decode"): "pass", ("models", deployment["router"]): "pass",
                  ("server_info", "prefill"): "pass", ("server_info", "decode"): "pass",
                  ("chat", deployment["router"]): "pass", ("tool_call", deployment["router"]): "pass",
                  ("tool_call_stream", deployment["router"]): "pass",
                  **{(p, deployment["router"]): "fail" if p in STANDIN_FAILS else "pass" for p in PROBES},
                  # the prefill runs HiCache; the stand-in router answers from its own cache, which
                  # keeps no host tier: the prompt is computed afresh, so no load-back to judge
                  ("load_back", deployment["router"]): "skip"}
    infos = {c["target"]: c["detail"] for c in doc["checks"] if c["check"] == "server_info"}
    assert (infos["prefill"]["enable_hierarchical_cache"], infos["decode"]["enable_hierarchical_cache"]) == (True, False)
    assert infos["decode"]["disaggregation_mode"] == "decode"


def test_smoke_profile_hicache_mismatch(deployment):
    r = run_cli("check", "smoke", "--profile", str(deployment["dir"] / "pd-mismatch.yaml"), "--json")
    assert r.code == 1
    bad = [c for c in r.json()["checks"] if c["status"] == "fail" and c["check"] not in STANDIN_FAILS]
    assert [(c["check"], c["target"], c["reason"]) for c in bad] == [
        ("server_info", "decode", "HiCache running off but the serve config says on")]


def test_load_profile_uses_router_and_profile_defaults(deployment):
    r = run_cli("check", "load", "--profile", str(deployment["dir"] / "pd.yaml"), "--min-requests", "40",
                "--answer-words", "20", "--json", "--no-progress")
    assert r.code == 0, r.err                    # 0/40 passes the profile's 10 % gate
    doc = r.json()
    assert doc["settings"]["urls"] == [deployment["router"]] and doc["max_corruption"] == 0.1
    lv = doc["levels"][0]
    assert (lv["concurrency"], lv["turns"], lv["corrupted"]) == (8, 40, 0)
    # /metrics are scraped from the prefill and decode servers (which got none of the router's traffic)
    assert lv["metrics"].get("sglang:num_requests_total", 0) == 0
    assert lv["metrics"]["sglang:num_aborted_requests_total"] == 0 and "sglang:num_running_reqs" in lv["metrics"]


def test_load_profile_pd_without_a_router_refuses_and_sends_nothing(deployment):
    """A PD profile without a router: check load --profile sent its load to the prefill (the
    first server group), which never decodes; now exit 2, one line saying why and what to do,
    and no chat reaches any server. The same profile with its router passes (above)."""
    d = deployment["dir"]
    text = (d / "pd.yaml").read_text()
    (d / "pd-no-router.yaml").write_text("\n".join(ln for ln in text.splitlines() if "role: router" not in ln) + "\n")
    def chats():
        return [sum(x["path"] == "/v1/chat/completions" for x in json.loads(urllib.request.urlopen(
            u + "/_standin/requests").read())["requests"]) for u in (deployment["prefill"], deployment["decode"])]
    before = chats()
    r = run_cli("check", "load", "--profile", str(d / "pd-no-router.yaml"), "--min-requests", "8", "--no-progress")
    assert r.code == 2 and r.out == ""
    assert r.err.strip() == (f"dsv4ctl: error: check load --profile {d / 'pd-no-router.yaml'}: PD groups (prefill, decode) "
                             "and no router group: load sent to the prefill alone never decodes; add a router group "
                             "(role: router, prefill: [...], decode: [...]) to the profile, or give the router's URL: "
                             "dsv4ctl check load http://ROUTER:PORT")
    assert chats() == before
    # check smoke --profile the same (it sent its chats to the prefill: a failed gate, exit 1)
    r = run_cli("check", "smoke", "--profile", str(d / "pd-no-router.yaml"), "--json")
    assert r.code == 2 and r.out == ""
    assert r.err.strip() == (f"dsv4ctl: error: check smoke --profile {d / 'pd-no-router.yaml'}: PD groups (prefill, "
                             "decode) and no router group: chats sent to the prefill alone never decode; add a router "
                             "group (role: router, prefill: [...], decode: [...]) to the profile, or give the router's "
                             "URL: dsv4ctl check smoke http://ROUTER:PORT")
    assert chats() == before
    # and promote's canary checks (sent to the first server on the canary host) refuse before any switch
    from dsv4ctl.deploy.promote import check_target
    from dsv4ctl.errors import InputError
    from dsv4ctl.profile.deployment import load_deployment
    dep = load_deployment(str(d / "pd-no-router.yaml"))
    for canary in (None, [dep.groups["prefill"].group.host]):
        with pytest.raises(InputError, match=r"^deploy --promote .*pd-no-router.yaml: PD groups \(prefill, decode\) and "
                           r"no router group: the gate's chats sent to the prefill or decode alone get no answer; add a "
                           r"router group \(role: router, prefill: \[\.\.\.\], decode: \[\.\.\.\]\) to the profile$"):
            check_target(dep, canary)
    assert check_target(load_deployment(str(d / "pd.yaml")), None) is None


def test_api_key_is_sent_and_never_printed(tmp_path):
    key = "s3cret-token-1234"
    cfg = write_config(tmp_path / "s.yaml", api_key=key)
    with standin(cfg, *FAST) as url:
        r = run_cli("check", "smoke", url, "--json")
        # no key: the client's problem, no verdict (before: failed lines, exit 1)
        hp = url.split("://")[1]
        assert r.code == 2 and r.out == "" and r.err.strip() == (
            f"dsv4ctl: error: check smoke: {hp} needs an API key (HTTP 401 for GET /v1/models): "
            "set DSV4CTL_API_KEY or the serve config's api-key")
        r = run_cli("check", "smoke", url, "--json", env={"DSV4CTL_API_KEY": key})
        assert r.code == OK_CODE, r.out
        assert_all_pass_but_standin_fails(r.json()["checks"])
        assert key not in r.out and key not in r.err
        r = run_cli("check", "load", url, "-c", "4", "--turns", "2", "--min-requests", "8", "--max-corruption", "0.9",
                    "--records", str(tmp_path / "r.jsonl"), "--json", env={"DSV4CTL_API_KEY": key})
        assert r.code == 0, r.err
        assert r.json()["levels"][0]["turns"] == 8
        assert key not in r.out + r.err + (tmp_path / "r.jsonl").read_text()
        r = run_cli("check", "load", url, "-c", "4", "--no-progress")
        assert r.code == 2 and "needs an API key (HTTP 401 for GET /v1/models)" in r.err
        r = run_cli("check", "load", url, "-c", "4", "--no-progress", "--model", "m", "--api-key", "other-key")
        assert r.code == 2 and r.err.strip() == (
            f"dsv4ctl: error: check load: {hp} refuses the API key (HTTP 401 for POST /v1/chat/completions): "
            "set DSV4CTL_API_KEY or the serve config's api-key")


def test_judge_server_info_cuts_long_server_values():
    good = {"version": "0.5.23", "tool_call_parser": "deepseekv4", "reasoning_parser": "deepseek-v4"}
    r = judge_server_info({**good, "version": "9" * 5000, "tool_call_parser": list(range(1000))}, Worker("w", "u"),
                          "0.5.23")
    assert r["status"] == "fail"
    # cut to 80 characters with "…": inside one long word, else at a field boundary (before: "...")
    assert r["reason"].startswith("version '" + "9" * 79 + "…', expected 0.5.23; tool_call_parser '[0, 1, 2")
    assert ", 20, 21…', expected 'deepseekv4'" in r["reason"]
    assert len(r["reason"]) < 300 and len(r["detail"]["version"]) == 80
    r = judge_server_info({**good, "enable_hierarchical_cache": True, "hicache_write_policy": "p" * 1000},
                          Worker("w", "u"))
    assert r["status"] == "pass" and r["reason"].endswith("(ratio None, " + "p" * 79 + "…)")


def test_load_profile_says_which_router_metrics_are_scraped(deployment):
    # before: the first router's gateway metrics were scraped silently; now the document and the
    # report say which router (the entry: the only one the traffic goes to) and which are not
    base = ("check", "load", "--profile", str(deployment["dir"] / "pd-two-routers.yaml"), "--min-requests", "8",
            "-c", "2", "--answer-words", "20", "--no-progress", "--max-corruption", "0.5")
    r = run_cli(*base, "--json")
    assert r.code == 0, r.err
    s = r.json()["settings"]
    want = (f"gateway metrics: {s['gateway_metrics']} of router group router, the entry the "
            "check's traffic goes to (not scraped: router group(s) router-b, which get none of it)")
    assert s["urls"] == [deployment["router"]] and s["gateway_scope"] == want
    r = run_cli(*base)
    assert r.code == 0 and want in " ".join(r.out.split())
    r = run_cli("check", "load", "--profile", str(deployment["dir"] / "pd.yaml"), "--min-requests", "8", "-c", "2",
                "--answer-words", "20", "--no-progress", "--max-corruption", "0.5", "--json")
    assert r.json()["settings"]["gateway_scope"].endswith("of router group router, the entry the check's traffic goes to")


def test_profile_check_sends_the_serve_configs_api_key(tmp_path):
    # before: check --profile sent no key (only DSV4CTL_API_KEY / --api-key): 401 on every probe
    key = "prof-key-5678"
    port = free_port()
    cfg = write_config(tmp_path / "c.yaml", port=port, api_key=key)
    (tmp_path / "p.yaml").write_text(textwrap.dedent("""\
        version: 1
        name: standin-key
        model: deepseek-v4-flash
        hosts:
          - name: local
            address: 127.0.0.1
            gpus: {model: NVIDIA B200, count: 8, memory_mib: 183359}
        groups:
          - {name: one, role: colocated, host: local, gpus: [0, 1, 2, 3, 4, 5, 6, 7], tp: 8, serve_config: c.yaml}
        """))
    with standin(cfg, *FAST, port=port):
        r = run_cli("check", "smoke", "--profile", str(tmp_path / "p.yaml"), "--json")
        assert r.code == OK_CODE, r.err
        assert key not in r.out + r.err
        recs = tmp_path / "r.jsonl"
        r = run_cli("check", "load", "--profile", str(tmp_path / "p.yaml"), "-c", "2", "--turns", "2",
                    "--min-requests", "4", "--max-corruption", "0.9", "--no-progress", "--json", "--records", str(recs))
        assert r.code == 0, r.err
        assert key not in r.out + r.err + recs.read_text()
        r = run_cli("check", "smoke", "--profile", str(tmp_path / "p.yaml"), env={"DSV4CTL_API_KEY": "not-the-key"})
        assert r.code == 2 and "refuses the API key (HTTP 401 for GET /v1/models)" in r.err


def test_over_pool_is_skipped_when_the_pool_holds_a_full_context_request(tmp_path):
    cfg = write_config(tmp_path / "s.yaml")          # the stand-in's pool: 4 x the context length
    with standin(cfg, *FAST) as url:
        r = run_cli("check", "smoke", url, "--json")
    assert r.code == OK_CODE, r.err
    (ln,) = [c for c in r.json()["checks"] if c["check"] == "over_pool"]
    assert ln["status"] == "skip" and ln["reason"] == (
        "the KV pool holds a full-context request (max_req_input_len 65530 tokens, context length 65536): "
        "no band between them")


def test_over_pool_pass_names_the_band(tmp_path):
    cfg = write_config(tmp_path / "s.yaml", **POOL)
    with standin(cfg, *FAST) as url:
        r = run_cli("check", "smoke", url, "--json")
    (ln,) = [c for c in r.json()["checks"] if c["check"] == "over_pool"]
    assert ln["status"] == "pass" and ln["detail"]["max_req_input_len"] == 16378
    assert ln["reason"].startswith("HTTP 400 for a prompt of about 38887 tokens, over the KV pool's limit 16378")
    assert "exceeds the maximum allowed length (16378 tokens)" in ln["detail"]["error"]
