"""The upgrade gate's statistics (dsv4ctl/check/stats.py, dsv4ctl/check/paired.py): the exact
McNemar test, the Agresti-Min interval, Connor's sample size (checked by simulation: the sized A/B
finds a +1 % regression about 80 % of the time and a non-regression about 5 % of the time or less),
and the pairing of check load records."""

from __future__ import annotations

import math
import random

import pytest

from dsv4ctl.check import paired as P
from dsv4ctl.check import stats as S
from dsv4ctl.deploy.promote import compare_verdict, upgrade_changes


def test_mcnemar_exact_is_the_binomial_tail_of_the_discordant_pairs():
    assert S.mcnemar_exact(0, 0) == 1.0
    assert S.mcnemar_exact(0, 5) == pytest.approx(1 / 32)                  # all five the same way
    assert S.mcnemar_exact(2, 8) == pytest.approx(sum(math.comb(10, k) for k in range(8, 11)) / 1024)
    assert S.mcnemar_exact(8, 2) > 0.9                                       # one-sided: B better is no regression
    with pytest.raises(ValueError):
        S.mcnemar_exact(-1, 2)


def test_agresti_min_interval():
    d, lo, hi = S.paired_diff_ci(0, 0, 100)
    assert d == 0 and lo < 0 < hi and hi == pytest.approx(-lo)
    d, lo, hi = S.paired_diff_ci(1, 11, 200)          # hand: n*=202, b*=1.5, c*=11.5, dd=10/202
    se = math.sqrt((13 / 202 - (10 / 202) ** 2) / 202)
    assert d == pytest.approx(0.05) and lo == pytest.approx(10 / 202 - 1.959964 * se, abs=1e-6)
    assert hi == pytest.approx(10 / 202 + 1.959964 * se, abs=1e-6)
    with pytest.raises(ValueError):
        S.paired_diff_ci(5, 6, 10)


def test_connor_sample_size_and_its_power_by_simulation():
    n = P.plan_pairs()
    assert n == S.paired_sample_size(0.01, 0.01, 0.05, 0.8) == 1984
    # Connor's normal approximation (1,828 pairs) overstates the exact test's power; N is raised to 0.8
    assert S.mcnemar_power(1828, 0.01, 0.02) == pytest.approx(0.771, abs=0.001)
    assert 0.8 <= S.mcnemar_power(n, 0.01, 0.02) < S.mcnemar_power(2200, 0.01, 0.02)
    assert S.mcnemar_power(n, 0.01, 0.01) < 0.05                           # its size: the level holds
    assert S.paired_sample_size(0.01, 0.02) < n < S.paired_sample_size(0.02, 0.01)
    rng = random.Random(7)

    def rejects(p_a: float, p_b: float) -> float:
        hits = 0
        for _ in range(300):
            b = c = 0
            for _ in range(n):
                x, y = rng.random() < p_a, rng.random() < p_b
                b += x and not y
                c += y and not x
            hits += S.mcnemar_exact(b, c) < P.ALPHA
        return hits / 300
    assert 0.74 <= rejects(0.01, 0.02) <= 0.86         # power 0.8 (300 runs: a standard error of 0.023)
    assert rejects(0.01, 0.01) <= 0.06                  # level 0.05


def _recs(classes: list[str], sessions: int = 2) -> list[dict]:
    return [{"session": i % sessions, "class": c} for i, c in enumerate(classes)]


def test_compare_paired_per_class_and_regression():
    a = _recs(["ok"] * 200)
    b = _recs(["ok"] * 170 + ["wrong_args"] * 20 + ["dsml_in_content"] * 10)
    cmp = P.compare_paired(a, b)
    assert (cmp["pairs"], cmp["a_only"], cmp["b_only"]) == (200, 0, 30)
    assert cmp["regression"] and cmp["mcnemar_p"] == pytest.approx(0.5 ** 30)
    assert cmp["classes"]["wrong_args"]["b"] == 20 and cmp["classes"]["wrong_args"]["difference"] == 0.1
    lo, hi = cmp["classes"]["wrong_args"]["difference_ci95"]
    assert 0.05 < lo < 0.1 < hi < 0.15
    ok, why = compare_verdict({"comparisons": [{"paired": cmp}]}, 0, "")
    assert not ok and why.startswith("regression against the running release: corrupted: new 15.00 % vs running 0.00 %")
    assert "wrong_args: 20 vs 0: +10.00 % (95 % CI +" in why
    same = P.compare_paired(a, _recs(["ok"] * 199 + ["wrong_args"]))
    assert not same["regression"] and compare_verdict({"comparisons": [{"paired": same}]}, 0, "")[0]
    assert compare_verdict(None, 2, "dsv4ctl: error: http://x: connection refused") == (False, "http://x: connection refused")


def test_pairs_are_the_nth_turn_of_each_session():
    a = [{"session": 0, "class": "ok"}, {"session": 1, "class": "ok"}, {"session": 0, "class": "ok"}]
    b = [{"session": 1, "class": "wrong_args"}, {"session": 0, "class": "ok"}]
    pairs = P.pair_records(a, b)
    assert [(x["session"], y["class"]) for x, y in pairs] == [(0, "ok"), (1, "wrong_args")]


def test_what_is_an_upgrade():
    base = {"sglang": "0.5.22", "base_commit": "a" * 40, "patches": [], "series": None, "environments": ["e1"]}
    assert upgrade_changes(base, dict(base)) == []
    assert upgrade_changes(base, {**base, "sglang": "0.5.23", "base_commit": "b" * 40}) == ["SGLang 0.5.22 -> 0.5.23"]
    assert upgrade_changes(base, {**base, "base_commit": "b" * 40}) == ["SGLang base commit aaaaaaaaaaaa -> bbbbbbbbbbbb"]
    assert upgrade_changes(base, {**base, "patches": [["p", "x"]]}) == ["patch series (0 -> 1 patch(es))"]
    assert upgrade_changes(base, {**base, "environments": ["e2"]}) == ["environment (lock digest)"]
    assert P.sizing(64, 1984) == {"concurrency": 64, "turns": 32, "pairs": 1984}
