"""``dsv4ctl plan``: per-GPU-rank KV pool budgets of a profile, as its SGLang release would size them.

Inputs per server group: the profile (topology, GPU memory, measured memory), the group's serve
config (server arguments), its env switches, the tree's index-K dtype/accounting, and what-if
overrides (``--set KEY=VALUE``). The package in layers: :mod:`.inputs` resolves them into a
:class:`GroupInputs`, :mod:`.stages` sizes each PP stage's pools (the arithmetic is
:mod:`.capacity`, one set of release rules per :mod:`.versions` entry) and judges them
(:mod:`.verdict`), :mod:`.fixes` searches the changes that re-plan to a better verdict; this
module walks the groups and ranks and builds the JSON-ready report (schema ``dsv4ctl.plan/2``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from . import capacity as cap
from .capacity import GIB
from ..errors import InputError
from .models import load_model
from . import verdict as vd
from .sglang_version import VersionChoice, resolve_version
from .versions import DEFAULT_VERSION, VersionRules
from ..profile.model import Group, Profile
from ..profile.deployment import Deployment, as_deployment
from ..profile.serveconfig import ServeConfig
# resolution, stages and fixes live in their own modules; the names other modules and tests use
# from here are re-exported
from .inputs import (GroupInputs, SERVE_KEYS, SET_KEYS, node_placement, parse_set,  # noqa: F401
                     placement, resolve_group, serve_args, topology)
from .stages import StagePlan, evaluate, rank_verdict, shortfall, to_gib
from .fixes import chunk_fix, first_passing_mfs, fixes_for, tight_fixes, why_no_fix

SCHEMA = "dsv4ctl.plan/2"   # /2: headroom_gib counts 2 MiB rounding, the allocator and the draft pool


SGLANG_VERSION = DEFAULT_VERSION      # the release planned for when nothing says otherwise


@dataclass
class GroupPlan:
    """The plan of one server group, JSON-ready through :meth:`to_dict`."""

    group: Group
    inputs: GroupInputs
    stages: list[StagePlan]
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)
    index_k_source: str = "profile"
    verdict: Optional[dict] = None

    def rank_layout(self) -> list[tuple[int, int, int, StagePlan]]:
        """(rank, tp_rank, dp_rank, stage) of every GPU rank, in the group's GPU order."""
        gi = self.inputs
        replicas = 1 if gi.dp_attention else gi.dp
        out = []
        for rep in range(replicas):
            for st in self.stages:
                for tp_rank in range(gi.tp):
                    dp_rank = tp_rank // (gi.tp // gi.dp) if gi.dp_attention else rep
                    out.append((len(out), tp_rank, dp_rank, st))
        return out

    def ranks(self) -> list[dict]:
        """Every GPU rank: rank, gpu, tp/pp/dp rank and that rank's pool numbers and verdict."""
        gi = self.inputs
        out = []
        for rank, tp_rank, dp_rank, st in self.rank_layout():
            own = None
            if gi.rank_resident_gib and rank < len(gi.rank_resident_gib):
                own = int(gi.rank_resident_gib[rank] * GIB)
            node, host, gpu = gi.places[rank] if rank < len(gi.places) else (None, None, None)
            out.append(dict(rank=rank, node=node, host=host, gpu=gpu,
                            tp_rank=tp_rank, pp_rank=st.pp_rank, dp_rank=dp_rank,
                            **_stage_numbers(self, st, own)))
        return out

    def to_dict(self) -> dict:
        g, gi = self.group, self.inputs
        return dict(
            name=g.name, role=g.role, host=g.host, nnodes=g.nnodes, replicas=g.replicas,
            nodes=[dict(host=n.host, gpus=list(n.gpus)) for n in
                   (g.servers[gi.replica] if gi.replica is not None else g.nodes)],
            replica=gi.replica, tp=gi.tp, dp=gi.dp, pp=gi.pp, ep=g.ep,
            dp_attention=gi.dp_attention, mem_fraction_static=gi.mem_fraction_static,
            mem_fraction_static_source=gi.mfs_source, context_length=gi.context_length,
            activation_reserve_gib=gi.activation_reserve_gib,
            gpu_memory_mib=gi.gpu_memory_mib,
            memory_inputs=dict(free_gib_before_load=gi.free_gib_before_load,
                               weights_gib_per_rank=gi.weights_gib_per_rank, other_gib=gi.other_gib,
                               available_bytes_override=gi.available_bytes_override,
                               estimated=gi.estimated,
                               draft_weights_gib_per_rank=gi.draft_weights_gib_per_rank,
                               draft_freed_gib_per_rank=gi.draft_freed_gib_per_rank,
                               checkpoint_format=gi.checkpoint_format,
                               rank_resident_gib=gi.rank_resident_gib),
            server_args={k: v for k, v in asdict(gi.pool).items()},
            ranks=self.ranks(), warnings=self.warnings, errors=self.errors, fixes=self.fixes,
            index_k_source=self.index_k_source,
            activation_estimate_gib=gi.activation_estimate_gib,
            activation_rank_gib=gi.rank_estimate_gib,
            verdict=self.verdict)


