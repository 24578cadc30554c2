"""Per-GPU memory (issue 16 item 4): ``dsv4ctl facts`` reads nvidia-smi through the GPU fact
(:mod:`dsv4ctl.hosts.gpus`, fixtures in tests/data/gpus/) and ``plan`` sizes pools from the
minimum across the group's GPUs as SGLang does, reporting each rank's own headroom (field report
C6: uneven non-torch memory per rank)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path

import pytest

from dsv4ctl.hosts.gpus import parse_gpus
from dsv4ctl.plan.facts import CONTEXT_GIB, group_facts
from tests.conftest import DEFAULT_PROFILE, run_cli

DATA = Path(__file__).parent / "data" / "gpus"


def run(*argv: str) -> tuple[int, str, str]:
    from dsv4ctl.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def prof(tmp_path):
    shutil.copytree(DEFAULT_PROFILE.parent / DEFAULT_PROFILE.stem, tmp_path / DEFAULT_PROFILE.stem)
    text = DEFAULT_PROFILE.read_text().replace("series: ../patches/sglang-0.5.23", "series: null")
    text = text.replace("    address: 127.0.0.1 ", "    local: true\n    address: 127.0.0.1 ")
    p = tmp_path / DEFAULT_PROFILE.name
    p.write_text(text)
    return p


def set_decode_memory(prof: Path, lines: str) -> None:
    s = prof.read_text()
    i = s.index("  - name: decode")
    j = s.index("      free_gib_before_load: 177.0\n", i)
    prof.write_text(s[:j] + lines + s[j + len("      free_gib_before_load: 177.0\n"):])


def test_group_facts_from_the_busy_b200_fixture():
    gpus = parse_gpus((DATA / "b200x8-busy.txt").read_text())
    f = group_facts("decode", "b200-0", [4, 5, 6, 7], gpus)
    p = round(182723 / 1024 - CONTEXT_GIB, 3)
    assert f.free_gib_before_load == [p, p, round(162243 / 1024 - CONTEXT_GIB, 3), p] == [176.98, 176.98, 156.98, 176.98]
    assert any(n.startswith("GPU 6: memory held by python3 (pid 5120, 20460 MiB)") for n in f.notes)
    assert "unbalanced: free before load 156.98 GiB on one GPU < 0.9 x 176.98 GiB on another: SGLang refuses to start ('The memory capacity is unbalanced')" in f.notes
    assert not any(n.startswith("unbalanced") for n in group_facts("decode", "b200-0", [4, 5, 6, 7], gpus, tp=1).notes)
    f = group_facts("x", "h", [0, 9], gpus)
    assert f.free_gib_before_load[1] is None and "GPU 9: not reported by nvidia-smi on h" in f.notes


def test_facts_command_reads_nvidia_smi_on_the_host(prof, tmp_path, monkeypatch):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    smi = bin_ / "nvidia-smi"
    fixture = DATA / "b200x8-busy.txt"
    smi.write_text("#!/bin/bash\n"
                   f"if [[ \"$*\" == *query-gpu* ]]; then awk '/^@gpus/{{f=1;next}}/^@apps/{{f=0}}f' {fixture}; "
                   f"else awk '/^@apps/{{f=1;next}}f' {fixture}; fi\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    code, out, err = run("facts", str(prof), "--json", "-g", "decode")
    assert code == 0, err
    d = json.loads(out)
    assert d["schema"] == "dsv4ctl.facts/1"
    (g,) = d["groups"]
    assert g["memory"]["free_gib_before_load"] == [176.98, 176.98, 156.98, 176.98]
    assert [x["index"] for x in g["gpus"]] == [4, 5, 6, 7] and g["gpus"][2]["processes"][0]["pid"] == 5120
    code, out, err = run("facts", str(prof), "-g", "router")
    assert code == 2 and "router" in err


def test_facts_without_nvidia_smi_is_a_remote_error(prof, tmp_path, monkeypatch):
    only = tmp_path / "only-bash"
    only.mkdir()
    (only / "bash").symlink_to(shutil.which("bash"))
    monkeypatch.setenv("PATH", str(only))               # bash, and no nvidia-smi
    code, out, err = run("facts", str(prof))
    assert code == 3 and err.strip().endswith("nvidia-smi not found") and len(err.splitlines()) == 1


def test_plan_sizes_from_the_minimum_and_reports_each_rank(prof):
    set_decode_memory(prof, "      free_gib_before_load: [177.0, 177.0, 177.0, 177.0]\n      other_gib: [4.0, 0, 0, 0]\n")
    code, out, err = run("plan", str(prof), "-g", "decode", "--json")
    assert code == 0, err
    g = json.loads(out)["groups"][0]
    assert g["memory_inputs"]["rank_resident_gib"] == [129.34, 133.34, 133.34, 133.34]
    rs = g["ranks"]
    # one pool size for all (the minimum F: 177 - 43.66 - 4), each rank's own headroom
    assert len({r["full_max_total_num_tokens"] for r in rs}) == 1
    assert rs[0]["available_bytes"] == int((129.34 - 177.0 * (1 - 0.885)) * 2**30)
    assert [r["headroom_gib"] for r in rs] == [9.49, 13.49, 13.49, 13.49]
    assert [r["verdict"] for r in rs] == ["tight", "fits", "fits", "fits"]
    assert g["verdict"]["level"] == "tight"
    # the rank note, then (issue 44.4) what the rank is short of and its fixes
    assert "(rank 0, GPU 4: the tightest of the group's per-GPU memory); short of" in g["verdict"]["message"]


def test_unbalanced_free_memory_fails_as_sglang_refuses(prof):
    set_decode_memory(prof, "      free_gib_before_load: [177.0, 177.0, 157.0, 177.0]\n")
    code, out, err = run("plan", str(prof), "-g", "decode")
    assert code == 1
    assert err.startswith("dsv4ctl: plan fails: decode: free before load 157.0 GiB on one GPU < 0.9 x 177.0 GiB")


def test_per_gpu_values_must_match_the_gpus(prof):
    set_decode_memory(prof, "      free_gib_before_load: [177.0, 177.0]\n")
    code, out, err = run("plan", str(prof), "-g", "decode")
    assert code == 2 and "memory.free_gib_before_load" in err and "2 per-GPU values for the group's 4 GPUs" in err


def test_profile_plan_min_requests(prof):
    prof.write_text(prof.read_text().replace("check:\n", "plan:\n  min_requests: 20\ncheck:\n", 1))
    code, out, err = run("plan", str(prof), "-g", "decode")
    assert code == 1 and "16 request(s) fit at context_length 1,048,576" in err and "at least 20 needed" in err


@pytest.mark.parametrize("bad", ["inf", "nan", "-1", "0", "1e9"])
def test_facts_timeout_is_checked_before_anything_runs(bad):
    r = run_cli("facts", "--timeout", bad)
    assert r.code == 2 and r.err.startswith(f"dsv4ctl: error: --timeout '{bad}': expected ") and r.err.count("\n") == 1


def test_balance_line_is_sglangs():
    from dsv4ctl.plan.verdict import to_balance, unbalanced
    # bootstrap.py:444: MIN across ranks < 0.9 x a rank's own -> RuntimeError
    assert unbalanced([177.0, 159.3]) is None and unbalanced([177.0, 159.29]).startswith("free before load 159.29 GiB")
    assert to_balance([177.0, 177.0, 157.0, 140.0]) == [(2, 2.3), (3, 19.3)]
    assert to_balance([177.0, 159.29]) == [(1, 0.1)] and to_balance([177.0, 159.3]) == []


def test_unbalanced_plan_offers_the_memory_to_free_and_the_fix_replans(prof):
    set_decode_memory(prof, "      free_gib_before_load: [177.0, 177.0, 157.0, 177.0]\n")
    code, out, err = run("plan", str(prof), "-g", "decode", "--json")
    assert code == 1
    g = json.loads(out)["groups"][0]
    assert g["verdict"]["deciding"] == "unbalanced"
    assert g["fixes"] == ["free 2.3 GiB on GPU 6 (other processes hold it; dsv4ctl facts shows which): SGLang needs "
                          "every GPU's free memory >= 0.9 x 177.0 GiB (re-planned: tight, headroom 8.66 GiB)"]
    # the fix applied: GPU 6 at 157.0 + 2.3 GiB plans without error, with the same headroom
    prof.write_text(prof.read_text().replace("[177.0, 177.0, 157.0, 177.0]", "[177.0, 177.0, 159.3, 177.0]"))
    code, out, err = run("plan", str(prof), "-g", "decode", "--json")
    g = json.loads(out)["groups"][0]
    assert code == 0 and g["verdict"]["level"] == "tight" and min(r["headroom_gib"] for r in g["ranks"]) == 8.66


def test_unbalanced_fix_names_every_gpu_and_other_gib(prof):
    set_decode_memory(prof, "      free_gib_before_load: [177.0, 177.0, 157.0, 140.0]\n      other_gib: [0, 0, 20.0, 0]\n")
    code, out, err = run("plan", str(prof), "-g", "decode")
    assert code == 1
    assert ("fix decode: free 2.3 GiB on GPU 6 (other_gib 20.0 GiB) and 19.3 GiB on GPU 7 (other processes hold it; "
            "dsv4ctl facts shows which): SGLang needs every GPU's free memory >= 0.9 x 177.0 GiB "
            "(re-planned: tight, headroom 10.468 GiB)") in out


def test_one_gpu_per_tp_group_is_never_unbalanced(prof):
    # SGLang checks the balance only when tp_size > 1 (bootstrap.py:214)
    s = prof.read_text().replace("    gpus: [4, 5, 6, 7]\n    tp: 4\n", "    gpus: [4, 5, 6, 7]\n    tp: 1\n    dp: 4\n")
    prof.write_text(s)
    sc = prof.parent / "dsv4-flash-8xb200-pd" / "decode.yaml"
    sc.write_text(sc.read_text().replace("tp-size: 4\n", "tp-size: 1\ndp-size: 4\n"))
    set_decode_memory(prof, "      free_gib_before_load: [177.0, 177.0, 157.0, 177.0]\n")
    code, out, err = run("plan", str(prof), "-g", "decode", "--json")
    assert code == 0 and json.loads(out)["groups"][0]["verdict"]["deciding"] != "unbalanced", err


def test_unbalanced_fix_is_dropped_when_its_replan_fails(prof):
    # GPU 4's other memory makes it the tightest F: freeing 2.3 GiB on GPU 6 raises the minimum P
    # (157.0 -> 159.3), SGLang reserves more outside the pools and the full pool drops from
    # 14,243,072 to 14,202,880 tokens: 99 requests of 142,336 tokens, under the 100 required
    set_decode_memory(prof, "      free_gib_before_load: [177.0, 177.0, 157.0, 177.0]\n      other_gib: [20.0, 0, 0, 0]\n")
    code, out, err = run("plan", str(prof), "-g", "decode", "--json", "--set", "context_length=142336",
                         "--set", "min_requests=100")
    g = json.loads(out)["groups"][0]
    assert code == 1 and g["verdict"]["deciding"] == "unbalanced" and g["fixes"] == []
    assert {r["max_concurrent_requests"] for r in g["ranks"]} == {100}
    prof.write_text(prof.read_text().replace("[177.0, 177.0, 157.0, 177.0]", "[177.0, 177.0, 159.3, 177.0]"))
    code, out, err = run("plan", str(prof), "-g", "decode", "--json", "--set", "context_length=142336",
                         "--set", "min_requests=100")
    g = json.loads(out)["groups"][0]
    assert code == 1 and g["verdict"]["deciding"] == "requests" and g["ranks"][0]["full_max_total_num_tokens"] == 14202880


def test_balance_check_switched_off_in_the_group_env_is_a_warning(prof):
    """SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=false (environ.py:500): SGLang logs a warning and
    starts, sizing the pools from the least free GPU: plan warns instead of failing."""
    set_decode_memory(prof, "      free_gib_before_load: [177.0, 177.0, 157.0, 177.0]\n")
    s = prof.read_text().replace("    gpus: [4, 5, 6, 7]\n    tp: 4\n",
                                 "    gpus: [4, 5, 6, 7]\n    tp: 4\n    env: {SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK: 'false'}\n")
    assert s != prof.read_text()
    prof.write_text(s)
    code, out, err = run("plan", str(prof), "-g", "decode", "--json")
    g = json.loads(out)["groups"][0]
    assert code == 0 and g["verdict"]["deciding"] != "unbalanced", err
    assert ("unbalanced: free before load 157.0 GiB on one GPU < 0.9 x 177.0 GiB on another; with "
            "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=false SGLang only warns and starts") in " ".join(g["warnings"])


@pytest.mark.parametrize("value,code", [("n", 0), ("No", 0), ("0", 0), ("off", 2), ("", 2), ("y", 1)])
def test_sglang_env_switches_read_as_sglang_reads_them(prof, value, code):
    """EnvBool (srt/environ.py:143-150): n/no/0 switch the balance check off; 'off' and '' are
    not values SGLang reads (it warns and keeps the default: the check is on)."""
    set_decode_memory(prof, "      free_gib_before_load: [177.0, 177.0, 157.0, 177.0]\n")
    prof.write_text(prof.read_text().replace(
        "    gpus: [4, 5, 6, 7]\n    tp: 4\n",
        f"    gpus: [4, 5, 6, 7]\n    tp: 4\n    env: {{SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK: '{value}'}}\n"))
    c, out, err = run("plan", str(prof), "-g", "decode")
    assert c == code, err
    if code == 2:
        assert "is not a value SGLang's EnvBool reads (true/1/yes/y, false/0/no/n)" in err


def test_unbalanced_fix_raises_every_gpu_to_the_most_free_when_the_line_is_not_enough(prof):
    """Up to the 0.9 line the prefill's pools (sized from the least free GPU) do not fit; with every
    GPU at the most free one's memory they do: that fix is printed, re-planned."""
    s = prof.read_text()
    i = s.index("  - name: prefill")
    j = s.index("      free_gib_before_load: 177.0", i)
    e = s.index("\n", j)
    prof.write_text(s[:j] + "      free_gib_before_load: [174.4, 175.117, 157.6, 165.623]" + s[e:])
    code, out, err = run("plan", str(prof), "-g", "prefill", "--json")
    g = json.loads(out)["groups"][0]
    assert code == 1 and g["verdict"]["deciding"] == "unbalanced"
    assert g["fixes"] == ["free 0.717 GiB on GPU 0 and 17.517 GiB on GPU 2 and 9.494 GiB on GPU 3 (other processes "
                          "hold it; dsv4ctl facts shows which): SGLang needs every GPU's free memory >= 0.9 x 175.117 "
                          "GiB, and the pools, sized from the least free GPU, fit only with every GPU at 175.117 GiB "
                          "(re-planned: tight, headroom 12.549 GiB)"]
    prof.write_text(prof.read_text().replace("[174.4, 175.117, 157.6, 165.623]", "[175.117, 175.117, 175.117, 175.117]"))
    code, out, err = run("plan", str(prof), "-g", "prefill", "--json")
    g = json.loads(out)["groups"][0]
    assert code == 0 and min(r["headroom_gib"] for r in g["ranks"]) == 12.549
