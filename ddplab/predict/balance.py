"""Equal tokens, unequal cost: what a rank's forward+backward costs, and two ways to share a pool of
sequences among the ranks (pure: numbers in, numbers out).

- A transformer's cost per sequence of L tokens is not proportional to L: the projections and the MLP
  grow with L, attention's scores with L^2. So a rank's forward+backward time for a set of sequences,
  one micro-batch per length, is modelled as
      t = c x batches + a x tokens + b x sum_sq       (sum_sq = the sum of the squared lengths)
  with c the fixed cost of one forward+backward call. `fit` finds (c, a, b) by least squares from
  measured points, `standard_errors` their standard errors; `fit_tokens` fits the tokens-only model
  c x batches + a x tokens, to compare.
- `by_length_groups` ("tokens"): what a length-grouped sampler does: sort by length and cut the list
  into contiguous pieces of equal tokens, so each rank gets equal tokens but sequences of one length.
  With the pool {2 x 512, 16 x 64} on 2 ranks, rank 0 gets the two 512s and rank 1 the sixteen 64s:
  1024 tokens each, but rank 0's sum of squared lengths is 8x rank 1's.
- `by_cost` ("cost"): greedy longest-processing-time (Graham 1969): sequences by estimated cost,
  largest first, each to the rank whose estimated total is the least so far. The pool stays the same
  sequences; only who computes which changes.
Both return, per rank, indices into the pool. The balance study (`spec.balance.BalanceStudy`,
`rank/tasks/balance.py`) measures the points and runs both; `tables/balance.py` compares them.
Used by notebook 07. Reference: R. L. Graham, "Bounds on multiprocessing timing anomalies" (1969).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

POLICIES = ("tokens", "cost")


@dataclass(frozen=True)
class CostModel:
    """t = c_ms x batches + a_ms_per_token x tokens + b_ms_per_sq x sum_sq, in ms (b = 0: tokens only)."""

    c_ms: float                # one forward+backward call (one micro-batch)
    a_ms_per_token: float
    b_ms_per_sq: float = 0.0   # per squared token of length

    def predict(self, tokens: float, sum_sq: float, batches: int = 1) -> float:
        return self.c_ms * batches + self.a_ms_per_token * tokens + self.b_ms_per_sq * sum_sq

    def sequence_ms(self, length: int) -> float:
        """What one more sequence of `length` tokens adds to a micro-batch of its length."""
        return self.a_ms_per_token * length + self.b_ms_per_sq * length * length

    def lengths_ms(self, lengths) -> float:
        """A rank's set of sequences, one micro-batch per distinct length (0 for none)."""
        lengths = list(lengths)
        if not lengths:
            return 0.0
        return self.predict(tokens(lengths), sum_sq(lengths), batches=len(set(lengths)))


@dataclass(frozen=True)
class FitQuality:
    r2: float
    mean_abs_error_ms: float
    max_abs_error_ms: float
    mean_rel_error: float      # mean |predicted - measured| / measured


# ---- the pool's arithmetic ------------------------------------------------------------------------
def tokens(lengths) -> int:
    return sum(lengths)


def sum_sq(lengths) -> int:
    """The sum of the squared lengths: what attention's cost grows with."""
    return sum(n * n for n in lengths)


def groups(lengths) -> dict[int, int]:
    """length -> how many sequences of it, longest first (one micro-batch each)."""
    out: dict[int, int] = {}
    for n in sorted(lengths, reverse=True):
        out[n] = out.get(n, 0) + 1
    return out


def describe(lengths) -> str:
    """[512, 512, 64] -> '2x512 + 1x64'."""
    return " + ".join(f"{k}x{n}" for n, k in groups(lengths).items()) or "(none)"