def _stage_numbers(gp: GroupPlan, st: StagePlan, own_resident: Optional[int] = None) -> dict:
    s, e = st.sizes, st.exact_sizes
    gi = gp.inputs
    mem, v = rank_verdict(gi, st, own_resident)
    return dict(
        layers=list(s.layers),
        available_bytes=s.available_bytes,
        bytes_per_full_token=s.bytes_per_full_token,
        bytes_per_swa_token=s.bytes_per_swa_token,
        fixed_bytes=s.fixed_bytes,
        full_max_total_num_tokens=s.full_max_total_num_tokens,
        swa_max_total_num_tokens=s.swa_max_total_num_tokens,
        c4_max_total_num_tokens=s.c4_max_total_num_tokens,
        c128_max_total_num_tokens=s.c128_max_total_num_tokens,
        c4_state_pool_size=s.c4_state_pool_size,
        c128_state_pool_size=s.c128_state_pool_size,
        max_running_requests=s.max_running_requests,
        swa_mode=s.swa_mode,
        pools_gib={k: to_gib(v) for k, v in asdict(st.alloc_real).items()},
        allocated_gib=to_gib(st.alloc_real.total),
        index_k_gib=to_gib(st.alloc_real.c4_index_k),
        index_k=dict(
            dtype=cap.index_k_dtype_of(st.conf.inputs),
            accounting=st.conf.inputs.index_k_accounting,
            budget_bytes_per_slot=s.index_k_budget_bytes,
            real_bytes_per_slot=s.index_k_real_bytes,
            budget_gib=to_gib(st.alloc_budget.c4_index_k),
            real_gib=to_gib(st.alloc_real.c4_index_k),
            overcommit_gib=to_gib(st.alloc_real.c4_index_k - st.alloc_budget.c4_index_k),
            exact=dict(bytes_per_full_token=e.bytes_per_full_token,
                       full_max_total_num_tokens=e.full_max_total_num_tokens,
                       swa_max_total_num_tokens=e.swa_max_total_num_tokens,
                       c4_max_total_num_tokens=e.c4_max_total_num_tokens,
                       c128_max_total_num_tokens=e.c128_max_total_num_tokens,
                       c4_state_pool_size=e.c4_state_pool_size,
                       c128_state_pool_size=e.c128_state_pool_size),
        ),
        req_to_token_gib=to_gib(st.req_to_token_bytes),
        headroom_gib=to_gib(mem.headroom),
        max_concurrent_requests=st.concurrent,
        resident_gib=to_gib(mem.resident),
        rounding_gib=to_gib(mem.pools_rounding),
        allocator_gib=to_gib(mem.allocator),
        draft_pool_gib=to_gib(mem.draft_pool),
        indexer_logits_gib=to_gib(st.logits_bytes),
        decode_logits_gib=to_gib(st.decode_logits_bytes),
        verdict=v.level,
        deciding=v.deciding,
        slack=v.slack if v.deciding == "requests" else to_gib(v.slack),
    )


# said when no candidate change re-plans without failing (dsv4ctl/plan/fixes.py: fixes_for)
NO_FIX = ("; no fix found: no single change dsv4ctl tries (mem-fraction-static 0.3-0.99, max-running-requests, "
          "context-length, chunked-prefill-size, index-K, 2-8x the GPUs, alone or with mem-fraction-static) "
          "plans without failing or landing under 90 % of SGLang's activation estimate")


# said when no candidate change re-plans a tight group to fits (dsv4ctl/plan/fixes.py: tight_fixes)
NO_TIGHT_FIX = ("no fix found: no single change dsv4ctl tries (mem-fraction-static 0.3-0.99, cuda-graph-max-bs-decode, "
                "chunked-prefill-size, context-length, max-total-tokens, 2-8x the GPUs alone or with mem-fraction-static) "
                "plans fits")


