"""``dsv4ctl facts PROFILE --write``: the measured per-GPU ``free_gib_before_load`` goes into the
profile (issue 16 item 4), through the round-trip editor :func:`dsv4ctl.profile.edit.set_value`.

The editor is tested on the shipped profile's text (exact results); the command over a real sshd
host whose ``nvidia-smi`` prints rows of the real H200 capture (tests/data/gpus/h200-query.csv,
copied from shared/reference/fixtures/h200)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path

import pytest

from dsv4ctl.errors import InputError
from dsv4ctl.hosts.gpus import parse_gpus
from dsv4ctl.plan.facts import CONTEXT_GIB, group_facts, profile_with_facts, values_to_write
from dsv4ctl.profile.edit import set_value
from tests.conftest import DEFAULT_PROFILE
from tests.sshd import harness

SHIPPED = DEFAULT_PROFILE.read_text()
H200 = (Path(__file__).parent / "data" / "gpus" / "h200-query.csv").read_text().splitlines()
STAMP = "2026-12-02T01:00:00Z"
MEASURED = f"# measured by dsv4ctl facts {STAMP}"
PREFILL_LINE = ("      free_gib_before_load: 177.0   # assumption (capacity reference §4); measure with "
                "torch.cuda.mem_get_info\n")
DECODE_AT = SHIPPED.index("  - name: decode")
P = round(143156 / 1024 - CONTEXT_GIB, 3)          # the real H200's memory.free, MiB -> GiB, minus context


def decode_replaced(text: str, new_line: str) -> str:
    old = "      free_gib_before_load: 177.0\n"
    i = text.index(old, DECODE_AT)
    return text[:i] + new_line + text[i + len(old):]


# -- the editor, on the shipped profile text ------------------------------------------------------

def test_replaces_only_the_value_and_adds_the_comment():
    new = set_value(SHIPPED, ("groups", 1, "memory", "free_gib_before_load"), [176.98, 176.98, 156.98, 176.98],
                    "p.yaml", MEASURED)
    assert new == decode_replaced(
        SHIPPED, f"      free_gib_before_load: [176.98, 176.98, 156.98, 176.98]  {MEASURED}\n")


def test_a_trailing_comment_is_replaced_or_kept():
    path = ("groups", 0, "memory", "free_gib_before_load")
    new = set_value(SHIPPED, path, [9.5, 9.5, 9.5, 9.5], "p.yaml", MEASURED)
    assert new == SHIPPED.replace(PREFILL_LINE, f"      free_gib_before_load: [9.5, 9.5, 9.5, 9.5] {MEASURED}\n")
    # no new comment: the old one stays, at its column when the value fits before it
    new = set_value(SHIPPED, path, 9.5, "p.yaml")
    assert new == SHIPPED.replace(PREFILL_LINE, PREFILL_LINE.replace("177.0   #", "9.5     #"))
    new = set_value(SHIPPED, path, [1.0, 2.0, 3.0, 4.0], "p.yaml")
    assert new == SHIPPED.replace(PREFILL_LINE, PREFILL_LINE.replace("177.0   #", "[1.0, 2.0, 3.0, 4.0] #"))


def test_idempotent_and_reversible():
    path = ("groups", 1, "memory", "free_gib_before_load")
    once = set_value(SHIPPED, path, [1.5, 2.5, 3.5, 4.5], "p.yaml", MEASURED)
    assert set_value(once, path, [1.5, 2.5, 3.5, 4.5], "p.yaml", MEASURED) == once
    assert set_value(once, path, 177.0, "p.yaml", "") == SHIPPED          # "": the comment goes too
    back = set_value(once, path, 177.0, "p.yaml")          # None: the comment stays, at its column
    col = len("      free_gib_before_load: [1.5, 2.5, 3.5, 4.5]  ")
    assert back == decode_replaced(SHIPPED, "      free_gib_before_load: 177.0".ljust(col) + MEASURED + "\n")


def test_insert_the_key_when_absent():
    text = decode_replaced(SHIPPED, "")
    new = set_value(text, ("groups", 1, "memory", "free_gib_before_load"), [1.0, 2.0, 3.0, 4.0], "p.yaml", MEASURED)
    assert new == text.replace("      weights_gib_per_rank: 43.66\n  - name: router",
                               f"      weights_gib_per_rank: 43.66\n      free_gib_before_load: [1.0, 2.0, 3.0, 4.0]"
                               f"  {MEASURED}\n  - name: router")


def test_insert_the_memory_block_when_absent():
    block = "    memory:\n      free_gib_before_load: 177.0\n      weights_gib_per_rank: 43.66\n  - name: router"
    text = SHIPPED.replace(block, "  - name: router")
    new = set_value(text, ("groups", 1, "memory", "free_gib_before_load"), [1.0, 2.0, 3.0, 4.0], "p.yaml", MEASURED)
    assert new == text.replace("decode.yaml\n  - name: router", "decode.yaml\n    memory:\n      free_gib_before_load: "
                               f"[1.0, 2.0, 3.0, 4.0]  {MEASURED}\n  - name: router")
    # the last group of a file without a final newline
    text = SHIPPED.rstrip("\n")
    new = set_value(text, ("groups", 2, "memory", "other_gib"), 1.0, "p.yaml")
    assert new == text + "\n    memory:\n      other_gib: 1.0"


def test_empty_values_are_filled_in():
    block = "    memory:\n      free_gib_before_load: 177.0\n      weights_gib_per_rank: 43.66\n"
    path = ("groups", 1, "memory", "free_gib_before_load")
    line = f"      free_gib_before_load: [1.0]  {MEASURED}\n"
    text = SHIPPED.replace(block, "    memory:   # to measure\n")
    assert set_value(text, path, [1.0], "p.yaml", MEASURED) == SHIPPED.replace(block, "    memory:   # to measure\n" + line)
    text = decode_replaced(SHIPPED, "      free_gib_before_load:\n")
    assert set_value(text, path, [1.0], "p.yaml", MEASURED) == decode_replaced(SHIPPED, line)
    # a file ending in "memory:" without a line end keeps ending without one
    text = SHIPPED[:SHIPPED.index(block)] + "    memory:"
    assert set_value(text, path, [1.0], "p.yaml", MEASURED) == text + "\n" + line.rstrip("\n")
    with pytest.raises(InputError, match=r"p.yaml:\d+: groups\[1\]\.memory is null: give it a value by hand"):
        set_value(SHIPPED.replace(block, "    memory: ~\n"), path, [1.0], "p.yaml")


def test_a_block_sequence_becomes_one_line_and_crlf_stays():
    text = SHIPPED.replace(PREFILL_LINE, "      free_gib_before_load:   # per GPU\n        - 1\n        - 2\n"
                                         "        - 3\n        - 4\n      # measured by hand\n")
    new = set_value(text, ("groups", 0, "memory", "free_gib_before_load"), [5.0, 6.0, 7.0, 8.0], "p.yaml")
    assert new == SHIPPED.replace(PREFILL_LINE, "      free_gib_before_load: [5.0, 6.0, 7.0, 8.0] # per GPU\n"
                                                "      # measured by hand\n")
    crlf = SHIPPED.replace("\n", "\r\n")
    new = set_value(crlf, ("groups", 1, "memory", "free_gib_before_load"), [1.0], "p.yaml", MEASURED)
    assert new == decode_replaced(SHIPPED, f"      free_gib_before_load: [1.0]  {MEASURED}\n").replace("\n", "\r\n")


@pytest.mark.parametrize("text, path, match", [
    (SHIPPED, ("groups", 7, "memory", "x"), r"p.yaml:\d+: groups\[7\]: no such item"),
    (SHIPPED, ("groups", 0, "gpus", "x"), r"groups\[0\]\.gpus is not a mapping"),
    (SHIPPED.replace(PREFILL_LINE, "      free_gib_before_load: &p 177.0\n"), ("groups", 0, "memory", "free_gib_before_load"),
     "anchored or tagged"),
    (SHIPPED.replace("    memory:\n      free_gib_before_load: 177.0\n      weights_gib_per_rank: 43.66\n  - name: router",
                     "    memory: {weights_gib_per_rank: 43.66}\n  - name: router"),
     ("groups", 1, "memory", "free_gib_before_load"), r"groups\[1\]\.memory is a flow mapping: add .* by hand"),
    ("a: [1\n", ("a",), r"p.yaml:\d+: YAML syntax error"),
])
def test_refusals(text, path, match):
    with pytest.raises(InputError, match=match):
        set_value(text, path, [1.0], "p.yaml")


def test_what_to_write_from_the_gpus():
    rows = [H200[0]] + [H200[1].replace("0, NVIDIA", f"{i}, NVIDIA", 1).replace("-000000000000,", f"-00000000000{i},")
                        for i in range(4)]
    gpus = parse_gpus("@gpus\n" + "\n".join(rows) + "\n@apps\ngpu_uuid, pid, process_name, used_memory [MiB]\n"
                      "GPU-00000000-0000-0000-0000-000000000002, 77, python3, 20460 MiB\n")
    f = group_facts("prefill", "h0", [0, 1, 2, 3], gpus)
    vals, why = values_to_write(f, [0, 1, 2, 3], 177.0)
    assert vals is None and why == ["group prefill: GPU 2 on h0 has processes holding memory (python3 pid 77): "
                                    "its free memory is not the free memory before load"]
    assert values_to_write(f, [0, 1, 2, 3], 177.0, force=True) == ([P] * 4, [])
    f = group_facts("prefill", "h0", [0, 1, 9], gpus)
    assert values_to_write(f, [0, 1, 9], [1.0, 2.0, 3.0]) == (None, ["group prefill: GPU 9 on h0 not reported by nvidia-smi"])
    assert values_to_write(f, [0, 1, 9], [1.0, 2.0, 3.0], force=True) == ([P, P, 3.0], [])
    assert values_to_write(f, [0, 1, 9], None, force=True)[1] == [
        "group prefill: GPU 9 on h0 not reported by nvidia-smi and the profile has no value to keep"]
    assert profile_with_facts(SHIPPED, "p.yaml", {1: [P] * 4}, STAMP) == decode_replaced(
        SHIPPED, f"      free_gib_before_load: [{P}, {P}, {P}, {P}]  {MEASURED}\n")


# -- the command, over a real sshd host --------------------------------------------------------------

@pytest.fixture(scope="module")
def gpu_host(tmp_path_factory):
    """One real sshd host whose PATH starts with a folder holding a fake ``nvidia-smi`` that prints
    ``gpus.csv`` and ``apps.csv`` of that folder."""
    why = harness.available()
    if why:
        pytest.skip(why)
    from tests.sshd.gpuhost import start_gpu_cluster
    c, bin_ = start_gpu_cluster(tmp_path_factory.mktemp("facts-sshd"))
    yield c, bin_
    c.stop()


def set_gpus(bin_: Path, busy: dict[int, int] | None = None, missing: tuple[int, ...] = ()) -> None:
    """Eight rows made from the real H200 row (index and uuid changed); ``busy``: GPU -> MiB held
    by a python3 process (used and free adjusted)."""
    busy = busy or {}
    rows, apps = [H200[0]], ["gpu_uuid, pid, process_name, used_memory [MiB]"]
    for i in range(8):
        if i in missing:
            continue
        row = H200[1].replace("0, NVIDIA", f"{i}, NVIDIA", 1).replace("-000000000000,", f"-00000000000{i},")
        if i in busy:
            row = row.replace(" 0 MiB, 143156 MiB", f" {busy[i] + 20} MiB, {143156 - busy[i] - 20} MiB")
            apps.append(f"GPU-00000000-0000-0000-0000-00000000000{i}, {5000 + i}, python3, {busy[i]} MiB")
        rows.append(row)
    (bin_ / "gpus.csv").write_text("\n".join(rows) + "\n")
    (bin_ / "apps.csv").write_text("\n".join(apps) + "\n")


@pytest.fixture
def prof(tmp_path, gpu_host):
    c, _ = gpu_host
    h = c.hosts[0]
    shutil.copytree(DEFAULT_PROFILE.parent / DEFAULT_PROFILE.stem, tmp_path / DEFAULT_PROFILE.stem)
    text = SHIPPED.replace("series: ../patches/sglang-0.5.23", "series: null")
    text = text.replace("    address: 127.0.0.1 ", f"    address: {h.address} ")
    text = text.replace("    ssh: {user: sglang, port: 22, key: ~/.ssh/id_ed25519}",
                        f"    ssh: {{user: {c.user}, port: {h.port}, key: {c.user_key}, known_hosts: {c.known_hosts}}}")
    text = text.replace("{model: NVIDIA B200, count: 8, memory_mib: 183359}", "{model: NVIDIA H200, count: 8, memory_mib: 143771}")
    p = tmp_path / DEFAULT_PROFILE.name
    p.write_text(text)
    p.chmod(0o640)
    return p


def run(*argv: str) -> tuple[int, str, str]:
    from dsv4ctl.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch):
    import dsv4ctl.hosts.audit as audit
    monkeypatch.setattr(audit, "now_iso", lambda t=None: STAMP)


def expected_both(text: str) -> str:
    vals = ", ".join([str(P)] * 4)
    text = text.replace(PREFILL_LINE, f"      free_gib_before_load: [{vals}] {MEASURED}\n")
    return decode_replaced(text, f"      free_gib_before_load: [{vals}]  {MEASURED}\n")


def test_write_sets_every_group_and_the_profile_loads(prof, gpu_host):
    from dsv4ctl.profile.model import load_profile
    set_gpus(gpu_host[1])
    before = prof.read_text()
    code, out, err = run("facts", str(prof), "--write", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["written"] == ["prefill", "decode"] and d["refused"] == [] and d["dry_run"] is False
    assert d["groups"][0]["gpus"][0]["name"] == "NVIDIA H200"
    assert prof.read_text() == expected_both(before)
    assert oct(prof.stat().st_mode & 0o777) == "0o640"
    assert [g.memory.free_gib_before_load for g in load_profile(prof).servers()] == [[P] * 4, [P] * 4]
    assert not [f for f in os.listdir(prof.parent) if f.startswith(".")]         # no temp file left
    # measuring again writes the same text
    code, out, err = run("facts", str(prof), "--write")
    assert code == 0 and prof.read_text() == expected_both(before)
    assert out.rstrip().endswith(f"wrote {prof}: groups[].memory.free_gib_before_load of prefill, decode")


def test_dry_run_prints_the_diff_and_writes_nothing(prof, gpu_host):
    set_gpus(gpu_host[1])
    before = prof.read_bytes()
    code, out, err = run("facts", str(prof), "-g", "decode", "--write", "--dry-run")
    assert code == 0, err
    assert prof.read_bytes() == before
    assert (f"-      free_gib_before_load: 177.0\n+      free_gib_before_load: [{P}, {P}, {P}, {P}]  {MEASURED}\n"
            in out)
    assert out.rstrip().endswith(f"dry run: would write {prof}: groups[].memory.free_gib_before_load of decode")
    code, out, err = run("facts", str(prof), "-g", "decode", "--write", "--dry-run", "--json")
    d = json.loads(out)
    assert code == 0 and d["written"] == [] and d["dry_run"] is True and "+      free_gib_before_load" in d["diff"]


def test_a_busy_gpu_refuses_the_whole_write_unless_forced(prof, gpu_host):
    set_gpus(gpu_host[1], busy={6: 20460})
    before = prof.read_bytes()
    code, out, err = run("facts", str(prof), "--write")
    assert code == 1 and prof.read_bytes() == before
    assert err == ("dsv4ctl: refused: facts --write: group decode: GPU 6 on b200-0 has processes holding memory "
                   "(python3 pid 5006): its free memory is not the free memory before load; nothing written (refused: "
                   "decode; writable: prefill): measure again on idle GPUs, or --force\n")
    code, out, err = run("facts", str(prof), "--write", "--json")
    d = json.loads(out)
    assert code == 1 and d["written"] == [] and len(d["refused"]) == 1
    code, out, err = run("facts", str(prof), "--write", "--force", "-g", "decode")
    assert code == 0, err
    busy = round((143156 - 20480) / 1024 - CONTEXT_GIB, 3)
    assert prof.read_text() == decode_replaced(
        before.decode(), f"      free_gib_before_load: [{P}, {P}, {busy}, {P}]  {MEASURED}\n")
    # and the plan now fails on the imbalance, with the memory to free as its fix
    code, out, err = run("plan", str(prof), "-g", "decode", "--json")
    g = json.loads(out)["groups"][0]
    assert code == 1 and g["verdict"]["deciding"] == "unbalanced"
    assert g["fixes"][0].startswith(f"free {round(-(-round((0.9 * P - busy) * 1000) // 100) / 10, 1)} GiB on GPU 6 "
                                    "(other processes hold it; dsv4ctl facts shows which)")


def test_a_gpu_not_reported_keeps_the_profile_value_only_when_forced(prof, gpu_host):
    set_gpus(gpu_host[1], missing=(7,))
    before = prof.read_text()
    code, out, err = run("facts", str(prof), "-g", "decode", "--write")
    assert code == 1 and prof.read_text() == before
    assert err.startswith("dsv4ctl: refused: facts --write: group decode: GPU 7 on b200-0 not reported by nvidia-smi; "
                          "nothing written") and err.count("\n") == 1
    code, out, err = run("facts", str(prof), "-g", "decode", "--write", "--force")
    assert code == 0, err
    assert prof.read_text() == decode_replaced(before, f"      free_gib_before_load: [{P}, {P}, {P}, 177.0]  {MEASURED}\n")


def test_shipped_profiles_and_usage_are_refused_before_any_host_is_read():
    code, out, err = run("facts", str(DEFAULT_PROFILE), "--write")
    assert code == 2 and "shipped with dsv4ctl, not edited" in err and err.count("\n") == 1
    for flag in ("--dry-run", "--force"):
        code, out, err = run("facts", str(DEFAULT_PROFILE), flag)
        assert code == 2 and err == f"dsv4ctl: error: {flag} goes with --write\n"


def test_a_profile_that_would_not_load_is_not_written(prof, gpu_host, monkeypatch):
    import dsv4ctl.plan.facts as pf
    set_gpus(gpu_host[1])
    real = pf.profile_with_facts
    monkeypatch.setattr(pf, "profile_with_facts",
                        lambda *a: real(*a).replace("    tp: 4\n    serve_config: dsv4-flash-8xb200-pd/decode.yaml",
                                                    "    tp: 3\n    serve_config: dsv4-flash-8xb200-pd/decode.yaml"))
    before = prof.read_bytes()
    code, out, err = run("facts", str(prof), "-g", "decode", "--write")
    assert code == 2 and prof.read_bytes() == before
    assert err.startswith(f"dsv4ctl: error: {prof}:") and "tp*pp = 3 does not match the 4 GPUs" in err
    assert err.endswith("(after the edit); nothing written\n") and err.count("\n") == 1
    assert not [f for f in os.listdir(prof.parent) if f.startswith(".")]


def test_editor_refuses_a_shared_memory_mapping_and_keeps_flow_mappings_valid():
    """``memory: &mem {...}`` / ``memory: *mem``: an edit of one group's values would change the
    other's: refused. A flow mapping gets the new value and no comment inside its braces."""
    from dsv4ctl.errors import InputError
    from dsv4ctl.profile.edit import set_value
    shared = ("groups:\n  - name: prefill\n    memory: &mem\n      free_gib_before_load: 177.0\n"
              "  - name: decode\n    memory: *mem\n")
    for i in (0, 1):
        with pytest.raises(InputError) as e:
            set_value(shared, ("groups", i, "memory", "free_gib_before_load"), [171.0], "p.yaml", "# measured")
        assert "is an alias or anchored (shared with another part of the file)" in str(e.value)
    flow = "groups:\n  - name: decode\n    memory: {free_gib_before_load: 177.0, weights_gib_per_rank: 43.66}\n"
    out = set_value(flow, ("groups", 0, "memory", "free_gib_before_load"), [171.0, 170.5], "p.yaml", "# measured")
    assert out == ("groups:\n  - name: decode\n    memory: {free_gib_before_load: [171.0, 170.5], "
                   "weights_gib_per_rank: 43.66}\n")


