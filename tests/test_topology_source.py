"""Issue 25 item 2: the serve config is what SGLang reads, so it is the source of a server's
topology. ``plan`` never plans the profile's tp/dp/pp where the serve config runs something else
(a key left out runs SGLang's default), ``config lint`` reports the same disagreement (DSV120),
and SGLang's argparse aliases (``attention-data-parallel-size``) are read."""

from __future__ import annotations

import json
import shutil

import yaml

from tests.conftest import REPO, run_cli

SHIPPED = REPO / "profiles"


def copy_profile(tmp_path, prefill_edit=None, profile_edit=None):
    """The shipped PD profile and its serve configs under tmp_path, edited."""
    shutil.copytree(SHIPPED / "dsv4-flash-8xb200-pd", tmp_path / "dsv4-flash-8xb200-pd")
    prof = tmp_path / "dsv4-flash-8xb200-pd.yaml"
    text = (SHIPPED / "dsv4-flash-8xb200-pd.yaml").read_text()
    prof.write_text(profile_edit(text) if profile_edit else text)
    pre = tmp_path / "dsv4-flash-8xb200-pd" / "prefill.yaml"
    if prefill_edit:
        pre.write_text(prefill_edit(pre.read_text()))
    return prof, pre


def env(tmp_path):
    return {"DSV4CTL_CACHE": str(tmp_path / "cache"), "DSV4CTL_STATE_DIR": str(tmp_path / "state")}


def test_a_left_out_tp_size_is_sglangs_default_not_the_profiles(tmp_path):
    prof, pre = copy_profile(tmp_path, lambda t: t.replace("tp-size: 4\n", ""))
    line = next(i for i, ln in enumerate(prof.read_text().splitlines(), 1) if ln.strip() == "tp: 4")
    r = run_cli("plan", str(prof), env=env(tmp_path))
    assert r.code == 2, r.err
    assert r.err == (f"dsv4ctl: error: {pre}: no tp-size: SGLang runs tp-size 1 (its default), but the profile's "
                     f"group 'prefill' says tp: 4 ({prof}:{line}): put tp-size: 4 in the serve config\n")
    r = run_cli("config", "lint", str(prof), "--json", env=env(tmp_path))
    assert r.code == 2, r.err          # lint errors: exit 2
    hits = [f for f in r.json()["findings"] if f["rule"] == "DSV120"]
    assert [(h["file"], h["line"], h["group"]) for h in hits] == [(str(pre), 1, "prefill")]
    assert hits[0]["message"].startswith("no tp-size: SGLang runs tp-size 1 (its default)")
    # the other group, whose serve config agrees, still plans
    r = run_cli("plan", str(prof), "-g", "decode", "--json", env=env(tmp_path))
    assert r.code == 0, r.err
    assert [g["tp"] for g in r.json()["groups"]] == [4]


def test_a_tp_size_that_disagrees_is_named_in_both_places(tmp_path):
    prof, pre = copy_profile(tmp_path, lambda t: t.replace("tp-size: 4\n", "tp-size: 8\n"))
    tp_line = next(i for i, ln in enumerate(pre.read_text().splitlines(), 1) if ln.startswith("tp-size:"))
    r = run_cli("config", "lint", str(prof), "--json", env=env(tmp_path))
    assert r.code == 2
    hit = next(f for f in r.json()["findings"] if f["rule"] == "DSV120")
    assert (hit["file"], hit["line"]) == (str(pre), tp_line)
    assert hit["message"] == "tp-size: 8 disagrees with the profile's group 'prefill' (tp: 4)"
    r = run_cli("plan", str(prof), env=env(tmp_path))
    assert r.code == 2 and f"{pre}:{tp_line}: tp-size: 8 disagrees with the profile's group 'prefill' (tp: 4)" in r.err


