"""What a bucket sweep measured (`BucketSweep`, `rank/tasks/bucket_sweep.py`), as tables.

- `measured(run)`: per plan, the step time (each step timed by its slowest rank; the median of each
  round's median, and the spread of those round medians), backward, first launch, last gradient
  ready, communication end and exposed tail, as the ranks recorded them;
- `inputs(run)`: what the simulator takes from the same run: every gradient's median ready time in
  the compute-only backward, that backward's length, forward and optimizer time;
- `trustworthy`, `tail_difference`, `step_difference`: whether this machine's noise lets the sweep judge
  a timing claim, and the verdict on two plans' exposed tails or steps ("tie" when it cannot tell);
- `launched_before_last_ready`, `summed_vs_added`: did a bucket start before backward's end; three
  ways to price a plan's communication.
Numbers in, DataFrames out (no processes); `tables/buckets.py` puts the simulator beside them.
Used by notebook 05, its bucket slider and bench/simulator_accuracy.py.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pandas as pd

from ..predict import buckets as simulator
from ..predict.buckets import Grad
from ..predict.comm import AlphaBeta
from ..spec.tasks import parse_plan


def sweep_record(run, rank: int = 0):
    """What `rank` recorded (`record.BucketSweepRecord`)."""
    if run.spec.task.kind != "bucket-sweep":
        raise ValueError("this run is not a bucket sweep: use recipes.bucket_sweep()")
    return run.ranks[rank].result


def _arm_steps(run, name: str) -> list[list]:
    """Per timed step, every rank's record of it (`record.SweepStep`)."""
    per_rank = [sweep_record(run, i).arm(name).steps for i in range(len(run.ranks))]
    return [list(s) for s in zip(*per_rank)]


def step_times(run, name: str) -> dict[int, list[float]]:
    """Per round, `name`'s timed steps, each timed by its slowest rank (ms)."""
    rounds: dict[int, list[float]] = {}
    for s in _arm_steps(run, name):
        rounds.setdefault(s[0].round, []).append(max(x.step_ms for x in s))
    return rounds


def arm_names(run) -> list[str]:
    return [a.name for a in sweep_record(run).arms]


def cap_of(name: str) -> float | None:
    """The bucket cap (MiB) of a plan name; None for DDP's default and for compute-only."""
    return None if name == "compute-only" else parse_plan(name)[1]


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
            row["exposed_tail_ms"] = med(lambda x: max(0.0, x.after_last_ready_ms))
        rows.append(row)
    return pd.DataFrame(rows).set_index("plan")


def robust_spread(values) -> float:
    """The run-to-run spread: 1.4826 x the median absolute deviation (the standard deviation for
    normal noise, but one disturbed round does not inflate it)."""
    if len(values) < 2:
        return 0.0
    m = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - m) for v in values)


def median_error(values) -> float:
    """The standard error of a median of `values`, robustly: `robust_spread` / sqrt(n)."""
    return robust_spread(values) / len(values) ** 0.5 if values else 0.0


def round_summary(rounds: dict[int, list[float]]) -> tuple[float, float]:
    """(median, spread) of a quantity timed in interleaved rounds: the median of the per-round medians,
    and the spread 1.4826 x MAD of them, at least what step-to-step noise implies for a median of one
    round's steps (a few rounds can agree by luck)."""
    medians = [statistics.median(v) for v in rounds.values()]
    every = [t for v in rounds.values() for t in v]
    per_round = max(1, round(len(every) / len(rounds)))
    return statistics.median(medians), max(robust_spread(medians), robust_spread(every) / per_round ** 0.5)


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


def inputs(run) -> Inputs:
    """A collective starts when its last rank joins, so each compute-only step is represented by its
    slowest rank (the ranks start every step together): that rank's ready times, backward, forward
    and optimizer; then the median of each over the steps."""
    sweep = sweep_record(run)
    sizes = sweep.parameter_bytes
    slowest = [max(s, key=lambda x: x.step_ms) for s in _arm_steps(run, "compute-only")]
    ready: dict[str, list[float]] = {}
    for x in slowest:
        for n, t in x.ready_ms():
            ready.setdefault(n, []).append(t)
    names = sweep.ready_order
    grads = simulator.grads_in_ready_order(names, [sizes[n] for n in names], [statistics.median(ready[n]) for n in names])
    med = lambda k: statistics.median(getattr(x, k) for x in slowest)  # noqa: E731
    return Inputs(grads, med("backward_ms"), med("forward_ms"), med("optimizer_ms"))


