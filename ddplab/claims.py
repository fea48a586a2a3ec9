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

shows one line, the answer first, with what this run saw (the statistics fold beneath it in Jupyter,
`Verdict.details()` elsewhere):

    holds: the straggler's peer waits longer (seen +19.6 ms)

A fitted quantity with a standard error goes through `estimate` (a normal interval at the same `alpha`).
Where this run cannot resolve a claim, `check` prints beside it a quiet reference run's verdict of the
same claim (`ddplab.references`), labelled as such: it never decides anything. `noted` does the same for
an open question a table shows. With `$DDPLAB_RECORD_CLAIMS` set to a file, both append each verdict to
it as a JSON line (how `bench/reference_runs.py` collects them).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass
from statistics import NormalDist

from ddplab.folded import Folded, show
from ddplab.references import claim_key, reference, reference_source, stored
from ddplab.signtest import ALPHA, median_interval, min_rounds
from ddplab.verify import CheckFailed

__all__ = ["ALPHA", "Verdict", "answer", "check", "claim_key", "estimate", "family", "finding", "judge", "median_interval",
           "min_rounds", "noted", "paired", "reference", "this_run", "weakest"]

HOLDS, CONTRADICTED, UNRESOLVED = "holds", "contradicted", "cannot resolve"


def _suffix(unit: str) -> str:
    """How a unit follows a number: "x" right after it ("1.8x"), any other after a space ("4 ms")."""
    return "x" if unit == "x" else f" {unit}" if unit else ""


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

    @property
    def headline(self) -> str:
        """The claim in plain words: its text without the trailing notes on how it was measured (`measured`)."""
        return _split_claim(self.claim)[0]

    @property
    def measured(self) -> str:
        """The claim's trailing notes on how it was measured ("per step, split minus uncut"), or ""."""
        return _split_claim(self.claim)[1]

    @property
    def is_ratio(self) -> bool:
        """A ratio (`unit="x"`, or `paired`'s ratios): shown as "1.84x", without a sign."""
        return self.unit == "x" or (self.unit == "" and "ratio" in self.what)

    def effect(self) -> str:
        """What this run saw, in the claim's unit: "+19.6 ms", "1.84x" for a ratio (`unit="x"`, or `paired`'s
        ratios), "+0.252" where the quantity has no unit."""
        if self.is_ratio:
            return f"{self.center:.3g}x" if math.isfinite(self.center) else _g(self.center)
        return _g(self.center) + _suffix(self.unit)

    def __str__(self) -> str:
        """The verdict in one line: the answer, the claim in plain words and the size of what was seen; the
        statistics behind it are `details()`."""
        said = {HOLDS: "holds", CONTRADICTED: "contradicted", UNRESOLVED: "cannot resolve"}[self.outcome]
        return f"{said}: {self.seen()}"

    def seen(self) -> str:
        """The line without its answer: the claim in plain words and what this run saw."""
        why = ", too few values" if not (math.isfinite(self.low) and math.isfinite(self.high)) else ", noise too wide"
        return f"{self.headline} (seen {self.effect()}{why if self.outcome == UNRESOLVED else ''})"

    def details(self) -> str:
        """The statistics behind the one line: how it was measured, the interval, the claim's bound and, where
        it cannot resolve, what would resolve it."""
        u = _suffix(self.unit)
        # enough digits that a family's level (alpha / k) never rounds to "100%": 99.8%, 99.98%, ...
        digits = 2 + max(1, math.ceil(-math.log10(200 * self.alpha)))
        level = f"{100 * (1 - 2 * self.alpha):.{digits}g}%"
        lines = [f"measured: {self.measured}"] if self.measured else []
        g = (lambda x: f"{x:.3g}" if math.isfinite(x) else _g(x)) if self.is_ratio else _g
        lines.append(f"{self.what} {g(self.center)}{u}, {level} interval [{g(self.low)}, {g(self.high)}]{u}; "
                     f"the claim: {self.claimed}")
        if self.advice:
            lines.append(f"to resolve it: {self.advice}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:   # Jupyter: the one line, the statistics folded beneath it
        return Folded(str(self), self.details())._repr_html_()

    def __repr__(self) -> str:   # where no HTML shows: the line, then the statistics indented
        return repr(Folded(str(self), self.details()))


# words in a claim's last parenthesis (or bracket) that say how it was measured, not what is claimed
_MEASURED = re.compile(r"\bper[ -](step|round|repeat|call)|\bminus\b|\bover\b|\bratio\b|\bmedian\b|;|\bslope\b|"
                       r"standard error|relative error|\bagainst\b|\bweakest\b")


def _split_claim(claim: str) -> tuple[str, str]:
    """(headline, how it was measured): the claim's trailing bracket and parenthesis are moved to the second
    part when they describe the measurement (`_MEASURED`); a parenthesis that names what is claimed ("(1GbE
    link)", "(run as GPipe)") stays in the headline."""
    head, notes = claim.rstrip(), []
    for close, open_ in (("]", "["), (")", "(")):
        if not head.endswith(close):
            continue
        depth = 0
        for i in range(len(head) - 1, -1, -1):
            depth += head[i] == close
            depth -= head[i] == open_
            if depth == 0:
                break
        inner = head[i + 1:-1]
        if depth == 0 and i > 0 and head[i - 1] == " " and _MEASURED.search(inner):
            head, notes = head[:i].rstrip(), [inner, *notes]
    return head, "; ".join(notes)


def _decide(claim, center, low, high, n, what, unit, alpha, above, below, within, scale_rounds) -> Verdict:
    given = [x is not None for x in (above, below, within)]
    if sum(given) != 1:
        raise ValueError("claim: give exactly one of above=, below= or within=")
    u = _suffix(unit)
    if above is not None:
        claimed, ok, bad, edges = f"> {above:.3g}{u}", low > above, high < above, [above]
    elif below is not None:
        claimed, ok, bad, edges = f"< {below:.3g}{u}", high < below, low > below, [below]
    else:
        lo, hi = within
        if not lo < hi:
            raise ValueError(f"within: the band must have low < high, got {within}")
        claimed, ok, bad, edges = f"within [{lo:.3g}, {hi:.3g}]{u}", lo <= low and high <= hi, high < lo or low > hi, [lo, hi]
    outcome, advice = HOLDS if ok else CONTRADICTED if bad else UNRESOLVED, ""
    if outcome == UNRESOLVED:
        if not (math.isfinite(low) and math.isfinite(high)):
            advice = f"it takes at least {min_rounds(alpha)} measured values to judge at all"
        else:
            nearest = min(edges, key=lambda e: abs(center - e))
            margin = abs(center - nearest)
            half = center - low if nearest < center else high - center   # the side that faces the edge
            band = within is not None   # a band has no "effect" to grow: only its edge and the noise
            if margin > 0 and scale_rounds and half / margin <= 10:
                need = max(math.ceil(n * (half / margin) ** 2), n + 1)
                advice = (f"about {need} measured values (not {n})" + ("" if band else " or a slightly larger effect" if half / margin < 1.1
                                                                      else f" or an effect {half / margin:.1f}x larger")
                          + " would resolve it, noise staying as it is")
            elif margin > 0 and scale_rounds and band:
                advice = (f"the median sits {_g(margin)}{u} from the band's edge {nearest:.3g}: it would take over 100x "
                          f"the measured values (not {n}) to tell on which side it lies")
            elif margin > 0 and scale_rounds:
                advice = (f"no effect shows above the noise here: it would take over 100x the measured values (not {n}) or an "
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
             alpha: float = ALPHA, widen: tuple[float, str] = (1.0, "")) -> Verdict:
    """Judge a claim about a fitted quantity with standard error `se`: a normal interval at `alpha`, its
    half-width times `widen`[0] where the fit needs more (`widen`[1] says why, e.g. Student's t)."""
    if not (math.isfinite(value) and math.isfinite(se) and se >= 0 and widen[0] > 0):
        raise ValueError(f"value, se, widen: need finite numbers, se >= 0 and widen > 0, got {value}, {se}, {widen[0]}")
    z = NormalDist().inv_cdf(1 - alpha) * widen[0]
    return _decide(claim, value, value - z * se, value + z * se, 1, f"estimate (standard error {se:.2g}{widen[1]})",
                   unit, alpha, above, below, within, scale_rounds=False)


def check(verdict: Verdict) -> Verdict:
    """Print the verdict's line (and, where it cannot resolve, a reference run's verdict of the same
    claim beside it); raise CheckFailed only when the run contradicts the claim. Returns the verdict
    (a notebook cell that ends with it ends with `;`)."""
    ref = _count(verdict) and reference(verdict.claim)
    if verdict.contradicted:
        raise CheckFailed(f"NOT verified: {verdict}\n" + verdict.details())
    source = f"\nthe reference run: {reference_source(verdict.claim)}" if ref else ""
    show(Folded(str(verdict) + (f"\n  {ref}" if ref else ""), verdict.details() + source))
    return verdict


_CHECKED: dict[str, tuple[Verdict, bool]] = {}   # this process's checks by claim (a cell run again replaces its own)


def this_run() -> str:
    """One line on this process's timing claims so far (`check`): the machine's load, how many resolved,
    and whether each unresolved one showed a reference run beside it."""
    load, cores = os.getloadavg()[0], os.cpu_count()
    checked = list(_CHECKED.values())
    if not checked:
        return f"this run (load {load:.1f}, {cores} cores): no timing claim yet"
    open_ = [has for v, has in checked if not v.resolved]
    said = f"this run (load {load:.1f}, {cores} cores): {len(checked) - len(open_)} of {len(checked)} timing claims resolved"
    if not open_:
        return said
    missing = open_.count(False)
    return said + ("; each unresolved one shows a reference run" if not missing else
                   f"; {missing} of the {len(open_)} unresolved {'has' if missing == 1 else 'have'} no reference run yet")


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
    return f"this run's answer, {answer(verdict)}: {verdict.seen()}"


def answer(verdict: Verdict) -> str:
    """An open question's answer in a word: "yes", "no, the opposite" (plain "no" for a band, which has no
    opposite) or "not resolved" (`finding`)."""
    no = "no" if verdict.claimed.startswith("within") else "no, the opposite"
    return {HOLDS: "yes", CONTRADICTED: no, UNRESOLVED: "not resolved"}[verdict.outcome]


def noted(verdict: Verdict) -> str:
    """Note an open question's verdict that a table shows (never failing): recorded for the reference runs,
    counted by `this_run`. Where this run cannot resolve it, returns a quiet reference run's answer in
    words ("yes, seen -12.3 ms (2026-12-06)"), else ""."""
    ref = _count(verdict, finding=True)
    word = {HOLDS: "yes", CONTRADICTED: "no, the opposite"}.get(ref.get("outcome"), ref.get("outcome"))
    return f"{word}, seen {ref['seen'] or '?'} ({ref['date']})" if ref else ""


def _count(verdict: Verdict, finding: bool = False) -> dict:
    """Count `verdict` for `this_run` (appended to $DDPLAB_RECORD_CLAIMS, if set); returns the reference
    run's entry of its claim where this run cannot resolve it (`references.stored`), else {}."""
    path = os.environ.get("DDPLAB_RECORD_CLAIMS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"key": claim_key(verdict.claim), "line": str(verdict), "seen": verdict.effect(),
                                "finding": finding, **asdict(verdict)}) + "\n")
    ref = {} if verdict.resolved else stored(verdict.claim)
    _CHECKED[claim_key(verdict.claim)] = (verdict, bool(ref))
    return ref
