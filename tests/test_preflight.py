"""The deploy preflight's line says each group's plan verdict in plan's own words (issue 46.7:
it said "2 group(s) fit" for two groups plan calls tight)."""

from __future__ import annotations

from dsv4ctl.deploy.preflight import preflight, verdict_text
from dsv4ctl.plan.plan import build_plan
from dsv4ctl.profile.deployment import as_deployment
from dsv4ctl.profile.model import load_profile
from tests.conftest import DEFAULT_PROFILE


def test_preflight_names_each_groups_verdict_as_plan_does():
    dep = as_deployment(load_profile(DEFAULT_PROFILE))
    words = {g.group.name: (g.verdict["level"], g.verdict["deciding"]) for g in build_plan(dep).groups}
    assert words == {"prefill": ("tight", "indexer_logits"), "decode": ("tight", "activation_floor")}
    out = preflight(dep)
    assert out["plan"]["verdicts"] == {"prefill": "tight (indexer_logits)", "decode": "tight (activation_floor)"}
    assert "plan ok (prefill tight (indexer_logits), decode tight (activation_floor))" in out["summary"], out["summary"]


def test_verdict_text_is_plans_verdict_row():
    assert verdict_text({"level": "fits", "deciding": "margin"}) == "fits"
    assert verdict_text({"level": "tight", "deciding": "activation"}) == "tight (activation)"
    assert verdict_text(None) == "fits"