def calibration_shapes(lengths, tokens_per_batch: int) -> list[tuple[int, int]]:
    """(count, length) micro-batches for calibration: every length at `tokens_per_batch` tokens and at
    half as many, longest first. Equal tokens at different lengths tell a from b; two token levels
    tell a from c (with one level, tokens and the constant are the same column). The levels alternate
    from length to length, so every other shape (what one of two ranks times) has every length and
    both levels."""
    levels = (tokens_per_batch, tokens_per_batch // 2)
    return [(t // n, n) for i, n in enumerate(sorted(lengths, reverse=True)) for t in levels[::1 - 2 * (i % 2)]]


# ---- fitting --------------------------------------------------------------------------------------
def _points(samples, where: str = "samples") -> list[tuple[float, float, float, float]]:
    """(batches, tokens, sum_sq, ms) from (tokens, sum_sq, ms) or (tokens, sum_sq, ms, batches)."""
    try:
        samples = list(samples)
    except TypeError:
        raise ValueError(f"{where}: expected a list of (tokens, sum_sq, ms) points (got {samples!r})") from None
    out = []
    for i, s in enumerate(samples):
        try:
            values = [float(v) for v in s]
        except (TypeError, ValueError):
            raise ValueError(f"{where}[{i}]: expected numbers (tokens, sum_sq, ms[, batches]) (got {s!r})") from None
        if len(values) not in (3, 4) or not all(math.isfinite(v) and v >= 0 for v in values):
            raise ValueError(f"{where}[{i}]: expected finite, non-negative (tokens, sum_sq, ms[, batches]) (got {s!r})")
        n, q, ms = values[:3]
        out.append((values[3] if len(values) == 4 else 1.0, n, q, ms))
    return out


def _least_squares(rows: list[list[float]], ys: list[float], names: list[str], where: str) -> list[float]:
    """Coefficients minimizing sum (row . x - y)^2: normal equations on columns scaled to unit
    length, Gaussian elimination with partial pivoting; a singular design is refused by name."""
    k = len(names)
    if len(rows) < k:
        raise ValueError(f"{where}: fitting {', '.join(names)} needs at least {k} points (got {len(rows)})")
    scale = [math.sqrt(sum(r[j] ** 2 for r in rows)) for j in range(k)]
    for j, s in enumerate(scale):
        if s == 0:
            raise ValueError(f"{where}: singular design: every point has {names[j]} = 0")
    x = [[r[j] / scale[j] for j in range(k)] for r in rows]
    a = [[sum(r[i] * r[j] for r in x) for j in range(k)] + [sum(r[i] * y for r, y in zip(x, ys))] for i in range(k)]
    for col in range(k):
        pivot = max(range(col, k), key=lambda i: abs(a[i][col]))
        # with unit columns, a pivot this small means one column is (almost) a combination of the others
        if abs(a[pivot][col]) < 1e-10:
            raise ValueError(f"{where}: singular design: {names[col]} is a combination of "
                             f"{', '.join(n for n in names if n != names[col])} over these points; "
                             f"vary the lengths and the token counts independently")
        a[col], a[pivot] = a[pivot], a[col]
        for i in range(k):
            if i != col:
                f = a[i][col] / a[col][col]
                a[i] = [u - f * v for u, v in zip(a[i], a[col])]
    return [a[j][k] / a[j][j] / scale[j] for j in range(k)]


def fit(samples) -> CostModel:
    """Least squares of t = c x batches + a x tokens + b x sum_sq over measured points, each
    (tokens, sum_sq, ms) for one micro-batch, or (tokens, sum_sq, ms, batches)."""
    pts = _points(samples)
    c, a, b = _least_squares([[m, n, q] for m, n, q, _ in pts], [t for *_, t in pts],
                             ["batches (the constant c)", "tokens", "sum_sq"], "samples")
    return CostModel(c, a, b)


def standard_errors(samples) -> tuple[CostModel, int]:
    """The least-squares standard errors of `fit`'s (c, a, b) over the same points, as a CostModel of
    errors, and the residual degrees of freedom (points - 3): s^2 (X'X)^-1 with s^2 the residual sum of
    squares over the degrees of freedom (ordinary least squares, independent errors of one size)."""
    pts = _points(samples)
    rows, ys = [[m, n, q] for m, n, q, _ in pts], [t for *_, t in pts]
    names = ["batches (the constant c)", "tokens", "sum_sq"]
    dof = len(rows) - len(names)
    if dof < 1:
        raise ValueError(f"samples: standard errors need more points than the 3 coefficients (got {len(rows)})")
    coef = _least_squares(rows, ys, names, "samples")
    s2 = sum((sum(c * x for c, x in zip(coef, r)) - y) ** 2 for r, y in zip(rows, ys)) / dof
    # Frisch-Waugh: the variance of coefficient j is s^2 over what of column j the other columns leave
    # unexplained (the residual sum of squares of regressing it on them), the diagonal of s^2 (X'X)^-1
    errors = []
    for j in range(len(names)):
        others = [[x for i, x in enumerate(r) if i != j] for r in rows]
        col = [r[j] for r in rows]
        b = _least_squares(others, col, [n for i, n in enumerate(names) if i != j], "samples")
        unexplained = sum((x - sum(c * o for c, o in zip(b, r))) ** 2 for x, r in zip(col, others))
        errors.append(math.sqrt(s2 / unexplained))
    return CostModel(*errors), dof


def fit_tokens(samples) -> CostModel:
    """Least squares of the tokens-only model t = c x batches + a x tokens, over the same points."""
    pts = _points(samples)
    c, a = _least_squares([[m, n] for m, n, _, _ in pts], [t for *_, t in pts],
                          ["batches (the constant c)", "tokens"], "samples")
    return CostModel(c, a, 0.0)


def quality(model: CostModel, samples) -> FitQuality:
    """How well `model` explains measured points: R^2, mean and max |error| (ms), mean relative error."""
    pts = _points(samples)
    if not pts:
        raise ValueError("samples: no points to grade the model on")
    measured = [t for *_, t in pts]
    errors = [model.predict(n, q, m) - t for m, n, q, t in pts]
    mean = sum(measured) / len(measured)
    ss_tot = sum((t - mean) ** 2 for t in measured)
    ss_res = sum(e * e for e in errors)
    return FitQuality(1 - ss_res / ss_tot if ss_tot else 1.0, sum(abs(e) for e in errors) / len(errors),
                      max(abs(e) for e in errors),
                      sum(abs(e) / t for e, t in zip(errors, measured) if t > 0) / len(errors))


# ---- assigning a pool to ranks ---------------------------------------------------------------------
def _check_pool(lengths, world_size) -> list[int]:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: must be a positive integer (got {world_size!r})")
    lengths = list(lengths)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in lengths):
        raise ValueError(f"lengths: every sequence length must be a positive integer (got {lengths!r})")
    if len(lengths) < world_size:
        raise ValueError(f"lengths: {len(lengths)} sequences cannot give each of {world_size} ranks one")
    return lengths


def by_length_groups(lengths, world_size: int) -> list[list[int]]:
    """Per rank, the pool indices a length-grouped sampler gives it: the pool sorted longest first,
    cut into `world_size` contiguous pieces of (as nearly as the lengths allow) equal tokens, none empty."""
    lengths = _check_pool(lengths, world_size)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    total = tokens(lengths)
    out: list[list[int]] = [[] for _ in range(world_size)]
    rank, before = 0, 0
    for k, i in enumerate(order):
        # the rank whose share of the tokens this sequence starts in, but never skipping a rank and
        # always leaving a sequence for each rank still to come
        want = max(before * world_size // total, world_size - (len(order) - k))
        rank = min(max(rank, want), rank + 1 if out[rank] else rank, world_size - 1)
        out[rank].append(i)
        before += lengths[i]
    return out


def by_cost(lengths, world_size: int, model: CostModel) -> list[list[int]]:
    """Per rank, the pool indices greedy longest-processing-time gives it: sequences by `model`'s
    estimated cost, largest first, each to the rank with the least estimated total (a rank's total:
    one micro-batch per distinct length, `CostModel.lengths_ms`; ties: fewer sequences, lower rank)."""
    lengths = _check_pool(lengths, world_size)
    if not isinstance(model, CostModel):
        raise ValueError(f"model: expected a CostModel (from fit), got {type(model).__name__}")
    order = sorted(range(len(lengths)), key=lambda i: (-model.sequence_ms(lengths[i]), -lengths[i], i))
    out: list[list[int]] = [[] for _ in range(world_size)]
    for i in order:
        r = min(range(world_size), key=lambda r: (model.lengths_ms(lengths[j] for j in out[r]), len(out[r]), r))
        out[r].append(i)
    return out


def assign(policy: str, lengths, world_size: int, model: CostModel | None = None) -> list[list[int]]:
    """`by_length_groups` for "tokens", `by_cost` for "cost"."""
    if policy == "tokens":
        return by_length_groups(lengths, world_size)
    if policy == "cost":
        return by_cost(lengths, world_size, model)
    raise ValueError(f"policy: must be one of {', '.join(POLICIES)} (got {policy!r})")
