"""What a bucket sweep measured (`BucketSweep`, `rank/tasks/bucket_sweep.py`), as tables: per plan
(`measured`), what the simulator takes from it (`inputs`), one value per timed step indexed by (round,
step in the round) so that a step of one plan pairs with the same step of another (`per_step`,
`steps`; the plans take turns a step at a time, the compute-only baseline at both ends of every
pass), and the timing claims judged on those pairs by `claims` (the `judge_*` functions; `ordered`,
`faster_than`; `split_finding` and `judge_isolated_price` answer hypotheses, printed, not checked).
Numbers in, DataFrames out (no processes); `tables/buckets.py` puts the simulator beside them. Used by
notebook 05, its bucket slider, `ddplab tune-buckets` and bench/simulator_accuracy.py.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pandas as pd

from .. import claims, record
from .. import predict
from ..predict.buckets import Grad
from ..predict.comm import AlphaBeta
from ..spec.bucket_sweep import Plan
from .stats import round_summary
from .reads import reading, reading_no_run



@reading(run="bucket-sweep")
def sweep_record(run, rank: int = 0):
    """What `rank` recorded (`record.BucketSweepRecord`)."""
    return run.ranks[rank].result


def _arm_steps(run, name: str) -> list[list]:
    """Per timed step, every rank's record of it (`record.SweepStep`)."""
    per_rank = [sweep_record(run, i).arm(name).steps for i in range(len(run.ranks))]
    return [list(s) for s in zip(*per_rank)]


@reading(run="bucket-sweep")
def step_times(run, name: str) -> dict[int, list[float]]:
    """Per round, `name`'s timed steps, each timed by its slowest rank (ms)."""
    rounds: dict[int, list[float]] = {}
    for s in _arm_steps(run, name):
        rounds.setdefault(s[0].round, []).append(max(x.step_ms for x in s))
    return rounds


@reading(run="bucket-sweep")
def arm_names(run) -> list[str]:
    return [a.name for a in sweep_record(run).arms]


@reading_no_run
def cap_of(name: str) -> float | None:
    """The bucket cap (MiB) of a plan name; None for DDP's default and for compute-only."""
    return None if name == "compute-only" else Plan.parse(name).cap_mb


@reading(run="bucket-sweep")
def measured(run) -> pd.DataFrame:
    """One row per plan (see the module docstring); times in ms."""
    rows = []
    for name in arm_names(run):
        steps = _arm_steps(run, name)
        rounds = step_times(run, name)
        medians = [statistics.median(v) for v in rounds.values()]
        step_ms, spread_ms = round_summary(rounds)
        med = lambda f: statistics.median(f(x) for s in steps for x in s)  # noqa: E731 - over steps and ranks
        row = {"plan": name, "cap_mb": cap_of(name), "step_ms": step_ms, "spread_ms": spread_ms,
               "round_min_ms": min(medians), "round_max_ms": max(medians),
               "forward_ms": med(lambda x: x.forward_ms), "backward_ms": med(lambda x: x.backward_ms),
               "optimizer_ms": med(lambda x: x.optimizer_ms)}
        if steps[0][0].backward.ready:
            row["last_ready_ms"] = med(lambda x: x.last_ready_ms)
        if steps[0][0].buckets:
            row["buckets"] = len(steps[0][0].buckets)
            row["first_launch_ms"] = med(lambda x: x.first_launch_ms)
            row["comm_end_ms"] = med(lambda x: x.comm_end_ms)
            row["exposed_tail_ms"] = statistics.median(record.exposed_tail_ms(s) for s in steps)
        rows.append(row)
    return pd.DataFrame(rows).set_index("plan")


@dataclass(frozen=True)
class Inputs:
    """The simulator's view of one machine and model, from the compute-only plan of a sweep."""

    grads: list[Grad]          # in ready order
    backward_ms: float
    forward_ms: float
    optimizer_ms: float

    @property
    def gradient_bytes(self) -> int:
        return sum(g.bytes for g in self.grads)


@reading(run="bucket-sweep")
def inputs(run) -> Inputs:
    """A collective starts when its last rank joins, so each compute-only step is represented by its
    slowest rank (the ranks start every step together): that rank's ready times, backward, forward
    and optimizer; then the median of each over the steps."""
    sweep = sweep_record(run)
    slowest = [max(s, key=lambda x: x.step_ms) for s in _arm_steps(run, "compute-only")]
    ready: dict[str, list[float]] = {}
    for x in slowest:
        for n, t in x.ready_ms():
            ready.setdefault(n, []).append(t)
    names = sweep.ready_order
    grads = predict.buckets.grads_in_ready_order(names, [sweep.parameter_bytes[n] for n in names], [statistics.median(ready[n]) for n in names])
    med = lambda k: statistics.median(getattr(x, k) for x in slowest)  # noqa: E731
    return Inputs(grads, med("backward_ms"), med("forward_ms"), med("optimizer_ms"))


