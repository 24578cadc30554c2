"""``dsv4ctl plan --from-log FILE``: compare a server's start-up log with the plan, per rank and
pool (helper of :mod:`dsv4ctl.commands.plan`; not a command module of its own)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..errors import InputError, VerdictError
from ..render import console, dump_json, markdown_table, rich_table


def log_report(doc: dict, text: str, log_name: str, groups: Optional[list[str]]) -> dict:
    """The ``dsv4ctl.plan-log/1`` document: ``doc`` is a ``dsv4ctl.plan/2`` plan, ``text`` the
    log. Pure. InputError when the log has no DSV4 pool line, a pool line has malformed fields
    (``LOG:LINE: FIELD: message``) or the group is ambiguous."""
    from ..plan.poollog import BPFT_TOLERANCE, LogFormatError, compare, match_rank, parse_log
    try:
        records = parse_log(text)
    except LogFormatError as e:
        raise InputError(f"{log_name}:{e.line}: {e.field}: {e.message}") from None
    if not records:
        raise InputError(f"{log_name}: no 'DSV4 pool sizes' or 'DSV4_POOL_PLAN' line, nor SGLang's "
                         "'max_total_num_tokens=' line (SGLang 0.5.23 logs them at start-up)")
    gs = doc["groups"]
    if len(gs) != 1:
        raise InputError(f"--from-log: the plan has groups {', '.join(g['name'] for g in gs)}; "
                         "name the server's group with -g")
    g = gs[0]
    ranks, ok = [], True
    for rec in records:
        pr = match_rank(g["ranks"], rec)
        entry = dict(rank=rec.label(), source=rec.source, line=rec.line, plan_rank=None, pools={},
                     bytes_per_full_token=dict(logged=rec.bytes_per_full_token, planned=None),
                     available=dict(logged_bytes=rec.available_bytes, logged_gib=rec.available_gib,
                                    planned_bytes=None))
        if pr is None:
            ok = False
            entry["error"] = f"no rank {rec.label()} in group {g['name']} (tp{g['tp']} dp{g['dp']} pp{g['pp']})"
            ranks.append(entry)
            continue
        entry["plan_rank"] = pr["rank"]
        for d in compare(pr, rec):
            entry["pools"][d.pool] = dict(planned=d.planned, logged=d.logged, diff=d.diff, pct=d.pct)
            ok = ok and d.diff == 0
        entry["bytes_per_full_token"]["planned"] = pr["bytes_per_full_token"]
        if rec.bytes_per_full_token is not None:
            # gated: a token cap (--max-total-tokens, the PP MIN) can hide a bytes-per-token difference
            same = abs(rec.bytes_per_full_token - pr["bytes_per_full_token"]) <= BPFT_TOLERANCE
            entry["bytes_per_full_token"]["match"] = same
            ok = ok and same
        entry["available"]["planned_bytes"] = pr["available_bytes"]
        ranks.append(entry)
    return dict(schema="dsv4ctl.plan-log/1", profile=doc["profile"], group=g["name"], log=log_name,
                ok=ok, ranks=ranks)


#: ``--from-log`` reads at most this much: a start-up log is kilobytes; a month of server log
#: is not what to compare (read fully, it could exhaust memory).
MAX_LOG_BYTES = 256 << 20


def from_log(doc: dict, path: str, as_json: bool, markdown: bool) -> None:
    """Read ``path``, print the comparison, raise VerdictError (exit 1) on any difference."""
    p = Path(path).expanduser()
    from ..resources import read_file_capped
    raw = read_file_capped(p, MAX_LOG_BYTES, f"--from-log {path}", "; pass the start-up part (e.g. grep -E "
                           f"'DSV4_POOL_PLAN|DSV4 memory calculation' {path} > startup.log)")
    text = raw.decode("utf-8", "replace")
    rep = log_report(doc, text, str(p), None)
    if as_json:
        print(dump_json(rep))
    else:
        headers = ["rank", "pool", "planned", "logged", "diff", "diff %"]
        rows = []
        for r in rep["ranks"]:
            if "error" in r:
                rows.append([r["rank"], "-", "-", "-", "-", r["error"]])
                continue
            for pool, d in r["pools"].items():
                rows.append([r["rank"], pool, f"{d['planned']:,}", f"{d['logged']:,}", f"{d['diff']:+,}", f"{d['pct']:+.3f}"])
            b = r["bytes_per_full_token"]
            if b["logged"] is not None:
                rows.append([r["rank"], "bytes/full token", f"{b['planned']:.2f}", f"{b['logged']:.2f}",
                             f"{b['logged'] - b['planned']:+.2f}", ""])
        title = f"plan vs log: {rep['profile']} group {rep['group']} · {rep['log']}"
        if markdown:
            print(f"## {title}\n\n{markdown_table(headers, rows)}")
        else:
            console().print(rich_table(title, headers, rows, right=range(2, 6)))
        print("ok: the log matches the plan" if rep["ok"] else
              "mismatch: the server sized its pools differently from the plan "
              "(check the memory inputs, the serve config and the tree's patches)")
    if not rep["ok"]:
        bad = sum(1 for r in rep["ranks"] for d in r["pools"].values() if d["diff"]) + \
            sum(1 for r in rep["ranks"] if "error" in r)
        bpft = sum(1 for r in rep["ranks"] if r["bytes_per_full_token"].get("match") is False)
        raise VerdictError(f"plan --from-log: {bad} pool value(s) differ from the plan"
                           + (f"; bytes per full token differs on {bpft} rank(s)" if bpft else ""), label="plan differs")
