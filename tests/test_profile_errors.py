"""Bad profiles and serve configs: one stderr line ``dsv4ctl: error: FILE:LINE: FIELD: message``,
exit code 2, nothing on stdout, no traceback (README "Exit codes", issue 2 "Done when").

Each case edits a copy of the default profile (and its serve configs) and runs the real CLI."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import DEFAULT_PROFILE, Result, run_cli

SERVE_DIR = DEFAULT_PROFILE.with_suffix("")  # profiles/dsv4-flash-8xb200-pd/


def copy_profile(dst: Path) -> Path:
    """The default profile and its serve configs copied to ``dst``; returns the profile path."""
    shutil.copy(DEFAULT_PROFILE, dst / DEFAULT_PROFILE.name)
    shutil.copytree(SERVE_DIR, dst / SERVE_DIR.name)
    return dst / DEFAULT_PROFILE.name


def edit(path: Path, old: str, new: str) -> str:
    """Replace the one occurrence of ``old`` in ``path`` by ``new``; returns the new text."""
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} must occur once in {path}"
    text = text.replace(old, new)
    path.write_text(text)
    return text


def line_of(text: str, anchor: str, nth: int = 1) -> int:
    """1-based line number of the ``nth`` line containing ``anchor``."""
    hits = [i + 1 for i, ln in enumerate(text.splitlines()) if anchor in ln]
    assert len(hits) >= nth, f"{anchor!r} not found"
    return hits[nth - 1]


def one_error(r: Result) -> str:
    """Assert the shape every input error has and return the message after the prefix."""
    assert r.code == 2, (r.code, r.out[-500:], r.err)
    assert r.out == ""
    assert "Traceback" not in r.err
    lines = r.err.splitlines()
    assert len(lines) == 1, r.err
    assert lines[0].startswith("dsv4ctl: error: ")
    return lines[0][len("dsv4ctl: error: "):]


# (id, old, new, anchor of the reported line in the edited profile, expected "FIELD: message")
PROFILE_CASES = [
    ("yaml-syntax", "  - name: b200-0\n", "  - name: b200-0: x\n", "name: b200-0: x",
     "YAML syntax error: mapping values are not allowed in this context"),
    ("duplicate-key", "name: dsv4-flash-8xb200-pd\n", "name: dsv4-flash-8xb200-pd\nname: again\n", "name: again",
     "name: duplicate key"),
    ("unknown-top-field", "name: dsv4-flash-8xb200-pd\n", "name: dsv4-flash-8xb200-pd\ncolour: blue\n", "colour:",
     "colour: unknown field"),
    ("unknown-group-field", "    gpus: [4, 5, 6, 7]\n", "    gpus: [4, 5, 6, 7]\n    tpp: 2\n", "tpp: 2",
     "groups[1].tpp: unknown field"),
    ("unknown-ssh-field", "ssh: {user: sglang,", "ssh: {usr: sglang,", "ssh: {usr",
     "hosts[0].ssh.usr: unknown field"),
    ("negative-ram", "ram_gib: 2048", "ram_gib: -1", "ram_gib", "hosts[0].ram_gib: -1 is less than the minimum of 0"),
    ("negative-gpu-memory", "memory_mib: 183359", "memory_mib: -5", "memory_mib",
     "hosts[0].gpus.memory_mib: -5 is less than the minimum of 1"),
    ("zero-gpu-count", "count: 8,", "count: 0,", "count: 0", "hosts[0].gpus.count: 0 is less than the minimum of 1"),
    ("negative-free-memory", "free_gib_before_load: 177.0   #", "free_gib_before_load: -177.0   #", "-177.0",
     "groups[0].memory.free_gib_before_load: -177.0 is less than the minimum of 0"),
    ("zero-free-memory", "free_gib_before_load: 177.0   #", "free_gib_before_load: 0   #", "free_gib_before_load: 0 ",
     "groups[0].memory.free_gib_before_load: must be > 0 GiB, got 0"),
    ("negative-weights", "weights_gib_per_rank: 43.66\n", "weights_gib_per_rank: -1\n", "weights_gib_per_rank: -1",
     "groups[1].memory.weights_gib_per_rank: -1 is less than the minimum of 0"),
    ("negative-tp", "    tp: 4\n    serve_config: dsv4-flash-8xb200-pd/decode", "    tp: -4\n    serve_config: dsv4-flash-8xb200-pd/decode",
     "tp: -4", "groups[1].tp: -4 is less than the minimum of 1"),
    ("negative-gpu-index", "gpus: [4, 5, 6, 7]", "gpus: [4, 5, 6, -7]", "gpus: [4, 5, 6, -7]",
     "groups[1].gpus[3]: -7 is less than the minimum of 0"),
    ("zero-keep-releases", "keep_releases: 5", "keep_releases: 0", "keep_releases",
     "deploy.keep_releases: 0 is less than the minimum of 1"),
    ("bad-port-type", "port: 8000", "port: eighty", "port: eighty", "groups[2].port: 'eighty' is not of type 'integer'"),
    ("bad-ssh-port", "port: 22,", "port: 70000,", "port: 70000", "hosts[0].ssh.port: 70000 is greater than the maximum of 65535"),
    ("bad-role", "role: decode\n", "role: decoder\n", "role: decoder",
     "groups[1].role: 'decoder' is not one of ['prefill', 'decode', 'colocated', 'router']"),
    ("bad-index-k-dtype", "index_k_dtype: bf16", "index_k_dtype: fp16", "index_k_dtype",
     "sglang.index_k_dtype: 'fp16' is not one of ['fp8', 'bf16', 'fp4']"),
    ("tp-not-matching-gpus", "    tp: 4\n    serve_config: dsv4-flash-8xb200-pd/prefill", "    tp: 3\n    serve_config: dsv4-flash-8xb200-pd/prefill",
     "tp: 3", "groups[0].tp: tp*pp = 3 does not match the 4 GPUs of the group"),
    ("tp-pp-dp-not-matching", "    tp: 4\n    serve_config: dsv4-flash-8xb200-pd/prefill", "    tp: 2\n    dp: 4\n    serve_config: dsv4-flash-8xb200-pd/prefill",
     "tp: 2", "groups[0].tp: tp*pp*dp = 8 does not match the 4 GPUs of the group"),
    ("dp-not-dividing-tp", "    tp: 4\n    serve_config: dsv4-flash-8xb200-pd/prefill", "    tp: 4\n    dp: 3\n    dp_attention: true\n    serve_config: dsv4-flash-8xb200-pd/prefill",
     "dp: 3", "groups[0].dp: dp 3 must divide tp 4 with dp_attention"),
    ("gpu-used-twice", "gpus: [4, 5, 6, 7]", "gpus: [3, 5, 6, 7]", "gpus: [3, 5",
     "groups[1].gpus: GPU 3 of b200-0 already used by group 'prefill'"),
    ("gpu-outside-host", "gpus: [4, 5, 6, 7]", "gpus: [4, 5, 6, 9]", "gpus: [4, 5, 6, 9]",
     "groups[1].gpus: GPU 9 outside host b200-0's 8 GPUs"),
    ("unknown-host", "    host: b200-0\n    gpus: [4", "    host: b200-9\n    gpus: [4", "host: b200-9",
     "groups[1].host: unknown host 'b200-9' (hosts: b200-0)"),
    ("unknown-router-target", "decode: [decode]", "decode: [decoder]", "decode: [decoder]",
     "groups[2].decode: unknown group 'decoder'"),
    ("unknown-model", "model: deepseek-v4-flash ", "model: deepseek-v4-mega ", "model: deepseek-v4-mega",
     "model: unknown model 'deepseek-v4-mega': not a shipped model (deepseek-v4-flash, deepseek-v4-pro) "
     "and no config.json at {dir}/deepseek-v4-mega"),
    ("missing-serve-config", "serve_config: dsv4-flash-8xb200-pd/decode.yaml", "serve_config: dsv4-flash-8xb200-pd/nope.yaml",
     "nope.yaml", "groups[1].serve_config: no such file {dir}/dsv4-flash-8xb200-pd/nope.yaml"),
]


@pytest.mark.parametrize("old,new,anchor,expected", [c[1:] for c in PROFILE_CASES], ids=[c[0] for c in PROFILE_CASES])
def test_bad_profile_is_one_line_with_file_line_and_field(tmp_path, old, new, anchor, expected):
    prof = copy_profile(tmp_path)
    text = edit(prof, old, new)
    msg = one_error(run_cli("plan", str(prof), "--json"))
    assert msg == f"{prof}:{line_of(text, anchor)}: {expected.format(dir=tmp_path)}"


def test_missing_required_field_names_it(tmp_path):
    prof = copy_profile(tmp_path)
    text = edit(prof, "model: deepseek-v4-flash ", "#model: deepseek-v4-flash ")
    # the line of the root mapping: its first key
    assert one_error(run_cli("plan", str(prof))) == f"{prof}:{line_of(text, 'version: 1')}: (root): 'model' is required"


def test_host_without_gpu_memory_is_named(tmp_path):
    prof = copy_profile(tmp_path)
    text = edit(prof, "gpus: {model: NVIDIA B200, count: 8, memory_mib: 183359}", "gpus: {model: NVIDIA B200, count: 8}")
    assert one_error(run_cli("plan", str(prof))) == (
        f"{prof}:{line_of(text, 'gpus: {model')}: hosts[0].gpus: 'memory_mib' is required")


@pytest.mark.parametrize("content,expected", [
    ("", "{p}:1: empty profile"),
    ("- a\n- b\n", "{p}:1: a profile must be a mapping"),
    ("name: [x\n", "{p}:2: YAML syntax error: did not find expected ',' or ']'"),
])
def test_degenerate_files(tmp_path, content, expected):
    p = tmp_path / "p.yaml"
    p.write_text(content)
    assert one_error(run_cli("plan", str(p))) == expected.format(p=p)


def test_missing_profile_file_and_unknown_shipped_name(tmp_path):
    assert one_error(run_cli("plan", str(tmp_path / "nope.yaml"))) == f"{tmp_path}/nope.yaml: no such file"
    msg = one_error(run_cli("plan", "no-such-profile"))
    assert msg.endswith("profiles/no-such-profile.yaml: no such file")


def test_a_bare_name_that_is_a_folder_here_is_the_shipped_profile(tmp_path):
    """A shipped profile's serve-config folder has the profile's name: in ``profiles/`` (or any
    folder holding one of that name) the bare name still means the shipped profile; a folder
    without a shipped profile of its name is reported as a folder."""
    (tmp_path / "dsv4-pro-4xh200-pd").mkdir()
    (tmp_path / "mine").mkdir()
    r = run_cli("plan", "dsv4-pro-4xh200-pd", "--json", cwd=tmp_path)
    assert r.code in (0, 1), r.err
    assert r.json()["profile_path"].endswith("profiles/dsv4-pro-4xh200-pd.yaml")
    assert one_error(run_cli("plan", "mine", cwd=tmp_path)) == "mine: not a regular file (a folder)"
    # an operator's copy beside its serve-config folder (what profile init makes) is that copy
    r = run_cli("profile", "init", "dsv4-pro-4xh200-pd.yaml", "--from", "dsv4-pro-4xh200-pd", cwd=tmp_path / "mine")
    assert r.code == 0, r.err
    r = run_cli("plan", "dsv4-pro-4xh200-pd", "--json", cwd=tmp_path / "mine")
    assert r.json()["profile_path"] == "dsv4-pro-4xh200-pd.yaml" or \
        r.json()["profile_path"] == str(tmp_path / "mine" / "dsv4-pro-4xh200-pd.yaml"), r.json()["profile_path"]


def test_a_good_edit_of_the_copy_still_plans(tmp_path):
    """Control for the cases above: the unedited copy plans (exit 0), so each failure is the edit's."""
    prof = copy_profile(tmp_path)
    r = run_cli("plan", str(prof), "--json")
    assert r.code == 0, r.err
    assert r.json()["profile_path"] == str(prof)


