"""YAML merge keys (``<<``) read as SGLang reads ``--config`` (PyYAML ``safe_load``), in profiles
and serve configs; the round-trip editor sets a merged key (an explicit key wins) and refuses to
remove one, naming the ``<<`` line (issue 41 item 6)."""

from __future__ import annotations

import shutil

import pytest
import yaml

from dsv4ctl.errors import InputError
from dsv4ctl.profile.yamlpos import parse_yaml
from dsv4ctl.serve.edit import REMOVE, Change, apply_changes
from tests.conftest import run_cli

DOCS = [
    "base: &b {a: 1, b: 2}\nx:\n  <<: *b\n  b: 3\n",                              # written key wins
    "a: &a {p: 1}\nb: &b {p: 2, q: 3}\nc:\n  <<: [*a, *b]\n  r: 4\n",             # first merged mapping wins
    "<<: {x: 1}\ny: 2\n",                                                         # top level, inline
    "e: &e {k: v}\ngroups:\n  - {name: a, env: {<<: *e, z: 1}}\n  - {name: b, env: {<<: *e}}\n",
    "<<: {x: 1}\n<<: {x: 2, y: 3}\n",                                             # two merge keys
    # SGLang's keys are longer than one character: PyYAML 6.0 keeps every merged pair and builds
    # the mapping in order, so the last mapping naming a key wins (breaker's finding)
    "model-path: /m\n<<: [{tp-size: 4}, {tp-size: 8}]\n",
    "model-path: /m\n<<: {tp-size: 4, dp-size: 1}\n<<: {tp-size: 8}\n",
    "base: &b {tp-size: 4}\nx:\n  <<: [*b, *b, {tp-size: 2}]\n",
]


@pytest.mark.parametrize("text", DOCS)
def test_merge_keys_read_as_pyyaml_safe_load(text):
    data, _pos = parse_yaml(text, "f.yaml")
    assert data == yaml.safe_load(text)
    assert list(data) == list(yaml.safe_load(text))          # key order too


def test_merged_values_point_at_their_merge_key_line():
    _data, pos = parse_yaml(DOCS[1], "f.yaml")
    assert pos.where(("c", "p")) == "f.yaml:4" and pos.where(("c", "r")) == "f.yaml:5"
    assert pos.merged == {("c", "p"), ("c", "q")}


def test_a_merge_of_no_mapping_is_one_error_line():
    with pytest.raises(InputError, match=r"f.yaml:2: x.<<: a merge key takes a mapping or a list of mappings"):
        parse_yaml("x:\n  <<: 3\n", "f.yaml")


CONF = "model-path: m\n<<: {max-running-requests: 128, watchdog-timeout: 900}\nport: 30001\n"


def test_the_editor_sets_a_merged_key_and_refuses_to_remove_one():
    out = apply_changes(CONF, [Change("max-running-requests", 64)], "d.yaml")
    assert yaml.safe_load(out)["max-running-requests"] == 64 and out.startswith(CONF)
    with pytest.raises(InputError, match=r"^d.yaml:2: max-running-requests comes from a YAML merge key \(<<\)"):
        apply_changes(CONF, [Change("max-running-requests", REMOVE)], "d.yaml")


def test_plan_reads_a_profile_whose_groups_share_memory_by_a_merge_key(tmp_path):
    assert run_cli("profile", "init", str(tmp_path / "p.yaml")).code == 0
    text = (tmp_path / "p.yaml").read_text()
    text = text.replace("    memory:\n      free_gib_before_load: 177.0   # assumption",
                        "    memory: &mem\n      free_gib_before_load: 177.0   # assumption", 1)
    text = text.replace("    memory:\n      free_gib_before_load: 177.0\n      weights_gib_per_rank: 43.66",
                        "    memory:\n      <<: *mem\n      weights_gib_per_rank: 40.0")
    assert "<<: *mem" in text
    (tmp_path / "p.yaml").write_text(text)
    r = run_cli("plan", str(tmp_path / "p.yaml"), "--json")
    assert r.code == 0, r.err
    groups = {g["name"]: g for g in r.json()["groups"]}
    assert "decode" in groups and "prefill" in groups
    assert "weights 40.0 GiB/rank" in run_cli("plan", str(tmp_path / "p.yaml")).out
