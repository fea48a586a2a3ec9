"""The statistics every view shares (pure: no torch): a robust spread, and the median and spread of a
quantity timed in interleaved rounds. Judging a claim against that noise is `claims.py`'s."""

from __future__ import annotations

import bisect
import statistics

from .reads import reading_no_run



@reading_no_run
def slowest_rank(per_rank) -> list[float]:
    """Per step (or call), the slowest rank's time, from one list per rank in the same order: a
    synchronous step is done only when every rank is."""
    return [max(t) for t in zip(*per_rank)]


@reading_no_run
def robust_spread(values) -> float:
    """The run-to-run spread: 1.4826 x the median absolute deviation (the standard deviation for
    normal noise, but one disturbed round or step does not inflate it); 0 for fewer than 2 values."""
    values = list(values)
    if len(values) < 2:
        return 0.0
    m = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - m) for v in values)


@reading_no_run
def round_summary(rounds: dict[int, list[float]]) -> tuple[float, float]:
    """(median, spread) of a quantity timed in interleaved rounds: the median of the per-round medians,
    and the spread 1.4826 x MAD of them, at least what step-to-step noise implies for a median of one
    round's steps (a few rounds can agree by luck)."""
    medians = [statistics.median(v) for v in rounds.values()]
    every = [t for v in rounds.values() for t in v]
    per_round = max(1, round(len(every) / len(rounds)))
    return statistics.median(medians), max(robust_spread(medians), robust_spread(every) / per_round ** 0.5)


@reading_no_run
def moves(a, b) -> int:
    """How many items of order `b` must be taken out and put back elsewhere to give order `a`: the items
    outside their longest common subsequence (a gradient that slips by one, ahead of all the others, is
    one move, where counting changed positions would count every gradient after it)."""
    where = {x: i for i, x in enumerate(a)}
    tails: list[int] = []   # patience sorting: the longest run of b's items in increasing position in a
    for i in (where[x] for x in b if x in where):
        tails[bisect.bisect_left(tails, i):bisect.bisect_left(tails, i) + 1] = [i]
    return len(b) - len(tails)
