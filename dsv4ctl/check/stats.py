"""Small, pure statistics for the corruption gate (standard library only, no I/O).

* :func:`wilson` — Wilson score interval for a binomial proportion: E. B. Wilson, "Probable
  inference, the law of succession, and statistical inference", JASA 22 (1927) 209-212; the
  closed form used is eq. (3) of R. G. Newcombe, "Two-sided confidence intervals for the single
  proportion: comparison of seven methods", Statistics in Medicine 17 (1998) 857-872.
* :func:`newcombe_diff` — Newcombe's hybrid score interval for p1 − p2 (method 10 of
  R. G. Newcombe, "Interval estimation for the difference between independent proportions",
  Statistics in Medicine 17 (1998) 873-890).
* :func:`fisher_exact` — two-sided Fisher exact test of a 2×2 table (the p-value sums the
  hypergeometric probabilities not larger than the observed table's, as R's ``fisher.test`` and
  SciPy's ``fisher_exact`` do).
* :func:`percentile` — linear interpolation between closest ranks (NumPy's default "linear").
* :func:`mcnemar_exact` — one-sided exact McNemar test of paired binary outcomes: the discordant
  pairs are Binomial(b + c, 1/2) under no difference (Q. McNemar, "Note on the sampling error of
  the difference between correlated proportions or percentages", Psychometrika 12 (1947) 153-157;
  the exact conditional form as R's ``mcnemar.exact`` / ``binom.test`` on the discordant pairs).
* :func:`paired_diff_ci` — Agresti-Min interval for the difference of two paired proportions
  (A. Agresti, Y. Min, "Simple improved confidence intervals for comparing matched proportions",
  Statistics in Medicine 24 (2005) 729-740: Wald after adding 1/2 to each of the four cells).
* :func:`paired_sample_size` — pairs a one-sided McNemar test needs to detect a difference
  (R. G. Connor, "Sample size for testing differences in proportions for the paired-sample
  design", Biometrics 43 (1987) 207-211, eq. 3).

No library here: SciPy/statsmodels would be heavy imports for a few lines of closed-form math.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Optional, Sequence


def z_value(confidence: float = 0.95) -> float:
    """Two-sided standard normal quantile: 1.959964 for 0.95. ValueError outside (0, 1)."""
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval (lo, hi) for k successes in n trials, as fractions in [0, 1].

    ``(p + z²/2n ± z·sqrt(p(1−p)/n + z²/4n²)) / (1 + z²/n)`` with p = k/n (Newcombe 1998, eq. 3).
    n = 0 gives (0, 1). ValueError for k < 0, n < 0 or k > n."""
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0
    z = z_value(confidence)
    p = k / n
    z2 = z * z
    denom = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    lo, hi = max(0.0, centre - half), min(1.0, centre + half)
    if k == 0:
        lo = 0.0
    if k == n:
        hi = 1.0
    return lo, hi


