"""``conforms`` (the fast profile check) never accepts a document jsonschema rejects, on the
shipped profile and on hypothesis mutations of it (values replaced by other JSON-ish values,
keys added or dropped)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv4ctl.profile.model import PROFILE_SCHEMA, _validator, conforms
from dsv4ctl.profile.yamlpos import load_yaml
from tests.conftest import DEFAULT_PROFILE

BASE, _ = load_yaml(DEFAULT_PROFILE)
VALIDATOR = _validator()

scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 70000), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from(["", "x", "bf16", "fp8", "prefill", "router", "a b", "sglang", "auto"]),
                    st.sampled_from([4.0, 0.5, 1e300, -1.0, 65536, 0]))
values = st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(
    st.sampled_from(["name", "tp", "x", "memory_mib", "port", "role"]), c, max_size=3)), max_leaves=6)


def paths(x, here=()):
    yield here
    if isinstance(x, dict):
        for k, v in x.items():
            yield from paths(v, here + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from paths(v, here + (i,))


ALL = [p for p in paths(BASE) if p]


def mutate(doc, path, op, value):
    doc = copy.deepcopy(doc)
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if op == "set":
        parent[path[-1]] = value
    elif op == "drop" and isinstance(parent, dict):
        del parent[path[-1]]
    elif op == "add" and isinstance(parent, dict):
        parent["extra_key"] = value
    return doc


def test_the_shipped_profile_conforms():
    assert conforms(PROFILE_SCHEMA, BASE) and VALIDATOR.is_valid(BASE)


@pytest.mark.parametrize("bad", [4.0, True, float("nan"), float("inf"), -1, "8"])
def test_strict_numbers(bad):
    doc = mutate(BASE, ("groups", 0, "tp"), "set", bad)
    assert not conforms(PROFILE_SCHEMA, doc) and not VALIDATOR.is_valid(doc)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(ALL), st.sampled_from(["set", "drop", "add"]), values)
def test_conforms_never_accepts_what_jsonschema_rejects(path, op, value):
    doc = mutate(BASE, path, op, value)
    # the same verdict (a needless reject would only cost time: jsonschema then has the last word)
    assert conforms(PROFILE_SCHEMA, doc) == VALIDATOR.is_valid(doc), (path, op, value)


@pytest.mark.parametrize("value, ok", [(0, False), (1, False), (0.01, True), (0.999, True), (-0.5, False)])
def test_exclusive_bounds_as_jsonschema(value, ok):
    """``check.compare.baseline`` is in (0, 1): ``conforms`` knows exclusiveMinimum/Maximum (a
    profile setting it was a KeyError traceback) and agrees with jsonschema at the bounds."""
    doc = copy.deepcopy(BASE)
    doc.setdefault("check", {})["compare"] = {"baseline": value}
    assert conforms(PROFILE_SCHEMA, doc) == VALIDATOR.is_valid(doc) == ok