def _tight(model, gi: GroupInputs, v: vd.Verdict, short: dict, msg: str, gp: "GroupPlan", resolve,
           rules: Optional[VersionRules]) -> str:
    """A ``tight`` made actionable (issue 44.4): ``msg`` with what the rank is short of and by how
    much, and the fixes that re-plan to ``fits`` put in ``gp.fixes`` (or why there is none)."""
    if v.deciding == "available_bytes":
        return msg + "; no fix: the inputs disagree (check available_bytes), the pools are not what is short"
    if short["shortfall_gib"] is not None:
        msg += f"; short of {short['short_of']} by {short['shortfall_gib']} GiB"
    elif short["shortfall_requests"] is not None:
        msg += f"; short of {short['shortfall_requests']} request(s) at context_length {gi.context_length:,}"
    gp.fixes.extend(tight_fixes(model, gi, v, resolve, rules.version if rules else None))
    return msg + (": see the fixes" if gp.fixes else "; " + NO_TIGHT_FIX)


def plan_group(profile: Profile, group: Group, model, facts, overrides: dict, tree=None,
               serve: Optional[ServeConfig] = None, rules: Optional[VersionRules] = None) -> GroupPlan:
    """Plan one server group (``serve``: its parsed serve config); capacity errors become plan
    errors (verdict ``fails``), not exceptions. ``tree``: :class:`dsv4ctl.patches.planfacts.TreeFacts`, or None.

    The group's verdict is its worst rank's (:mod:`dsv4ctl.plan.verdict`): ``fails`` is an error
    (exit 1) with fixes that were each re-planned and pass; ``tight`` is a warning."""
    tree_idx, tree_notes = tree.for_env(group.env) if tree else ({}, [])
    gi = resolve_group(profile, group, model, facts, overrides, tree_idx, serve, rules)
    source = "--set" if {"index_k_dtype", "index_k_accounting"} & set(overrides) else (
        tree.source(tree_idx) if tree_idx else "profile")
    stages, v, msg = evaluate(model, gi)
    if v.deciding == "no_kv_memory" and "Raise --mem-fraction-static above" in msg:
        if gi.mem_fraction_static <= 0:
            at = f"--mem-fraction-static={gi.mem_fraction_static}"
            msg = msg.replace(at, f"{at} (SGLang's default for these flags: memory_hook.py reserves "
                                  f"{gi.activation_reserve_gib} GiB for activations and CUDA graphs, more than the "
                                  f"GPU's {round(gi.gpu_memory_mib / 1024, 3)} GiB)", 1)
        msg += first_passing_mfs(model, gi)
    gp = GroupPlan(group=group, inputs=gi, stages=stages or [], index_k_source=source)
    if v.deciding == "available_bytes" and gi.available_bytes_override is not None:
        msg = (f"the given available_bytes ({gi.available_bytes_override:,} B), the weights and what SGLang builds "
               f"before serving exceed the GPU ({msg}): check the available_bytes value against "
               f"weights_gib_per_rank and the GPU memory")
    if stages and gi.rank_resident_gib and len(set(gi.rank_resident_gib)) > 1:
        r = gi.rank_resident_gib.index(min(gi.rank_resident_gib))
        msg += f" (rank {r}, {gi.gpu_name(r)}: the tightest of the group's per-GPU memory)"
    if v.level == "fails":
        def resolve(o: dict) -> GroupInputs:
            return resolve_group(profile, group, model, facts, {**overrides, **o}, tree_idx, serve, rules)
        gp.fixes.extend(fixes_for(model, gi, v, stages, resolve))
        if (v.deciding in ("no_kv_memory", "pools") and gi.mfs_source.startswith("default")) \
                or v.deciding == "indexer_logits":
            gp.fixes.extend(("or " if gp.fixes else "") + f for f in chunk_fix(model, gi, resolve))
        if not gp.fixes:
            msg = msg.replace(": see the fixes)", ")") + NO_FIX + why_no_fix(model, gi, v, resolve)
        gp.errors.append(msg)
    short = shortfall(gi, stages, v)
    if v.level == "tight":
        msg = _tight(model, gi, v, short, msg, gp, lambda o: resolve_group(profile, group, model, facts, {**overrides, **o},
                                                                        tree_idx, serve, rules), rules)
    gp.verdict = dict(level=v.level, deciding=v.deciding, message=msg, **short)
    if v.level == "tight":
        gp.warnings.append(f"tight: {msg}")
    if not stages:
        return gp
    gp.warnings[0:0] = tree_notes      # what the tree carries first, as before the verdict
    if gi.replica is not None:
        gp.warnings.append(f"replica {gi.replica} of {group.replicas} planned: the one with the least free GPU "
                           "memory (memory lists give every replica's GPUs); the others have at least its headroom")
    for note in gi.estimated:
        gp.warnings.append(f"estimated input: {note}; measure it for an exact plan")
    st = min(stages, key=lambda s: s.headroom_bytes)
    over = st.alloc_real.c4_index_k - st.alloc_budget.c4_index_k
    dtype = cap.index_k_dtype_of(st.conf.inputs)
    if over > 0:
        gp.warnings.append(f"index-K is {dtype} ({st.sizes.index_k_real_bytes} B/slot) but SGLang budgets "
                           f"{st.sizes.index_k_budget_bytes} B/slot: {to_gib(over)} GiB per rank over budget, "
                           f"taken from the {to_gib(st.headroom_budgeted_bytes)} GiB headroom SGLang budgets "
                           f"({to_gib(st.headroom_bytes)} GiB left before serving: the table's headroom row)")
    elif over < 0:
        gp.warnings.append(f"index-K is {dtype} ({st.sizes.index_k_real_bytes} B/slot) but SGLang budgets "
                           f"{st.sizes.index_k_budget_bytes} B/slot: {to_gib(-over)} GiB per rank budgeted and unused")
    if gi.pool.speculative_algorithm == "DSPARK":
        gp.warnings.append("DSPARK's draft pool is not modelled (EAGLE's is): headroom is optimistic")
    frees = gi.free_gib_per_gpu or []
    if gi.tp > 1 and not gi.balance_check and vd.unbalanced(frees):
        gp.warnings.append(f"unbalanced: free before load {min(frees)} GiB on one GPU < {vd.BALANCE_FRACTION:g} x "
                           f"{max(frees)} GiB on another; with SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=false SGLang "
                           "only warns and starts: pools are sized from the GPU with the least free memory")
    return gp