def newcombe_diff(k1: int, n1: int, k2: int, n2: int, confidence: float = 0.95) -> tuple[float, float, float]:
    """(d, lo, hi): d = k1/n1 − k2/n2 and Newcombe's hybrid score interval (method 10).

    lo = d − sqrt((p1−l1)² + (u2−p2)²), hi = d + sqrt((u1−p1)² + (p2−l2)²), where (l, u) are the
    Wilson intervals of each proportion. ValueError if n1 or n2 is 0."""
    if n1 <= 0 or n2 <= 0:
        raise ValueError("both samples need at least one trial")
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson(k1, n1, confidence)
    l2, u2 = wilson(k2, n2, confidence)
    d = p1 - p2
    return d, d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def fisher_exact(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided Fisher exact p-value that k1/n1 and k2/n2 come from the same proportion.

    Table [[k1, n1−k1], [k2, n2−k2]]; the p-value is the sum of hypergeometric probabilities of
    all tables with the same margins whose probability is ≤ the observed one (relative tolerance
    1e-7, as R/SciPy). ValueError on impossible counts."""
    for k, n in ((k1, n1), (k2, n2)):
        if n < 0 or k < 0 or k > n:
            raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    K, N = k1 + k2, n1 + n2
    if N == 0:
        return 1.0
    lo, hi = max(0, K - n2), min(K, n1)
    logp = {x: _log_comb(n1, x) + _log_comb(n2, K - x) - _log_comb(N, K) for x in range(lo, hi + 1)}
    obs = logp[k1]
    total = sum(math.exp(v) for v in logp.values() if v <= obs + 1e-7 * abs(obs) + 1e-12)
    return min(1.0, total)


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """q-th percentile (0..100) by linear interpolation between closest ranks; None if empty."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError("q must be in [0, 100]")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    i = int(math.floor(pos))
    j = min(i + 1, len(s) - 1)
    return s[i] + (s[j] - s[i]) * (pos - i)


def binom_half_sf(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2), exact (log-space sum). 1.0 for k <= 0, 0.0 for k > n.
    ValueError for n < 0."""
    if n < 0:
        raise ValueError("n must be >= 0")
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    logs = [_log_comb(n, x) - n * math.log(2) for x in range(k, n + 1)]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(v - top) for v in logs))


def mcnemar_exact(b: int, c: int) -> float:
    """One-sided exact McNemar p-value that the second arm fails more often than the first.

    ``b``: pairs where only the first arm failed; ``c``: pairs where only the second did. Under
    no difference each discordant pair is equally likely either way, so p = P(X >= c) for
    X ~ Binomial(b + c, 1/2) (McNemar 1947, exact conditional form). No discordant pair: 1.0.
    ValueError for negative counts."""
    if b < 0 or c < 0:
        raise ValueError("counts must be >= 0")
    return binom_half_sf(c, b + c)


def paired_diff_ci(b: int, c: int, n: int, confidence: float = 0.95) -> tuple[float, float, float]:
    """(d, lo, hi): d = (c − b)/n, the second arm's failure rate minus the first's over ``n``
    pairs, and the Agresti-Min (2005) interval: the Wald interval of the matched difference after
    adding 1/2 to each of the four cells (n + 2 pairs, b + 1/2, c + 1/2), clipped to [−1, 1].
    ValueError for n <= 0 or b + c > n."""
    if n <= 0 or b < 0 or c < 0 or b + c > n:
        raise ValueError(f"need 0 <= b, c and b + c <= n > 0, got b={b}, c={c}, n={n}")
    z = z_value(confidence)
    nn, bb, cc = n + 2, b + 0.5, c + 0.5
    dd = (cc - bb) / nn
    se = math.sqrt(max(0.0, (bb + cc) / nn - dd * dd) / nn)
    return (c - b) / n, max(-1.0, dd - z * se), min(1.0, dd + z * se)


def _binom_logpmf(k: int, n: int, p: float) -> float:
    return _log_comb(n, k) + k * math.log(p) + (n - k) * math.log1p(-p)


def mcnemar_power(n: int, p1: float, p2: float, alpha: float = 0.05) -> float:
    """Exact power of :func:`mcnemar_exact` at level ``alpha`` over ``n`` pairs whose arms fail
    independently with rates ``p1`` (first) and ``p2`` (second): the discordant pairs D ~
    Binomial(n, psi), psi = p1(1 − p2) + p2(1 − p1), and given D the second-arm-only ones
    C ~ Binomial(D, p2(1 − p1) / psi); power = P(mcnemar_exact(D − C, C) < alpha), summed over D
    within 10 standard deviations of its mean. Rates in (0, 1)."""
    psi = p1 * (1 - p2) + p2 * (1 - p1)
    q = p2 * (1 - p1) / psi
    mean, sd = n * psi, math.sqrt(n * psi * (1 - psi))
    total, log_half = 0.0, math.log(0.5)
    for d in range(max(1, int(mean - 10 * sd)), min(n, int(mean + 10 * sd) + 1) + 1):
        sf, c_star = 0.0, d + 1          # the smallest c with P(X >= c) < alpha, X ~ Bin(d, 1/2)
        for c in range(d, -1, -1):
            sf += math.exp(_log_comb(d, c) + d * log_half)
            if sf >= alpha:
                break
            c_star = c
        if c_star <= d:
            tail = sum(math.exp(_binom_logpmf(c, d, q)) for c in range(c_star, d + 1))
            total += math.exp(_binom_logpmf(d, n, psi)) * tail
    return min(1.0, total)


#: The most pairs :func:`paired_sample_size` sizes (a smaller rise is refused, not sized for hours).
MAX_PAIRS = 200_000


def paired_sample_size(p_base: float, delta: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Pairs a one-sided McNemar test at level ``alpha`` needs to detect, with probability
    ``power``, a failure rate of ``p_base + delta`` on the second arm against ``p_base`` on the
    first. Start: Connor (1987, eq. 3), n = (z_a·sqrt(psi) + z_b·sqrt(psi − delta²))² / delta²,
    psi = p1(1 − p2) + p2(1 − p1) the share of discordant pairs when the two arms fail
    independently of each other (failures that tend to hit the same turns on both arms give fewer
    discordant pairs, so fewer are needed: this n is the conservative one). That normal
    approximation overstates the power of the exact test (1 % -> 2 %: 1,828 pairs have an exact
    power of 0.77), so n then grows in steps of 1 % until :func:`mcnemar_power` reaches ``power``.
    Fractions in (0, 1); ValueError otherwise, when p_base + delta >= 1 or when more than
    :data:`MAX_PAIRS` pairs would be needed."""
    for name, v in (("p_base", p_base), ("delta", delta), ("alpha", alpha), ("power", power)):
        if not 0 < v < 1:
            raise ValueError(f"{name} must be in (0, 1), got {v}")
    p1, p2 = p_base, p_base + delta
    if p2 >= 1:
        raise ValueError("p_base + delta must be below 1")
    psi = p1 * (1 - p2) + p2 * (1 - p1)
    za, zb = NormalDist().inv_cdf(1 - alpha), NormalDist().inv_cdf(power)
    n = math.ceil((za * math.sqrt(psi) + zb * math.sqrt(psi - delta * delta)) ** 2 / (delta * delta))
    while n <= MAX_PAIRS and mcnemar_power(n, p1, p2, alpha) < power:
        n = math.ceil(n * 1.01)
    if n > MAX_PAIRS:      # the exact power's sum grows with n (131,055 pairs: 13 s; 0.01 % over 1 %: hours)
        raise ValueError(f"a rise of {delta:g} over {p_base:g} needs more than {MAX_PAIRS:,} pairs: "
                         "detect a larger rise (delta) or give the pairs")
    return n