def test_editors_count_lines_as_yaml_does():
    """U+2028 inside a value is not a line break for YAML (str.splitlines would split there and
    every later position would be off by one)."""
    from dsv4ctl.profile.edit import set_value
    from dsv4ctl.serve.edit import Change, apply_changes
    text = "served-model-name: \"a\u2028b\"\nmem-fraction-static: 0.865\nport: 30000\n"
    out = apply_changes(text, [Change("mem-fraction-static", 0.86)], "p.yaml")
    assert out == "served-model-name: \"a\u2028b\"\nmem-fraction-static: 0.86\nport: 30000\n"
    prof = "name: \"x\u2028y\"\ngroups:\n  - name: d\n    memory:\n      free_gib_before_load: 1.0\n"
    assert set_value(prof, ("groups", 0, "memory", "free_gib_before_load"), [2.0], "p.yaml") == prof.replace("1.0", "[2.0]")


def test_na_memory_prints_unknown_and_refuses_the_write(prof, gpu_host):
    """nvidia-smi's [N/A] memory (issue 41 item 6): 'unknown', never 'None MiB', a note saying the
    free memory is not measured, and --write refuses that GPU by what it is."""
    set_gpus(gpu_host[1])
    csv_ = gpu_host[1] / "gpus.csv"
    rows = csv_.read_text().splitlines()
    rows[8] = rows[8].replace("143771 MiB, 0 MiB, 143156 MiB", "[N/A], [N/A], [N/A]")      # GPU 7
    csv_.write_text("\n".join(rows) + "\n")
    code, out, err = run("facts", str(prof), "-g", "decode")
    assert code == 0, err
    assert "None" not in out
    assert "  GPU 7: NVIDIA H200: total unknown, used unknown, free unknown -> free_gib_before_load unknown" in out
    assert ("  note: GPU 7: free memory unknown (nvidia-smi on b200-0 gives no number, e.g. [N/A]): "
            "free_gib_before_load not measured") in out
    code, out, err = run("facts", str(prof), "-g", "decode", "--write")
    assert code == 1
    assert err.startswith("dsv4ctl: refused: facts --write: group decode: GPU 7 on b200-0 free memory unknown to "
                          "nvidia-smi ([N/A]); nothing written")
