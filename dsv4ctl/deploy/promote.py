"""Release promotion: ``dsv4ctl deploy --promote`` and ``dsv4ctl promote ID``.

Pipeline (issue 7, item 1)::

    preflight   config lint (dsv4ctl.lint) + plan (dsv4ctl.plan.build_plan, the profile's series)
                -- any error stops here, before a host is touched (lint: exit 2, plan: exit 1)
    push        every host (the deploy engine's delta push, verified on the host)
    canary      switch the canary host(s) only (default: the decode group's host; without a decode
                group the host of the first server group, which is where `check` sends traffic
                when there is no router), health gate
    check smoke `dsv4ctl check smoke --profile P --json`
    check load  `dsv4ctl check load --profile P --json` with the profile's `check:` gate
                (concurrency, max_corruption, turns; overridable)
    rest        switch every other host, health gate
    good        mark the release good (state.json), audit, unlock

A failing check or gate puts every switched host back on its previous release (restarted) and
marks the release ``failed`` with the failing check; the check reports are kept as evidence in
``$DSV4CTL_CACHE/evidence/<id>/<stamp>/`` locally and ``<root>/evidence/<id>/<stamp>/`` on each
host. The checks run as ``python -m dsv4ctl.cli check ... --json`` child processes, so the gate
(Wilson upper bound vs ``max_corruption``) and its verdict are exactly the check command's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError, VerdictError
from ..hosts.audit import file_stamp, now_iso

CHECKS = ("smoke", "load")


@dataclass
class PromoteOptions:
    """CLI knobs of the promotion. ``canary``: a group or host name (None: default rule);
    ``concurrency`` (``N`` or ``N,N``), ``max_corruption`` (fraction), ``turns``,
    ``min_requests``: override the profile's ``check:`` gate (None: the profile's value)."""

    canary: str | None = None
    concurrency: str | None = None
    max_corruption: float | None = None
    turns: int | None = None
    min_requests: int | None = None
    canary_hosts: list[str] = field(default_factory=list)
    preflight: dict | None = None

    # The deploy engine runs a promotion through these three methods and never imports this
    # module (imports point one way: promote uses the engine).
    def prepare(self, dep, log) -> None:
        """Before anything is built or touched: choose the canary, run the preflight."""
        self.canary_hosts = choose_canary(dep, self.canary)
        self.preflight = preflight(dep)
        log(f"preflight: {self.preflight['summary']}")

    def dry_run_lines(self, site, rid: str) -> list[str]:
        """The ``--dry-run`` listing of ``deploy --promote``."""
        return pipeline_lines(site, rid, self, self.preflight)

    def run_locked(self, site, rel, spec: dict, report: dict, frm: dict, t_start: float) -> dict:
        """Canary, checks, the rest, good (the hosts are locked and the release pushed)."""
        return promote_locked(site, rel, spec, self, self.preflight, report, frm, t_start)


# -- pure cores --------------------------------------------------------------------------------

def choose_canary(profile, canary: str | None = None) -> list[str]:
    """Host names switched first. ``canary`` names a group (its host) or a host; default: the
    hosts of the decode groups, else the host of the first server group (the traffic entry of
    ``check`` without a router). InputError for an unknown name or a profile without servers."""
    from ..profile.deployment import as_deployment
    profile = as_deployment(profile).profile
    if canary:
        names = {g.name: g for g in profile.groups}
        if canary in names:
            return [names[canary].host]
        if canary in profile.hosts:
            return [canary]
        raise InputError(f"--canary {canary!r}: not a group ({', '.join(names)}) or host "
                         f"({', '.join(profile.hosts)}) of {profile.path}")
    decode = [g.host for g in profile.groups if g.role == "decode"]
    if decode:
        return sorted(set(decode), key=decode.index)
    servers = profile.servers()
    if not servers:
        raise InputError(f"{profile.path}: no server group to promote")
    return [servers[0].host]


def gate_settings(profile, po: PromoteOptions) -> dict:
    """The effective load gate {concurrency, max_corruption, turns, min_requests}: options
    first, then the profile's ``check:`` section, then ``check load``'s defaults (64, 0.01, 8)."""
    from ..profile.deployment import as_deployment
    chk = as_deployment(profile).check
    return {"concurrency": str(po.concurrency) if po.concurrency is not None else chk.concurrency_arg,
            "max_corruption": po.max_corruption if po.max_corruption is not None else chk.max_corruption,
            "turns": po.turns if po.turns is not None else chk.turns,
            "min_requests": po.min_requests}


def check_target(profile, canary_hosts: list[str] | None) -> str | None:
    """Where the canary's checks send traffic. None (``--profile``: every worker's /health and
    /server_info against its serve config, traffic to the router or first server group) when
    every host is switched (``canary_hosts`` None). While only the canary runs the new release,
    ``--profile`` would judge the other hosts' old configs against the new profile, so the
    checks go to one URL: the router (it reaches the decode canary), else the first server
    group on a canary host (a colocated canary checked directly)."""
    if canary_hosts is None:
        return None
    from ..check.targets import from_profile
    from ..profile.deployment import as_deployment
    dep = as_deployment(profile)
    t = from_profile(dep)
    if dep.routers():
        return t.entry
    return next((g.url for g in dep.servers() if g.group.host in canary_hosts), t.entry)


def first_deploy_canary(canary: list[str], currents: dict[str, str | None]) -> list[str]:
    """The canary hosts given the hosts' active releases: when no host runs a release yet (a
    first deploy) there is nothing to protect and a partial switch cannot serve, so every host
    is the canary; otherwise ``canary`` unchanged."""
    if not any(currents.values()):
        return list(currents)
    return canary


def check_argv(kind: str, profile_path: str, po: PromoteOptions, url: str | None = None) -> list[str]:
    """``dsv4ctl`` argv of one check (``--json``): ``--profile P``, or ``URL`` when given. Only
    the overridden gate values are passed; the rest ``check load`` reads from the profile
    (``check load URL`` has no profile: then the profile's gate is passed explicitly by
    :func:`effective_options`)."""
    src = [url] if url else ["--profile", profile_path]
    if kind == "smoke":
        return ["check", "smoke", *src, "--json"]
    argv = ["check", "load", *src, "--json", "--no-progress"]
    for opt, v in (("--concurrency", po.concurrency), ("--max-corruption", po.max_corruption),
                   ("--turns", po.turns), ("--min-requests", po.min_requests)):
        if v is not None:
            argv += [opt, str(v)]
    return argv


def effective_options(profile, po: PromoteOptions, url: str | None) -> PromoteOptions:
    """``po`` with the profile's gate filled in when the checks run against a bare URL."""
    if not url:
        return po
    g = gate_settings(profile, po)
    return PromoteOptions(canary=po.canary, concurrency=g["concurrency"], max_corruption=g["max_corruption"],
                          turns=g["turns"], min_requests=po.min_requests, canary_hosts=po.canary_hosts)


