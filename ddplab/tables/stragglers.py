"""Who waits for whom in a synchronous step (notebook 07): for every bucket's all-reduce, when each rank
arrived (launched it: the bucket probe's launch time, on the host's one clock), how long every early
rank then waited for the last one, and who that was; per step and rank, the time spent waiting and
the rest of the step. A collective completes only when its last rank has joined, so an early rank's
wait is the last arrival minus its own.

- `arrivals(run)`: one row per step, bucket and rank;
- `last_arrivals(run)`: per rank, how often it was the last to arrive;
- `compute_and_wait(run)`: per step and rank, the wait at the step's final bucket (after it, an early
  rank has nothing left to compute) and the step's other time;
- `per_rank(run)`: their medians per rank, with the run-to-run spread of the wait;
- `delay_response(runs, baseline)`: per straggler run, the injected delay against what the early
  ranks waited and what the step lost, each beside the baseline run without a straggler;
- `delay_cycle(run)`, `cycle_response(run)`, `cycle_slopes(run)`: a straggler whose delay cycles step by
  step (0, 20, 40, 80 ms, ...): every delay against the same cycle's step without one, and the slope of
  the step against the delay, one per cycle (the delays interleaved: no baseline from another moment);
- `judge_wait_for_delay(run)`: per step, the early ranks' wait over the delay the slow rank lost,
  judged by `claims` (`check_wait_for_delay` for several runs).
Needs the buckets probe (`probes=("buckets",)`). Numbers in, DataFrames out (no processes).
"""

from __future__ import annotations

import statistics

import pandas as pd

from .stats import robust_spread
from .reads import reading


SKIP = 1   # steps left out at the start: DDP's first iteration runs one bucket, then rebuilds


def _buckets(run, skip: int):
    if any(s.buckets is None for r in run.ranks for s in r.steps):
        raise ValueError(f"{run.spec.name}: no bucket events: run it with probes=('buckets',) to see arrivals")
    if run.spec.steps <= skip:
        raise ValueError(f"{run.spec.name}: {run.spec.steps} step(s), all within the first {skip} left out; "
                         "run more steps")
    for i in range(skip, run.spec.steps):
        yield i, {r.rank: {b.index: b for b in r.steps[i].buckets} for r in run.ranks}


@reading(run="train")
def arrivals(run, skip: int = SKIP) -> pd.DataFrame:
    """Per step (from `skip` on), bucket and rank: arrival_ms after the first rank's arrival at that
    bucket, wait_ms until the last rank's arrival (0 for the last), and whether it was the last."""
    rows = []
    for step, by_rank in _buckets(run, skip):
        for index in sorted(by_rank[0]):
            launch = {r: b[index].launch_ns for r, b in by_rank.items()}
            first, last = min(launch.values()), max(launch.values())
            late = max(launch, key=launch.get)
            for r, t in sorted(launch.items()):
                rows.append({"step": step, "bucket": index, "rank": r, "arrival_ms": (t - first) / 1e6,
                             "wait_ms": (last - t) / 1e6, "last": r == late})
    return pd.DataFrame(rows).set_index(["step", "bucket", "rank"])


@reading(run="train")
def wait_gaps(run, early: int, late: int, final_only: bool = False, skip: int = SKIP) -> list[float]:
    """Per step: rank `early`'s wait minus rank `late`'s, at the step's final bucket (`final_only`) or
    the smallest over the step's buckets (one value a step: its buckets share one delay, so they are
    not independent). Positive where `late` joined after `early` (every bucket of the step, without
    `final_only`): the paired values behind "rank `late` arrives last" (claims.judge(..., above=0))."""
    a = arrivals(run, skip)
    if final_only:
        final = a.index.get_level_values("bucket").max()
        a = a[a.index.get_level_values("bucket") == final]
    w = a["wait_ms"].unstack("rank")
    return (w[early] - w[late]).groupby(level="step").min().tolist()