# ------------------------------------------------------------------------------ serve configs
# (id, which serve config, old, new, anchor, expected "FIELD: message")
SERVE_CASES = [
    ("tp-disagrees", "decode.yaml", "tp-size: 4", "tp-size: 8", "tp-size: 8",
     "tp-size: 8 disagrees with the profile's group 'decode' (tp: 4)"),
    # the profile leaves dp and pp to the serve config (issue 25): SGLang's placement decides
    ("dp-more-ranks", "decode.yaml", "tp-size: 4\n", "tp-size: 4\ndp-size: 2\n", "base-gpu-id",
     "SGLang puts group 'decode' on GPUs 4,5,6,7,8,9,10,11 (base-gpu-id 4, gpu-id-step 1, 8 rank(s)), but the "
     "profile lists GPUs 4,5,6,7 (PROFILE:47): make the profile's gpus the GPUs SGLang uses"),
    ("pp-more-ranks", "prefill.yaml", "tp-size: 4\n", "tp-size: 4\npp-size: 2\n", "base-gpu-id",
     "SGLang puts group 'prefill' on GPUs 0,1,2,3,4,5,6,7 (base-gpu-id 0, gpu-id-step 1, 8 rank(s)), but the "
     "profile lists GPUs 0,1,2,3 (PROFILE:38): make the profile's gpus the GPUs SGLang uses"),
    ("underscore-key", "decode.yaml", "max-running-requests: 128", "max_running_requests: 128", "max_running",
     "max_running_requests: not an SGLang 0.5.23 server argument (SGLang --config keys use dashes: "
     "max-running-requests) (SGLang 0.5.23 refuses it at start-up: argparse: unrecognized arguments)"),
    ("alias-twice", "decode.yaml", "tp-size: 4\n", "tensor-parallel-size: 4\ntp-size: 4\n", "tp-size: 4",
     "tp-size: tp-size already given as tensor-parallel-size (dsv4ctl refuses it: SGLang's argparse would "
     "silently take the last one)"),
    ("not-a-number", "decode.yaml", "mem-fraction-static: 0.885", "mem-fraction-static: lots", "mem-fraction-static",
     "mem-fraction-static: invalid float value: 'lots' (SGLang 0.5.23 refuses it at start-up: argparse)"),
    ("negative-mrr", "decode.yaml", "max-running-requests: 128", "max-running-requests: -3", "max-running-requests",
     "max-running-requests: must be >= 0, got -3"),
    ("yaml-syntax", "prefill.yaml", "port: 30000", "port: [30000", "port: [30000",
     "YAML syntax error: did not find expected ',' or ']'"),
]


