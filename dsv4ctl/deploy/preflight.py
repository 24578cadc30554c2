"""The preflight of every deploy: ``config lint`` and ``plan`` of the exact serve configs and
series the release is built from, before any host is touched."""

from __future__ import annotations

from ..errors import InputError, VerdictError


def preflight(profile) -> dict:
    """``config lint`` and ``plan`` of the profile (its serve configs and ``sglang.series`` are
    what the release is built from). Raises InputError naming the first lint error (exit 2),
    VerdictError naming the first plan error (exit 1). Returns {lint, plan, summary}."""
    from ..serve.argtable import load_table
    from ..serve.lintinput import build_input
    from ..serve.lint import lint
    from ..plan.plan import build_plan
    from ..profile.deployment import as_deployment
    profile = as_deployment(profile)
    inp = build_input(profile)
    findings = lint(inp, load_table())
    errs = [f for f in findings if f.severity == "error"]
    if errs:
        raise InputError(f"preflight: config lint: {len(errs)} error(s), nothing touched; first: {errs[0].format()}")
    rep = build_plan(profile)
    if not rep.ok:
        bad = [(g.group.name, e) for g in rep.groups for e in g.errors]
        raise VerdictError(f"preflight: plan: {len(bad)} error(s), nothing touched; group {bad[0][0]}: {bad[0][1]}")
    warns = sum(1 for f in findings if f.severity != "error")
    return {"lint": {"errors": 0, "warnings": warns}, "plan": {"ok": True, "groups": [g.group.name for g in rep.groups]},
            "summary": f"config lint ok ({warns} warning(s)), plan ok ({len(rep.groups)} group(s) fit)"}
