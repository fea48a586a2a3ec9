"""A measured bucket sweep against the bucket simulator: tables, calibration, the ordering check.

- `measured(run)`: per plan, the step time (each step timed by its slowest rank; the median of each
  round's median, and the spread of those round medians), backward, first launch, last gradient
  ready, communication end and exposed tail, as the ranks recorded them.
- `inputs(run)`: what the simulator takes from the same run: every gradient's median ready time in
  the compute-only backward, that backward's length, forward and optimizer time.
- `costs(...)` / `compare(...)`: the simulator's step time for every plan under three cost models
  (textbook; shared core; shared core with alpha calibrated on one plan); errors per plan.
- `ordering(...)`: for every pair of plans, does the prediction order them as the measurement does?
  Pairs whose medians differ by less than twice the run-to-run spread are ties, not verdicts; a
  prediction of equal times for a resolved pair counts as not ordered.
Numbers in, DataFrames out (pure: no processes). Used by notebook 05 and bench/simulator_accuracy.py.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass

import pandas as pd

from . import schedule
from .comm import AlphaBeta
from .schedule import Cost, Grad
from .spec import parse_plan

MIB = 2 ** 20
DDP_DEFAULT_CAP_MB, DDP_DEFAULT_FIRST_CAP_MB = 25, 1


def _sweep(run) -> dict:
    if run.spec.task != "bucket-sweep":
        raise ValueError("this run is not a bucket sweep: use recipes.bucket_sweep()")
    return run.ranks[0].raw["bucket_sweep"]


def _arm(run, name: str, rank: int = 0) -> dict:
    """What `rank` recorded for plan `name`."""
    return next(a for a in run.ranks[rank].raw["bucket_sweep"]["arms"] if a["name"] == name)


def _arm_steps(run, name: str) -> list[list[dict]]:
    """Per timed step, every rank's record of it."""
    per_rank = [_arm(run, name, i)["steps"] for i in range(len(run.ranks))]
    return [list(s) for s in zip(*per_rank)]


def _after_last_ready_ms(x: dict) -> float:
    """One step's communication after its last gradient was ready: last all-reduce done minus last ready."""
    return max(b["done_ms"] for b in x["buckets"]) - x["ready"][-1][1]


def step_times(run, name: str) -> dict[int, list[float]]:
    """Per round, `name`'s timed steps, each timed by its slowest rank (ms)."""
    rounds: dict[int, list[float]] = {}
    for s in _arm_steps(run, name):
        rounds.setdefault(s[0]["round"], []).append(max(x["step_ms"] for x in s))
    return rounds


def arm_names(run) -> list[str]:
    return [a["name"] for a in _sweep(run)["arms"]]


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
        every = [t for v in rounds.values() for t in v]
        per_round = max(1, round(len(every) / len(rounds)))
        med = lambda f: statistics.median(f(x) for s in steps for x in s)  # noqa: E731 - over steps and ranks
        row = {"plan": name, "cap_mb": cap_of(name), "step_ms": statistics.median(medians),
               # a few rounds can agree by luck: the spread is at least what step-to-step noise
               # implies for a median of that many steps
               "spread_ms": max(_robust_spread(medians), _robust_spread(every) / per_round ** 0.5),
               "round_min_ms": min(medians), "round_max_ms": max(medians),
               "forward_ms": med(lambda x: x["forward_ms"]), "backward_ms": med(lambda x: x["backward_ms"]),
               "optimizer_ms": med(lambda x: x["optimizer_ms"])}
        if steps[0][0].get("ready"):
            row["last_ready_ms"] = med(lambda x: x["ready"][-1][1])
        if steps[0][0].get("buckets"):
            row["buckets"] = len(steps[0][0]["buckets"])
            row["first_launch_ms"] = med(lambda x: min(b["launch_ms"] for b in x["buckets"]))
            row["comm_end_ms"] = med(lambda x: max(b["done_ms"] for b in x["buckets"]))
            row["exposed_tail_ms"] = med(lambda x: max(0.0, _after_last_ready_ms(x)))
        rows.append(row)
    return pd.DataFrame(rows).set_index("plan")


