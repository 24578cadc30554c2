"""The shipped JSON Schemas (dsv4ctl/data/schemas/): the generated ones match the validators
they mirror, and real data validates against them with jsonschema (a runtime dependency of
dsv4ctl, so always installed)."""

from __future__ import annotations

import importlib.util
import json

import jsonschema
import pytest
import yaml

from tests.conftest import REPO, run_cli

SCHEMAS = REPO / "dsv4ctl" / "data" / "schemas"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_schemas", REPO / "scripts" / "gen_schemas.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _validator(name: str):
    doc = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(doc)
    return jsonschema.Draft202012Validator(doc)


def test_generated_schemas_are_current():
    for name, text in _gen().generate().items():
        assert (SCHEMAS / name).read_text() == text, f"{name} is stale: run python scripts/gen_schemas.py"


def test_every_schema_is_valid_draft_2020_12():
    names = sorted(p.name for p in SCHEMAS.glob("*.schema.json"))
    assert names == ["check-load.schema.json", "plan.schema.json", "playbook.schema.json", "profile.schema.json",
                     "watch.schema.json"]
    for n in names:
        _validator(n[:-len(".schema.json")])


@pytest.mark.parametrize("path", sorted((REPO / "profiles").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_profiles_validate_against_the_profile_schema(path):
    errors = list(_validator("profile").iter_errors(yaml.safe_load(path.read_text())))
    assert errors == []


def test_the_profile_schema_rejects_what_the_loader_rejects(tmp_path):
    data = yaml.safe_load((REPO / "profiles/dsv4-flash-8xb200-pd.yaml").read_text())
    data["sglang"]["index_k_dtype"] = "fp16"
    data["hostz"] = []
    msgs = sorted(e.message for e in _validator("profile").iter_errors(data))
    assert msgs == ["'fp16' is not one of ['fp8', 'bf16', 'fp4']",
                    "Additional properties are not allowed ('hostz' was unexpected)"]


@pytest.mark.parametrize("path", sorted((REPO / "playbooks").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_playbooks_validate_against_the_playbook_schema(path):
    assert list(_validator("playbook").iter_errors(yaml.safe_load(path.read_text()))) == []


def test_plan_output_validates_against_the_plan_schema():
    v = _validator("plan")
    for golden in sorted((REPO / "tests/data/golden").glob("plan_*.json")):
        assert list(v.iter_errors(json.loads(golden.read_text())["stdout"])) == [], golden.name
    r = run_cli("plan", "--json")
    doc = r.json()
    assert list(v.iter_errors(doc)) == []
    doc["groups"][0]["ranks"][0].pop("headroom_gib")
    assert [e.message for e in v.iter_errors(doc)] == ["'headroom_gib' is a required property"]


def test_check_load_document_validates_against_its_schema():
    from dsv4ctl.check import report as R
    recs = [{"class": "ok", "ttft_s": 0.1, "e2e_s": 0.5, "completion_tokens": 10, "stream": True, "rid": f"r{i}"}
            for i in range(4)]
    lv = R.summarize_level(recs, url="http://127.0.0.1:1", concurrency=2, duration_s=1.0, itl_gaps=[0.01],
                           max_corruption=0.6)
    doc = R.build_doc([lv], max_corruption=0.6, settings={"urls": ["http://127.0.0.1:1"]})
    v = _validator("check-load")
    assert list(v.iter_errors(doc)) == []
    doc["levels"][0]["pass"] = "yes"
    assert [e.message for e in v.iter_errors(doc)] == ["'yes' is not of type 'boolean'"]
