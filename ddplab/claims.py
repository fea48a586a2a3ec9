"""Timing claims, judged in one place: **holds**, **contradicted**, or **cannot resolve here now**.

A timing claim is a hypothesis about a paired quantity: per round (or step), arm a minus arm b, or a
over b, with the two arms measured interleaved in the same round. The claim says where the median of
that quantity lies against a threshold (`above`, `below`) or a band (`within`). The median's
interval is distribution-free: the order statistics that invert the sign test (no normality, no
bootstrap; heavy tails and outliers on a shared machine cost resolution, never correctness), with
`alpha` (default 0.001) the chance that the true median lies below the interval, and again above it.
So a true claim is called "contradicted" at most `alpha` of the time (0.1%; 2 alpha for a band, one
alpha at either edge; `tests/views/test_claims.py` measures it on thousands of heavy-tailed null draws), and
only "contradicted" fails a cell or a test.

    from ddplab import claims
    claims.check(claims.paired("the straggler's peer waits longer", wait0_ms, wait1_ms, above=0.0))

prints one line,

    holds: the straggler's peer waits longer (median of 10 paired differences +19.6 ms, 99.8% interval
    [+18.9, +20.3] ms, claim > 0 ms)

A quantity estimated with a standard error (a fitted slope) goes through `estimate` with a normal
interval at the same `alpha`.

Where this run cannot resolve a claim, `check` prints beside it the same claim's verdict from a
**reference run**: a real run of the same notebook that resolved it, made by `bench/reference_runs.py`
and stored with its machine, load, links, date and commit in `ddplab/references/claims.json` (plain
JSON, read as data). It is shown labelled as such and never decides anything: the outcome is this
run's. Claims are matched by their text with every number blanked (`claim_key`). With
`$DDPLAB_RECORD_CLAIMS` set to a file, `check` also appends each verdict to it as one JSON line (how
the reference script collects them). Used by notebooks 03-09 and their tests.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import NormalDist

from ddplab.verify import CheckFailed

__all__ = ["ALPHA", "Verdict", "check", "claim_key", "estimate", "family", "finding", "judge", "median_interval", "min_rounds", "paired",
           "reference", "weakest"]

ALPHA = 0.001
HOLDS, CONTRADICTED, UNRESOLVED = "holds", "contradicted", "cannot resolve"


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


def _g(x: float) -> str:
    return f"{x:+.3g}" if math.isfinite(x) else ("-inf" if x < 0 else "+inf")


@dataclass(frozen=True)
class Verdict:
    """One claim's outcome, with what was seen (`center`, the interval [low, high]) and the claim."""

    claim: str
    outcome: str          # "holds", "contradicted" or "cannot resolve"
    center: float
    low: float
    high: float
    n: int
    what: str             # "median of 12 paired differences", "estimate"
    claimed: str          # "> 0 ms", "within [0.9, 1.1]"
    unit: str = ""
    advice: str = ""
    alpha: float = ALPHA

    @property
    def holds(self) -> bool:
        return self.outcome == HOLDS

    @property
    def contradicted(self) -> bool:
        return self.outcome == CONTRADICTED

    @property
    def resolved(self) -> bool:
        return self.outcome != UNRESOLVED

    def __str__(self) -> str:
        u = f" {self.unit}" if self.unit else ""
        # enough digits that a family's level (alpha / k) never rounds to "100%": 99.8%, 99.98%, ...
        digits = 2 + max(1, math.ceil(-math.log10(200 * self.alpha)))
        level = f"{100 * (1 - 2 * self.alpha):.{digits}g}%"
        line = (f"{self.outcome}: {self.claim} ({self.what} {_g(self.center)}{u}, {level} interval "
                f"[{_g(self.low)}, {_g(self.high)}]{u}, claim {self.claimed})")
        return line + (f"; {self.advice}" if self.advice else "")