def _robust_spread(values) -> float:
    """The run-to-run spread: 1.4826 x the median absolute deviation (the standard deviation for
    normal noise, but one disturbed round does not inflate it)."""
    if len(values) < 2:
        return 0.0
    m = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - m) for v in values)


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
    sweep, sizes = _sweep(run), run.ranks[0].raw["parameter_bytes"]
    slowest = [max(s, key=lambda x: x["step_ms"]) for s in _arm_steps(run, "compute-only")]
    ready: dict[str, list[float]] = {}
    for x in slowest:
        for n, t in x["ready"]:
            ready.setdefault(n, []).append(t)
    names = [n for n, _ in sweep["ready_order"]]
    grads = schedule.grads_in_ready_order(names, [sizes[n] for n in names], [statistics.median(ready[n]) for n in names])
    med = lambda k: statistics.median(x[k] for x in slowest)  # noqa: E731
    return Inputs(grads, med("backward_ms"), med("forward_ms"), med("optimizer_ms"))


def plan_for(run, name: str, ins: Inputs | None = None) -> list[list[str]]:
    """The bucket plan a sweep plan used: observed where the probes saw it, else DDP's rule."""
    arm = _arm(run, name)
    if arm["layout"]:
        return [list(b) for b in arm["layout"]]
    return ddp_rule(ins or inputs(run), cap_of(name))


def ddp_rule(ins: Inputs, cap_mb: float | None) -> list[list[str]]:
    """DDP's buckets for `cap_mb` (None: its default, 25 MiB with a 1 MiB first bucket)."""
    if cap_mb is None:
        return schedule.ddp_plan(ins.grads, DDP_DEFAULT_CAP_MB * MIB, DDP_DEFAULT_FIRST_CAP_MB * MIB)
    return schedule.ddp_plan(ins.grads, cap_mb * MIB)


def predict(ins: Inputs, plan, cost: Cost) -> schedule.Schedule:
    return schedule.simulate(ins.grads, plan, cost, ins.backward_ms, ins.forward_ms, ins.optimizer_ms)


MODELS = ("textbook", "shared_core", "calibrated")


def calibrate(ins: Inputs, plan, base: Cost, measured_step_ms: float, knob: str = "alpha_ms") -> Cost:
    """`base` with `knob` fitted so that `plan`'s predicted step equals `measured_step_ms`."""
    value = schedule.calibrate(lambda v: predict(ins, plan, schedule.with_knob(base, knob, v)).step_ms,
                               measured_step_ms)
    return schedule.with_knob(base, knob, value)


def calibration_plan(layouts: dict) -> str:
    """The plan to calibrate on: the one with the most buckets, where the per-bucket start-up cost
    dominates (so its fitted value is best determined)."""
    return max(layouts, key=lambda p: len(layouts[p]))


def costs(run, link: AlphaBeta, calibrate_on: str | None = None, plans=None) -> dict[str, Cost]:
    """The three cost models compared in notebook 05:
    - textbook: the isolated alpha-beta line, perfect overlap, no copies (no fitted parameter);
    - shared_core: the same line, but communication and backward share each rank's core
      (interference 1) and every bucket's copies in and out are priced at the copy bandwidth the
      ranks measured (no fitted parameter);
    - calibrated: shared_core with the start-up cost alpha of an all-reduce launched during backward
      fitted on ONE plan (`calibrate_on`, default `calibration_plan`)."""
    return _costs(run, link, *_prepare(run, plans, calibrate_on))


def _prepare(run, plans, calibrate_on):
    """The measured table, the simulator inputs, each plan's buckets and the calibration plan."""
    table, ins = measured(run), inputs(run)
    plans = [p for p in (plans or table.index) if p != "compute-only"]
    layouts = {p: plan_for(run, p, ins) for p in plans}
    return table, ins, layouts, calibrate_on or calibration_plan(layouts)


def _costs(run, link, table, ins, layouts, calibrate_on) -> dict[str, Cost]:
    shared = Cost(link, interference=1.0, copy_bytes_per_s=_sweep(run)["copy_bytes_per_s"])
    return {"textbook": Cost(link), "shared_core": shared,
            "calibrated": calibrate(ins, layouts[calibrate_on], shared, table.loc[calibrate_on, "step_ms"])}


