"""The sign test's interval for a median: distribution-free (no normality, no bootstrap), from the order
statistics alone, so heavy tails and outliers on a shared machine cost resolution, never correctness.
`ddplab.claims` judges every timing claim on it."""

from __future__ import annotations

import math

__all__ = ["ALPHA", "median_interval", "min_rounds"]

ALPHA = 0.001   # the chance that the true median lies below the interval, and again above it


def _binom_cdf_half(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(0, k + 1)) / 2 ** n


def min_rounds(alpha: float = ALPHA) -> int:
    """The fewest paired rounds whose sign-test interval is finite at `alpha` (10 at 0.001)."""
    return math.ceil(math.log2(1 / alpha))


def median_interval(values, alpha: float = ALPHA) -> tuple[float, float, float]:
    """(median, low, high): the k-th smallest and k-th largest of `values`, k the largest with
    P(Binomial(n, 1/2) <= k - 1) <= alpha, so the true median lies below `low` (or above `high`)
    with probability at most alpha; an infinite end where there are too few values."""
    v = sorted(float(x) for x in values)
    if not v or not all(math.isfinite(x) for x in v):
        raise ValueError(f"values: need finite numbers, got {v[:8]}")
    n = len(v)
    median = (v[(n - 1) // 2] + v[n // 2]) / 2
    k = 0
    while k < n // 2 and _binom_cdf_half(k, n) <= alpha:   # P(X <= k) <= alpha: the (k+1)-th value bounds
        k += 1
    if k == 0:
        return median, -math.inf, math.inf
    return median, v[k - 1], v[n - k]
