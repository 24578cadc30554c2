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
    compare     an upgrade (the SGLang version, the patch series or the environment differs from
                the running release's: :func:`upgrade_changes`) runs the paired A/B
                `dsv4ctl check load --compare RUNNING CANARY` (:mod:`dsv4ctl.check.paired`: same
                known-answer workload on both, one-sided exact McNemar, sized by
                :func:`compare_sizing`); a significant regression fails the promotion like a
                failed check (``--no-compare`` skips it)
    rest        switch every other host, health gate
    good        mark the release good (state.json), audit, unlock

A failing check or gate puts every switched host back on its previous release (restarted) and
marks the release ``failed`` with the failing check; the check reports are kept as evidence in
``<state>/evidence/<id>/<stamp>/`` locally (:func:`dsv4ctl.resources.state_root`: ``$DSV4CTL_STATE_DIR``,
else ``$XDG_STATE_HOME/dsv4ctl``; evidence is state, not cache) and ``<root>/evidence/<id>/<stamp>/`` on each
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

from ..errors import EXIT_USAGE, DsvError, GateFailed, InputError
from ..hosts.audit import file_stamp, now_iso

CHECKS = ("smoke", "load")


@dataclass
class PromoteOptions:
    """CLI knobs of the promotion. ``canary``: a group or host name (None: default rule);
    ``concurrency`` (``N`` or ``N,N``), ``max_corruption`` (fraction), ``turns``,
    ``min_requests``: override the profile's ``check:`` gate (None: the profile's value);
    ``compare``: run the upgrade gate's paired A/B when the release is an upgrade (``--no-compare``:
    False)."""

    canary: str | None = None
    concurrency: str | None = None
    max_corruption: float | None = None
    turns: int | None = None
    min_requests: int | None = None
    compare: bool = True
    built_from: dict | None = None       # {base_commit, patches, series} of the release (set by the engine)
    canary_hosts: list[str] = field(default_factory=list)
    preflight: dict | None = None
    stamp: str = ""

    # The deploy engine runs a promotion through these three methods and never imports this
    # module (imports point one way: promote uses the engine).
    def prepare(self, dep, log) -> None:
        """Before anything is built or touched: choose the canary, run the preflight. InputError
        (exit 2) with ``deploy.slurm.submit_host``: its switch would cancel and submit every
        server's job at once, not the canary's first (docs/slurm.md, what is not there yet)."""
        from .service import canary_first_refusal
        refused = canary_first_refusal(dep)
        if refused:
            raise InputError(refused)
        self.canary_hosts = choose_canary(dep, self.canary)
        from .preflight import preflight
        self.preflight = preflight(dep)
        log(f"preflight: {self.preflight['summary']}")

    def steps(self, site, rid: str, spec: dict, *, locked: bool = True):
        """The promotion's steps (:func:`promote_steps`); the evidence stamp is fixed here."""
        self.stamp = file_stamp()
        return promote_steps(site, rid, spec, self, self.stamp, locked=locked)

    def run_locked(self, site, rel, spec: dict, run, report: dict, frm: dict, t_start: float) -> dict:
        """Canary, checks, the rest, good (the hosts are locked and the release pushed)."""
        return promote_locked(site, rel, spec, run, self, report, frm, t_start)


# -- pure cores --------------------------------------------------------------------------------

def choose_canary(profile, canary: str | None = None) -> list[str]:
    """Host names switched first. ``canary`` names a group (the hosts of its first server) or a
    host; default: the decode groups' first servers, else the first server group's (the traffic
    entry of ``check`` without a router). A multi-node server is switched as a whole: every node
    of a server that has a node among the chosen hosts is in the canary (:func:`whole_servers`).
    InputError for an unknown name or a profile without servers."""
    from ..profile.deployment import as_deployment
    profile = as_deployment(profile).profile
    if canary:
        names = {g.name: g for g in profile.groups}
        if canary in names:
            return whole_servers(profile, [names[canary].host])
        if canary in profile.hosts:
            return whole_servers(profile, [canary])
        raise InputError(f"--canary {canary!r}: not a group ({', '.join(names)}) or host "
                         f"({', '.join(profile.hosts)}) of {profile.path}")
    decode = [g.host for g in profile.groups if g.role == "decode"]
    if decode:
        return whole_servers(profile, sorted(set(decode), key=decode.index))
    servers = profile.servers()
    if not servers:
        raise InputError(f"{profile.path}: no server group to promote")
    return whole_servers(profile, [servers[0].host])


def whole_servers(profile, hosts: list[str]) -> list[str]:
    """``hosts`` plus every other node of each multi-node server that has a node on them (its
    nodes run one release: SGLang shards the model over all of them), in first-use order; until
    nothing changes (a host may be a node of servers of several groups)."""
    out = list(dict.fromkeys(hosts))
    grown = True
    while grown:
        grown = False
        for g in profile.servers():
            for srv in g.servers or [g.nodes]:
                names = [n.host for n in srv]
                if any(h in out for h in names) and not all(h in out for h in names):
                    out += [h for h in names if h not in out]
                    grown = True
    return out


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
    group on a canary host (a colocated canary checked directly). A PD profile without a router
    group has no URL a chat can be sent to (prefill or decode alone answers none): InputError
    (exit 2) before anything is switched."""
    from ..check.targets import from_profile
    from ..profile.deployment import as_deployment
    dep = as_deployment(profile)
    t = from_profile(dep)
    t.load_entry("deploy --promote {profile}", "the gate's chats sent to the prefill or decode alone get no answer", None)
    if canary_hosts is None:
        return None
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


def canary_check_args(profile, kind: str, url: str | None, canary_hosts: list[str]) -> list[str]:
    """Extra argv of a canary check sent to ``url``: ``check smoke`` gets ``--expect-version``
    (the tree's SGLang release) and, sent to the profile's router, ``--worker URL`` for every server whose node 0 is on a canary host (each replica; its facts
    are read from it, not from the gateway); ``check load`` gets ``--gateway-metrics`` (the router's Prometheus URL:
    retries the gateway hid). [] for checks not sent to the router."""
    from ..plan.sglang_version import resolve_version
    from ..profile.deployment import as_deployment
    dep = as_deployment(profile)
    routers = dep.routers()
    if not url:
        return []
    # a check sent to a URL has no profile to read the release from: the SGLang release the
    # workers must report is the one the deployed tree says (check smoke --expect-version)
    expect = ["--expect-version", resolve_version(dep).version] if kind == "smoke" else []
    if not routers or url != routers[0].url:
        return expect
    if kind == "smoke":
        return expect + [w for g in dep.servers() for srv, (_, u) in zip(g.group.servers or [g.group.nodes], g.replica_urls)
                         if srv[0].host in canary_hosts for w in ("--worker", u)]
    return ["--gateway-metrics", routers[0].metrics_url]


def check_argv(kind: str, profile_path: str, po: PromoteOptions, url: str | None = None,
               extra: list[str] | tuple = ()) -> list[str]:
    """``dsv4ctl`` argv of one check (``--json``): ``--profile P``, or ``URL`` when given. Only
    the overridden gate values are passed; the rest ``check load`` reads from the profile
    (``check load URL`` has no profile: then the profile's gate is passed explicitly by
    :func:`effective_options`). ``extra``: :func:`canary_check_args`, after the source."""
    src = [url] if url else ["--profile", profile_path]
    if kind == "smoke":
        return ["check", "smoke", *src, *extra, "--json"]
    argv = ["check", "load", *src, *extra, "--json", "--no-progress"]
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
    unreachable / a client-side limit, a crash) fails too, with the child's error line. In
    ``deploy --promote`` a canary check that exits 2 is "could not run": no verdict, the canary goes
    back, the release is not marked failed, exit 2."""
    if code == 0 and isinstance(doc, dict) and doc.get("pass", False):
        return True, "pass"
    msg = err.removeprefix("dsv4ctl: error: ").removeprefix("dsv4ctl: gate failed: ").strip() \
        or f"check {kind} exited {code}"
    return False, msg


def promote_steps(site, rid: str, spec: dict, po: PromoteOptions, stamp: str, *, locked: bool = True):
    """Every step of ``deploy --promote`` of ``rid``: lock, push (for an image release also its
    build, ship and verify), the canary's switch and gate, the checks (``dsv4ctl check``
    children), the rest's switch and gate (and a smoke of the whole deployment), the evidence,
    the close-out. Returns a :class:`~dsv4ctl.deploy.steps.RunSteps`."""
    from .steps import (RunSteps, Step, close_step, env_steps, gate_steps, image_steps, image_verify_steps, lock_step,
                        next_previous, present_verify_steps, prune_after_switch, push_step, revert_steps, switch_step)
    hosts = site.hosts
    skipped: list[str] = []      # an upgrade's A/B skipped by --no-compare: said in the notes
    canary = first_deploy_canary([h for h in hosts if h in po.canary_hosts], {h: site.facts[h].current for h in hosts})
    rest = [h for h in hosts if h not in canary]
    url = check_target(site.profile, canary if rest else None)
    cpo = effective_options(site.profile, po, url)
    g = gate_settings(site.profile, po)
    path = str(site.profile.path)
    ab = compare_steps(site, rid, spec, po, canary, bool(rest), url)
    skipped += [x for x in ab if isinstance(x, str)]
    ab = [x for x in ab if not isinstance(x, str)]
    steps = [] if locked else [lock_step(site, h, f"deploy {rid}") for h in hosts]
    steps += ([push_step(site, h, rid) for h in hosts] + env_steps(site, rid, spec) + image_steps(site, rid, spec)
              + present_verify_steps(site, rid, spec=spec) + image_verify_steps(site, rid, spec))
    for name, hs in (("canary", canary), ("rest", rest)):
        steps += [x for x in ab if x.stage == "before" and name == "canary"]
        steps += [switch_step(site, h, rid, next_previous(site.facts[h], rid), spec, site.facts[h].current_launch, name)
                  for h in hs]
        if hs:
            steps += gate_steps(site, spec, hs if rest else None, name)
        if name == "canary":
            for kind in CHECKS:
                argv = check_argv(kind, path, cpo, url, canary_check_args(site.profile, kind, url, canary))
                why = (f"; gate: concurrency {g['concurrency']}, turns {g['turns']}, 95 % Wilson upper bound of the "
                       f"corruption rate <= {g['max_corruption']:g}") if kind == "load" else ""
                steps.append(Step("check", "local", f"dsv4ctl {' '.join(argv)}{why}", " ".join(["dsv4ctl", *argv]),
                                  name, extra={"kind": kind, "argv": argv}))
            steps += [x for x in ab if x.stage == "canary"]
        elif hs and url:
            argv = check_argv("smoke", path, po)
            steps.append(Step("check", "local", f"dsv4ctl {' '.join(argv)} (every worker on the release)",
                              " ".join(["dsv4ctl", *argv]), name, extra={"kind": "smoke", "argv": argv}))
    hrel = f"evidence/{rid}/{stamp}"
    steps += [Step("evidence", h, f"store the check reports in {site.paths[h].root}/{hrel}/") for h in hosts]
    keep = site.profile.deploy.keep_releases
    rec = {"action": "deploy", "release": rid, "promote": True, "canary": canary, "result": "ok", "detail": "",
           "evidence": hrel}
    steps += [close_step(site, h, {**rec, "from": site.facts[h].current}, event=(rid, "gate_passed", {"evidence": hrel}),
                         prune=prune_after_switch(site.facts[h], rid, keep)) for h in hosts]
    from .steps import local_prune_steps
    steps += local_prune_steps(site, rid, spec, [s for s in steps if s.phase == "close"])
    fail = revert_steps(site, hosts, rid, spec)
    fail += [Step("close", h, f"close: mark {rid} failed with the failing check; keep the reports as evidence; "
                              "audit deploy rolled-back; unlock") for h in hosts]
    notes = ["first deploy (no host runs a release): every host is the canary"] if canary != [
        h for h in hosts if h in po.canary_hosts] else []
    return RunSteps(steps, fail, notes + skipped)


# -- the upgrade gate: a paired A/B against the running release ----------------------------------

def upgrade_changes(old: dict, new: dict) -> list[str]:
    """What makes a release an upgrade of the running one (pure): one line per difference of
    ``old`` and ``new``, each {sglang (version or None), base_commit, patches [[name, sha256]],
    series, environments (sorted env digests of launch.json)}. ``SGLang 0.5.22 -> 0.5.23`` (a new
    base commit of the same version: ``SGLang base commit abc -> def``), ``patch series`` (other
    patches or series identity) and ``environment`` (another lock digest). Serve configs and launch
    commands are not an upgrade (the load gate judges them). [] when none differs."""
    out = []
    if old.get("sglang") != new.get("sglang") and old.get("sglang") and new.get("sglang"):
        out.append(f"SGLang {old['sglang']} -> {new['sglang']}")
    elif old.get("base_commit") != new.get("base_commit"):
        out.append(f"SGLang base commit {str(old.get('base_commit'))[:12]} -> {str(new.get('base_commit'))[:12]}")
    if old.get("patches") != new.get("patches") or old.get("series") != new.get("series"):
        out.append(f"patch series ({len(old.get('patches') or [])} -> {len(new.get('patches') or [])} patch(es))")
    if old.get("environments") != new.get("environments"):
        out.append("environment (lock digest)")
    return out


def release_identity(site, rid: str, launch: dict | None, built_from: dict | None = None) -> dict | None:
    """{sglang, base_commit, patches, series, environments} of release ``rid`` from
    ``built_from`` ({base_commit, patches [[name, sha256]], series}: what the run builds it from),
    else its RELEASE.json in the local release cache, and ``launch`` (its launch.json); the SGLang
    version is the profile tree's at the release's base commit (None when the tree cannot say).
    None when neither says."""
    from .release import default_cache
    if built_from is not None:
        meta = {"base_commit": built_from["base_commit"], "series_identity": built_from.get("series"),
                "patches": [{"name": n, "sha256": h} for n, h in built_from.get("patches") or []]}
    else:
        try:
            meta = json.loads((Path(site.opts.cache or default_cache()) / rid / "RELEASE.json").read_text())
        except (OSError, ValueError):
            return None
    version = None
    tree = site.profile.sglang.tree if hasattr(site.profile, "sglang") else None
    if tree is not None and Path(tree).is_dir() and meta.get("base_commit"):
        from ..patches.gitio import Git
        from ..patches.tree import tree_version
        try:
            version = tree_version(Git(str(tree)), meta["base_commit"])
        except Exception:        # not a checkout, the commit gone: the base commit still tells
            version = None
    envs = sorted({s.get("python_env") for s in (launch or {}).values() if isinstance(s, dict) and s.get("python_env")})
    return {"sglang": version, "base_commit": meta.get("base_commit"),
            "patches": [[p.get("name"), p.get("sha256")] for p in meta.get("patches") or []],
            "series": meta.get("series_identity"), "environments": envs}


def running_changes(site, rid: str, spec: dict, canary: list[str],
                    built_from: dict | None = None) -> tuple[str | None, list[str]]:
    """(the running release of the canary's hosts, :func:`upgrade_changes` against it). None and
    [] on a first deploy or a redeploy of the running release; a running release the local cache
    has no record of counts as an upgrade (``not in the local release cache``: compared, never
    assumed equal)."""
    old = next((site.facts[h].current for h in canary if site.facts[h].current), None)
    if old is None or old == rid:
        return old, []
    launch = next((site.facts[h].current_launch for h in canary if site.facts[h].current == old), None)
    a, b = release_identity(site, old, launch), release_identity(site, rid, spec, built_from)
    if a is None or b is None:
        return old, [f"the record of {old if a is None else rid} is not in the local release cache"]
    return old, upgrade_changes(a, b)


def compare_urls(profile, canary_hosts: list[str]) -> tuple[str, str] | None:
    """(running, canary): the URL of a colocated server whose nodes are all off the canary
    (running the current release) and of one on the canary (the new release), the same group
    when it has both, else the same role. None when there is no such pair: a PD deployment (a
    prefill or decode server alone answers no chat) or no server off the canary."""
    from ..profile.deployment import as_deployment
    dep = as_deployment(profile)
    servers = [(g.name, srv, u) for g in dep.servers() if g.group.role == "colocated"
               for srv, (_, u) in zip(g.group.servers or [g.group.nodes], g.replica_urls)]
    new = [x for x in servers if any(n.host in canary_hosts for n in x[1])]
    old = [x for x in servers if all(n.host not in canary_hosts for n in x[1])]
    if not new or not old:
        return None
    same = [(o, n) for n in new for o in old if o[0] == n[0]]
    o, n = same[0] if same else (old[0], new[0])
    return o[2], n[2]


#: check load's --turns maximum (commands.options.MAX_TURNS): the A/B's turns per session.
MAX_AB_TURNS = 10_000


def compare_sizing(profile, canary_hosts: list[str], po: PromoteOptions) -> dict:
    """{concurrency, turns, pairs, source}: the A/B's sessions are the load gate's highest
    concurrency, at most the plan's max-running-requests of the canary's group (the batch a
    server admits at once); ``pairs``: ``check.compare.pairs``, else
    :func:`dsv4ctl.check.paired.plan_pairs` of ``check.compare.baseline`` and ``.delta`` (one-sided
    McNemar, alpha 0.05, power 0.8: 1,984 pairs for 1 % -> 2 %); turns per session to issue them.
    InputError for a baseline + delta of 1 or more, a rise too small to size
    (:data:`dsv4ctl.check.stats.MAX_PAIRS`) or pairs needing more than :data:`MAX_AB_TURNS` turns."""
    from ..check.paired import ALPHA, POWER, plan_pairs, sizing
    from ..profile.deployment import as_deployment
    dep = as_deployment(profile)
    chk = dep.check
    conc = max(int(x) for x in str(gate_settings(dep, po)["concurrency"]).split(","))
    mrr = None
    try:
        from ..plan.plan import build_plan
        rep = build_plan(dep)
        mrr = min((st.sizes.max_running_requests for g in rep.groups for st in g.stages
                   if g.group.host in canary_hosts), default=None)
    except Exception:            # the preflight planned it already; a plan that fails here sizes nothing
        mrr = None
    if mrr:
        conc = min(conc, int(mrr))
    if chk.compare_pairs:
        pairs, source = int(chk.compare_pairs), "check.compare.pairs"
    else:
        try:
            pairs = plan_pairs(chk.compare_baseline, chk.compare_delta)
        except ValueError as e:
            raise InputError(f"{dep.profile.path}: check.compare: {e}") from None
        source = (f"one-sided exact McNemar, alpha {ALPHA:g}, power {POWER:g}: a rise of "
                  f"{100 * chk.compare_delta:g} % over {100 * chk.compare_baseline:g} %")
    out = sizing(conc, pairs)
    if out["turns"] > MAX_AB_TURNS:       # check load --turns takes at most 10,000: refused now, not after a switch
        raise InputError(f"{dep.profile.path}: check.compare.pairs {pairs:,}: {out['turns']:,} turns per session over "
                         f"{out['concurrency']} session(s); check load runs at most {MAX_AB_TURNS:,}: give fewer pairs")
    return {**out, "source": source, "max_running_requests": mrr}


def compare_steps(site, rid: str, spec: dict, po: PromoteOptions, canary: list[str], has_rest: bool,
                  url: str | None = None) -> list:
    """The A/B steps (``check`` steps of kind ``compare``) when release ``rid`` (launch ``spec``)
    is an upgrade of the running one (:func:`running_changes`) and ``po.compare``; [] otherwise
    (a first deploy, a redeploy of the same version, series and environment, ``--no-compare``).

    Side by side when a colocated server off the canary still runs the old release
    (:func:`compare_urls`): one ``check load --compare RUNNING CANARY`` step of the canary.
    Otherwise (PD: a decode or prefill server alone answers no chat; one host) in sequence
    through the canary checks' entry (``url``: the router or the canary's server; else the
    profile's entry): arm A (kind ``compare-a``, stage ``before``) runs the workload on the
    running release before the canary is switched, arm B (kind ``compare``) the same workload
    after; both keep their per-turn records, which are paired. An upgrade with ``--no-compare``
    gives the line that says so (a str, a note of the dry run) instead."""
    from .steps import Step
    old, changes = running_changes(site, rid, spec, canary, po.built_from)
    if not changes:
        return []
    if not po.compare:
        return [f"upgrade ({'; '.join(changes)}): paired A/B against {old} skipped (--no-compare)"]
    what = "; ".join(changes)
    urls = compare_urls(site.profile, canary) if has_rest else None
    size = compare_sizing(site.profile, canary, po)
    tail = ["--concurrency", str(size["concurrency"]), "--turns", str(size["turns"]), "--min-requests", "0",
            "--max-corruption", "0.999", "--json", "--no-progress"]
    extra = {"changes": changes, "sizing": size, "running": old}
    why = f"{size['pairs']} pairs ({size['source']}); fails on a regression (McNemar p < 0.05)"
    if urls:
        argv = ["check", "load", "--compare", urls[0], urls[1], *tail]
        return [Step("check", "local", f"dsv4ctl {' '.join(argv)}; upgrade ({what}): paired A/B of {old} (A, running) "
                     f"and {rid} (B, canary), {why}", " ".join(["dsv4ctl", *argv]), "canary",
                     extra={"kind": "compare", "argv": argv, **extra})]
    from ..check.targets import from_profile
    from ..profile.deployment import as_deployment
    entry = url or from_profile(as_deployment(site.profile)).entry
    argv = ["check", "load", entry, *tail]
    return [Step("check", "local", f"dsv4ctl {' '.join(argv)} --records compare-a.jsonl; upgrade ({what}): arm A of "
                 f"the paired A/B on {old} before the canary switch (no server off the canary serves beside it)",
                 " ".join(["dsv4ctl", *argv]), "before",
                 extra={"kind": "compare-a", "argv": argv, "records": "compare-a.jsonl", **extra}),
            Step("check", "local", f"dsv4ctl {' '.join(argv)} --records compare-b.jsonl; arm B on {rid}, paired "
                 f"with arm A turn by turn, {why}", " ".join(["dsv4ctl", *argv]), "canary",
                 extra={"kind": "compare", "argv": argv, "records": "compare-b.jsonl", "arm_a": "compare-a.jsonl",
                        **extra})]


def compare_verdict(doc: dict | None, code: int, err: str) -> tuple[bool, str]:
    """(passed, reason) of the A/B child ``check load --compare``: it passes when its paired
    comparison shows no regression of B against A (:func:`dsv4ctl.check.paired.compare_paired`);
    the reason of a regression names the per-class differences with their 95 % intervals. A
    child that gave no comparison (exit 2, a crash) does not pass: its error line."""
    from ..check.paired import find_paired, regression_lines
    cmp = find_paired(doc) if isinstance(doc, dict) else None
    if cmp is None:
        msg = err.removeprefix("dsv4ctl: error: ").removeprefix("dsv4ctl: gate failed: ").strip()
        return False, msg or f"check load --compare exited {code} without a comparison"
    lines = regression_lines(cmp)
    if cmp["regression"]:
        return False, "regression against the running release: " + "; ".join(x.strip() for x in lines)
    return True, "no regression: " + lines[0]


# -- preflight ---------------------------------------------------------------------------------

# -- checks and evidence -----------------------------------------------------------------------

def evidence_dir(rid: str, stamp: str) -> Path:
    """Local evidence folder: ``<state>/evidence/<id>/<stamp>/`` in dsv4ctl's state folder
    (:func:`dsv4ctl.resources.state_root`), never the cache: it records why a release is
    good or failed."""
    from ..resources import state_root
    return state_root() / "evidence" / rid / stamp


def run_check(kind: str, profile, po: PromoteOptions, edir: Path, log, url: str | None = None,
              name: str | None = None, extra: list[str] | tuple = ()) -> dict:
    """Run one check as a ``dsv4ctl`` child process; its JSON report goes to ``edir/<name>.json``
    (stderr to ``<name>.err``; ``name`` defaults to ``kind``). Returns {check, passed, reason,
    exit_code, evidence}."""
    name = name or kind
    argv = check_argv(kind, str(profile.path), po, url, extra)
    log(f"check {kind}: dsv4ctl {' '.join(argv)}")
    edir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    code, doc, stderr = _child(argv, profile, edir, name)
    err = next((ln for ln in reversed(stderr.splitlines()) if ln.startswith(("dsv4ctl: error:", "dsv4ctl: gate failed:"))), "")
    passed, reason = check_verdict(kind, code, doc, err)
    log(f"check {kind}: {'pass' if passed else 'FAIL: ' + reason} ({time.monotonic() - t0:.1f} s)")
    return {"check": name, "passed": passed, "reason": reason, "exit_code": code,
            "target": url or "profile", "evidence": str(edir / f"{name}.json")}


def _child(argv: list[str], profile, edir: Path, name: str) -> tuple[int, dict | None, str]:
    """Run ``dsv4ctl ARGV`` as a child process (the profile's API key on its environment, never
    on its argv): (exit code, its JSON document or None, its stderr); stdout and stderr kept as
    ``edir/<name>.json`` / ``.err``."""
    from .site import api_key
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    key = api_key(profile)
    if key:
        env["DSV4CTL_API_KEY"] = key
    p = subprocess.run([sys.executable, "-m", "dsv4ctl.cli", *argv], capture_output=True, text=True, env=env)
    (edir / f"{name}.json").write_text(p.stdout)
    (edir / f"{name}.err").write_text(p.stderr)
    try:
        doc = json.loads(p.stdout) if p.stdout.strip() else None
    except ValueError:
        doc = None
    return p.returncode, doc, p.stderr


def _arm(step: dict, profile, edir: Path, name: str) -> tuple[int, dict | None, str]:
    """Run one A/B child (``step["argv"]``, ``--records edir/<records>`` when the step keeps
    them, :func:`_child`): (exit code, its JSON document or None, its last error line)."""
    argv = list(step["argv"]) + (["--records", str(edir / step["records"])] if step.get("records") else [])
    code, doc, stderr = _child(argv, profile, edir, name)
    return code, doc, next((ln for ln in reversed(stderr.splitlines()) if ln.startswith("dsv4ctl: error:")), "")


def _records(path: Path) -> list[dict]:
    """The per-turn records of ``check load --records`` (one JSON object a line); [] when absent."""
    try:
        return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    except (OSError, ValueError):
        return []


def run_compare(step: dict, profile, edir: Path, log) -> dict:
    """Run one step of the upgrade gate's A/B (``step``: its extra: kind, argv, records, arm_a,
    changes, sizing) as a ``dsv4ctl check load`` child. ``compare-a`` (arm A, in sequence) passes
    when the child answered (its records kept); ``compare`` judges the paired comparison: the
    child's own (``--compare``, side by side) or arm A's records paired with this arm's (in
    sequence, :func:`dsv4ctl.check.paired.compare_paired`; written to ``edir/compare.json``).
    Returns a check result {check, passed, reason, exit_code, evidence}: exit code 1 on a
    regression (:func:`compare_verdict`), the child's code (2 when it was 0 or 1) when there was
    nothing to compare."""
    from ..check.paired import compare_paired
    edir.mkdir(parents=True, exist_ok=True)
    kind = step["kind"]
    log(f"check {kind}: dsv4ctl {' '.join(step['argv'])} ({step['sizing']['pairs']} pairs: {step['sizing']['source']})")
    t0 = time.monotonic()
    code, doc, err = _arm(step, profile, edir, kind)
    if kind == "compare-a":
        ok = isinstance(doc, dict) and bool(_records(edir / step["records"]))
        reason = "arm A answered" if ok else (err.removeprefix("dsv4ctl: error: ") or f"check load exited {code}")
        log(f"check {kind}: {'done' if ok else 'FAIL: ' + reason} ({time.monotonic() - t0:.1f} s)")
        return {"check": kind, "passed": ok, "reason": reason, "exit_code": 0 if ok else (code if code > 1 else 2),
                "target": step["argv"][2], "evidence": str(edir / f"{kind}.json")}
    if step.get("arm_a") and isinstance(doc, dict):
        a, b = _records(edir / step["arm_a"]), _records(edir / step["records"])
        doc = {"schema": "dsv4ctl.promotion.compare/1", "sequential": True, "arm_b": doc,
               "comparisons": [{"paired": compare_paired(a, b)}] if a and b else []}
        (edir / "compare.json").write_text(json.dumps(doc, indent=1) + "\n")
    passed, reason = compare_verdict(doc, code, err)
    has_cmp = isinstance(doc, dict) and bool(doc.get("comparisons"))
    code = 0 if passed else (1 if has_cmp else (code if code > 1 else 2))
    log(f"check compare: {'pass' if passed else 'FAIL'}: {reason} ({time.monotonic() - t0:.1f} s)")
    target = step["argv"][2] if step.get("arm_a") else " vs ".join(step["argv"][3:5])
    return {"check": "compare", "passed": passed, "reason": reason, "exit_code": code, "target": target,
            "changes": step["changes"], "evidence": str(edir / "compare.json")}


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

def promote_locked(site, rel, spec: dict, run, po: PromoteOptions, report: dict, frm: dict, t_start: float) -> dict:
    """Run ``run`` (:func:`promote_steps`) after the push: canary → checks → rest → good. Raises
    GateFailed (a VerdictError, exit 1) after putting every switched host back (release marked failed, evidence kept)
    when a gate or check fails."""
    from . import engine as E
    p = _Promotion(site, rel.id, spec, run, po, report, frm)
    try:
        p.arm_before()
        p.stage("canary", p.canary, "canary health gate", None)
        if p.rest:
            p.stage("rest", p.rest, "health gate of the rest", "check smoke (all hosts)")
    except KeyboardInterrupt:
        p.put_back()
        E.close_all(site, {**p.rec, "result": "interrupted", "detail": "interrupted during promotion; rolled back"},
                    event=(p.rid, "interrupted", {"interrupted_during": "promotion"}), per_host=frm)
        raise
    summary = {"schema": "dsv4ctl.promotion/1", "release": p.rid, "result": "good", "canary": p.canary,
               "checks": p.results, "at": now_iso()}
    for st in run.of("evidence"):
        E.trace(site, st)
    store_evidence(site, site.hosts, p.rid, p.stamp, p.edir, summary)
    return E.finish_good(site, p.rid, run.of("close"), report, t_start, prunes=run.of("image-prune"))


class _Promotion:
    """One ``deploy --promote`` after the push (hosts locked): the canary and the rest, which hosts
    were switched so far, the checks' results, and the ways it ends early: a failed gate or check
    (every switched host put back, the release marked failed, :class:`GateFailed`), a check that
    could not run (put back, not marked, exit 2), a host lost (no verdict, exit 3)."""

    def __init__(self, site, rid: str, spec: dict, run, po: PromoteOptions, report: dict, frm: dict) -> None:
        from . import netloss
        from .steps import revert_steps
        self.site, self.rid, self.run, self.po, self.frm = site, rid, run, po, frm
        self.canary = [s.host for s in run.of("switch", "canary")]
        self.rest = [s.host for s in run.of("switch", "rest")]
        self.url = check_target(site.profile, self.canary if self.rest else None)
        self.cpo = effective_options(site.profile, po, self.url)
        if len(self.canary) == len(site.hosts) and len(po.canary_hosts) < len(site.hosts):
            site.opts.log("first deploy (no host runs a release): every host is the canary")
        self.stamp = po.stamp
        self.edir = evidence_dir(rid, self.stamp)
        self.reverts = {s.host: s for s in revert_steps(site, site.hosts, rid, spec)}
        self.rec = {"action": "deploy", "release": rid, "promote": True, "canary": self.canary}
        self.results: list[dict] = []
        running, changes = running_changes(site, rid, spec, self.canary, po.built_from)
        self.upgrade = {"running": running, "changes": changes,
                        "compare": bool(changes) and po.compare and bool(run.of("check", "canary") and any(
                            st.extra.get("kind") == "compare" for st in run.of("check", "canary")))}
        if changes and not po.compare:
            site.opts.log(f"upgrade ({'; '.join(changes)}): paired A/B against {running} skipped (--no-compare)")
        report["promotion"] = {"canary": self.canary, "rest": self.rest, "check_target": self.url or "profile",
                               "preflight": po.preflight, "gate": gate_settings(site.profile, po),
                               "upgrade": self.upgrade, "checks": self.results, "evidence": str(self.edir)}
        self.switched: list[str] = []
        self.before = {h: site.facts[h].current for h in site.hosts}
        olds = set(self.before.values())
        self.finish = netloss.finish_command(site, "deploy --promote", next(iter(olds)) if len(olds) == 1 else None)
        self.stranded: dict = {}

    def stage(self, stage: str, hosts: list[str], gate_what: str, check_what: str | None) -> None:
        """Switch ``hosts`` (stage ``canary`` or ``rest``) with the health gate, then run the
        stage's checks; ends the promotion early (raises) on a failed gate or check
        (``check_what``: how a failed check is named, None: by the check's name)."""
        from . import engine as E
        site, rid, run = self.site, self.rid, self.run
        site.opts.log(f"{stage}: switching {', '.join(hosts)} to {rid}")
        act = E.switch_with_gate(site, run.of("switch", stage), run.of("gate", stage), [self.reverts[h] for h in hosts])
        if not act.ok:    # switch_with_gate put them back
            self.gate_failed(act, gate_what, list(self.results), hosts)
        self.switched += hosts
        more, bad = self.checks(stage)
        self.results += more
        if bad and bad["exit_code"] == EXIT_USAGE:
            self.not_run(bad, self.results)
        if bad:
            self.fail(check_what or f"check {bad['check']}", bad["reason"], self.results)

    def arm_before(self) -> None:
        """The checks before the canary switch (arm A of an A/B in sequence): one that fails is
        a check that could not run (:meth:`not_run`: nothing was switched, exit 2)."""
        more, bad = self.checks("before")
        self.results += more
        if bad:
            self.not_run({**bad, "exit_code": EXIT_USAGE}, self.results)

    def put_back(self, lost=()) -> str:
        """Switch every switched host back (revert steps) and gate the previous release; the text
        to add to the reason ("" when nothing was switched)."""
        from . import engine as E
        site = self.site
        steps = [self.reverts[h] for h in self.switched]
        if not steps:
            return ""
        self.stranded.update(E.revert(site, steps))
        old = E.revert_gate(site, steps, lost)
        if not old:
            return ""
        bad = E.run_gate(site, old)
        return (" (the previous release is healthy again)" if not bad
                else f" (after rolling back, still unhealthy: {E.failure_text(site, bad)})")

    def gate_failed(self, act, what: str, results: list[dict], moved_extra: list[str]):
        """A failed health gate: a host lost in the gate is no verdict (netloss; the switched
        hosts go back, exit 3), else :meth:`fail`."""
        from . import engine as E, netloss
        if not act.verdict:
            act.why += self.put_back(act.lost)
            act.stranded.update(self.stranded)
            act.lost.update(netloss.probe(self.site, [h for h in act.stranded if h not in act.lost]))
            E.raise_lost(self.site, act, f"deploy --promote of {self.rid} stopped", self.rid, self.rec,
                         self.finish, self.frm)
        self.stranded.update(act.stranded)
        self.fail(what, act.why, results, moved_extra)

    def fail(self, what: str, why: str, results: list[dict], moved_extra: list[str] = ()):
        """Put the switched hosts back, keep the evidence, mark the release failed, raise
        GateFailed (or the stranded hosts' error)."""
        from . import engine as E, netloss
        site, rid, edir = self.site, self.rid, self.edir
        moved = list(self.switched) + [h for h in moved_extra if h not in self.switched]
        why += self.put_back()
        summary = {"schema": "dsv4ctl.promotion/1", "release": rid, "result": "rolled-back", "failed": what,
                   "reason": why, "canary": self.canary, "checks": results, "at": now_iso()}
        hrel = store_evidence(site, site.hosts, rid, self.stamp, edir, summary) if results else None
        E.close_all(site, {**self.rec, "result": "rolled-back", "failed_check": what, "detail": why[:2000],
                           "evidence": hrel},
                    event=(rid, "failed", {"failed_check": what, "failure": why[:1000],
                                           **({"evidence": hrel} if hrel else {})}), per_host=self.frm)
        back = sorted({(self.before[h] or "(none)") for h in moved})
        never = [h for h in site.hosts if h not in moved]
        if self.stranded:
            E.raise_gate_failed(site, netloss.Activation(False, why, what, True, stranded=self.stranded),
                                f"deploy --promote of {rid}", "", self.finish)
        raise GateFailed(f"deploy --promote of {rid}: {what} failed: {why}; "
                           + (f"rolled back {', '.join(moved)} to {', '.join(back)}" if moved else "no host was switched")
                           + (f"; {', '.join(never)} never switched" if never else "")
                           + (f"; evidence in {edir}" if results else ""))

    def not_run(self, bad: dict, results: list[dict]):
        """The check could not run (exit 2: the client's own failure, e.g. out of descriptors,
        DNS, a usage error): no verdict on the release. The canary goes back (an unproven
        release does not stay in service), the release is not marked failed, DsvError exit 2."""
        from . import engine as E
        site, rid, switched = self.site, self.rid, self.switched
        why = bad["reason"] + self.put_back()
        summary = {"schema": "dsv4ctl.promotion/1", "release": rid, "result": "not-run", "failed": None,
                   "reason": why, "canary": self.canary, "checks": results, "at": now_iso()}
        hrel = store_evidence(site, site.hosts, rid, self.stamp, self.edir, summary)
        E.close_all(site, {**self.rec, "result": "check-not-run", "detail": why[:2000], "evidence": hrel},
                    per_host=self.frm)
        back = (f"rolled back {', '.join(switched)} to "
                f"{', '.join(sorted({(self.before[h] or '(none)') for h in switched}))}" if switched
                else "no host was switched")
        raise DsvError(f"deploy --promote of {rid}: check {bad['check']} could not run: {why}; {back}; the release "
                       f"is not marked failed (no verdict); evidence in {self.edir}", EXIT_USAGE)

    def checks(self, stage: str) -> tuple[list[dict], dict | None]:
        """Run the checks of ``stage`` in order until one fails: ``(results, the failed one or
        None)``; a server that died under a check makes it a verdict (exit code 1)."""
        from . import engine as E
        site, url, canary = self.site, self.url, self.canary
        out = []
        for st in self.run.of("check", stage):
            E.trace(site, st)
            kind = st.extra["kind"]
            if kind in ("compare", "compare-a"):
                r = run_compare(st.extra, site.profile, self.edir, site.opts.log)
            else:
                r = run_check(kind, site.profile, self.cpo if stage == "canary" else self.po, self.edir, site.opts.log,
                              url if stage == "canary" else None, name=kind if stage == "canary" else "smoke-all",
                              extra=canary_check_args(site.profile, kind, url, canary) if stage == "canary" else ())
            out.append(r)
            if not r["passed"]:
                # a server that died under the check (a node lost mid-load: node 0 stalls, then
                # exits on its watchdog, and the client sees a refused connection) is a verdict
                dead = E.dead_servers(site, self.run.of("gate", stage))
                if dead:
                    r = {**r, "exit_code": 1, "check_exit_code": r["exit_code"], "reason": f"{dead} (during check {kind})"}
                    out[-1] = r
                return out, r
        return out, None


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

def by_hand_steps(site, rid: str, po: PromoteOptions, hrel: str):
    """Steps of ``dsv4ctl promote ID``: the checks against the running deployment, then per host
    lock, evidence, close (``rid`` marked good). The locks come after the checks: a check run
    does not block other operators."""
    from .steps import RunSteps, Step, close_step, lock_step
    g = gate_settings(site.profile, po)
    steps = []
    for kind in CHECKS:
        argv = check_argv(kind, str(site.profile.path), po)
        why = (f"; gate: concurrency {g['concurrency']}, turns {g['turns']}, 95 % Wilson upper bound "
               f"<= {g['max_corruption']:g}") if kind == "load" else ""
        steps.append(Step("check", "local", f"dsv4ctl {' '.join(argv)}{why}", " ".join(["dsv4ctl", *argv]),
                          extra={"kind": kind, "argv": argv}))
    steps += [lock_step(site, h, f"promote {rid}") for h in site.hosts]
    steps += [Step("evidence", h, f"store the check reports in {site.paths[h].root}/{hrel}/") for h in site.hosts]
    steps += [close_step(site, h, {"action": "promote", "release": rid, "result": "ok", "detail": "", "evidence": hrel},
                         event=(rid, "gate_passed", {"evidence": hrel})) for h in site.hosts]
    fail = [Step("close", h, f"close: mark {rid} failed with the failing check; audit promote failed; unlock")
            for h in site.hosts]
    return RunSteps(steps, fail)


def promote_by_hand(profile, opts, rid: str, po: PromoteOptions) -> dict:
    """Mark ``rid`` good after check smoke + check load against the running deployment.

    ``rid`` must be the active release on every host (InputError otherwise, nothing changes).
    A check that could not run (exit 2: a client-side limit, DNS, a refused API key) is no verdict:
    DsvError exit 2, the release is not marked, the evidence kept.
    Failing checks: GateFailed (a VerdictError, exit 1) naming the check; the release is marked ``failed``
    (still running: nothing is switched, but ``rollback`` no longer picks it), the evidence kept. Dry run: the steps, nothing run."""
    from ..profile.deployment import as_deployment
    from . import engine as E
    profile = as_deployment(profile)
    site = E.open_site(profile, opts)
    try:
        _check_promotable(profile, E.gather_facts(site), rid)
        stamp = file_stamp()
        hrel = f"evidence/{rid}/{stamp}"
        from .steps import DRY_RUN_TOKEN
        site.token = DRY_RUN_TOKEN if opts.dry_run else site.token
        run = by_hand_steps(site, rid, po, hrel)
        if opts.dry_run:
            return {"schema": "dsv4ctl.promote/1", "dry_run": True, "release": rid, "actions": run.lines(),
                    "steps": [s.to_dict() for s in run.steps], "on_failure": [s.to_dict() for s in run.on_failure]}
        edir = evidence_dir(rid, stamp)
        results, bad = _by_hand_checks(site, run, profile, opts, rid, po, edir)
        try:
            E.acquire_locks(site, f"promote {rid}")
            _by_hand_close(site, rid, po, stamp, hrel, edir, results, bad)
        finally:
            E.release_locks(site)
        return {"schema": "dsv4ctl.promote/1", "release": rid, "result": "good", "checks": results,
                "evidence": str(edir), "hosts": list(site.hosts)}
    finally:
        site.close()


def _check_promotable(profile, facts: dict, rid: str) -> None:
    """InputError unless ``rid`` is the active release on every host (``facts``: host -> facts)
    and the profile's serve configs are the ones ``rid`` was built with."""
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


def _by_hand_checks(site, run, profile, opts, rid: str, po: PromoteOptions,
                    edir: Path) -> tuple[list[dict], dict | None]:
    """Run the checks of ``dsv4ctl promote`` in order until one fails: ``(results, the failed
    one or None)``. Interrupted: the audit log of every host says so (under the lock), then the
    interrupt propagates."""
    from . import engine as E
    results, bad = [], None
    try:
        for st in run.of("check"):
            E.trace(site, st)
            r = run_check(st.extra["kind"], profile, po, edir, opts.log)
            results.append(r)
            if not r["passed"]:
                bad = r
                break
    except KeyboardInterrupt:
        # the check child was stopped (subprocess.run kills it); nothing was changed on a host:
        # say so in every host's audit log (under the lock; a held lock is left alone)
        try:
            E.acquire_locks(site, f"promote {rid}")
            E.close_all(site, {"action": "promote", "release": rid, "result": "interrupted",
                               "detail": f"interrupted during the checks; {rid} not marked"})
        except (DsvError, KeyboardInterrupt):
            pass
        finally:
            E.release_locks(site)
        raise
    return results, bad


def _by_hand_close(site, rid: str, po: PromoteOptions, stamp: str, hrel: str, edir: Path,
                   results: list[dict], bad: dict | None) -> None:
    """With the locks held: store the evidence, then close: ``rid`` marked good, or (a failed
    check) marked failed and GateFailed, or (a check that could not run) not marked and DsvError
    exit 2."""
    from . import engine as E
    run = by_hand_steps(site, rid, po, hrel)
    no_verdict = bad is not None and bad["exit_code"] == EXIT_USAGE
    summary = {"schema": "dsv4ctl.promotion/1", "release": rid,
               "result": "not-run" if no_verdict else "failed" if bad else "good",
               "by_hand": True, "checks": results, "at": now_iso()}
    for st in run.of("evidence"):
        E.trace(site, st)
    store_evidence(site, site.hosts, rid, stamp, edir, summary)
    if no_verdict:
        # the check could not run (exit 2: the client's own limits, DNS, a refused API key):
        # no verdict, as in deploy --promote; the release is not marked failed
        E.close_all(site, {"action": "promote", "release": rid, "evidence": hrel, "result": "check-not-run",
                           "detail": bad["reason"][:2000]})
        raise DsvError(f"promote {rid}: check {bad['check']} could not run: {bad['reason']}; the release is "
                       f"not marked failed (no verdict); evidence in {edir}", EXIT_USAGE)
    if bad:
        E.close_all(site, {"action": "promote", "release": rid, "evidence": hrel, "result": "failed",
                           "failed_check": f"check {bad['check']}", "detail": bad["reason"][:2000]},
                    event=(rid, "failed", {"failed_check": f"check {bad['check']}",
                                           "failure": bad["reason"][:1000], "evidence": hrel}))
        raise GateFailed(f"promote {rid}: check {bad['check']} failed: {bad['reason']}; "
                           f"marked failed (rollback will not pick it); evidence in {edir}")
    E.run_close(site, run.of("close"))
    E.raise_close_errors(site, rid)
