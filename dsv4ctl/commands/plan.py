"""``dsv4ctl plan``: thin CLI over :mod:`dsv4ctl.plan`."""

from __future__ import annotations

from typing import Optional

import typer

from ..errors import InputError, PlanFails
from ..render import console, dump_json, markdown_table, rich_table, styled, text_table

def _span(values: list) -> str:
    """``3``, ``0-15`` (a contiguous run) or ``0,2,5``."""
    vs = sorted(set(values))
    if len(vs) > 2 and vs == list(range(vs[0], vs[-1] + 1)):
        return f"{vs[0]}-{vs[-1]}"
    return ",".join(map(str, vs))


def _gpus(rs: list[dict]) -> str:
    """The GPUs of a set of ranks: ``0,1,2,3``, or per host for a multi-node server
    (``h200-0: 0-7 · h200-1: 0-7``); ``-`` for what-if ranks."""
    if any(x["gpu"] is None for x in rs):
        return "-"
    hosts = list(dict.fromkeys(x.get("host") for x in rs))
    if len(hosts) == 1:
        return ",".join(str(x["gpu"]) for x in rs)
    return " · ".join(f"{h}: {_span([x['gpu'] for x in rs if x.get('host') == h])}" for h in hosts)


METRICS = [
    ("GPUs", lambda g, r, rs: _gpus(rs)),
    ("pp / dp rank", lambda g, r, rs: f"{r['pp_rank']} / {_span([x['dp_rank'] for x in rs])}"),
    ("layers", lambda g, r, rs: f"{r['layers'][0]}..{r['layers'][1] - 1}"),
    ("available GiB", lambda g, r, rs: f"{r['available_bytes'] / 2**30:.3f}"),
    ("bytes per full token", lambda g, r, rs: f"{r['bytes_per_full_token']:.2f}"),
    ("fixed GiB", lambda g, r, rs: f"{r['fixed_bytes'] / 2**30:.3f}"),
    ("full tokens", lambda g, r, rs: f"{r['full_max_total_num_tokens']:,}"),
    ("SWA tokens", lambda g, r, rs: f"{r['swa_max_total_num_tokens']:,} ({r['swa_mode']})"),
    ("c4 tokens", lambda g, r, rs: f"{r['c4_max_total_num_tokens']:,}"),
    ("c128 tokens", lambda g, r, rs: f"{r['c128_max_total_num_tokens']:,}"),
    ("c4 / c128 state rows", lambda g, r, rs: f"{r['c4_state_pool_size']:,} / {r['c128_state_pool_size']:,}"),
    ("max running requests", lambda g, r, rs: r["max_running_requests"]),
    ("GiB SWA / c4 / c128", lambda g, r, rs: "{swa_latent} / {c4_latent} / {c128_latent}".format(**r["pools_gib"])),
    ("GiB states c4 / c128", lambda g, r, rs: f"{r['pools_gib']['c4_attn_state'] + r['pools_gib']['c4_index_state']:.3f} / {r['pools_gib']['c128_state']}"),
    ("index-K", lambda g, r, rs: f"{r['index_k']['dtype']}, {r['index_k']['accounting']} accounting"),
    ("index-K GiB budget -> real", lambda g, r, rs: f"{r['index_k']['budget_gib']} -> {r['index_k']['real_gib']}"),
    ("index-K over-commit GiB", lambda g, r, rs: r["index_k"]["overcommit_gib"]),
    ("full tokens, exact accounting", lambda g, r, rs: f"{r['index_k']['exact']['full_max_total_num_tokens']:,}"),
    ("allocated GiB (real)", lambda g, r, rs: r["allocated_gib"]),
    ("rounding / allocator / draft GiB", lambda g, r, rs: f"{r['rounding_gib']} / {r['allocator_gib']} / {r['draft_pool_gib']}"),
    ("headroom GiB", lambda g, r, rs: r["headroom_gib"]),
    ("verdict", lambda g, r, rs: f"{r['verdict']} ({r['deciding']})"),
    ("max requests @ context", lambda g, r, rs: f"{r['max_concurrent_requests']} @ {g['context_length']:,}"),
]


def _columns(doc: dict) -> list[tuple[str, dict, dict, list]]:
    """One column per group and set of identical ranks: (title, group, rank, ranks)."""
    from ..report.memory import rank_label, rank_sets
    return [(f"{g['name']} {rank_label(rs)}", g, rs[0], rs) for g in doc["groups"] for rs in rank_sets(g)]