def measured_timeline(run, plan: str, step: int | None = None, rank: int = 0) -> dict:
    """One measured step of `plan` on `rank` (default: its median step by step time): bucket
    launch/done, last gradient ready and backward's return, in ms after backward started (to overlay
    on a simulated timeline)."""
    steps = sweep_record(run, rank).arm(plan).steps
    if step is None:
        order = sorted(range(len(steps)), key=lambda i: steps[i].step_ms)
        step = order[len(order) // 2]
    st = steps[step]
    ms = st.backward.ms
    return {"buckets": [{"index": b.index, "launch_ms": ms(b.launch_ns), "done_ms": ms(b.done_ns)}
                        for b in st.buckets or []],
            "last_ready_ms": st.last_ready_ms if st.backward.ready else None, "backward_ms": st.backward_ms}


def in_flight(run, name: str, link: AlphaBeta, rank: int = 0) -> pd.DataFrame:
    """Every bucket of every timed step of plan `name` on `rank`: its bytes, how long its all-reduce
    took in flight (launch to done), what the isolated alpha-beta fit predicts, and their ratio."""
    steps = sweep_record(run, rank).arm(name).steps
    rows = [{"step": i, "bucket": b.index, "bytes": b.bytes, "in_flight_ms": st.backward.ms(b.done_ns) - st.backward.ms(b.launch_ns),
             "isolated_ms": link.predict(b.bytes) * 1e3} for i, st in enumerate(steps) for b in st.buckets or []]
    df = pd.DataFrame(rows)
    df["ratio"] = df["in_flight_ms"] / df["isolated_ms"]
    return df


def trustworthy(table: pd.DataFrame, max_spread: float = 0.10) -> tuple[bool, str]:
    """Can this sweep judge timing claims at all? No if any synchronized plan measured no slower than
    the compute-only step (impossible, so noise exceeded what is being measured), or if any plan's
    step time (the compute-only baseline's included) scattered between rounds by more than
    `max_spread`: the models are compared with every plan, and calibrated on one, so one plan's
    noise is enough to decide a comparison (a CI run: baseline 9.0%, one plan 11.2%, and the model
    calibrated on a plan that scattered 10% came out twice as far off as the textbook one)."""
    base = table.loc["compute-only"]
    faster = [p for p in table.index if p != "compute-only" and table.loc[p, "step_ms"] <= base["step_ms"]]
    if faster:
        return False, (f"{', '.join(faster)} measured no slower than the compute-only step ({base['step_ms']:.1f} ms): "
                       f"this machine's noise exceeded the communication being measured; run the sweep again")
    scatter = table["spread_ms"] / table["step_ms"]
    worst = scatter.idxmax()
    if scatter[worst] > max_spread:
        what = "the compute-only baseline" if worst == "compute-only" else f"plan {worst}"
        return False, f"{what} scattered by {scatter[worst]:.0%} between rounds; run the sweep again"
    return True, (f"every plan slower than compute-only, scatter between rounds at most {scatter[worst]:.1%} "
                  f"({worst}): timing claims can be judged")


def tail_difference(run, a: str, b: str, k: float = 2.0) -> dict:
    """Is plan `b`'s exposed tail (per step: last all-reduce done minus last gradient ready, on the
    rank where it is longest) shorter than plan `a`'s? Medians, their difference, and a tie threshold of
    k standard errors (robust: 1.4826 x MAD / sqrt(steps), the larger of the two); verdict "shorter",
    "longer" or "tie". One value per step, not per rank: the ranks' tails in one step end on the same
    collective, so they are not independent samples."""
    def tails(name):
        return [max(x.after_last_ready_ms for x in s) for s in _arm_steps(run, name)]
    ta, tb = tails(a), tails(b)
    ma, mb = statistics.median(ta), statistics.median(tb)
    threshold = k * max(median_error(ta), median_error(tb))
    diff = mb - ma
    verdict = "tie" if abs(diff) <= threshold else ("shorter" if diff < 0 else "longer")
    return {"tail_a_ms": ma, "tail_b_ms": mb, "diff_ms": diff, "threshold_ms": threshold, "verdict": verdict}


def step_difference(table: pd.DataFrame, a: str, b: str, k: float = 2.0) -> dict:
    """Is plan `b`'s step faster than plan `a`'s, in `measured(run)`? The difference of their medians
    (positive: `b` is faster), the tie threshold k x the larger of their spreads, and a verdict
    "faster", "slower" or "tie" (the same rule as `buckets.ordering`)."""
    diff = table.loc[a, "step_ms"] - table.loc[b, "step_ms"]
    threshold = k * max(table.loc[a, "spread_ms"], table.loc[b, "spread_ms"])
    verdict = "tie" if abs(diff) <= threshold else ("faster" if diff > 0 else "slower")
    return {"step_a_ms": table.loc[a, "step_ms"], "step_b_ms": table.loc[b, "step_ms"], "faster_by_ms": diff,
            "threshold_ms": threshold, "verdict": verdict}


def launched_before_last_ready(run, name: str, bucket: int) -> list[bool]:
    """For every timed step of plan `name` on every rank: did bucket `bucket` start its all-reduce
    before that step's last gradient was ready (so part of it could hide behind backward)?"""
    return [st.backward.ms(b.launch_ns) < st.last_ready_ms for steps in _arm_steps(run, name)
            for st in steps for b in st.buckets if b.index == bucket]


def summed_vs_added(run, name: str, link: AlphaBeta, cost, ins: Inputs, layout, k: float = 2.0) -> dict:
    """Three ways to price plan `name`'s communication, per step (ms): its buckets' launch-to-done
    intervals summed (median over rank 0's steps), their isolated costs under `cost` summed, and what
    the plan really added to the step (its step time minus the compute-only step's), known to within
    `added_noise_ms` (k x the larger of the two step times' spreads); and the median communication
    span (first launch to last done), which the summed intervals exceed when buckets overlap each other."""
    flights = in_flight(run, name, link)
    size = {g.name: g.bytes for g in ins.grads}
    table = measured(run)
    return {"summed_in_flight_ms": float(flights.groupby("step")["in_flight_ms"].sum().median()),
            "span_ms": float(table.loc[name, "comm_end_ms"] - table.loc[name, "first_launch_ms"]),
            "summed_isolated_ms": sum(cost.allreduce_ms(sum(size[n] for n in b)) for b in layout),
            "added_ms": float(table.loc[name, "step_ms"] - table.loc["compute-only", "step_ms"]),
            "added_noise_ms": float(k * max(table.loc[name, "spread_ms"], table.loc["compute-only", "spread_ms"]))}