@dataclass
class PlanReport:
    """The whole plan. ``ok`` is False when any group has an error (exit 1)."""

    profile: Profile
    model: cap.ModelGeometry
    groups: list[GroupPlan]
    sglang: Optional[VersionChoice] = None

    @property
    def ok(self) -> bool:
        return not any(g.errors for g in self.groups)

    @property
    def sglang_version(self) -> str:
        return self.sglang.version if self.sglang else DEFAULT_VERSION

    def to_dict(self) -> dict:
        """The ``dsv4ctl.plan/2`` JSON document (see README, "plan JSON"); ``sglang_version`` is the
        release planned for, ``sglang_version_source`` where it came from."""
        return dict(schema=SCHEMA, sglang_version=self.sglang_version,
                    sglang_version_source=self.sglang.source if self.sglang else "default",
                    profile=self.profile.name,
                    profile_path=str(self.profile.path), model=self.model.name, ok=self.ok,
                    groups=[g.to_dict() for g in self.groups])


def build_plan(deployment: "Deployment | Profile", overrides: Optional[dict] = None,
               groups: Optional[list[str]] = None) -> PlanReport:
    """Plan every server group of the deployment (a Profile is resolved first), or the named ``groups``.

    ``overrides`` come from :func:`parse_set`. Raises InputError for bad input (exit 2)."""
    dep = as_deployment(deployment)
    profile = dep.profile
    overrides = dict(overrides or {})
    if "model" in overrides:
        model_ref, where = overrides["model"], "--set model"
    else:
        model_ref, where = profile.model, f"{profile.positions.where(('model',))}: model"
    try:
        model, facts = load_model(model_ref, profile.base_dir)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    if "model" in overrides:
        base, _ = load_model(profile.model, profile.base_dir)
        if cap.replace(base, name="") == cap.replace(model, name=""):
            overrides.pop("model")      # the same model by another name: measured weights still apply
    selected = profile.servers()
    if groups:
        selected = [profile.group(n) for n in dict.fromkeys(groups)]   # -g a -g a plans a once
        for g in selected:
            if not g.is_server:
                raise InputError(f"group {g.name!r} is the router: it has no KV pools")
    choice = resolve_version(dep)
    tree = None
    if dep.sglang.tree is not None and dep.sglang.series is not None:  # imported only when needed: start-up
        from ..patches.planfacts import deployment_tree_facts
        tree = deployment_tree_facts(dep)       # once per Deployment (kept by with_serve_texts)
    return PlanReport(profile=profile, model=model, sglang=choice,
                      groups=[plan_group(profile, g, model, facts, overrides, tree, dep.groups[g.name].serve,
                                         choice.rules)
                              for g in selected])
