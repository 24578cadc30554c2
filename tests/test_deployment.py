"""The resolved Deployment (dsv4ctl/profile/deployment.py): one home for ports, URLs, roots,
defaults, tree and series; the one serve-config reader; each serve config read once per command."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from dsv4ctl.errors import InputError
from dsv4ctl.profile import serveconfig
from dsv4ctl.profile.deployment import (DEFAULT_LAUNCH, CheckSettings, DeploySettings, http_url, load_deployment,
                                        resolve)
from dsv4ctl.profile.model import load_profile
from dsv4ctl.profile.serveconfig import parse_serve_config, read_serve_config
from tests.conftest import DEFAULT_PROFILE, REPO, run_cli
from tests.test_golden import LocalWorld, needs_rsync, run


@pytest.fixture
def prof(tmp_path) -> Path:
    """A copy of the shipped profile (with its serve configs and the shipped series)."""
    shutil.copy(DEFAULT_PROFILE, tmp_path / DEFAULT_PROFILE.name)
    shutil.copytree(DEFAULT_PROFILE.with_suffix(""), tmp_path / DEFAULT_PROFILE.stem)
    shutil.copytree(REPO / "patches", tmp_path.parent / "patches", dirs_exist_ok=True)
    return tmp_path / DEFAULT_PROFILE.name


def edit(path: Path, fn) -> Path:
    doc = yaml.safe_load(path.read_text())
    fn(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_http_url_brackets_ipv6_only():
    assert http_url("127.0.0.1", 30000) == "http://127.0.0.1:30000"
    assert http_url("::1", 30000) == "http://[::1]:30000"
    assert http_url("[fe80::1]", 8000) == "http://[fe80::1]:8000"
    assert http_url("gpu-0.example", 8000) == "http://gpu-0.example:8000"


def test_shipped_profile_resolves_to_its_ports_urls_models_and_defaults():
    dep = load_deployment(DEFAULT_PROFILE)
    pre, dec, rt = dep.group("prefill"), dep.group("decode"), dep.group("router")
    assert (pre.port, dec.port, rt.port) == (30000, 30001, 8000)
    assert (pre.url, rt.url) == ("http://127.0.0.1:30000", "http://127.0.0.1:8000")
    assert pre.bootstrap_port == 8998 and dec.bootstrap_port == 8998 and rt.bootstrap_port is None
    assert pre.hicache_configured is True and dec.hicache_configured is False
    assert pre.served_model == "deepseek-v4-flash"
    assert dep.router_pairs() == [("prefill", "decode")]
    assert pre.root == "/srv/dsv4ctl"
    assert pre.launch_template == DEFAULT_LAUNCH["server"]
    assert rt.launch_template == "{python} -m sglang_router.launch_router {router_args} --host 0.0.0.0 --port {port}"
    assert dep.deploy == DeploySettings(root="/srv/dsv4ctl", keep_releases=5, service="auto", health_timeout_s=900.0)
    assert dep.check == CheckSettings(concurrency=(64,), max_corruption=0.01, turns=8, stall_timeout_s=60.0)
    assert dep.sglang.series.resolve() == REPO / "patches" / "sglang-0.5.23" and dep.sglang.tree is None


def test_defaults_when_sections_are_absent(prof):
    edit(prof, lambda d: [d.pop(k) for k in ("deploy", "check")])
    dep = load_deployment(prof)
    assert dep.deploy == DeploySettings() and dep.deploy.health_timeout_s == 900.0 and dep.deploy.python == "python3"
    assert dep.check.concurrency_arg == "64"


def test_port_precedence_profile_then_serve_config_then_default(prof):
    def f(d):
        d["groups"][0]["port"] = 31000
        d["hosts"][0]["address"] = "::1"
    edit(prof, f)
    cfg = prof.parent / DEFAULT_PROFILE.stem / "decode.yaml"
    cfg.write_text(cfg.read_text().replace("port: 30001", "# no port"))
    dep = load_deployment(prof)
    assert dep.group("prefill").url == "http://[::1]:31000"
    assert dep.group("decode").port == 30000 and dep.group("decode").url == "http://[::1]:30000"
    live = parse_serve_config("port: 30555\n", "h:/srv/current/configs/decode.yaml")
    assert dep.group("decode").url_with(live) == "http://[::1]:30555"
    assert dep.group("prefill").url_with(live) == "http://[::1]:31000"


def test_launch_template_precedence(prof):
    def f(d):
        d["deploy"]["launch"] = {"server": "S {port}", "decode": "D {port}"}
        d["groups"][0]["launch"] = "G {port}"
    edit(prof, f)
    dep = load_deployment(prof)
    assert [dep.group(n).launch_template for n in ("prefill", "decode", "router")] == \
        ["G {port}", "D {port}", DEFAULT_LAUNCH["router"].replace("{module}", "sglang_router.launch_router")]


def test_router_gateway_prometheus_and_bootstrap_defaults(prof):
    """gateway picks the module; Prometheus port = router port + 21000 (8000 -> 29000), or the
    profile's; the metrics URL is on the host's address; the bootstrap port the router is given is
    the serve config's, else SGLang's 8998 (never none)."""
    from dsv4ctl.deploy.release import launch_spec
    cfg = prof.parent / DEFAULT_PROFILE.stem / "prefill.yaml"
    cfg.write_text("\n".join(ln for ln in cfg.read_text().splitlines()
                             if not ln.startswith("disaggregation-bootstrap-port")) + "\n")
    dep = load_deployment(prof)
    rt, pre = dep.group("router"), dep.group("prefill")
    assert pre.bootstrap_port is None and pre.bootstrap_port_effective == 8998
    assert (rt.gateway, rt.gateway_module) == ("sglang-router", "sglang_router.launch_router")
    assert (rt.prometheus_host, rt.prometheus_port) == ("0.0.0.0", 29000)
    assert rt.metrics_url == "http://127.0.0.1:29000/metrics" and pre.metrics_url is None
    words = launch_spec(dep)["router"]["router_args"]
    assert words == ["--pd-disaggregation", "--prefill", "http://127.0.0.1:30000", "8998", "--decode",
                     "http://127.0.0.1:30001", "--prometheus-host", "0.0.0.0", "--prometheus-port", "29000"]

    def f(d):
        r = next(g for g in d["groups"] if g["role"] == "router")
        r.update(gateway="smg", port=60000, prometheus_host="127.0.0.1")
    edit(prof, f)
    dep = load_deployment(prof)
    rt = dep.group("router")
    assert rt.launch_template == "{python} -m smg.launch_router {router_args} --host 0.0.0.0 --port {port}"
    assert rt.prometheus_port == 39000 and rt.metrics_url == "http://127.0.0.1:39000/metrics"
    edit(prof, lambda d: next(g for g in d["groups"] if g["role"] == "router").update(prometheus_port=9100))
    assert load_deployment(prof).group("router").prometheus_port == 9100
    edit(prof, lambda d: next(g for g in d["groups"] if g["role"] == "router").update(prometheus_port=60000))
    with pytest.raises(InputError, match="prometheus_port 60000 is the router's own port"):
        load_deployment(prof)
    edit(prof, lambda d: d["groups"][0].update(gateway="smg"))
    with pytest.raises(InputError, match="gateway is a router group's setting"):
        load_deployment(prof)
    edit(prof, lambda d: d["groups"][0].pop("gateway") and next(
        g for g in d["groups"] if g["role"] == "router").update(gateway="nginx", prometheus_port=9100))
    with pytest.raises(InputError, match="gateway"):
        load_deployment(prof)


@pytest.mark.parametrize("where,value", [("deploy", ""), ("deploy", "relative/root"), ("deploy", "/"),
                                         ("host", ""), ("host", "srv")])
def test_a_deploy_root_that_is_not_absolute_is_an_input_error(prof, where, value):
    def f(d):
        if where == "deploy":
            d["deploy"]["root"] = value
        else:
            d["hosts"][0]["root"] = value
    edit(prof, f)
    with pytest.raises(InputError, match=r"must be an absolute path other than /"):
        load_deployment(prof)
    r = run_cli("deploy", str(prof), "--dry-run")
    assert r.code == 2 and r.err.count("\n") == 1
    assert ("deploy.root" if where == "deploy" else "hosts[0].root") in r.err


def test_tree_and_series_paths_are_relative_to_the_profile_and_unset_series_is_none(prof, tmp_path):
    (tmp_path / "src").mkdir()
    edit(prof, lambda d: d["sglang"].update(tree="src", series=None))
    dep = load_deployment(prof)
    assert dep.sglang.tree == tmp_path / "src" and dep.sglang.series is None
    assert dep.tree() == tmp_path / "src"
    with pytest.raises(InputError, match="SGLang tree not found"):
        dep.tree(str(tmp_path / "nope"))
    edit(prof, lambda d: d["sglang"].update(tree=None))
    with pytest.raises(InputError, match=r"sglang.tree: no SGLang git checkout given"):
        load_deployment(prof).tree(required=True)


@pytest.mark.parametrize("suffix,ok", [(".yaml", True), (".yml", True), (".YAML", True), (".Yml", True),
                                       (".json", False), ("", False)])
def test_suffix_rule_is_sglangs_lowercased_one_everywhere(prof, suffix, ok):
    """sglang 0.5.23 server_args_config_parser.py: ``path.suffix.lower() in [".yaml", ".yml"]``;
    plan and lint answer the same (they share the reader)."""
    d = prof.parent / DEFAULT_PROFILE.stem
    (d / "decode.yaml").rename(d / f"decode{suffix}")
    edit(prof, lambda doc: doc["groups"][1].update(serve_config=f"{DEFAULT_PROFILE.stem}/decode{suffix}"))
    for argv in (("plan", str(prof), "--json"), ("config", "lint", str(prof), "--json")):
        r = run_cli(*argv)
        if ok:
            assert r.code == 0, r.err
        else:
            assert r.code == 2 and "SGLang only accepts --config files ending in .yaml or .yml" in r.err


def test_serve_config_reader_keeps_bytes_text_lines_and_canonical_args(tmp_path):
    p = tmp_path / "g.yaml"
    raw = b"# c\r\ntp-size: 4\r\nenable-hicache: true\r\nport: 30002"
    p.write_bytes(raw)
    sc = read_serve_config(p)
    assert sc.raw == raw and sc.text == raw.decode() and sc.lines == {"tp-size": 2, "enable-hicache": 3, "port": 4}
    assert sc.args() == {"tp-size": 4, "enable-hierarchical-cache": True, "port": 30002}
    assert sc.hicache_enabled and sc.get("enable-hierarchical-cache") is True
    bad = parse_serve_config("tp_size: 4\n", "x.yaml")
    with pytest.raises(InputError, match=r"x.yaml:1: tp_size: SGLang --config keys use dashes \(tp-size\)"):
        bad.args()
    with pytest.raises(InputError, match=r"given twice \(alias of tp-size\)"):
        parse_serve_config("tp-size: 4\ntensor-parallel-size: 4\n", "y.yaml").args()
    with pytest.raises(InputError, match=r"z.yaml: not UTF-8"):
        parse_serve_config(b"a: \xff\n", "z.yaml")
    with pytest.raises(InputError, match=r"w.yaml:1: a serve config must be a mapping"):
        parse_serve_config("- 1\n", "w.yaml")
    assert parse_serve_config("", "e.yaml").data == {}


def _reads_during(*argv: str, env=None) -> tuple[int, dict[str, int], int]:
    """(exit code, serve-config reads per file, SGLang version resolutions) of one command run in
    this process (tests/test_golden.py ``run``)."""
    from dsv4ctl.plan import sglang_version
    serveconfig.READS.clear()
    sglang_version.RESOLUTIONS.clear()
    r = run(*argv, env=env)
    return r.code, dict(serveconfig.READS), len(sglang_version.RESOLUTIONS)


def test_plan_lint_and_hicache_read_each_serve_config_once(prof):
    cfgs = {str(prof.parent / DEFAULT_PROFILE.stem / f"{g}.yaml") for g in ("prefill", "decode")}
    for argv in (("plan", str(prof), "--json"), ("config", "lint", str(prof), "--json"),
                 ("hicache", "off", str(prof), "--dry-run", "--json"), ("hicache", "status", str(prof), "--no-server",
                                                                       "--json")):
        code, reads, versions = _reads_during(*argv)
        assert code == 0 and reads == {c: 1 for c in cfgs}, argv
        assert versions <= 1, (argv, versions)     # the release resolved once (or not at all)


@needs_rsync
@pytest.mark.parametrize("extra", [(), ("--promote",)])
def test_deploy_dry_run_reads_each_serve_config_once(tmp_path, extra):
    w = LocalWorld(tmp_path)
    code, reads, versions = _reads_during("deploy", *extra, str(w.profile), "--dry-run", "--json", env=w.env)
    assert code == 0
    assert reads == {str(w.cfgdir / "prefill.yaml"): 1, str(w.cfgdir / "decode.yaml"): 1}
    assert versions == 1


def test_unset_series_is_no_series_for_plan_and_deploy(tmp_path):
    """One answer: without ``sglang.series`` a release ships ``base_ref`` as is, and plan takes
    index-K from the profile (not from a shipped series the release would not carry)."""
    from dsv4ctl.deploy.release import release_inputs
    from dsv4ctl.plan.plan import build_plan
    w = LocalWorld(tmp_path)
    dep = load_deployment(w.profile)
    assert dep.sglang.series is None
    _, _, patches, configs, _, ident = release_inputs(dep, None, None, None)
    assert patches == [] and ident is None and set(configs) == {"prefill", "decode"}
    rep = build_plan(dep)
    assert {g.index_k_source for g in rep.groups} == {"profile"}


def test_one_lock_message_for_deploy_and_for_hicache(tmp_path):
    from dsv4ctl.hosts.lock import LockHeld, check_unlocked, held_error, holder
    from dsv4ctl.remote import connect
    root = tmp_path / "root"
    (root / ".lock").mkdir(parents=True)
    h = holder("deploy rabc", "tok")
    (root / ".lock" / "holder.json").write_text(__import__("json").dumps(h))
    dep = resolve(load_profile(DEFAULT_PROFILE))
    t = connect(dep.hosts["b200-0"].__class__(name="h", address="127.0.0.1", local=True))
    try:
        with pytest.raises(LockHeld) as e:
            check_unlocked(t, str(root))
    finally:
        t.close()
    assert e.value.exit_code == 3
    assert str(e.value) == str(held_error("h", f"{root}/.lock", __import__("json").dumps(h), can_break=False))
    assert f"h: deploy lock {root}/.lock held by {h['who']} (deploy rabc, pid {h['pid']}" in str(e.value)


def test_secrets_never_reach_deploy_output(tmp_path):
    """Env secrets (any quoting), secret serve-config keys and secret launch flags are masked in the
    dry-run listing, -v and --json, for both service backends; the YAML cache keeps no secret."""
    import json as _json
    import os
    from dsv4ctl.deploy.steps import deployment_secrets, mask_secrets
    w = LocalWorld(tmp_path)
    secrets = {"HF_TOKEN": "hf_secret123", "OPENAI_API_KEY": "sk abc'def", "TOKEN": 'a"LEAK6', "DB_PASSWORD": "has space X"}
    prof = _json.loads(_json.dumps(w.prof))
    prof["groups"][0]["env"] = dict(secrets)
    prof["deploy"]["launch"]["server"] += " --api-key sk-LEAK1 --admin-api-key=sk-LEAK2"
    cfg = w.cfgdir / "decode.yaml"
    cfg.write_text(cfg.read_text() + "api-key: sk-CONFIG-SECRET\n")
    leaks = list(secrets.values()) + ["sk-LEAK1", "sk-LEAK2", "sk-CONFIG-SECRET", "abc'def", "LEAK6"]
    for service in ("launcher", "systemd"):
        prof["deploy"]["service"] = service
        p = w.write_profile(f"s-{service}.yaml", prof)
        for extra in (["--dry-run", "-v"], ["--dry-run", "--json"], ["--dry-run", "--promote", "-v"]):
            r = run_cli("deploy", str(p), *extra, "--no-preflight" if "--promote" not in extra else "--dry-run",
                        env=dict(w.env, DSV4CTL_CACHE=str(tmp_path / "cache")))
            out = r.out + r.err
            assert "***" in out or r.code != 0, (service, extra, r.err[-300:])
            assert not [s for s in leaks if s in out], (service, extra, [s for s in leaks if s in out])
    assert not [f for f in (tmp_path / "cache" / "yaml").iterdir()
                if "sk-CONFIG-SECRET" in f.read_text()] if (tmp_path / "cache" / "yaml").exists() else True
    dep = load_deployment(w.write_profile("s.yaml", prof))
    assert mask_secrets("x 'OPENAI_API_KEY=sk abc'\"'\"'def' y", deployment_secrets(dep)) == "x 'OPENAI_API_KEY=***' y"
    ydir = tmp_path / "cache" / "yaml"
    if ydir.exists():
        assert oct(ydir.stat().st_mode & 0o777) == "0o700"
        assert all(oct(f.stat().st_mode & 0o777) == "0o600" for f in ydir.iterdir())
    del os
