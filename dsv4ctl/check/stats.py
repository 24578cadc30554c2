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