@reading(run="train")
def judge_last(run, late: int, final_only: bool = False, skip: int = SKIP):
    """The claim "rank `late` joins the all-reduces after every other rank, in most steps" (the median step:
    a few steps may go the other way), judged on this run's paired waits, one value per step (one verdict
    per other rank, the weakest first: a contradiction, else an unresolved)."""
    from .. import claims

    where = "the step's final all-reduce" if final_only else "every all-reduce of the step"   # in most steps:
    what = "rank {r}'s wait minus rank {late}'s" if final_only else \
        "per step, the smallest over its buckets of rank {r}'s wait minus rank {late}'s"
    others = [r for r in sorted(x.rank for x in run.ranks) if r != late]
    verdicts = [claims.judge(f"rank {late} joins {where} after rank {r} in most steps ({what.format(r=r, late=late)})",
                             wait_gaps(run, r, late, final_only, skip), above=0.0, alpha=claims.family(len(others)))
                for r in others]
    return claims.weakest(verdicts)


@reading(run="train")
def last_arrivals(run, skip: int = SKIP) -> pd.DataFrame:
    """Per rank: how many of the run's all-reduces (steps x buckets) it joined last, and the share."""
    a = arrivals(run, skip)
    counts = a.groupby(level="rank")["last"].sum().astype(int)
    total = len(a) // run.world_size
    return pd.DataFrame({"arrived_last": counts, "of": total, "share": counts / total})


@reading(run="train")
def compute_and_wait(run, skip: int = SKIP) -> pd.DataFrame:
    """Per step and rank: the step time, the wait at the step's final bucket (the last rank's arrival
    minus this rank's), and everything else in the step (`other_ms` = step - wait)."""
    return _compute_and_wait(run, arrivals(run, skip), skip)


def _compute_and_wait(run, a: pd.DataFrame, skip: int) -> pd.DataFrame:
    final = a.index.get_level_values("bucket").max()
    rows = []
    for r in run.ranks:
        for i in range(skip, run.spec.steps):
            wait = float(a.loc[(i, final, r.rank), "wait_ms"])
            rows.append({"step": i, "rank": r.rank, "step_ms": r.steps[i].step_ms, "wait_ms": wait,
                         "other_ms": r.steps[i].step_ms - wait})
    return pd.DataFrame(rows).set_index(["step", "rank"])


@reading(run="train")
def per_rank(run, skip: int = SKIP) -> pd.DataFrame:
    """Per rank: median step, wait and other time over the steps, the wait's spread (1.4826 x MAD),
    and how often it arrived last at the final bucket."""
    a = arrivals(run, skip)
    cw = _compute_and_wait(run, a, skip)
    final = a.xs(a.index.get_level_values("bucket").max(), level="bucket")
    rows = []
    for rank, g in cw.groupby(level="rank"):
        rows.append({"rank": rank, "step_ms": statistics.median(g["step_ms"]), "wait_ms": statistics.median(g["wait_ms"]),
                     "wait_spread_ms": robust_spread(list(g["wait_ms"])), "other_ms": statistics.median(g["other_ms"]),
                     "last_at_final_bucket": int(final.xs(rank, level="rank")["last"].sum())})
    return pd.DataFrame(rows).set_index("rank")


def _slowest_step_ms(run, skip: int) -> list[float]:
    return [max(r.steps[i].step_ms for r in run.ranks) for i in range(skip, run.spec.steps)]


@reading(runs="train", baseline="train")
def delay_response(runs, baseline, skip: int = SKIP) -> pd.DataFrame:
    """Per run with a straggler: where and how much it was delayed (`delay_ms` as specified,
    `measured_delay_ms` as the slow rank's clock saw it: its "straggler" phase, median over steps),
    the early ranks' median wait at the final bucket with its per-step spread (1.4826 x MAD), the step
    time (median over steps, each at its slowest rank) with its spread, and both against the
    `baseline` run without a straggler: `extra_wait_ms` (against the same ranks' baseline wait) and
    `step_added_ms`."""
    base_step = statistics.median(_slowest_step_ms(baseline, skip))
    base_cw = compute_and_wait(baseline, skip)
    rows = []
    for run in runs:
        slow = run.spec.straggler
        lost = lost_ms(run, skip)   # refuses a run without a straggler, or with a cycle of delays
        cw = compute_and_wait(run, skip)
        early = cw[cw.index.get_level_values("rank") != slow.rank]["wait_ms"].tolist()
        base_wait = statistics.median(base_cw[base_cw.index.get_level_values("rank") != slow.rank]["wait_ms"])
        steps = _slowest_step_ms(run, skip)
        rows.append({"run": run.spec.name, "where": slow.where, "slow_rank": slow.rank, "delay_ms": slow.ms,
                     "measured_delay_ms": statistics.median(lost), "early_wait_ms": statistics.median(early),
                     "wait_spread_ms": robust_spread(early), "extra_wait_ms": statistics.median(early) - base_wait,
                     "step_ms": statistics.median(steps), "step_spread_ms": robust_spread(steps),
                     "steps": len(steps), "step_added_ms": statistics.median(steps) - base_step})
    return pd.DataFrame(rows).set_index("run")


