"""The preflight of every deploy: ``config lint`` and ``plan`` of the exact serve configs and
series the release is built from, before any host is touched."""

from __future__ import annotations

from ..errors import InputError, PlanFails


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
    findings = lint(inp, load_table(version=inp.sglang_version))
    errs = [f for f in findings if f.severity == "error"]
    if errs:
        raise InputError(f"preflight: config lint: {len(errs)} error(s), nothing touched; first: {errs[0].format()}")
    rep = build_plan(profile)
    if not rep.ok:
        bad = [(g.group.name, e) for g in rep.groups for e in g.errors]
        raise PlanFails(f"preflight: {len(bad)} group error(s), nothing touched; group {bad[0][0]}: {bad[0][1]}")
    warns = sum(1 for f in findings if f.severity != "error")
    # a plan on estimated weights is not a measured fit: said on the preflight line (issue 27)
    guessed = [g.group.name for g in rep.groups if any(e.startswith(("weights_gib_per_rank=", "free_gib_before_load="))
                                                       for e in g.inputs.estimated)]
    env = environment_preflight(profile)
    verdicts = {g.group.name: verdict_text(g.verdict) for g in rep.groups}
    return {"lint": {"errors": 0, "warnings": warns},
            "plan": {"ok": True, "groups": list(verdicts), "verdicts": verdicts},
            "environment": env, "estimated": guessed,
            "summary": f"config lint ok ({warns} warning(s)), plan ok ("
                       + ", ".join(f"{g} {v}" for g, v in verdicts.items())
                       + (f"; weights or free memory estimated for {', '.join(guessed)}: measure them (dsv4ctl facts "
                          "--write, or weights_gib_per_rank from the server log)" if guessed else "") + ")"
                       + (f", environment {env['summary']}" if env else "")}


def verdict_text(verdict: dict | None) -> str:
    """A group's plan verdict in ``plan``'s own words (its table's verdict row): ``fits``,
    ``tight (activation_floor)``, ``fails (no_kv_memory)`` (:mod:`dsv4ctl.plan.verdict`);
    ``fits`` for a group planned without stages (no verdict recorded)."""
    if not verdict:
        return "fits"
    level, deciding = verdict.get("level") or "fits", verdict.get("deciding")
    return level if level == "fits" or not deciding else f"{level} ({deciding})"


def environment_preflight(dep) -> dict | None:
    """The environment lock (``sglang.environment``) against the exact pins of the SGLang the
    release is built from: ``python/pyproject.toml`` of the tree at the base ref (``git show``;
    a wheel's METADATA says the same in ``Requires-Dist``), markers evaluated for a Linux x86_64
    host. None without a lock; {digest, sglang, compared, summary}. InputError (exit 2, nothing
    touched) naming each contradiction with both versions: ``torch: the lock has 2.9.0, SGLang
    0.5.23 pins ==2.14.1``."""
    import subprocess
    from .environment import parse_lock, pin_conflicts, requirement_pins, sglang_requirements
    from .release import environment_digest, release_environment
    data = release_environment(dep)
    if data is None:
        return None
    lock = parse_lock(data.decode("utf-8"), str(dep.sglang.environment.lock))
    tree, ref = dep.tree(required=True), dep.sglang.base_ref or "HEAD"
    r = subprocess.run(["git", "-C", str(tree), "show", f"{ref}:python/pyproject.toml"], capture_output=True, text=True)
    doc = {"digest": environment_digest(dep), "packages": len(lock), "sglang": None, "compared": 0}
    if r.returncode != 0:
        doc["summary"] = (f"{doc['digest']} ({len(lock)} packages; the tree has no python/pyproject.toml at {ref}: "
                          "not compared with SGLang's pins)")
        return doc
    version, reqs = sglang_requirements(r.stdout)
    pins = requirement_pins(reqs)
    bad = pin_conflicts(lock, pins, version or ref)
    if bad:
        raise InputError(f"preflight: environment lock {dep.sglang.environment.lock} contradicts SGLang "
                         f"{version or ref}'s own pins ({len(bad)}), nothing touched: " + "; ".join(bad[:4])
                         + (f" (+{len(bad) - 4} more)" if len(bad) > 4 else ""))
    doc.update(sglang=version, compared=len(pins),
               summary=f"{doc['digest']} ok ({len(lock)} packages, SGLang {version or ref}'s {len(pins)} pins kept)")
    return doc