def _decide(claim, center, low, high, n, what, unit, alpha, above, below, within, scale_rounds) -> Verdict:
    given = [x is not None for x in (above, below, within)]
    if sum(given) != 1:
        raise ValueError("claim: give exactly one of above=, below= or within=")
    u = f" {unit}" if unit else ""
    if above is not None:
        claimed, ok, bad, edges = f"> {above:.3g}{u}", low > above, high < above, [above]
    elif below is not None:
        claimed, ok, bad, edges = f"< {below:.3g}{u}", high < below, low > below, [below]
    else:
        lo, hi = within
        if not lo < hi:
            raise ValueError(f"within: the band must have low < high, got {within}")
        claimed, ok, bad, edges = f"within [{lo:.3g}, {hi:.3g}]{u}", lo <= low and high <= hi, high < lo or low > hi, [lo, hi]
    outcome = HOLDS if ok else CONTRADICTED if bad else UNRESOLVED
    advice = ""
    if outcome == UNRESOLVED:
        if not (math.isfinite(low) and math.isfinite(high)):
            advice = f"it takes at least {min_rounds(alpha)} rounds to judge at all"
        else:
            nearest = min(edges, key=lambda e: abs(center - e))
            margin = abs(center - nearest)
            half = center - low if nearest < center else high - center   # the side that faces the edge
            band = within is not None   # a band has no "effect" to grow: only its edge and the noise
            if margin > 0 and scale_rounds and half / margin <= 10:
                need = max(math.ceil(n * (half / margin) ** 2), n + 1)
                advice = (f"about {need} rounds (not {n})" + ("" if band else f" or an effect {half / margin:.1f}x larger")
                          + " would resolve it, noise staying as it is")
            elif margin > 0 and scale_rounds and band:
                advice = (f"the median sits {_g(margin)}{u} from the band's edge {nearest:.3g}: it would take over 100x "
                          f"the rounds (not {n}) to tell on which side it lies")
            elif margin > 0 and scale_rounds:
                advice = (f"no effect shows above the noise here: it would take over 100x the rounds (not {n}) or an "
                          "effect over 10x larger, the median sitting this near the claim's edge")
            elif margin > 0:
                advice = f"it would take an interval {half / margin:.1f}x narrower"
            else:
                advice = "the median sits on the claim's edge: only a larger effect would resolve it"
    return Verdict(claim, outcome, center, low, high, n, what, claimed, unit, advice, alpha)


def judge(claim: str, values, *, above=None, below=None, within=None, unit: str = "ms",
          alpha: float = ALPHA, what: str = "") -> Verdict:
    """Judge a claim about the median of per-round paired `values` (differences or ratios)."""
    values = list(values)
    center, low, high = median_interval(values, alpha)
    n = len(values)
    return _decide(claim, center, low, high, n, what or f"median of {n} values", unit, alpha,
                   above, below, within, scale_rounds=True)


def paired(claim: str, a, b, *, ratio: bool = False, above=None, below=None, within=None, unit: str = "ms",
           alpha: float = ALPHA) -> Verdict:
    """Judge a claim about arm `a` against arm `b`, round by round: a - b (or a / b with `ratio`)."""
    a, b = [float(x) for x in a], [float(x) for x in b]
    if len(a) != len(b) or not a:
        raise ValueError(f"a, b: paired rounds need as many values in each arm, got {len(a)} and {len(b)}")
    if ratio and any(y <= 0 for y in b):
        raise ValueError("b: a ratio needs positive values in the second arm")
    values = [x / y for x, y in zip(a, b)] if ratio else [x - y for x, y in zip(a, b)]
    kind = "ratios" if ratio else "differences"
    return judge(claim, values, above=above, below=below, within=within, unit="" if ratio else unit,
                 alpha=alpha, what=f"median of {len(values)} paired {kind}")


def estimate(claim: str, value: float, se: float, *, above=None, below=None, within=None, unit: str = "",
             alpha: float = ALPHA) -> Verdict:
    """Judge a claim about a fitted quantity with standard error `se`: a normal interval at `alpha`."""
    if not (math.isfinite(value) and math.isfinite(se) and se >= 0):
        raise ValueError(f"value, se: need finite numbers and se >= 0, got {value}, {se}")
    z = NormalDist().inv_cdf(1 - alpha)
    return _decide(claim, value, value - z * se, value + z * se, 1, f"estimate (standard error {se:.2g})", unit, alpha,
                   above, below, within, scale_rounds=False)