@reading(run="bucket-sweep")
def measured_timeline(run, plan: str, step: int | None = None, rank: int = 0) -> dict:
    """One measured step of `plan` on `rank` (default: its median step by step time): bucket
    launch/done, last gradient ready and backward's return, in ms after backward started (to overlay
    on a simulated timeline)."""
    steps = sweep_record(run, rank).arm(plan).steps
    if step is None:
        step = sorted(range(len(steps)), key=lambda i: steps[i].step_ms)[len(steps) // 2]
    st = steps[step]
    ms = st.backward.ms
    return {"buckets": [{"index": b.index, "launch_ms": ms(b.launch_ns), "done_ms": ms(b.done_ns)}
                        for b in st.buckets or []],
            "last_ready_ms": st.last_ready_ms if st.backward.ready else None, "backward_ms": st.backward_ms}


@reading(run="bucket-sweep")
def in_flight(run, name: str, link: AlphaBeta, rank: int = 0) -> pd.DataFrame:
    """Every bucket of every timed step of plan `name` on `rank`: its bytes, how long its all-reduce
    took in flight (launch to done), what the isolated alpha-beta fit predicts, and their ratio."""
    steps = sweep_record(run, rank).arm(name).steps
    rows = [{"step": i, "bucket": b.index, "bytes": b.bytes, "in_flight_ms": st.backward.ms(b.done_ns) - st.backward.ms(b.launch_ns),
             "isolated_ms": link.predict(b.bytes) * 1e3} for i, st in enumerate(steps) for b in st.buckets or []]
    df = pd.DataFrame(rows)
    return df.assign(ratio=df["in_flight_ms"] / df["isolated_ms"])


# ---- per-step values, paired by (round, step in the round) -------------------------------------------
BASELINE = "compute-only"


@reading_no_run
def slowest_step_ms(rank_steps) -> float:
    """A step's time: it ends at its slowest rank."""
    return max(x.step_ms for x in rank_steps)


@reading_no_run
def last_ready_ms(rank_steps) -> float:
    """When the step's last gradient was ready, at the rank where that came latest."""
    return max(x.last_ready_ms for x in rank_steps)


@reading(run="bucket-sweep")
def per_step(run, name: str, of=slowest_step_ms) -> pd.Series:
    """`of(every rank's record of one step)` for each timed step of plan `name`, indexed by (round,
    step in the round). The compute-only baseline runs at both ends of every pass over the plans
    (rank/tasks/bucket_sweep.py): its step i is the mean of its two steps around the plans' step i."""
    values, seen = {}, {}
    for s in _arm_steps(run, name):
        r = s[0].round
        seen[r] = seen.get(r, 0) + 1
        values[(r, seen[r] - 1)] = of(s)
    if name == BASELINE and values:
        values = {(r, i): (values[(r, 2 * i)] + values[(r, 2 * i + 1)]) / 2 for r, n in seen.items() for i in range(n // 2)}
    return pd.Series(values, dtype=float).rename_axis(["round", "step"])


@reading(run="bucket-sweep")
def steps(run, of=slowest_step_ms, plans=None) -> pd.DataFrame:
    """`per_step` for every plan in `plans` (default: all, the compute-only baseline included), one
    column each; a row is one moment of the machine, so differences along a row are paired."""
    return pd.DataFrame({p: per_step(run, p, of) for p in (plans or arm_names(run))})


def _pairs(table: pd.DataFrame, a: str, b: str) -> tuple[list[float], list[float]]:
    both = table[[a, b]].dropna()
    return both[a].tolist(), both[b].tolist()


# ---- the timing claims, judged on paired steps -------------------------------------------------------
@reading_no_run
def judge_costs(table: pd.DataFrame) -> dict[str, claims.Verdict]:
    """Per synchronized plan in `steps(run)`: "synchronizing costs time" (its step minus the
    compute-only step around it, paired per step, above 0). A plan that measured faster than doing
    no communication at all would say the noise, not the plan, was measured."""
    return {p: claims.paired(f"{p}'s step is slower than the compute-only step", *_pairs(table, p, BASELINE), above=0.0)
            for p in table.columns if p != BASELINE}


@reading_no_run
def ordered(table: pd.DataFrame, a: str, b: str) -> claims.Verdict:
    """Plan `b`'s step against plan `a`'s, paired per step: the claim "b is slower than a"; it
    holds (b slower), is contradicted (b faster) or cannot resolve (this run cannot order them)."""
    return claims.paired(f"{b} is slower than {a}", *_pairs(table, b, a), above=0.0)


@reading_no_run
def faster_than(table: pd.DataFrame, base: str, plans, what: str = "is faster than") -> dict[str, claims.Verdict]:
    """Per plan: "its step is faster than `base`'s" (plan minus base, paired per step, below 0); `what` words
    another quantity's claim (a table of exposed tails: "leaves a shorter exposed tail than")."""
    return {p: claims.paired(f"{p} {what} {base}", *_pairs(table, p, base), below=0.0) for p in plans}


@reading_no_run
def verdict_table(verdicts: dict) -> pd.DataFrame:
    """One row per verdict of an open question (`faster_than`): its median, interval and this run's answer
    (`claims.answer`: "yes", "no, the opposite" or "not resolved"; never a failed check's word), and where
    this run cannot resolve it, a quiet reference run's answer (`claims.noted`; the column only if any)."""
    table = pd.DataFrame({k: {"median": v.center, "low": v.low, "high": v.high, "answer": claims.answer(v), "reference run":
                              claims.noted(v)} for k, v in verdicts.items()}).T.astype({"median": float, "low": float, "high": float})
    return table if table["reference run"].any() else table.drop(columns="reference run")


@reading_no_run
def judge_split_tail(tails: pd.DataFrame, uncut: str, split: str, on: str = "") -> claims.Verdict:
    """`tails` = steps(run, record.exposed_tail_ms, plans): "cutting the last bucket in two shortens
    the exposed tail" (split minus uncut, paired per step, below 0); `on` names the link, if any."""
    return claims.paired(f"{split} has a shorter exposed tail than {uncut}{f' ({on})' if on else ''}",
                         *_pairs(tails, split, uncut), below=0.0)


@reading_no_run
def judge_split_compute(last_ready: pd.DataFrame, uncut: str, split: str, on: str = "") -> claims.Verdict:
    """`last_ready` = steps(run, last_ready_ms, plans): the split's last gradient is ready later than the
    uncut plan's (paired per step, above 0). Beside `judge_split_tail`: a shorter tail with no less compute."""
    return claims.paired(f"{split} computes no less: backward ends after {uncut}'s{f' ({on})' if on else ''} "
                         "(last gradient ready, split minus uncut, per step)", *_pairs(last_ready, split, uncut), above=0.0)


@reading_no_run
def split_finding(tails: pd.DataFrame, step_table: pd.DataFrame, uncut: str, split: str) -> str:
    """The textbook's hypothesis about cutting the last bucket, answered by this run in words (not a
    check): did the split shorten the exposed tail (`judge_split_tail`), and how did the steps compare?"""
    t, s = judge_split_tail(tails, uncut, split), ordered(step_table, uncut, split)
    tail = {claims.HOLDS: "shorter", claims.CONTRADICTED: "longer"}.get(t.outcome, "not resolved")
    step = {claims.HOLDS: "slower", claims.CONTRADICTED: "faster"}.get(s.outcome, "not resolved")
    return f"{uncut} -> {split}: exposed tail {tail} (seen {t.effect()}), step {step} (seen {s.effect()})"


@reading(run="bucket-sweep")
def judge_launch_order(run, name: str, bucket: int | None = None, before: bool = False) -> claims.Verdict:
    """"`name`'s bucket `bucket` (None: its first) is launched only after (or, `before`, already
    before) the last gradient is ready", on every rank: per step the smallest (largest) gap."""
    which = "its first bucket" if bucket is None else f"bucket {bucket}"
    def gap(s):
        g = [(x.first_launch_ms if bucket is None else x.backward.ms(x.buckets[bucket].launch_ns)) - x.last_ready_ms for x in s]
        return max(g) if before else min(g)
    when = "before the last gradient is ready" if before else "only once the last gradient is ready"
    return claims.judge(f"{name}: {which} is launched {when} (on every rank; launch minus last ready, per step)",
                        per_step(run, name, gap).tolist(), **({"below": 0.0} if before else {"above": 0.0}))


@reading(run="bucket-sweep")
def judge_in_flight(run, name: str, link: AlphaBeta) -> claims.Verdict:
    """"An all-reduce takes longer from launch to done inside a step than alone": per step, the median
    over its buckets (every rank's) of launch-to-done time over the isolated fit's prediction, above 1.
    Launch to done also holds the wait for the other ranks' launch and for the buckets ahead, so this
    is not by itself evidence that communication and compute share a core (`judge_stretch` is)."""
    flights = pd.concat([in_flight(run, name, link, r) for r in range(len(run.ranks))])
    values = flights.groupby("step")["ratio"].median().tolist()
    return claims.judge(f"{name}: an all-reduce takes longer from launch to done than alone (median launch-to-done "
                        "/ isolated cost over the buckets, per step)", values, above=1.0, unit="x")


@reading(run="bucket-sweep")
def judge_stretch(run, name: str) -> claims.Verdict:
    """"Communication stretches backward": per step, `name`'s last gradient ready time over the
    compute-only one around it (each at its latest rank), above 1."""
    t = steps(run, last_ready_ms, [name, BASELINE])
    return claims.paired(f"{name}: communication stretches backward (last gradient ready, against the compute-only "
                         "step)", *_pairs(t, name, BASELINE), ratio=True, above=1.0)


@reading(run="bucket-sweep")
def added_ms(run, name: str) -> pd.Series:
    """Per step, what plan `name` added to the step: its step minus the compute-only step around it."""
    return steps(run, plans=[name, BASELINE]).pipe(lambda t: t[name] - t[BASELINE]).dropna()


@reading(run="bucket-sweep")
def summed_in_flight_ms(run, name: str, rank: int = 0) -> pd.Series:
    """Per step, `rank`'s launch-to-done intervals of every bucket, summed (ms)."""
    def summed(s):
        x = s[rank]
        return sum(x.backward.ms(b.done_ns) - x.backward.ms(b.launch_ns) for b in x.buckets)
    return per_step(run, name, summed)


@reading(run="bucket-sweep")
def judge_summed_vs_added(run, name: str) -> claims.Verdict:
    """"Summed launch-to-done intervals overstate what the plan adds": summed (rank 0) minus added, per step, > 0."""
    both = pd.DataFrame({"summed": summed_in_flight_ms(run, name), "added": added_ms(run, name)}).dropna()
    return claims.paired(f"{name}: summed launch-to-done times overstate what it adds to the step",
                         both["summed"], both["added"], above=0.0)


@reading(run="bucket-sweep")
def judge_isolated_price(run, name: str, summed_isolated_ms: float, within: float = 0.25) -> claims.Verdict:
    """The hypothesis "nothing is hidden: plan `name` adds its buckets' isolated costs summed, to within
    `within`" (per step, added over `summed_isolated_ms`): a finding about the machine, not a check."""
    values = (added_ms(run, name) / summed_isolated_ms).tolist()
    return claims.judge(f"{name} adds within {within:.0%} of its isolated costs summed (added over the isolated "
                        "sum, per step)", values, within=(1 - within, 1 + within), unit="x")


@reading(run="bucket-sweep")
def launched_before_last_ready(run, name: str, bucket: int) -> list[bool]:
    """For every timed step of plan `name` on every rank: did bucket `bucket` start its all-reduce
    before that step's last gradient was ready (so part of it could hide behind backward)?"""
    return [st.backward.ms(b.launch_ns) < st.last_ready_ms for steps_ in _arm_steps(run, name)
            for st in steps_ for b in st.buckets if b.index == bucket]


@reading(run="bucket-sweep")
def summed_vs_added(run, name: str, link: AlphaBeta, cost, ins: Inputs, layout) -> dict:
    """Three prices of plan `name`'s communication (ms): launch-to-done intervals summed (median over rank
    0's steps), isolated costs under `cost` summed, and what it added to the step (median and `claims`
    interval of its step minus the compute-only one); and the median span (first launch to last done)."""
    size = {g.name: g.bytes for g in ins.grads}
    table = measured(run)
    center, low, high = claims.median_interval(added_ms(run, name).tolist())
    return {"summed_in_flight_ms": float(summed_in_flight_ms(run, name).median()),
            "span_ms": float(table.loc[name, "comm_end_ms"] - table.loc[name, "first_launch_ms"]),
            "summed_isolated_ms": sum(cost.allreduce_ms(sum(size[n] for n in b)) for b in layout),
            "added_ms": center, "added_low_ms": low, "added_high_ms": high}
