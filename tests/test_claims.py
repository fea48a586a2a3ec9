"""The timing-claim judge (ddplab.claims): its false-contradiction rate on heavy-tailed null noise, and
each outcome reached on synthetic data built to give it (no launch)."""

import math
import random

import pytest

from ddplab import claims
from ddplab.verify import CheckFailed


def _heavy(rng: random.Random) -> float:
    """Student-t with 2 degrees of freedom (infinite variance), plus an occasional 20x outlier."""
    t = rng.gauss(0, 1) / math.sqrt((rng.gauss(0, 1) ** 2 + rng.gauss(0, 1) ** 2) / 2)
    return t * (20 if rng.random() < 0.05 else 1)


@pytest.mark.parametrize("n", [10, 12, 20, 41])
def test_a_true_claim_on_its_edge_is_contradicted_at_most_one_time_in_a_thousand(n):
    rng = random.Random(n)
    draws = 4000
    contradicted = sum(claims.judge("null", [_heavy(rng) for _ in range(n)], above=0.0).contradicted
                       for _ in range(draws))
    # the designed rate is <= 0.001; a binomial(4000, 0.001) exceeds 12 with probability < 1e-3
    assert contradicted <= 12, f"{contradicted} of {draws} null draws contradicted"
    assert claims.median_interval([_heavy(rng) for _ in range(n)])[1] > -math.inf


def test_the_interval_is_the_sign_test_order_statistics():
    median, low, high = claims.median_interval(range(1, 11))
    assert (median, low, high) == (5.5, 1.0, 10.0)        # n = 10: 1/1024 <= 0.001, so the extremes
    assert claims.median_interval(range(9))[1:] == (-math.inf, math.inf)
    assert claims.min_rounds() == 10
    _, low, high = claims.median_interval(range(100))
    assert 30 < low < 40 and 60 < high < 70


def test_each_outcome_is_reached_and_only_contradicted_fails():
    rng = random.Random(1)
    effect = [20 + rng.gauss(0, 1) for _ in range(12)]
    assert claims.judge("shorter", effect, above=0).holds
    assert claims.judge("longer", effect, below=0).contradicted
    noise = [rng.gauss(0, 5) for _ in range(12)]
    v = claims.judge("noise", noise, above=0)
    assert v.outcome == "cannot resolve" and ("rounds" in v.advice or "edge" in v.advice)
    assert claims.judge("few", effect[:5], above=0).outcome == "cannot resolve"
    assert claims.check(claims.judge("noise", noise, above=0)).outcome == "cannot resolve"
    with pytest.raises(CheckFailed, match="NOT verified: contradicted: longer"):
        claims.check(claims.judge("longer", effect, below=0))


def test_a_band_holds_inside_and_is_contradicted_outside():
    rng = random.Random(2)
    near_one = [1 + rng.gauss(0, 0.01) for _ in range(20)]
    assert claims.judge("slope", near_one, within=(0.9, 1.1)).holds
    assert claims.judge("slope", [x - 0.5 for x in near_one], within=(0.9, 1.1)).contradicted
    assert claims.judge("slope", [x - 0.1 for x in near_one], within=(0.9, 1.1)).outcome == "cannot resolve"


def test_paired_arms_and_ratios():
    a, b = [10.0 + i for i in range(12)], [5.0 + i for i in range(12)]
    assert claims.paired("a slower", a, b, above=0).center == 5.0
    r = claims.paired("a twice b?", [2 * x for x in b], b, ratio=True, within=(1.9, 2.1))
    assert r.holds and r.unit == ""
    with pytest.raises(ValueError, match="a, b"):
        claims.paired("x", a, b[:3], above=0)


def test_an_estimate_uses_a_normal_interval():
    assert claims.estimate("slope one", 1.0, 0.02, within=(0.9, 1.1)).holds
    assert claims.estimate("slope one", 0.5, 0.02, within=(0.9, 1.1)).contradicted
    assert claims.estimate("slope one", 0.85, 0.1, within=(0.9, 1.1)).outcome == "cannot resolve"
    v = claims.estimate("slope one", 1.0, 0.02, within=(0.9, 1.1))
    assert (v.high - v.center) / 0.02 == pytest.approx(3.0902, abs=1e-3)      # z at 0.999


def test_bad_claims_are_refused():
    with pytest.raises(ValueError, match="claim"):
        claims.judge("x", [1.0] * 12, above=0, below=1)
    with pytest.raises(ValueError, match="values"):
        claims.judge("x", [float("nan")] * 12, above=0)
    with pytest.raises(ValueError, match="within"):
        claims.judge("x", [1.0] * 12, within=(2, 1))