def check(verdict: Verdict) -> Verdict:
    """Print the verdict's line (and, where it cannot resolve, a reference run's verdict of the same
    claim beside it); raise CheckFailed only when the run contradicts the claim. Returns the verdict
    (a notebook cell that ends with it ends with `;`)."""
    _record(verdict)
    if verdict.contradicted:
        raise CheckFailed(f"NOT verified: {verdict}")
    print(verdict)
    if not verdict.resolved:
        ref = reference(verdict.claim)
        if ref:
            print(f"  {ref}")
    return verdict


def family(k: int, alpha: float = ALPHA) -> float:
    """The `alpha` for each of `k` claims checked together as "every one of these holds" (`weakest`):
    alpha / k, so that the family is called "contradicted" by chance at most `alpha` of the time (the
    union bound: each member's chance adds up), as one claim alone would be."""
    if k < 1:
        raise ValueError(f"k: a family needs at least one claim, got {k}")
    return alpha / k


def weakest(verdicts, then=None) -> Verdict:
    """The verdict to report for "every one of these holds": a contradiction first, then an unresolved
    one, then a holding one; among equals the least by `then` (a key on a verdict), if given. The members
    must be judged at `family(k)` (their alphas add up to at most ALPHA): k claims at ALPHA each would
    contradict a true family k times as often as one check may."""
    verdicts = list(verdicts)
    if not verdicts:
        raise ValueError("verdicts: need at least one")
    total = sum(v.alpha for v in verdicts)
    if total > ALPHA * (1 + 1e-9):
        raise ValueError(f"verdicts: {len(verdicts)} claims whose alphas add up to {total:.3g}, over {ALPHA:g}: "
                         f"judge each at claims.family({len(verdicts)})")
    order = {CONTRADICTED: 0, UNRESOLVED: 1, HOLDS: 2}
    return min(verdicts, key=lambda v: (order[v.outcome], then(v) if then else 0))


def finding(verdict: Verdict) -> str:
    """A verdict as this run's answer to an open question (one the machine decides, such as whether a
    plan beats another here), printed as such and never failing: "yes", "no, the opposite" or "not
    resolved", then the claim and what was seen."""
    word = {HOLDS: "yes", CONTRADICTED: "no, the opposite", UNRESOLVED: "not resolved"}[verdict.outcome]
    return f"this run's finding, not a check ({word}): {str(verdict).split(': ', 1)[1]}"


REFERENCES = Path(__file__).with_name("references") / "claims.json"
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?")


def claim_key(claim: str) -> str:
    """A claim's text with every number inside parentheses blanked (where claims quote this run's
    measurements): the same claim in another run has the same key, while the numbers that name what
    is claimed (a rank, a plan such as ddp:64, a stage count) stay and keep different claims apart."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(claim + "("):
        if ch in "()":
            part = claim[start:i]
            out.append(_NUMBER.sub("#", part) if depth > 0 else part)
            if i < len(claim):
                out.append(ch)
            depth = max(0, depth + (1 if ch == "(" else -1))
            start = i + 1
    return " ".join("".join(out).split())


@functools.lru_cache(maxsize=4)
def _references(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and isinstance(data.get("claims"), dict) else {}


def reference(claim: str, path: Path | None = None) -> str:
    """The labelled line of a stored reference run's verdict of `claim`, or "" where none is stored."""
    data = _references(path or REFERENCES)
    entry = data.get("claims", {}).get(claim_key(claim))
    run = data.get("runs", {}).get(str(entry.get("run"))) if isinstance(entry, dict) else None
    if not isinstance(run, dict):
        return ""
    links = "; ".join(sorted(set(str(x) for x in run.get("links", {}).values()))) or "loopback"
    return (f"a reference run that resolved it (not this run: {run.get('machine', '?')}, load {run.get('load', '?')}, "
            f"{links}, {run.get('date', '?')}, commit {run.get('commit', '?')}; bench/reference_runs.py): "
            f"{entry.get('line', '?')}")


def _record(verdict: Verdict) -> None:
    path = os.environ.get("DDPLAB_RECORD_CLAIMS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"key": claim_key(verdict.claim), "line": str(verdict), **asdict(verdict)}) + "\n")
