"""Reading side of ``config lint`` / ``hicache``: a :class:`~dsv4ctl.profile.deployment.Deployment`
→ :class:`dsv4ctl.serve.lint.LintInput` (serve configs, plan device pool GiB per rank, index-K
gating of the SGLang tree). The rules themselves are pure, in :mod:`dsv4ctl.serve.lint`."""

from __future__ import annotations

import copy

from ..plan.startup import is_sm100

from typing import Optional

from ..errors import InputError
from ..profile.deployment import Deployment, as_deployment
from ..profile.serveconfig import parse_serve_config
from .lint import GroupInput, LintInput


def device_pool_gib(dep: Deployment) -> tuple[dict[str, list[float]], Optional[str]]:
    """Per server group, each rank's device KV pool GiB as allocated (``dsv4ctl plan``'s
    ``allocated_gib``). Returns ({}, reason) when the plan cannot be built. Planned once per
    Deployment (:meth:`Deployment.once`: the lint inputs of several texts share it); the answer
    is shared, never written."""
    return dep.once("device_pool_gib", lambda: _device_pool_gib(dep))


def _device_pool_gib(dep: Deployment) -> tuple[dict[str, list[float]], Optional[str]]:
    """:func:`device_pool_gib`, planned."""
    from ..plan.plan import build_plan
    try:
        report = build_plan(dep)
    except InputError as e:
        return {}, str(e)
    return {gp.group.name: [r["allocated_gib"] for r in gp.ranks()] for gp in report.groups if gp.stages}, None


def topology_error(dep: Deployment, group, cfg) -> Optional[str]:
    """Why the serve config ``cfg`` of ``group`` does not run the topology its profile says
    (:func:`dsv4ctl.plan.plan.topology`, the rule plan applies), None when it does or when the
    file has other errors (the SGL rules report those)."""
    if cfg is None:
        return None
    from ..plan.plan import serve_args, topology
    try:
        args, where = serve_args(cfg)
    except InputError:
        return None
    try:
        topology(dep.profile, group, cfg, args, where, {})
    except InputError as e:
        return str(e)
    return None


def model_error(dep: Deployment, group, cfg) -> Optional[str]:
    """Why SGLang cannot build or serve the model with the group's resolved arguments
    (:func:`dsv4ctl.plan.inputs.model_refusal`, the rule ``plan`` refuses with), None when it can or
    when the file or the model has other errors (other rules and ``plan`` report those)."""
    if cfg is None or not is_dsv4(dep):
        return None
    from ..plan.inputs import merged_args, model_refusal
    from ..plan.models import load_model
    from ..plan.sglang_version import resolve_version
    from ..plan.versions import rules_for
    try:
        model = dep.once("model_geometry", lambda: load_model(dep.profile.model, dep.profile.base_dir)[0])
        args = merged_args(dep.profile, group, cfg, rules_for(resolve_version(dep).version))
    except (InputError, KeyError, ValueError):
        return None
    return model_refusal(group.name, model, args)


def _binds(g) -> list:
    """The group's listeners (:meth:`GroupView.binds`, with its attention-DP size); none when its
    serve config cannot be read (the SGL rules report that file)."""
    from ..plan.plan import serve_args
    try:
        attn_dp = 1
        if g.is_server and g.serve is not None:
            args, _ = serve_args(g.serve)
            attn_dp = args.get("dp_size", 1) if args.get("enable_dp_attention") else 1
        return g.binds(attn_dp)
    except InputError:
        return []


def is_dsv4(dep: Deployment) -> bool:
    """True unless the profile's model config says another model type: a DeepSeek-V3.2 config
    (``deepseek_v32``, no ``compress_ratios``) gets no DSV4 rules. An unreadable one counts as DSV4."""
    from ..plan.models import model_type_of
    profile = dep.profile
    mt = model_type_of(profile.model, profile.base_dir)
    return mt is None or mt.startswith("deepseek_v4")


def build_input(deployment, groups: Optional[list] = None, tree: Optional[str] = None,
                texts: Optional[dict[str, str]] = None, with_plan: bool = True) -> LintInput:
    """Assemble the lint input for ``groups`` (names or groups; default: every server group) of the
    deployment (a Profile is resolved first).

    ``texts`` maps group names to serve-config text to lint instead of the file (an edit not yet
    written). Raises InputError for a missing file of a selected group, or a YAML error.

    Built once per Deployment and arguments (:meth:`Deployment.once`): a command that lints the
    same texts twice (``hicache on --remote``: the profile's files, then the running release's,
    each edited and unedited) builds, plans and reads the tree's gating once per text. Each call
    gets its own :class:`LintInput` and :class:`GroupInput` objects (a caller may set a group's
    ``config``, as :mod:`dsv4ctl.serve.hicache_live` does); what they hold is shared, never written."""
    dep = as_deployment(deployment)
    names = None if not groups else tuple(sorted({getattr(g, "name", g) for g in groups}))
    key = ("lint_input", names, tree, tuple(sorted((texts or {}).items())), with_plan)
    kept = dep.once(key, lambda: _build_input(dep, groups, tree, texts, with_plan))
    out = copy.copy(kept)
    out.groups = [copy.copy(gi) for gi in kept.groups]
    return out