@pytest.mark.parametrize("which,old,new,anchor,expected", [c[1:] for c in SERVE_CASES], ids=[c[0] for c in SERVE_CASES])
def test_bad_serve_config_is_one_line_with_file_line_and_field(tmp_path, which, old, new, anchor, expected):
    prof = copy_profile(tmp_path)
    sc = tmp_path / SERVE_DIR.name / which
    text = edit(sc, old, new)
    line = line_of(text, anchor) if expected.startswith("YAML") is False else line_of(text, anchor) + 1
    assert one_error(run_cli("plan", str(prof))) == f"{sc}:{line}: {expected.replace('PROFILE', str(prof))}"


def test_profile_init_beside_a_file_named_as_its_serve_config_folder_writes_nothing(tmp_path):
    """``profile init blk.yaml`` puts the serve configs in ``blk/``; a regular file ``blk`` there is
    refused before anything is written, by the dry run too (exit 2, one line); a clean name works."""
    (tmp_path / "blk").write_text("mine\n")
    for extra in (("--dry-run",), ()):
        r = run_cli("profile", "init", "blk.yaml", *extra, cwd=tmp_path)
        assert r.code == 2 and r.out == "", (extra, r.out, r.err)
        assert r.err == (f"dsv4ctl: error: {Path('blk')}: not a folder, and {Path('blk') / 'prefill.yaml'} would go "
                         "inside it (move it or choose another PATH)\n"), r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blk"] and (tmp_path / "blk").read_text() == "mine\n"
    r = run_cli("profile", "init", "ok.yaml", cwd=tmp_path)
    assert r.code == 0 and (tmp_path / "ok.yaml").is_file() and (tmp_path / "ok" / "prefill.yaml").is_file(), r.err