def test_attention_dp_left_out_and_given_through_its_alias(tmp_path):
    def dpa(text):        # decode with DP attention 2 in the profile
        return text.replace("    gpus: [4, 5, 6, 7]\n    tp: 4\n", "    gpus: [4, 5, 6, 7]\n    tp: 4\n    dp: 2\n"
                            "    dp_attention: true\n")
    prof, _ = copy_profile(tmp_path, profile_edit=dpa)
    dec = tmp_path / "dsv4-flash-8xb200-pd" / "decode.yaml"
    r = run_cli("plan", str(prof), "-g", "decode", env=env(tmp_path))
    assert r.code == 2 and f"{dec}: no dp-size: SGLang runs dp-size 1 (its default)" in r.err
    assert "put attn-dp-size: 2 in the serve config" in r.err
    dec.write_text(dec.read_text() + "attention-data-parallel-size: 2\n")      # SGLang's own alias
    r = run_cli("plan", str(prof), "-g", "decode", "--json", env=env(tmp_path))
    assert r.code in (0, 1), r.err
    g = next(g for g in r.json()["groups"] if g["name"] == "decode")
    assert (g["tp"], g["dp"]) == (4, 2)
    r = run_cli("config", "lint", str(prof), "--json", env=env(tmp_path))
    assert not [f for f in r.json()["findings"] if f["rule"] == "DSV120"]


def test_the_shipped_profile_agrees_and_set_still_wins(tmp_path):
    r = run_cli("plan", "--json", env=env(tmp_path))
    assert r.code == 0, r.err
    assert {g["name"]: g["tp"] for g in r.json()["groups"]} == {"prefill": 4, "decode": 4}
    r = run_cli("plan", "-g", "prefill", "--set", "tp_size=2", "--json", env=env(tmp_path))
    assert r.code in (0, 1, 2), r.err
    assert "disagrees" not in r.err and "no tp-size" not in r.err


def test_placement_is_sglangs_rank_to_gpu_rule():
    from dsv4ctl.plan.plan import placement
    assert placement(4, 1, 1) == [0, 1, 2, 3]
    assert placement(4, 1, 1, base=4) == [4, 5, 6, 7]
    assert placement(2, 2, 1, base=0, step=2) == [0, 2, 2, 4]      # engine.py: the pp offset is not stepped
    assert placement(2, 1, 2, base=0, step=2) == [0, 2, 4, 6]      # a DP replica starts tp*pp*step further
    assert placement(1, 1, 4, base=4) == [4, 5, 6, 7]


def test_two_servers_on_the_same_gpus_are_refused(tmp_path):
    """decode's serve config without base-gpu-id runs on GPUs 0-3, where prefill runs."""
    prof, _ = copy_profile(tmp_path)
    dec = tmp_path / "dsv4-flash-8xb200-pd" / "decode.yaml"
    dec.write_text(dec.read_text().replace("base-gpu-id: 4\n", ""))
    gpus_line = [i for i, ln in enumerate(prof.read_text().splitlines(), 1) if ln.strip() == "gpus: [4, 5, 6, 7]"][0]
    msg = (f"{dec}: SGLang puts group 'decode' on GPUs 0,1,2,3 (base-gpu-id 0, gpu-id-step 1, 4 rank(s)), but the "
           f"profile lists GPUs 4,5,6,7 ({prof}:{gpus_line}): set base-gpu-id: 4 in the serve config")
    r = run_cli("plan", str(prof), env=env(tmp_path))
    assert r.code == 2 and r.err == f"dsv4ctl: error: {msg}\n"
    r = run_cli("config", "lint", str(prof), "--json", env=env(tmp_path))
    hit = next(f for f in r.json()["findings"] if f["rule"] == "DSV120")
    assert (hit["file"], hit["group"], hit["message"]) == (str(dec), "decode", msg.split(": ", 1)[1])
    # gpu-id-step 1 with base-gpu-id 4 is what the profile says; a step of 2 is not
    dec.write_text(dec.read_text() + "base-gpu-id: 4\ngpu-id-step: 2\n")
    r = run_cli("plan", str(prof), "-g", "decode", env=env(tmp_path))
    assert r.code == 2 and "on GPUs 4,6,8,10 (base-gpu-id 4, gpu-id-step 2" in r.err
    assert "make the profile's gpus the GPUs SGLang uses" in r.err