def _build_input(dep: Deployment, groups: Optional[list], tree: Optional[str],
                 texts: Optional[dict[str, str]], with_plan: bool) -> LintInput:
    """:func:`build_input`, built."""
    texts = texts or {}
    servers = dep.servers()
    selected = {getattr(g, "name", g) for g in groups} if groups else {g.name for g in servers}
    # Pairs and host totals need the partner groups too: read every server group.
    ginputs = []
    for g in servers:
        cfg = None
        path = g.serve_config_path
        if path is not None:
            if g.name in texts:
                cfg = parse_serve_config(texts[g.name], str(path))
            elif g.name in selected or path.exists():
                cfg = g.serve
        host = dep.hosts.get(g.group.host)
        ginputs.append(GroupInput(name=g.name, role=g.role, host=g.group.host, config=cfg, env=g.env,
                                  sm100=is_sm100(getattr(host, "gpu_model", None), getattr(host, "gpu_memory_mib", None)),
                                  topology_error=topology_error(dep, g.group, cfg),
                                  model_error=model_error(dep, g.group, cfg),
                                  rank_hosts=[n.host for srv in g.group.servers for n in srv for _ in n.gpus],
                                  binds=_binds(g)))
    # routers have no serve config to lint, only ports (DSV121)
    ginputs += [GroupInput(name=r.name, role=r.role, host=r.group.host, config=None, binds=_binds(r))
                for r in dep.routers()]
    inp = LintInput(groups=ginputs, pairs=dep.router_pairs(),
                    host_ram_gib={h.name: h.ram_gib for h in dep.hosts.values()},
                    index_k_dtype=dep.sglang.index_k_dtype, dsv4=is_dsv4(dep))
    any_hicache = any(gi.config is not None and gi.config.hicache_enabled for gi in ginputs)
    if with_plan and any_hicache:
        pools, err = device_pool_gib(dep)
        inp.plan_error = err
        for gi in ginputs:
            gi.rank_device_gib = pools.get(gi.name)
    from ..plan.sglang_version import resolve_version
    choice = resolve_version(dep)
    inp.sglang_version = choice.version
    if choice.disagree:
        line = dep.profile.positions.line(("sglang", "version"))
        inp.version_mismatch = (str(dep.profile.path), line or 1,
                                f"sglang.version is {choice.profile} but the {choice.source} is SGLang {choice.tree}: "
                                f"dsv4ctl plans and lints for {choice.tree}; set sglang.version: \"{choice.tree}\"")
    inp.series_mismatch = series_mismatch(dep, choice.version)
    tp = dep.tree(tree)
    inp.tree = str(tp) if tp else None
    if tp is not None and any_hicache and inp.index_k_dtype == "bf16":
        from .treegate import analyse_tree
        inp.gating = analyse_tree(tp)
    return inp


def series_mismatch(dep, version: str) -> Optional[tuple[str, int, str]]:
    """DSV123's (profile, line, message) when the profile's patch series (``sglang.series``) is
    cut against another SGLang release than ``version`` (the one the deployment runs: the tree's,
    else the profile's); None when it matches, no series is set, or it cannot be read (``patch``
    commands report an unreadable series)."""
    if dep.sglang.series is None:
        return None
    from ..errors import DsvError
    from ..patches.resolved import loaded_series
    try:
        ls = loaded_series(dep)             # once per Deployment, shared with the release inputs and the plan
    except (DsvError, OSError):
        return None
    if ls.series.package != "sglang" or ls.series.version == version:
        return None
    from ..resources import shipped_dir
    shipped = shipped_dir("patches") / f"sglang-{version}"
    fix = (f"set sglang.series: sglang-{version} (shipped)" if (shipped / "series").is_file()
           else f"cut the series against sglang=={version}")
    line = dep.profile.positions.line(("sglang", "series")) or 1
    return (str(dep.profile.path), line,
            f"sglang.series {ls.dir} is cut against {ls.series.base} but the deployment runs SGLang {version}: {fix}")


def restrict(findings, inp: LintInput, groups: Optional[list]):
    """Findings of the selected groups only (pair and host findings name the group they sit on)."""
    if not groups:
        return findings
    names = {getattr(g, "name", g) for g in groups}
    files = {gi.config.path for gi in inp.groups if gi.name in names and gi.config is not None}
    return [f for f in findings if f.group in names or f.file in files]