def _table(doc: dict) -> tuple[list[str], list[list]]:
    cols = _columns(doc)
    headers = ["per rank"] + [c[0] for c in cols]
    rows = [[name] + [fn(g, r, rs) for _, g, r, rs in cols] for name, fn in METRICS]
    return headers, rows


def _notes(doc: dict) -> list[tuple[str, str, str]]:
    out = []
    for g in doc["groups"]:
        out += [("error", g["name"], m) for m in g["errors"]]
        out += [("fix", g["name"], m) for m in g["fixes"]]
        out += [("warning", g["name"], m) for m in g["warnings"]]
    return out


def plan(
    profile: Optional[str] = typer.Argument(None, help="Profile path or shipped name (default: the embedded dsv4-flash-8xb200-pd)."),
    set_: Optional[list[str]] = typer.Option(None, "--set", "-s", metavar="KEY=VALUE",
                                   help="What-if override, SGLang names (mem_fraction_static=0.85, index_k_dtype=bf16, SGLANG_DSV4_KV_LAYOUT=v41, available_bytes=...). Repeatable."),
    group: Optional[list[str]] = typer.Option(None, "--group", "-g", help="Only these server groups. Repeatable."),
    as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.plan/2 JSON document."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown."),
    csv: bool = typer.Option(False, "--csv", help="Print CSV: one row per rank (node and host, GPU, memory segments in GiB, pool sizes)."),
    from_log: Optional[str] = typer.Option(None, "--from-log", metavar="FILE",
                                           help="Compare a server's start-up log (DSV4 pool lines / DSV4_POOL_PLAN) with the plan, per pool; exit 1 on a difference."),
) -> None:
    """Per-GPU-rank KV pool budgets as the SGLang release the profile ships sizes them (0.5.18-0.5.23:
    the tree's own version, else sglang.version), with real index-K sizing.

    Exit 0 when every group fits or is tight (a warning), 1 when a group fails (the deciding term
    first, then fixes that were re-planned), 2 on bad input. README: "Verdicts"."""
    from ..plan.plan import build_plan, parse_set
    from .common import load_deployment_arg
    if as_json + markdown + csv > 1:
        raise InputError("plan: --json, --markdown and --csv exclude each other")

    prof = load_deployment_arg(profile)
    report = build_plan(prof, parse_set(list(set_ or ())), list(group or ()) or None)
    doc = report.to_dict()
    if from_log:
        from .planlog import from_log as compare_log
        return compare_log(doc, from_log, as_json, markdown)
    if as_json:
        print(dump_json(doc))
    elif csv:
        from ..report.csvout import plan_csv
        print(plan_csv(doc), end="")
    elif markdown:
        print(f"## dsv4ctl plan: {doc['profile']} ({doc['model']}, SGLang {doc['sglang_version']})\n")
        print(markdown_table(*_table(doc)))
        notes = _notes(doc)
        if notes:
            print()
            for kind, g, m in notes:
                print(f"- **{kind}** `{g}`: {m}")
    else:
        headers, rows = _table(doc)
        if len(headers) > 1:    # groups that failed before sizing have no rank columns
            title = f"dsv4ctl plan: {doc['profile']} · {doc['model']} · SGLang {doc['sglang_version']}"
            text = text_table(title, headers, rows, right=range(1, len(headers)))
            if text is None:    # wider than the terminal: rich shrinks and wraps the columns
                console().print(rich_table(title, headers, rows, right=range(1, len(headers))))
            else:
                print(text)
            from ..report.terminal import plan_bar_lines
            print("\n".join(plan_bar_lines(doc)))
        for g in doc["groups"]:
            mi = g["memory_inputs"]
            print(f"{styled(g['name'], 'bold')}: tp{g['tp']} dp{g['dp']}{' (dp-attention)' if g['dp_attention'] else ''} "
                  f"pp{g['pp']} · mem_fraction_static {g['mem_fraction_static']} ({g['mem_fraction_static_source']}) · "
                  f"free before load {mi['free_gib_before_load']} GiB · weights {mi['weights_gib_per_rank']} GiB/rank"
                  + (" (estimated)" if any(e.startswith("weights_gib_per_rank=") for e in mi.get("estimated") or ())
                     else ""))
        for kind, g, m in _notes(doc):
            style = {"error": "bold red", "fix": "green", "warning": "yellow"}[kind]
            print(f"{styled(kind, style)} {g}: {m}")
    if not report.ok:
        raise PlanFails("; ".join(f"{g.group.name}: {g.errors[0]}" for g in report.groups if g.errors))


def register(app: typer.Typer) -> None:
    """Add ``plan`` to the root app."""
    app.command("plan")(plan)