def compare(run, link: AlphaBeta, calibrate_on: str | None = None, plans=None) -> tuple[pd.DataFrame, dict]:
    """Measured step time per plan beside the three models' predictions (see `costs`) and their
    relative errors (predicted - measured) / measured; returns (table, costs)."""
    table, ins, layouts, calibrate_on = _prepare(run, plans, calibrate_on)
    models = _costs(run, link, table, ins, layouts, calibrate_on)
    rows = []
    for p in layouts:
        m = table.loc[p, "step_ms"]
        row = {"plan": p, "buckets": len(layouts[p]), "measured_ms": m, "spread_ms": table.loc[p, "spread_ms"]}
        for name, cost in models.items():
            pred = predict(ins, layouts[p], cost).step_ms
            row[f"{name}_ms"], row[f"{name}_error"] = pred, (pred - m) / m
        row["calibration_point"] = p == calibrate_on
        rows.append(row)
    return pd.DataFrame(rows).set_index("plan"), models


def error_summary(table: pd.DataFrame, column: str = "calibrated_error", include_calibration: bool = False) -> dict:
    """Mean and max absolute relative error over the plans (without the calibration point by default)."""
    part = table if include_calibration else table[~table["calibration_point"]]
    errs = part[column].abs()
    return {"mean_abs_error": float(errs.mean()), "max_abs_error": float(errs.max()), "worst": errs.idxmax()}


def ordering(table: pd.DataFrame, predicted: str = "calibrated_ms", k: float = 2.0) -> pd.DataFrame:
    """Every pair of plans: measured difference, the tie threshold k x the larger spread, and whether
    the prediction orders the pair as measured (None for a tie)."""
    rows = []
    for a, b in itertools.combinations(table.index, 2):
        diff = table.loc[b, "measured_ms"] - table.loc[a, "measured_ms"]
        threshold = k * max(table.loc[a, "spread_ms"], table.loc[b, "spread_ms"])
        resolved = abs(diff) > threshold
        pdiff = table.loc[b, predicted] - table.loc[a, predicted]
        rows.append({"a": a, "b": b, "measured_diff_ms": diff, "threshold_ms": threshold,
                     "predicted_diff_ms": pdiff, "verdict": "ordered" if resolved else "tie",
                     # a model that predicts the same time for both cannot order them
                     "agrees": bool(abs(pdiff) > 1e-6 and (diff > 0) == (pdiff > 0)) if resolved else None})
    df = pd.DataFrame(rows, columns=["a", "b", "measured_diff_ms", "threshold_ms", "predicted_diff_ms", "verdict", "agrees"])
    df["agrees"] = df["agrees"].astype("boolean")  # True / False, <NA> for a tie
    return df


def summary(s: schedule.Schedule) -> dict:
    """What the bucket slider shows for one schedule."""
    last = s.last_bucket
    return {"buckets": len(s.buckets), "first_launch_ms": s.first_launch_ms, "last_ready_ms": last.ready_ms,
            "last_bucket_mib": last.bytes / MIB, "exposed_tail_ms": s.exposed_tail_ms, "step_ms": s.step_ms}


def bucket_table(s: schedule.Schedule) -> pd.DataFrame:
    """Per bucket: when it is ready, its cost alone, how much backward is still to run then (the
    time it can hide behind), when the channel takes it and when it finishes."""
    rows = [{"bucket": b.index, "tensors": len(b.params), "mib": b.bytes / MIB, "ready_ms": b.ready_ms,
             "cost_ms": b.cost_ms, "backward_left_ms": max(0.0, s.backward_ms - b.ready_ms),
             "start_ms": b.start_ms, "finish_ms": b.finish_ms} for b in s.buckets]
    return pd.DataFrame(rows).set_index("bucket")


