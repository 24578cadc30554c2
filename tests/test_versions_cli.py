"""SGLang versions end to end (issue 27 item 1): the release comes from the tree when one is
given, else the profile; an unknown one exits 2 naming the supported ones; a disagreement is a
lint error; the plan, its JSON and lint use the release's rules and argument table."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from tests.conftest import DEFAULT_PROFILE, run_cli
from tests.sshd.world import git


@pytest.fixture
def prof(tmp_path):
    """A copy of the shipped profile with its serve configs; write(version=..., tree=...)."""
    src = DEFAULT_PROFILE.parent
    shutil.copytree(src / DEFAULT_PROFILE.stem, tmp_path / DEFAULT_PROFILE.stem)
    data = yaml.safe_load(DEFAULT_PROFILE.read_text())
    data["sglang"]["series"] = None
    path = tmp_path / "p.yaml"

    def write(version=None, tree=None, ref=None, decode=None, decode_group=None, series=None):
        d = json.loads(json.dumps(data))
        for g in d["groups"]:
            if g["name"] == "decode":
                g.update(decode_group or {})
        if version is not None:
            d["sglang"]["version"] = version
        d["sglang"]["tree"] = str(tree) if tree else None
        d["sglang"]["base_ref"] = ref
        d["sglang"]["series"] = series
        d["sglang"]["index_k_dtype"] = "fp8"          # no bf16 gating check of the test trees
        if decode:
            cfg = tmp_path / DEFAULT_PROFILE.stem / "decode.yaml"
            lines = [ln for ln in cfg.read_text().splitlines(keepends=True)
                     if not ln.startswith(("mem-fraction-static:", "max-running-requests:"))]
            cfg.write_text("".join(lines) + decode)
        path.write_text(yaml.safe_dump(d, sort_keys=False))
        return path
    return write


def tree_at(tmp_path, version: str):
    t = tmp_path / f"sglang-{version}"
    (t / "python").mkdir(parents=True)
    (t / "python" / "pyproject.toml").write_text(f'[project]\nname = "sglang"\nversion = "{version}"\n')
    git(t, "init", "-q")
    git(t, "add", "-A")
    git(t, "commit", "-q", "-m", "x")
    return t


def plan(path, *args):
    return run_cli("plan", str(path), "--json", *args)


def test_profile_version_is_planned_and_named(prof):
    for v in ("0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"):
        r = plan(prof(version=v))
        assert r.code == 0, r.err
        d = r.json()
        assert (d["sglang_version"], d["sglang_version_source"]) == (v, "profile sglang.version")
    r = run_cli("plan", str(prof(version="0.5.22")))
    assert "SGLang 0.5.22" in r.out


@pytest.mark.parametrize("bad, words", [("9.9.9", "SGLang 9.9.9 is not supported"), ("0.5.17", "SGLang 0.5.17 is not supported"),
                                        ("latest", "'latest' is not an SGLang version")])
def test_an_unknown_version_exits_2_naming_the_supported_ones(prof, bad, words):
    for cmd in (["plan"], ["config", "lint"]):
        r = run_cli(*cmd, str(prof(version=bad)))
        assert r.code == 2, (cmd, r.err)
        assert words in r.err and "supported: 0.5.18, 0.5.19, 0.5.20, 0.5.21, 0.5.22, 0.5.23" in r.err
        assert len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err


def test_the_tree_wins_and_a_disagreement_is_a_lint_error(prof, tmp_path):
    t = tree_at(tmp_path, "0.5.22")
    p = prof(version="0.5.23", tree=t)
    d = plan(p).json()
    assert d["sglang_version"] == "0.5.22" and d["sglang_version_source"] == f"tree {t} at HEAD"
    r = run_cli("config", "lint", str(p), "--json")
    assert r.code == 2, r.err
    hits = [f for f in r.json()["findings"] if f["rule"] == "DSV122"]
    assert len(hits) == 1 and hits[0]["severity"] == "error"
    assert "sglang.version is 0.5.23 but the tree" in hits[0]["message"] and "is SGLang 0.5.22" in hits[0]["message"]
    r = run_cli("config", "lint", str(prof(version="0.5.22", tree=t)), "--json")
    assert r.code == 0 and not [f for f in r.json()["findings"] if f["rule"] == "DSV122"], r.out


def test_a_series_cut_for_another_release_is_a_lint_error_with_the_shipped_fix(prof, tmp_path):
    """DSV123: the patch series must be cut against the release the deployment runs (the tree's,
    else the profile's); the fix names the shipped series of that release."""
    r = run_cli("config", "lint", str(prof(version="0.5.22", series="sglang-0.5.23")), "--json")
    assert r.code == 2, r.err
    hits = [f for f in r.json()["findings"] if f["rule"] == "DSV123"]
    assert len(hits) == 1 and hits[0]["severity"] == "error", r.out
    assert "is cut against sglang==0.5.23 but the deployment runs SGLang 0.5.22" in hits[0]["message"]
    assert hits[0]["message"].endswith("set sglang.series: sglang-0.5.22 (shipped)")
    # the tree decides the release: a 0.5.21 tree with 0.5.22's series
    t = tree_at(tmp_path, "0.5.21")
    r = run_cli("config", "lint", str(prof(version="0.5.21", tree=t, series="sglang-0.5.22")), "--json")
    assert [f["message"].split(": ", 1)[1] for f in r.json()["findings"] if f["rule"] == "DSV123"] == [
        "set sglang.series: sglang-0.5.21 (shipped)"], r.out
    for v in ("0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"):
        r = run_cli("config", "lint", str(prof(version=v, series=f"sglang-{v}")), "--json")
        assert r.code == 0 and not [f for f in r.json()["findings"] if f["rule"] == "DSV123"], (v, r.out)


def test_the_release_rules_change_the_plan(prof):
    """A DP-attention decode server with few requests: 0.5.22+ caps the decode graph batch at
    max-running-requests (a smaller reserve, a larger default mem_fraction_static) where 0.5.21
    keeps the GPU-size default (tests/test_versions_oracle.py proves both with SGLang's code)."""
    dpa = dict(dp=4, dp_attention=True)
    mfs = {}
    cfg = DEFAULT_PROFILE.parent / DEFAULT_PROFILE.stem / "decode.yaml"
    for v in ("0.5.21", "0.5.22", "0.5.23"):
        # 0.5.21: dp-size + enable-dp-attention; 0.5.22+ refuse enable-dp-attention in --config (attn-dp-size)
        dp = "dp-size: 4\nenable-dp-attention: true\n" if v == "0.5.21" else "attn-dp-size: 4\n"
        p = prof(version=v, decode_group=dpa)
        (p.parent / DEFAULT_PROFILE.stem / "decode.yaml").write_text(
            "".join(ln for ln in cfg.read_text().splitlines(keepends=True) if not ln.startswith(("max-running-requests:", "mem-fraction-static:")))
            + "max-running-requests: 16\n" + dp)
        r = plan(p)
        assert r.code == 0, r.err
        g = next(g for g in r.json()["groups"] if g["name"] == "decode")
        mfs[v] = g["mem_fraction_static"]
    assert mfs["0.5.21"] < mfs["0.5.22"] == mfs["0.5.23"], mfs


def test_lint_uses_the_releases_argument_table(prof):
    """attn-dp-size exists from 0.5.22: a 0.5.21 serve config with it is an unknown key."""
    p = prof(version="0.5.21", decode="max-running-requests: 128\nattn-dp-size: 1\n")
    r = run_cli("config", "lint", str(p), "--json")
    assert r.code == 2
    assert any(f["rule"] == "SGL001" and "attn-dp-size" in f["message"] for f in r.json()["findings"]), r.out
    r = run_cli("config", "lint", str(prof(version="0.5.22")), "--json")
    assert not any(f["rule"] == "SGL001" for f in r.json()["findings"]), r.out


def test_plan_reads_only_keys_the_release_has(prof):
    """attn-dp-size is a 0.5.22+ argument: under 0.5.23 a serve config's attn-dp-size: 4 plans
    four attention-DP ranks; 0.5.21 has no such argument: its server refuses the key at start-up,
    and so does plan (exit 2, the same words as config lint's SGL001; issue 44)."""
    r = plan(prof(version="0.5.23", decode="max-running-requests: 128\nattn-dp-size: 4\n"))
    g = next(g for g in r.json()["groups"] if g["name"] == "decode")
    assert (r.code, g["dp"], g["dp_attention"]) == (0, 4, True), r.err
    r = plan(prof(version="0.5.21"))
    assert r.code == 2 and len(r.err.splitlines()) == 1, r.err
    assert ("decode.yaml:" in r.err and "attn-dp-size: not an SGLang 0.5.21 server argument" in r.err
            and "SGLang 0.5.21 refuses it at start-up" in r.err), r.err


def test_the_preflight_says_when_weights_are_estimated():
    """Issue 27: a crashing V4-Pro configuration passed the preflight as "plan ok" without saying
    its weights were estimated. The preflight line names the groups planned on estimates."""
    from dsv4ctl.deploy.preflight import preflight
    from dsv4ctl.profile.deployment import load_deployment
    from dsv4ctl.resources import shipped_dir
    pro = preflight(load_deployment(shipped_dir("profiles") / "dsv4-pro-4xh200-pd.yaml"))
    assert pro["estimated"] == ["prefill", "decode"]
    assert "weights or free memory estimated for prefill, decode: measure them" in pro["summary"]
    flash = preflight(load_deployment(shipped_dir("profiles") / "dsv4-flash-8xb200-pd.yaml"))   # measured
    assert flash["estimated"] == [] and "estimated" not in flash["summary"]


def test_a_tree_of_an_unsupported_release_exits_2_naming_the_tree(prof, tmp_path):
    t = tree_at(tmp_path, "0.5.24")
    r = run_cli("plan", str(prof(version="0.5.23", tree=t)))
    assert r.code == 2
    assert r.err.strip() == (f"dsv4ctl: error: {t} at HEAD (sglang.tree): SGLang 0.5.24 is not supported "
                             "(supported: 0.5.18, 0.5.19, 0.5.20, 0.5.21, 0.5.22, 0.5.23; 0.5.18 is the first release "
                             "that serves DeepSeek-V4)")


def test_abbreviations_resolve_with_the_release_parser(prof, tmp_path):
    """argparse prefix abbreviations follow the release's own options: ``page`` is ``page-size``
    for 0.5.22 (one option starts so) but ambiguous for 0.5.23 (SGLang refuses it: exit 2);
    ``attn-dp`` is ``attn-dp-size`` for 0.5.22 but no option of 0.5.21 (not read: lint says
    SGL001)."""
    shipped = (DEFAULT_PROFILE.parent / DEFAULT_PROFILE.stem / "decode.yaml").read_text()
    dpa = dict(dp=2, dp_attention=True)

    def write(version, extra, group=None):
        (tmp_path / DEFAULT_PROFILE.stem / "decode.yaml").write_text(shipped)
        return prof(version=version, decode=extra, decode_group=group)
    r = plan(write("0.5.22", "page: 128\n"))
    assert r.code == 0, r.err
    assert [g["server_args"]["page_size"] for g in r.json()["groups"] if g["name"] == "decode"] == [128]
    r = plan(write("0.5.23", "page: 128\n"))
    assert r.code == 2 and "page: SGLang rejects it: ambiguous option: --page could match" in r.err, r.err
    assert plan(write("0.5.22", "attn-dp: 2\n", dpa)).code == 0
    r = run_cli("config", "lint", str(write("0.5.21", "dp-size: 2\nattn-dp: 2\nenable-dp-attention: true\n", dpa)), "--json")
    assert [f["rule"] for f in r.json()["findings"] if f["message"].startswith("attn-dp")][:1] == ["SGL001"], r.out


def test_unchunked_indexer_logits_fail_on_releases_before_0521(prof, tmp_path):
    """0.5.18-0.5.20 score a prefill chunk's C4 indexer logits in one fp32 tensor (no free-memory
    chunking: that came with 0.5.21's mqa_logits_utils.py): headroom below the whole transient
    fails the first long prefill (field report C2). The shipped prefill (fp8 index-K: 21.76 GiB
    headroom on 0.5.20) with a 32,768-token chunk at 1M context needs 32 GiB: fails on 0.5.20,
    tight on 0.5.21 (which chunks them). Each printed fix, applied, re-plans to what it says."""
    shipped = (DEFAULT_PROFILE.parent / DEFAULT_PROFILE.stem / "prefill.yaml").read_text()
    assert "chunked-prefill-size: 8192" in shipped
    (tmp_path / DEFAULT_PROFILE.stem / "prefill.yaml").write_text(
        shipped.replace("chunked-prefill-size: 8192", "chunked-prefill-size: 32768"))
    r = run_cli("plan", str(prof(version="0.5.20")), "-g", "prefill", "--json")
    assert r.code == 1, r.err
    g = r.json()["groups"][0]
    assert (g["verdict"]["level"], g["verdict"]["deciding"]) == ("fails", "indexer_logits")
    assert g["errors"][0].startswith("headroom 21.76 GiB is under the indexer logits of one prefill chunk (32.0 GiB, "
                                     "fp32, 32,768 rows x 1,048,576 context / 4)")
    assert g["fixes"] == [
        "set mem-fraction-static: 0.739 (from 0.865) in the serve config (re-planned: tight, headroom 44.311 GiB)",
        "or set chunked-prefill-size: 8192 (from 32768) in the serve config: a prefill chunk's indexer logits are "
        "8,192 rows (re-planned: tight, headroom 21.76 GiB)"]
    for setting, headroom in (("mem_fraction_static=0.739", 44.311), ("chunked_prefill_size=8192", 21.76)):
        r2 = run_cli("plan", str(prof(version="0.5.20")), "-g", "prefill", "--json", "--set", setting)
        g2 = r2.json()["groups"][0]
        assert r2.code == 0 and g2["verdict"]["level"] == "tight", (setting, r2.out)
        assert min(rk["headroom_gib"] for rk in g2["ranks"]) == headroom, (setting, g2["ranks"][0])
    r = run_cli("plan", str(prof(version="0.5.21")), "-g", "prefill", "--json")
    assert r.code == 0, r.err
    assert r.json()["groups"][0]["verdict"]["level"] == "tight"


def test_v41_new_layout_exists_from_0523(prof):
    """SGLANG_DSV4_KV_LAYOUT=v41_new: 0.5.21/0.5.22 refuse it (select_dsv4_kv_layout asserts v41 or
    auto), 0.5.23 sizes its pools with it, 0.5.20 has no V4.1 layouts and ignores the variable."""
    for v, code in (("0.5.20", 0), ("0.5.21", 2), ("0.5.22", 2), ("0.5.23", 0)):
        r = run_cli("plan", str(prof(version=v)), "-g", "decode", "--json", "--set", "SGLANG_DSV4_KV_LAYOUT=v41_new")
        assert r.code == code, (v, r.err)
        if code == 2:
            assert "unknown SGLANG_DSV4_KV_LAYOUT='v41_new'" in r.err and len(r.err.splitlines()) == 1, r.err


@pytest.mark.parametrize("spelled", ["v0.5.22", " 0.5.22", "0.5.22 "])
def test_a_version_spelled_like_a_tag_is_that_release_everywhere(prof, spelled):
    """``v0.5.22`` (as base_ref spells it) is 0.5.22 for plan, lint, hicache and config set alike:
    its argument table and its title, never a file named after the raw string."""
    p = prof(version=spelled)
    d = plan(p).json()
    assert d["sglang_version"] == "0.5.22"
    r = run_cli("config", "lint", str(p), "--json")
    assert r.code == 0, r.err
    r = run_cli("hicache", "off", str(p), "--dry-run")
    assert r.code == 0 and "server_args-" not in r.err, r.err
    assert "SGLang 0.5.22" in run_cli("plan", str(p)).out


def test_a_what_if_option_the_release_lacks_is_said(prof):
    """``--set`` of a server argument the release does not have (0.5.19: no dsv4-attn-backend) is
    refused as that release refuses it at start-up (exit 2, issue 44; it used to plan with a
    warning); 0.5.23 has it and plans."""
    r = run_cli("plan", str(prof(version="0.5.19")), "-g", "decode", "--json", "--set", "dsv4_attn_backend=trtllm")
    assert r.code == 2 and len(r.err.splitlines()) == 1, r.err
    assert ("--set dsv4_attn_backend: not an SGLang 0.5.19 server argument (SGLang 0.5.19 refuses it at start-up: "
            "argparse: unrecognized arguments)") in r.err, r.err
    r = run_cli("plan", str(prof(version="0.5.23")), "-g", "decode", "--json", "--set", "dsv4_attn_backend=flashmla")
    assert r.code == 0, r.err


def test_trtllm_with_pd_is_refused_by_plan_and_lint_alike(prof):
    """``dsv4-attn-backend: trtllm`` on a PD decode server: SGLang 0.5.20-0.5.23 assert at argument
    resolution (deepseek_v4_hook.py); plan (exit 2) and config lint (SGL011) both refuse it, with
    SGLang's words (issue 44: both exited 0)."""
    prof(decode="dsv4-attn-backend: trtllm\n")
    for v in ("0.5.20", "0.5.23"):
        p = prof(version=v)
        r = plan(p)
        assert r.code == 2 and "trtllm does not support PD disaggregation yet" in r.err, r.err
        r = run_cli("config", "lint", str(p), "--json")
        assert r.code == 2 and any(f["rule"] == "SGL011" for f in r.json()["findings"]), r.out