def check_verdict(kind: str, code: int, doc: dict | None, err: str) -> tuple[bool, str]:
    """(passed, one-line reason) from a check child's exit code, JSON document and last stderr
    line. Exit 0 passes; 1 is the check's own failure (its message); anything else (2 usage /
    unreachable, a crash) fails too, with the child's error line."""
    if code == 0 and isinstance(doc, dict) and doc.get("pass", False):
        return True, "pass"
    msg = err.removeprefix("dsv4ctl: error: ").strip() or f"check {kind} exited {code}"
    return False, msg


def pipeline_lines(site, rid: str, po: PromoteOptions, pre: dict | None) -> list[str]:
    """The ``--dry-run`` lines of ``deploy --promote``: preflight result, then every action per
    host in execution order (push, canary switch, checks, the rest, good)."""
    from .engine import health_timeout, host_groups, launch_spec, link_bases, start_command
    spec = launch_spec(site.profile)
    canary = first_deploy_canary(po.canary_hosts, {h: site.facts[h].current for h in site.hosts})
    rest = [h for h in site.hosts if h not in canary]
    url = check_target(site.profile, canary if rest else None)
    cpo = effective_options(site.profile, po, url)
    g = gate_settings(site.profile, po)
    lines = [f"preflight: {pre['summary'] if pre else 'skipped'}"]
    if canary != po.canary_hosts:
        lines.append("first deploy (no host runs a release): every host is the canary")
    for h in site.hosts:
        f, p = site.facts[h], site.paths[h]
        lines.append(f"{h}: lock {p.lock}")
        if rid in f.releases:
            lines.append(f"{h}: release {rid} already present: no push")
        else:
            bases = link_bases(f, rid)
            lines.append(f"{h}: push {rid} to {p.incoming(rid)}, verify on the host, rename to {p.release(rid)}"
                         + (f" (reusing {', '.join(bases)})" if bases else ""))
    stage = [("canary", canary), ("rest", rest)]
    for name, hosts in stage:
        for h in hosts:
            f, p = site.facts[h], site.paths[h]
            lines.append(f"{h}: [{name}] switch {p.current}: {f.current or '(none)'} -> {rid}")
            for grp in host_groups(spec, h):
                lines.append(f"{h}: [{name}] restart {grp}: {start_command(site, h, rid, grp, spec[grp])}")
        if hosts:
            lines.append(f"[{name}] gate: /health of every worker, then a 1-token chat completion "
                         f"(timeout {health_timeout(site):g} s)")
        if name == "rest" and hosts and url:
            lines.append(f"[rest] dsv4ctl {' '.join(check_argv('smoke', str(site.profile.path), po))}")
        if name == "canary":
            for kind in CHECKS:
                lines.append(f"[canary] dsv4ctl {' '.join(check_argv(kind, str(site.profile.path), cpo, url))}")
            lines.append(f"[canary] load gate: concurrency {g['concurrency']}, turns {g['turns']}, 95 % Wilson "
                         f"upper bound of the corruption rate <= {g['max_corruption']:g}")
            lines.append("[canary] on a failed check: every switched host back to its previous release, "
                         f"{rid} marked failed, check reports kept in evidence/{rid}/ (local cache and each host)")
    lines.append(f"on success: mark {rid} good on every host, check reports kept as evidence, audit, unlock")
    return lines