@reading(run="train", baseline="train")
def judge_step_added(run, baseline, skip: int = SKIP):
    """The claim "the straggler lengthens the step": this run's steps (each at its slowest rank)
    against the baseline run's, step by step. The two runs ran one after the other, not interleaved,
    so a change of load between them shifts the differences; the claim asks only for a longer step,
    not for the whole delay."""
    from .. import claims

    steps, base = _slowest_step_ms(run, skip), _slowest_step_ms(baseline, skip)
    n = min(len(steps), len(base))
    return claims.paired(f"{run.spec.name}: the straggler lengthens the step (slowest rank's step ms, against "
                         f"{baseline.spec.name}'s)", steps[:n], base[:n], above=0.0)


MIN_WAIT_PER_DELAY = 0.5   # the early ranks wait most of the delay: it is on their critical path


@reading(run="train")
def delay_cycle(run, skip: int = SKIP) -> pd.DataFrame:
    """A run whose straggler cycles through delays, one per step (`Straggler(ms=(0, 20, 40, 80))`): per
    step of every whole cycle from `skip` on, its `cycle`, the delay specified (`delay_ms`) and the one
    the slow rank's clock saw (`measured_delay_ms`), the early ranks' step (`early_step_ms`, the
    longest of theirs) and their wait at the final bucket (`early_wait_ms`, their median)."""
    slow = run.spec.straggler
    if slow is None or len(getattr(slow, "cycle", ())) < 2:
        raise ValueError(f"{run.spec.name}: straggler.ms: needs a cycle of delays, such as (0, 20, 40, 80)")
    n = len(slow.cycle)
    cw = compute_and_wait(run, skip)
    early = cw[cw.index.get_level_values("rank") != slow.rank]
    rows = []
    for i in range(skip, run.spec.steps):
        c = i // n
        if c * n < skip or (c + 1) * n > run.spec.steps:   # whole cycles only
            continue
        e = early.xs(i, level="step")
        rows.append({"step": i, "cycle": c, "delay_ms": slow.ms_at(i),
                     "measured_delay_ms": run.ranks[slow.rank].steps[i].phase_ms.get("straggler", 0.0),
                     "early_step_ms": float(e["step_ms"].max()), "early_wait_ms": float(e["wait_ms"].median())})
    if len({r["cycle"] for r in rows}) < 1:
        raise ValueError(f"{run.spec.name}: no whole cycle of delays after the first {skip} step(s); run more steps")
    return pd.DataFrame(rows).set_index("step")


def _baselined(run, skip: int) -> pd.DataFrame:
    """`delay_cycle` with each step set against the same cycle's step without a delay (the lowest one):
    `step_added_ms` and `extra_wait_ms`, paired within the cycle."""
    t = delay_cycle(run, skip)
    base = t.loc[t.groupby("cycle")["delay_ms"].idxmin()].set_index("cycle")
    return t.assign(step_added_ms=t["early_step_ms"] - t["cycle"].map(base["early_step_ms"]),
                    extra_wait_ms=t["early_wait_ms"] - t["cycle"].map(base["early_wait_ms"]),
                    measured_delay_ms=t["measured_delay_ms"] - t["cycle"].map(base["measured_delay_ms"]))


@reading(run="train")
def cycle_response(run, skip: int = SKIP) -> pd.DataFrame:
    """Per delay of the cycle (the lowest left out: it is the baseline), with the columns of
    `delay_response`, but every one set against the same cycle's undelayed step: the delay the slow
    rank lost beyond that step's (`measured_delay_ms`), the step time the early ranks' step gained and
    the wait they gained, each the median over cycles of the difference to the same cycle's step
    without the delay (measured a few steps apart: the same moment of the machine), and its spread."""
    t = _baselined(run, skip)
    rows = []
    for d, part in t.groupby("delay_ms"):
        if d == t["delay_ms"].min():
            continue
        rows.append({"run": f"{run.spec.name} {d:g} ms", "where": run.spec.straggler.where, "delay_ms": d,
                     "measured_delay_ms": statistics.median(part["measured_delay_ms"]),
                     "step_added_ms": statistics.median(part["step_added_ms"]),
                     "step_spread_ms": robust_spread(part["step_added_ms"]),
                     "extra_wait_ms": statistics.median(part["extra_wait_ms"]), "steps": len(part)})
    return pd.DataFrame(rows).set_index("run")


