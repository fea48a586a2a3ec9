"""tables/stats.py: the robust spread and the round summary every timing view shares."""

from __future__ import annotations

import statistics

import pytest

from ddplab.tables.stats import robust_spread, round_summary


def test_the_robust_spread_is_the_standard_deviation_of_normal_noise_and_ignores_one_outlier():
    import random

    rng = random.Random(0)
    values = [rng.gauss(0.0, 2.0) for _ in range(4000)]
    assert robust_spread(values) == pytest.approx(2.0, rel=0.05)
    assert robust_spread(values + [1e6]) == pytest.approx(robust_spread(values), rel=0.01)
    assert statistics.stdev(values + [1e6]) > 100   # what a plain standard deviation would say
    assert robust_spread([3.0]) == 0.0 and robust_spread([]) == 0.0
    assert robust_spread(iter([1.0, 2.0, 3.0])) == pytest.approx(1.4826)   # any iterable


def test_the_round_summary_is_robust_to_one_disturbed_round():
    median, spread = round_summary({0: [10.0] * 3, 1: [10.2] * 3, 2: [9.9] * 3, 3: [50.0] * 3})
    assert median == pytest.approx(10.1) and spread < 1.0


def test_the_round_summary_spread_is_at_least_what_step_noise_implies_when_rounds_agree_by_luck():
    rounds = {0: [8.0, 10.0, 12.0], 1: [12.0, 10.0, 8.0]}   # equal round medians, noisy steps
    median, spread = round_summary(rounds)
    assert median == 10.0
    assert spread == pytest.approx(robust_spread([8.0, 10.0, 12.0] * 2) / 3 ** 0.5) and spread > 0
