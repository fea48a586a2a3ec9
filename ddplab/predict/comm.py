"""Communication cost per step, as formulas and as a fit to measurements (pure: no processes).

- The logical gradient payload is one value per parameter: P x bytes per element.
- A ring all-reduce of N bytes over D ranks is a reduce-scatter then an all-gather, each moving
  (D-1)/D x N per rank: every rank sends 2(D-1)/D x N bytes.
- nccl-tests report an all-reduce of N bytes taking t seconds as algorithm bandwidth algbw = N / t and
  bus bandwidth busbw = algbw x 2(D-1)/D, the rate each rank's link actually carried.
- The alpha-beta model t(n) = alpha + n * beta: alpha is the fixed start-up cost of one call
  (software, thread hand-offs, latency), 1/beta the effective bandwidth. `fit` minimizes relative
  error (small messages count as much as large ones) and grades itself by median and maximum
  relative error and R^2 of log t; a linear R^2 of 0.9999 can hide a 25% miss at small sizes.
- Where a flat latency floor dominates small messages (more ranks than cores), `fit_with_floor`
  fits max(floor, alpha + n * beta).
Used by notebooks 03 and 04 (and the bucket simulator).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from ..units import rel_error


def payload_bytes(parameter_count: int, grad_bytes_per_element: int = 4) -> int:
    """Bytes of one full gradient: one value per parameter."""
    return parameter_count * grad_bytes_per_element


def ring_bytes_per_rank(n_bytes: float, world_size: int) -> float:
    """Bytes each rank sends in a ring all-reduce of n_bytes: 2(D-1)/D x n."""
    return 2 * (world_size - 1) / world_size * n_bytes


def algbw(n_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth, bytes/s: message size over time."""
    return n_bytes / seconds


def busbw(n_bytes: float, seconds: float, world_size: int) -> float:
    """Bus bandwidth, bytes/s (nccl-tests' definition for all-reduce): algbw x 2(D-1)/D."""
    return algbw(n_bytes, seconds) * 2 * (world_size - 1) / world_size


@dataclass(frozen=True)
class AlphaBeta:
    """t(n) = max(floor, alpha + n * beta), in seconds; floor = 0 for the plain model."""

    alpha_s: float
    beta_s_per_byte: float
    floor_s: float = 0.0

    def predict(self, n_bytes: float) -> float:
        return max(self.floor_s, self.alpha_s + n_bytes * self.beta_s_per_byte)

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return 1 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else math.inf


@dataclass(frozen=True)
class FitQuality:
    median_rel_error: float
    max_rel_error: float
    r2_log: float
    residuals: tuple[float, ...]   # (predicted - measured) / measured, one per point


def quality(model: AlphaBeta, sizes, times) -> FitQuality:
    """How well `model` matches measured (size, time) points."""
    res = [rel_error(model.predict(n), t) for n, t in zip(sizes, times)]
    logs = [math.log(t) for t in times]
    mean = statistics.fmean(logs)
    ss_tot = sum((y - mean) ** 2 for y in logs)
    ss_res = sum((math.log(model.predict(n)) - y) ** 2 for n, y in zip(sizes, logs))
    return FitQuality(statistics.median(abs(r) for r in res), max(abs(r) for r in res),
                      1 - ss_res / ss_tot if ss_tot else 1.0, tuple(res))


def fit(sizes, times) -> AlphaBeta:
    """Least squares on relative error: minimize sum(((alpha + n*beta) - t) / t)^2 (weights 1/t)."""
    if len(sizes) < 2 or len(set(sizes)) < 2:
        raise ValueError("fit needs measurements at two or more different sizes")
    # normal equations of the weighted problem: rows (1/t, n/t), target 1
    a11 = sum(1 / t ** 2 for t in times)
    a12 = sum(n / t ** 2 for n, t in zip(sizes, times))
    a22 = sum(n * n / t ** 2 for n, t in zip(sizes, times))
    b1 = sum(1 / t for t in times)
    b2 = sum(n / t for n, t in zip(sizes, times))
    det = a11 * a22 - a12 * a12
    alpha = (b1 * a22 - b2 * a12) / det
    beta = (a11 * b2 - a12 * b1) / det
    if alpha < 0:  # a negative start-up cost is unphysical: refit the line through the origin
        alpha, beta = 0.0, b2 / a22
    return AlphaBeta(alpha, max(beta, 0.0))


def fit_with_floor(sizes, times) -> AlphaBeta:
    """Fit max(floor, alpha + n*beta): try every split of the sorted points into a flat floor (the
    median of the small ones) and a line (the large ones); keep the split with the smallest max error."""
    pts = sorted(zip(sizes, times))
    best, best_err = fit(sizes, times), quality(fit(sizes, times), sizes, times).max_rel_error
    for k in range(1, len(pts) - 1):
        line_pts = pts[k:]
        if len({n for n, _ in line_pts}) < 2:
            continue
        line = fit([n for n, _ in line_pts], [t for _, t in line_pts])
        model = AlphaBeta(line.alpha_s, line.beta_s_per_byte, statistics.median(t for _, t in pts[:k]))
        err = quality(model, sizes, times).max_rel_error
        if err < best_err:
            best, best_err = model, err
    return best