@reading(run="train")
def cycle_slopes(run, skip: int = SKIP) -> dict:
    """Per whole cycle of delays: the least-squares slope (and intercept) of the early ranks' step gained
    against the delay the slow rank lost, within that cycle; `slopes` are what `claims.judge` takes (one
    value per cycle: each from a few consecutive steps, so a change of load between cycles moves no
    slope), `slope` and `intercept` their medians, for the figure's line."""
    t = _baselined(run, skip)
    slopes, intercepts = [], []
    for _, part in t.groupby("cycle"):
        x, y = part["measured_delay_ms"], part["step_added_ms"]
        mx, my = x.mean(), y.mean()
        sxx = float(((x - mx) ** 2).sum())
        if sxx <= 0:
            continue
        b = float(((x - mx) * (y - my)).sum() / sxx)
        slopes.append(b)
        intercepts.append(float(my - b * mx))
    if not slopes:
        raise ValueError(f"{run.spec.name}: no cycle with two different delays measured")
    return {"slopes": slopes, "slope": statistics.median(slopes), "intercept": statistics.median(intercepts),
            "cycles": len(slopes)}


@reading(run="train")
def lost_ms(run, skip: int = SKIP) -> list[float]:
    """Per step (from `skip` on): what the straggler rank's own clock saw it lose (its "straggler" phase, ms)."""
    slow = run.spec.straggler
    if slow is None:
        raise ValueError(f"{run.spec.name}: no straggler in this run's spec; pass it as the baseline")
    if len(getattr(slow, "cycle", ())) > 1:
        raise ValueError(f"{run.spec.name}: straggler.ms is a cycle of delays (some steps have none): read it with "
                         "delay_cycle, cycle_response or cycle_slopes")
    return [run.ranks[slow.rank].steps[i].phase_ms.get("straggler", 0.0) for i in range(skip, run.spec.steps)]


@reading(run="train")
def wait_per_delay(run, skip: int = SKIP) -> list[float]:
    """Per step: the early ranks' wait at the final bucket (their median) over the delay the slow rank
    lost in that same step. Both halves come from one step, so the machine's load hits them alike."""
    lost = lost_ms(run, skip)
    cw = compute_and_wait(run, skip)
    early = cw[cw.index.get_level_values("rank") != run.spec.straggler.rank]["wait_ms"].groupby(level="step").median()
    return [w / d for w, d in zip(early.tolist(), lost)]


@reading(run="train")
def judge_wait_for_delay(run, skip: int = SKIP, least: float = MIN_WAIT_PER_DELAY):
    """The claim "the early ranks wait at the last bucket for the slow rank's delay", judged
    on this run's steps: per step, wait / delay above `least`. One-sided on purpose: on a quiet machine
    the ratio sits near 1, but load moves it (on the late rank it lengthens the wait without bound, on
    an early rank it shortens it), so the claim asks only that most of the delay reach the early ranks.
    A delay off their critical path would leave them waiting nothing."""
    from .. import claims

    ratios = wait_per_delay(run, skip)   # first: it refuses a run without a straggler, naming it
    slow = run.spec.straggler
    return claims.judge(f"{run.spec.name}: ranks wait at least {least:g} of rank {slow.rank}'s delay in {slow.where} "
                        f"(per step, the early ranks' wait at the last bucket over the delay)", ratios, above=least, unit="x")


@reading(runs="train")
def check_wait_for_delay(runs, skip: int = SKIP) -> list:
    """Notebook 07's check: `judge_wait_for_delay` for each straggler run, one line each; raises
    `verify.CheckFailed` only where a run contradicts it (tests/tasks/test_stragglers.py feeds it early
    ranks that waited nothing)."""
    from .. import claims

    return [claims.check(judge_wait_for_delay(run, skip)) for run in runs]