# -- preflight ---------------------------------------------------------------------------------

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


# -- checks and evidence -----------------------------------------------------------------------

def evidence_dir(cache: Path | None, rid: str, stamp: str) -> Path:
    """Local evidence folder: ``<cache root>/evidence/<id>/<stamp>/`` (cache root: the parent
    of the release cache, i.e. ``$DSV4CTL_CACHE``)."""
    from .release import default_cache
    return Path(cache or default_cache()).parent / "evidence" / rid / stamp


def run_check(kind: str, profile, po: PromoteOptions, edir: Path, log, url: str | None = None,
              name: str | None = None) -> dict:
    """Run one check as a ``dsv4ctl`` child process; its JSON report goes to ``edir/<name>.json``
    (stderr to ``<name>.err``; ``name`` defaults to ``kind``). Returns {check, passed, reason,
    exit_code, evidence}."""
    name = name or kind
    argv = check_argv(kind, str(profile.path), po, url)
    log(f"check {kind}: dsv4ctl {' '.join(argv)}")
    edir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "dsv4ctl.cli", *argv], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONUNBUFFERED="1"))
    (edir / f"{name}.json").write_text(p.stdout)
    (edir / f"{name}.err").write_text(p.stderr)
    try:
        doc = json.loads(p.stdout) if p.stdout.strip() else None
    except ValueError:
        doc = None
    err = next((ln for ln in reversed(p.stderr.splitlines()) if ln.startswith("dsv4ctl: error:")), "")
    passed, reason = check_verdict(kind, p.returncode, doc, err)
    log(f"check {kind}: {'pass' if passed else 'FAIL: ' + reason} ({time.monotonic() - t0:.1f} s)")
    return {"check": name, "passed": passed, "reason": reason, "exit_code": p.returncode,
            "target": url or "profile", "evidence": str(edir / f"{name}.json")}


def run_checks(profile, po: PromoteOptions, edir: Path, log, url: str | None = None) -> tuple[list[dict], dict | None]:
    """smoke, then load (only when smoke passed), against ``url`` or the profile's entry.
    Returns (results, first failure or None)."""
    results = []
    for kind in CHECKS:
        r = run_check(kind, profile, po, edir, log, url)
        results.append(r)
        if not r["passed"]:
            return results, r
    return results, None


