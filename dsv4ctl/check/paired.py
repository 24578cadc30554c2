"""The paired A/B of the upgrade gate (``deploy --promote`` when the SGLang version, the patch
series or the environment changes; ``check load --compare`` reports it too). Pure, no I/O.

Design: the same known-answer workload (:mod:`.workload`: the sessions are the same on both URLs,
turn for turn) runs against the running release (A) and the new one (B). A turn of A and the turn
of B at the same place of the same session (the n-th turn session s issued) form a pair; the
outcome is binary per arm: the turn is corrupted (any class but ``ok``: markup leaks, broken or
wrong arguments, missing calls, errors) or not.

* Test: one-sided exact McNemar on the discordant pairs (:func:`.stats.mcnemar_exact`): B fails
  where A did not (``c``) against the reverse (``b``); a regression is p < ``alpha``.
* Interval: the difference B − A of the corruption rates over the pairs with the Agresti-Min
  95 % interval (:func:`.stats.paired_diff_ci`), overall and per class (a pair counts for a class
  when that arm's turn has the class).
* Size: :func:`plan_pairs` — the pairs a one-sided exact McNemar at ``alpha`` 0.05 needs to see a
  rise of ``delta`` (1 percentage point) over a ``baseline`` corruption rate (1 %, the default
  gate) with power 0.8 (:func:`.stats.paired_sample_size`: Connor 1987's 1,828, raised until the
  exact test's power is 0.8): 1,984 pairs.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from . import classify as C
from .stats import mcnemar_exact, paired_diff_ci, paired_sample_size

ALPHA = 0.05          # one-sided level of the regression test
POWER = 0.8           # probability of seeing a regression of DELTA
BASELINE = 0.01       # corruption rate assumed for the running release (the default gate's limit)
DELTA = 0.01          # the regression the A/B is sized to detect: +1 percentage point


def plan_pairs(baseline: float = BASELINE, delta: float = DELTA, alpha: float = ALPHA, power: float = POWER) -> int:
    """Pairs the A/B needs (:func:`.stats.paired_sample_size`); 1,984 with the defaults."""
    return paired_sample_size(baseline, delta, alpha, power)


def sizing(concurrency: int, pairs: int) -> dict:
    """{concurrency, turns (per session), pairs}: ``pairs`` turns spread over ``concurrency``
    sessions, rounded up, plus one spare turn per session: a level stops at its turn count, and
    the sessions of the two arms need not end at the same turn (a pair needs both), so the spare
    turns keep the pairs at ``pairs`` or more."""
    c = max(1, int(concurrency))
    return {"concurrency": c, "turns": math.ceil(pairs / c) + 1, "pairs": int(pairs)}


def pair_records(a: Sequence[dict], b: Sequence[dict]) -> list[tuple[dict, dict]]:
    """Pairs of per-turn records (``check load`` records: ``session``, ``class``) of the two arms:
    the n-th record of session s on A with the n-th of session s on B (records of one session
    finish in the order they were issued). Turns one arm has and the other not are left out."""
    def index(recs):
        seen: dict = {}
        out = {}
        for r in recs:
            k = seen.get(r["session"], 0)
            seen[r["session"]] = k + 1
            out[(r["session"], k)] = r
        return out
    ia, ib = index(a), index(b)
    return [(ia[k], ib[k]) for k in ia if k in ib]


def compare_paired(a: Sequence[dict], b: Sequence[dict], alpha: float = ALPHA) -> dict:
    """The paired comparison of the records of A (running release) and B (new): {pairs, b_only
    (pairs where only B was corrupted), a_only, rate_a, rate_b, difference (B − A), difference_ci95,
    mcnemar_p (one-sided), alpha, regression (p < alpha and B worse), classes: {class: {a, b,
    difference, difference_ci95}} for every class seen on either arm}."""
    pairs = pair_records(a, b)
    n = len(pairs)
    out: dict = {"pairs": n, "alpha": alpha, "test": "McNemar exact, one-sided (B worse than A)"}
    if n == 0:
        return {**out, "a_only": 0, "b_only": 0, "rate_a": None, "rate_b": None, "difference": None,
                "difference_ci95": None, "mcnemar_p": 1.0, "regression": False, "classes": {}}
    bad = [(x["class"] != C.OK, y["class"] != C.OK) for x, y in pairs]
    a_only = sum(1 for x, y in bad if x and not y)
    b_only = sum(1 for x, y in bad if y and not x)
    d, lo, hi = paired_diff_ci(a_only, b_only, n)
    p = mcnemar_exact(a_only, b_only)
    classes = {}
    for cls in C.CLASSES:
        ka = sum(1 for x, _ in pairs if x["class"] == cls)
        kb = sum(1 for _, y in pairs if y["class"] == cls)
        if ka or kb:
            only_a = sum(1 for x, y in pairs if x["class"] == cls and y["class"] != cls)
            only_b = sum(1 for x, y in pairs if y["class"] == cls and x["class"] != cls)
            cd, clo, chi = paired_diff_ci(only_a, only_b, n)
            classes[cls] = {"a": ka, "b": kb, "difference": round(cd, 6), "difference_ci95": [round(clo, 6), round(chi, 6)]}
    return {**out, "a_only": a_only, "b_only": b_only, "rate_a": round(sum(x for x, _ in bad) / n, 6),
            "rate_b": round(sum(y for _, y in bad) / n, 6), "difference": round(d, 6),
            "difference_ci95": [round(lo, 6), round(hi, 6)], "mcnemar_p": p,
            "regression": p < alpha and b_only > a_only, "classes": classes}


def _pct(x: float) -> str:
    return f"{100 * x:+.2f} %"


def regression_lines(cmp: dict, a_name: str = "running", b_name: str = "new") -> list[str]:
    """Human lines of one paired comparison: the overall difference B − A with its 95 % interval
    and the McNemar p, then one line per class."""
    if not cmp.get("pairs"):
        return ["no pairs: nothing compared"]
    out = [f"corrupted: {b_name} {100 * cmp['rate_b']:.2f} % vs {a_name} {100 * cmp['rate_a']:.2f} % over "
           f"{cmp['pairs']} pairs: difference {_pct(cmp['difference'])} (95 % CI {_pct(cmp['difference_ci95'][0])} "
           f"to {_pct(cmp['difference_ci95'][1])}), McNemar exact one-sided p = {cmp['mcnemar_p']:.3g} "
           f"({cmp['b_only']} pairs only {b_name} corrupted, {cmp['a_only']} only {a_name})"]
    for cls, row in cmp["classes"].items():
        lo, hi = row["difference_ci95"]
        out.append(f"  {cls}: {row['b']} vs {row['a']}: {_pct(row['difference'])} (95 % CI {_pct(lo)} to {_pct(hi)})")
    return out


def find_paired(doc: dict) -> Optional[dict]:
    """The paired comparison of a ``check load --compare`` document (its first comparison's
    ``paired``), None without one."""
    comps = doc.get("comparisons") or []
    return comps[0].get("paired") if comps else None