def candidates(ins: Inputs, cost: Cost, caps_mb, split_cap_mb: float | None = None) -> pd.DataFrame:
    """The worked example's table: for each cap, DDP's plan from the measured ready order, and (if
    given) the plan at `split_cap_mb` with its last bucket cut in two; the last bucket's ready time,
    cost and the backward left to hide it, the exposed tail and the predicted step."""
    plans = {f"ddp:{c:g}": ddp_rule(ins, c) for c in caps_mb}
    if split_cap_mb is not None:
        plans[f"split:{split_cap_mb:g}"] = schedule.split_bucket(ddp_rule(ins, split_cap_mb), ins.grads)
    rows = []
    for name, plan in plans.items():
        s = predict(ins, plan, cost)
        last = s.last_bucket
        rows.append({"plan": name, "buckets": len(plan), "first_launch_ms": s.first_launch_ms,
                     "last_ready_ms": last.ready_ms, "last_cost_ms": last.cost_ms,
                     "backward_left_ms": max(0.0, s.backward_ms - last.ready_ms),
                     "exposed_tail_ms": s.exposed_tail_ms, "step_ms": s.step_ms})
    return pd.DataFrame(rows).set_index("plan")


def measured_timeline(run, plan: str, step: int | None = None, rank: int = 0) -> dict:
    """One measured step of `plan` on `rank` (default: its median step by step time): bucket
    launch/done, last gradient ready and backward's return, in ms after backward started (to overlay
    on a simulated timeline)."""
    arm = _arm(run, plan, rank)
    if step is None:
        order = sorted(range(len(arm["steps"])), key=lambda i: arm["steps"][i]["step_ms"])
        step = order[len(order) // 2]
    st = arm["steps"][step]
    return {"buckets": st.get("buckets", []), "last_ready_ms": st["ready"][-1][1] if st.get("ready") else None,
            "backward_ms": st["backward_ms"]}


def in_flight(run, name: str, link: AlphaBeta, rank: int = 0) -> pd.DataFrame:
    """Every bucket of every timed step of plan `name` on `rank`: its bytes, how long its all-reduce
    took in flight (launch to done), what the isolated alpha-beta fit predicts, and their ratio."""
    arm = _arm(run, name, rank)
    rows = [{"step": i, "bucket": b["index"], "bytes": b["bytes"], "in_flight_ms": b["done_ms"] - b["launch_ms"],
             "isolated_ms": link.predict(b["bytes"]) * 1e3} for i, st in enumerate(arm["steps"]) for b in st.get("buckets", [])]
    df = pd.DataFrame(rows)
    df["ratio"] = df["in_flight_ms"] / df["isolated_ms"]
    return df


def trustworthy(table: pd.DataFrame, max_baseline_spread: float = 0.10) -> tuple[bool, str]:
    """Can this sweep judge timing claims at all? No if any synchronized plan measured no slower than
    the compute-only step (impossible, so noise exceeded what is being measured), or if the
    compute-only baseline scattered between rounds by more than `max_baseline_spread`."""
    base = table.loc["compute-only"]
    faster = [p for p in table.index if p != "compute-only" and table.loc[p, "step_ms"] <= base["step_ms"]]
    if faster:
        return False, (f"{', '.join(faster)} measured no slower than the compute-only step ({base['step_ms']:.1f} ms): "
                       f"this machine's noise exceeded the communication being measured; run the sweep again")
    scatter = base["spread_ms"] / base["step_ms"]
    if scatter > max_baseline_spread:
        return False, f"the compute-only baseline scattered by {scatter:.0%} between rounds; run the sweep again"
    return True, f"every plan slower than compute-only, baseline scatter {scatter:.1%}: timing claims can be judged"


def tail_difference(run, a: str, b: str, k: float = 2.0) -> dict:
    """Is plan `b`'s exposed tail (per step and rank: last all-reduce done minus last gradient ready)
    shorter than plan `a`'s? Medians, their difference, and a tie threshold of k standard errors
    (robust: 1.4826 x MAD / sqrt(n), the larger of the two); verdict "shorter", "longer" or "tie"."""
    def tails(name):
        return [_after_last_ready_ms(x) for s in _arm_steps(run, name) for x in s]
    ta, tb = tails(a), tails(b)
    ma, mb = statistics.median(ta), statistics.median(tb)
    threshold = k * max(_robust_spread(ta) / len(ta) ** 0.5, _robust_spread(tb) / len(tb) ** 0.5)
    diff = mb - ma
    verdict = "tie" if abs(diff) <= threshold else ("shorter" if diff < 0 else "longer")
    return {"tail_a_ms": ma, "tail_b_ms": mb, "diff_ms": diff, "threshold_ms": threshold, "verdict": verdict}