def store_evidence(site, hosts: list[str], rid: str, stamp: str, edir: Path, summary: dict) -> str:
    """Copy the local evidence folder to ``<root>/evidence/<id>/<stamp>/`` on ``hosts`` (atomic
    writes; best effort, failures logged). Returns the host-relative folder."""
    from ..remote import atomic_write, run_parallel
    (edir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    files = {f.name: f.read_bytes() for f in sorted(edir.iterdir()) if f.is_file()}
    rel = f"evidence/{rid}/{stamp}"

    def body(t):
        for name, data in files.items():
            atomic_write(t, f"{site.paths[t.name].root}/{rel}/{name}", data)
    res = run_parallel({h: site.transports[h] for h in hosts}, body, timeout=120)
    for r in res.values():
        if not r.ok:
            site.opts.log(f"warning: evidence not stored: {r.error}")
    return rel


# -- deploy --promote (called by the engine with the locks held, after the push) ---------------

def promote_locked(site, rel, spec: dict, po: PromoteOptions, pre: dict | None, report: dict,
                   frm: dict, t_start: float) -> dict:
    """Canary → checks → rest → good. Raises VerdictError after rolling every switched host back
    (release marked failed, evidence kept) when a gate or check fails."""
    from . import engine as E
    opts = site.opts
    rid = rel.id
    canary = first_deploy_canary([h for h in site.hosts if h in po.canary_hosts],
                                 {h: site.facts[h].current for h in site.hosts})
    rest = [h for h in site.hosts if h not in canary]
    url = check_target(site.profile, canary if rest else None)
    cpo = effective_options(site.profile, po, url)
    if len(canary) == len(site.hosts) and len(po.canary_hosts) < len(site.hosts):
        opts.log("first deploy (no host runs a release): every host is the canary")
    stamp = file_stamp()
    edir = evidence_dir(opts.cache, rid, stamp)
    before = {h: (site.facts[h].current, site.facts[h].previous) for h in site.hosts}
    old_specs = {h: site.facts[h].current_launch for h in site.hosts}
    rec = {"action": "deploy", "release": rid, "promote": True, "canary": canary}
    report["promotion"] = {"canary": canary, "rest": rest, "check_target": url or "profile", "preflight": pre, "gate": gate_settings(site.profile, po),
                           "checks": [], "evidence": str(edir)}
    switched: list[str] = []

    def fail(what: str, why: str, results: list[dict], put_back: list[str] = ()):
        if switched:
            E._revert(site, switched, before, old_specs, {h: spec for h in switched})
            ospec = next((old_specs[h] for h in switched if old_specs[h]), None)
            if ospec:
                w, c, m = E.health_targets(site, ospec)
                bad = E.health.gate(w, c, E.health_timeout(site), m)
                why += (" (the previous release is healthy again)" if not bad
                        else f" (after rolling back, still unhealthy: {E.failure_text(site, bad)})")
        summary = {"schema": "dsv4ctl.promotion/1", "release": rid, "result": "rolled-back", "failed": what,
                   "reason": why, "canary": canary, "checks": results, "at": now_iso()}
        hrel = store_evidence(site, site.hosts, rid, stamp, edir, summary) if results else None
        E.close_out(site, {**rec, "result": "rolled-back", "failed_check": what, "detail": why[:2000],
                           "evidence": hrel},
                    state={rid: {"state": "failed", "failed_at": now_iso(), "failed_check": what,
                                 **({"evidence": hrel} if hrel else {})}}, per_host=frm)
        moved = list(switched) + [h for h in put_back if h not in switched]
        back = sorted({(before[h][0] or "(none)") for h in moved})
        where = f"; evidence in {edir}" if results else ""
        raise VerdictError(f"deploy --promote of {rid}: {what} failed: {why}; "
                           + (f"rolled back {', '.join(moved)} to {', '.join(back)}" if moved else "no host was switched")
                           + f"; {', '.join(h for h in site.hosts if h not in moved)} never switched" * bool(
                               [h for h in site.hosts if h not in moved])
                           + where)

    try:
        # canary
        opts.log(f"canary: switching {', '.join(canary)} to {rid}")
        ok, why, _ = E.switch_with_gate(site, {h: rid for h in canary}, what="deploy", spec=spec, hosts=canary)
        if not ok:
            fail("canary health gate", why, [], put_back=canary)   # switch_with_gate put the canary back
        switched += canary
        results, bad = run_checks(site.profile, cpo, edir, opts.log, url)
        report["promotion"]["checks"] = results
        if bad:
            fail(f"check {bad['check']}", bad["reason"], results)
        # the rest
        if rest:
            opts.log(f"rest: switching {', '.join(rest)} to {rid}")
            ok, why, _ = E.switch_with_gate(site, {h: rid for h in rest}, what="deploy", spec=spec, hosts=rest)
            if not ok:
                fail("health gate of the rest", why, results, put_back=rest)
            switched += rest
        if url:
            # every host on the release: the whole deployment's smoke (--profile: every worker's
            # /health and /server_info against its serve config)
            r = run_check("smoke", site.profile, po, edir, opts.log, None, name="smoke-all")
            results.append(r)
            if not r["passed"]:
                fail("check smoke (all hosts)", r["reason"], results)
    except KeyboardInterrupt:
        if switched:
            E._revert(site, switched, before, old_specs, {h: spec for h in switched})
        E.close_out(site, {**rec, "result": "interrupted", "detail": "interrupted during promotion; rolled back"},
                    state={rid: {"state": "failed", "failed_at": now_iso()}}, per_host=frm)
        raise
    summary = {"schema": "dsv4ctl.promotion/1", "release": rid, "result": "good", "canary": canary,
               "checks": results, "at": now_iso()}
    hrel = store_evidence(site, site.hosts, rid, stamp, edir, summary)
    return E.finish_good(site, rid, {**rec, "result": "ok", "evidence": hrel},
                         {"promoted_at": now_iso(), "evidence": hrel}, report, frm, t_start)


def config_drift(profile, release_meta: dict) -> list[str]:
    """Server groups whose serve config file (sha256) differs from the one recorded in the
    release's RELEASE.json ``configs`` {group: sha256}, sorted."""
    import hashlib
    from ..profile.deployment import as_deployment
    rec = release_meta.get("configs", {})
    out = []
    for g in as_deployment(profile).servers():
        if g.serve_config_path is not None and g.serve_config_path.is_file():
            if rec.get(g.name) != hashlib.sha256(g.serve.raw).hexdigest():
                out.append(g.name)
    return sorted(out)


# -- dsv4ctl promote ID --------------------------------------------------------------------------

def promote_by_hand(profile, opts, rid: str, po: PromoteOptions) -> dict:
    """Mark ``rid`` good after check smoke + check load against the running deployment.

    ``rid`` must be the active release on every host (InputError otherwise, nothing changes).
    Failing checks: VerdictError (exit 1) naming the check; the release is marked ``failed``
    (still running: nothing is switched, but ``rollback`` no longer picks it), the evidence kept. Dry run: the steps, nothing run."""
    from ..profile.deployment import as_deployment
    from . import engine as E
    profile = as_deployment(profile)
    site = E.open_site(profile, opts)
    try:
        facts = E.gather_facts(site)
        off = {h: f.current for h, f in facts.items() if f.current != rid}
        if off:
            raise InputError(f"promote {rid}: not the active release on "
                             + ", ".join(f"{h} (active: {c or 'none'})" for h, c in off.items())
                             + "; deploy it first (dsv4ctl deploy --promote runs the same checks)")
        stale = config_drift(profile, next(iter(facts.values())).releases.get(rid, {}))
        if stale:
            raise InputError(f"promote {rid}: the profile's serve config of group(s) {', '.join(stale)} differs from "
                             f"the one in {rid}: the checks would judge the running servers against another "
                             f"config; use the profile the release was built from")
        g = gate_settings(profile, po)
        if opts.dry_run:
            lines = [f"dsv4ctl {' '.join(check_argv(k, str(profile.path), po))}" for k in CHECKS]
            lines.append(f"load gate: concurrency {g['concurrency']}, turns {g['turns']}, 95 % Wilson upper bound "
                         f"<= {g['max_corruption']:g}")
            lines += [f"{h}: lock {site.paths[h].lock}, store evidence in {site.paths[h].root}/evidence/{rid}/, "
                      f"mark {rid} good in state.json, audit, unlock" for h in site.hosts]
            return {"schema": "dsv4ctl.promote/1", "dry_run": True, "release": rid, "actions": lines}
        stamp = file_stamp()
        edir = evidence_dir(opts.cache, rid, stamp)
        results, bad = run_checks(profile, po, edir, opts.log)
        try:
            E.acquire_locks(site, f"promote {rid}")
            summary = {"schema": "dsv4ctl.promotion/1", "release": rid, "result": "failed" if bad else "good",
                       "by_hand": True, "checks": results, "at": now_iso()}
            hrel = store_evidence(site, site.hosts, rid, stamp, edir, summary)
            rec = {"action": "promote", "release": rid, "evidence": hrel}
            if bad:
                E.close_out(site, {**rec, "result": "failed", "failed_check": f"check {bad['check']}",
                                   "detail": bad["reason"][:2000]},
                            state={rid: {"state": "failed", "failed_at": now_iso(),
                                         "failed_check": f"check {bad['check']}", "evidence": hrel}})
                raise VerdictError(f"promote {rid}: check {bad['check']} failed: {bad['reason']}; "
                                   f"marked failed (rollback will not pick it); evidence in {edir}")
            E.close_out(site, {**rec, "result": "ok"},
                        state={rid: {"state": "good", "promoted_at": now_iso(), "promoted_by": E.who(),
                                     "evidence": hrel}})
        finally:
            E.release_locks(site)
        return {"schema": "dsv4ctl.promote/1", "release": rid, "result": "good", "checks": results,
                "evidence": str(edir), "hosts": list(site.hosts)}
    finally:
        site.close()
