"""Bucket plans predicted by the simulator (`predict/buckets.py`) and compared with a measured sweep.

- `ddp_rule`, `predict`: DDP's buckets for a cap, and the simulated step, from a sweep's `inputs`;
- `costs(...)` / `compare(...)`: the simulator's step time for every plan under three cost models
  (textbook; shared core; shared core with alpha calibrated on one plan); errors per plan;
- `ordering(...)`: for every pair of plans, does the prediction order them as the measurement does?
  The measurement orders a pair only where `claims` resolves its paired steps; the rest cannot be
  resolved (ties, not verdicts); a prediction of equal times for a resolved pair counts as not ordered;
- `judge_optimistic`, `judge_closer`: the models against the measurement, judged per step (every
  plan measured in the same round, so the machine's load hits every plan of a step alike);
- `candidates`, `bucket_table`, `summary`: the worked example's tables; `is_last_split`: a cut last bucket?
Numbers in, DataFrames out (no processes), for notebook 05, its slider and bench/simulator_accuracy.py.
"""

from __future__ import annotations

import itertools

import pandas as pd

from .. import claims
from ..predict.buckets import Cost, Schedule, ddp_plan, simulate, split_bucket, with_knob
from ..predict.buckets import calibrate as fit_one_knob   # this module has a calibrate of its own
from ..predict.comm import AlphaBeta
from ..spec.bucket_sweep import Plan
from ..record.timeline import exposed_tail_ms
from ..units import MIB, rel_error
from . import bucket_sweep
from .bucket_sweep import Inputs, sweep_record, cap_of, inputs, measured
from .reads import reading, reading_no_run
from .stats import slowest_rank


DDP_DEFAULT_CAP_MB, DDP_DEFAULT_FIRST_CAP_MB = 25, 1


@reading(run="bucket-sweep")
def plan_for(run, name: str, ins: Inputs | None = None) -> list[list[str]]:
    """The bucket plan a sweep plan used: observed where the probes saw it, else DDP's rule."""
    arm = sweep_record(run).arm(name)
    if arm.layout:
        return [list(b) for b in arm.layout]
    return ddp_rule(ins or inputs(run), cap_of(name))


@reading_no_run
def ddp_rule(ins: Inputs, cap_mb: float | None) -> list[list[str]]:
    """DDP's buckets for `cap_mb` (None: its default, 25 MiB with a 1 MiB first bucket)."""
    return rule_for(ins.grads, cap_mb)


@reading_no_run
def rule_for(grads, cap_mb: float | None) -> list[list[str]]:
    """DDP's buckets for `cap_mb` over `grads` in ready order (None: its default caps)."""
    if cap_mb is None:
        return ddp_plan(grads, DDP_DEFAULT_CAP_MB * MIB, DDP_DEFAULT_FIRST_CAP_MB * MIB)
    return ddp_plan(grads, cap_mb * MIB)


@reading_no_run
def predict(ins: Inputs, plan, cost: Cost) -> Schedule:
    return simulate(ins.grads, plan, cost, ins.backward_ms, ins.forward_ms, ins.optimizer_ms)


MODELS = ("textbook", "shared_core", "calibrated")


@reading_no_run
def calibrate(ins: Inputs, plan, base: Cost, measured_step_ms: float, knob: str = "alpha_ms") -> Cost:
    """`base` with `knob` fitted so that `plan`'s predicted step equals `measured_step_ms`."""
    value = fit_one_knob(lambda v: predict(ins, plan, with_knob(base, knob, v)).step_ms, measured_step_ms)
    return with_knob(base, knob, value)


@reading_no_run
def calibration_plan(layouts: dict) -> str:
    """The plan to calibrate on: the one with the most buckets, where the per-bucket start-up cost dominates
    (so its fitted value is best determined), among those on the link's own bandwidth (`Plan.link_bandwidth`)."""
    return max((p for p in layouts if Plan.parse(p).link_bandwidth == 1), key=lambda p: len(layouts[p]))


@reading(run="bucket-sweep")
def costs(run, link: AlphaBeta, calibrate_on: str | None = None, plans=None) -> dict[str, Cost]:
    """The three cost models compared in notebook 05:
    - textbook: the isolated alpha-beta line, perfect overlap, no copies (no fitted parameter);
    - shared_core: the same line, but communication and backward share each rank's core
      (interference 1) and every bucket's copies in and out are priced at the copy bandwidth the
      ranks measured (no fitted parameter);
    - calibrated: shared_core with the start-up cost alpha of an all-reduce launched during backward
      fitted on ONE plan (`calibrate_on`, default `calibration_plan`).
    A run on an emulated link gets the link's wire time in every model (`Cost.link_hold`), after
    the all-reduce whose line `link` is (fitted on loopback)."""
    return _costs(run, link, *_prepare(run, plans, calibrate_on))


def _prepare(run, plans, calibrate_on):
    """The measured table, the simulator inputs, each plan's buckets and the calibration plan."""
    table, ins = measured(run), inputs(run)
    plans = [p for p in (plans or table.index) if p != "compute-only"]
    layouts = {p: plan_for(run, p, ins) for p in plans}
    if calibrate_on and Plan.parse(calibrate_on).link_bandwidth != 1:
        raise ValueError(f"calibrate_on: {calibrate_on!r} ran on another bandwidth than the link's; calibrate on a plan of its own")
    return table, ins, layouts, calibrate_on or calibration_plan(layouts)


def _costs(run, link, table, ins, layouts, calibrate_on) -> dict[str, Cost]:
    on = getattr(run.spec, "link", None)   # a run on an emulated link: its wire time is known, not fitted
    hold = AlphaBeta(*on.alpha_beta(run.world_size)) if on is not None else None
    shared = Cost(link, interference=1.0, copy_bytes_per_s=sweep_record(run).copy_bytes_per_s, link_hold=hold)
    return {"textbook": Cost(link, link_hold=hold), "shared_core": shared,
            "calibrated": calibrate(ins, layouts[calibrate_on], shared, table.loc[calibrate_on, "step_ms"])}


@reading(run="bucket-sweep")
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
            pred = predict(ins, layouts[p], cost.link_faster(Plan.parse(p).link_bandwidth)).step_ms
            row[f"{name}_ms"], row[f"{name}_error"] = pred, rel_error(pred, m)
        row["calibration_point"] = p == calibrate_on
        rows.append(row)
    return pd.DataFrame(rows).set_index("plan"), models


@reading_no_run
def error_summary(table: pd.DataFrame, column: str = "calibrated_error", include_calibration: bool = False) -> dict:
    """Mean and max absolute relative error over the plans (without the calibration point by default)."""
    part = table if include_calibration else table[~table["calibration_point"]]
    errs = part[column].abs()
    return {"mean_abs_error": float(errs.mean()), "max_abs_error": float(errs.max()), "worst": errs.idxmax()}


@reading_no_run
def ordering(table: pd.DataFrame, step_table: pd.DataFrame, predicted: str = "calibrated_ms") -> pd.DataFrame:
    """Every pair of plans in `table` (`compare`'s): the measured difference b - a, judged on the
    paired steps of `step_table` (`bucket_sweep.steps`), and whether the prediction orders the pair as
    measured (None where this run cannot resolve the pair: a tie, not a verdict)."""
    rows = []
    for a, b in itertools.combinations(table.index, 2):
        v = bucket_sweep.ordered(step_table, a, b)
        pdiff = table.loc[b, predicted] - table.loc[a, predicted]
        measured_slower = v.holds
        rows.append({"a": a, "b": b, "measured_diff_ms": v.center, "low_ms": v.low, "high_ms": v.high,
                     "predicted_diff_ms": pdiff, "verdict": "ordered" if v.resolved else claims.UNRESOLVED,
                     # a model that predicts the same time for both cannot order them
                     "agrees": bool(abs(pdiff) > 1e-6 and measured_slower == (pdiff > 0)) if v.resolved else None})
    df = pd.DataFrame(rows, columns=["a", "b", "measured_diff_ms", "low_ms", "high_ms", "predicted_diff_ms", "verdict", "agrees"])
    df["agrees"] = df["agrees"].astype("boolean")  # True / False, <NA> where the pair cannot be resolved
    return df


@reading_no_run
def step_errors(table: pd.DataFrame, step_table: pd.DataFrame, model: str, plans=None,
                baseline: str = "compute-only") -> pd.DataFrame:
    """Per step (a row of `bucket_sweep.steps`: every plan measured in one round), `model`'s relative
    error (predicted - measured) / measured for each plan in `plans` (default: `table`'s).

    The models' compute comes from medians of the compute-only steps, so they predict a step at the
    machine's median pace. Where `step_table` has the `baseline` column (the step measured without
    communication in the same round and position), each row's prediction is scaled by that step over
    the column's median: a round where compute alone ran 30% slow expects every plan 30% slower, so
    load that moves every arm alike drops out of the errors (the baseline measured beside the plans,
    not at another moment). The whole predicted step is scaled, communication included: right where
    compute and communication share the cores and slow down together (gloo on a CPU, chapter 05's
    sweep on loopback); on a GPU, or with an emulated link's fixed wire time, it over-corrects the
    communication part. Without the column the predictions are used as they are."""
    plans = list(plans if plans is not None else table.index)
    pace = step_table[baseline] / step_table[baseline].median() if baseline in step_table else 1.0
    return pd.DataFrame({p: (table.loc[p, f"{model}_ms"] * pace - step_table[p]) / step_table[p]
                         for p in plans}).dropna()


def _paced(step_table: pd.DataFrame, baseline: str = "compute-only") -> str:
    """What the claim's text says of the pacing `step_errors` applied (nothing where it applied none)."""
    return ", at that step's compute-only pace" if baseline in step_table else ""


@reading_no_run
def judge_optimistic(table: pd.DataFrame, step_table: pd.DataFrame, model: str = "textbook") -> claims.Verdict:
    """"`model` is optimistic on average": per step, its mean signed error over the plans (paced by
    that row's compute-only step: `step_errors`), below 0."""
    values = step_errors(table, step_table, model).mean(axis=1).tolist()
    return claims.judge(f"the {model} model is optimistic on average (mean signed error over the plans, per step"
                        f"{_paced(step_table)})",
                        values, below=0.0, unit="")


@reading_no_run
def judge_closer(table: pd.DataFrame, step_table: pd.DataFrame, model: str = "calibrated",
                 than: str = "textbook") -> claims.Verdict:
    """"`model` is closer than `than`": per step, the mean |error| of `model` minus that of `than` over
    the plans other than the calibration point (paced as in `step_errors`), below 0."""
    held_out = table.index[~table["calibration_point"]]
    gap = step_errors(table, step_table, model, held_out).abs().mean(axis=1) - \
        step_errors(table, step_table, than, held_out).abs().mean(axis=1)
    return claims.judge(f"the {model} model is closer than the {than} one (mean |error| over the {len(held_out)} "
                        f"plans other than the calibration point, minus the {than}'s, per step{_paced(step_table)})",
                        gap.dropna().tolist(), below=0.0, unit="")


def _repeat_ms(allreduce_run) -> dict[int, list[float]]:
    """Per message size of an all-reduce sweep, every repeat's time at its slowest rank (ms); the
    sizes alternate order from repeat to repeat, so repeat i of one size pairs with repeat i of another."""
    return {per_rank[0].bytes: slowest_rank([c.ms for c in per_rank])
            for per_rank in zip(*[r.result.sizes for r in allreduce_run.ranks])}


@reading(allreduce_run="allreduce-sweep")
def judge_bandwidth_term(allreduce_run, n_bytes: int, times: float = 5.0) -> claims.Verdict:
    """"At `n_bytes` the bandwidth term n*beta is more than `times` x alpha": on the line t = alpha + n*beta,
    the same as t(n) / t(smallest) > times + 1 (up to the smallest message's own bytes), judged on the
    sweep's repeats, paired (the largest size at most `n_bytes`)."""
    ms = _repeat_ms(allreduce_run)
    small = min(ms)
    if not small <= n_bytes:
        raise ValueError(f"n_bytes: {n_bytes} is below the sweep's smallest message ({small} B); its sizes: "
                         f"{_sizes_said(ms)}")
    big = max(n for n in ms if n <= n_bytes)
    return claims.paired(f"{big / MIB:g} MiB take over {times + 1:g}x the time of {small // 1024} KiB, so n*beta > "
                         f"{times:g} alpha (on the line t = alpha + n*beta; per-repeat ratio)", ms[big], ms[small],
                         ratio=True, above=times + 1)


@reading(allreduce_run="allreduce-sweep")
def judge_startup_term(allreduce_run, k: int = 16) -> claims.Verdict:
    """"For the smallest message n, n*beta is below alpha": on the line, t(k n) / t(n) = (alpha + k x) /
    (alpha + x) with x = n*beta, which is below (1 + k) / 2 exactly when x < alpha; judged on the
    sweep's repeats, paired. k = 16 (64 KiB against 4 KiB): where start-up dominates, the ratio sits
    near 1 whatever k is, while the threshold (1 + k) / 2 rises with k, so the small messages' noise
    (on a shared machine one 4 KiB all-reduce takes 0.3 ms, the next 8 ms) cannot hide the claim; with
    k = 4 (threshold 2.5) a quiet machine resolved it in 4 of 10 runs."""
    ms = _repeat_ms(allreduce_run)
    small = min(ms)
    if k * small not in ms:
        raise ValueError(f"allreduce_run: the claim compares {k * small} B (k={k} x the smallest message) with "
                         f"{small} B, and this sweep measured no {k * small} B; its sizes: {_sizes_said(ms)}. "
                         f"Give a sweep with max_bytes of at least {k * small} (recipes.allreduce_sweep), or a k "
                         f"it measured")
    return claims.paired(f"{k * small // 1024} KiB take under {(1 + k) / 2:g}x the time of {small // 1024} KiB, so "
                         f"for {small // 1024} KiB n*beta < alpha (on the line; per-repeat ratio)", ms[k * small], ms[small],
                         ratio=True, below=(1 + k) / 2)


def _sizes_said(ms: dict) -> str:
    return ", ".join(f"{n} B" for n in sorted(ms))


@reading_no_run
def is_last_split(split: list[list[str]], plan: list[list[str]]) -> bool:
    """Is `split` exactly `plan` with its last bucket cut in two (same buckets before it, and the two
    pieces, in order, are the last bucket tensor for tensor)?"""
    return (len(plan) >= 1 and len(split) == len(plan) + 1 and all(split[-2:])
            and split[:-2] + [split[-2] + split[-1]] == plan)


@reading_no_run
def summary(s: Schedule) -> dict:
    """What the bucket slider shows for one schedule."""
    last = s.last_bucket
    return {"buckets": len(s.buckets), "first_launch_ms": s.first_launch_ms, "last_ready_ms": last.ready_ms,
            "last_bucket_mib": last.bytes / MIB, "exposed_tail_ms": s.exposed_tail_ms, "step_ms": s.step_ms}


@reading_no_run
def bucket_table(s: Schedule) -> pd.DataFrame:
    """Per bucket: when it is ready, its cost alone, how much backward is still to run then (the
    time it can hide behind), when the channel takes it and when it finishes."""
    rows = [{"bucket": b.index, "tensors": len(b.params), "mib": b.bytes / MIB, "ready_ms": b.ready_ms,
             "cost_ms": b.cost_ms, "backward_left_ms": max(0.0, s.backward_ms - b.ready_ms),
             "start_ms": b.start_ms, "finish_ms": b.finish_ms} for b in s.buckets]
    return pd.DataFrame(rows).set_index("bucket")


@reading_no_run
def candidates(ins: Inputs, cost: Cost, caps_mb, split_cap_mb: float | None = None) -> pd.DataFrame:
    """The worked example's table: for each cap, DDP's plan from the measured ready order, and (if
    given) the plan at `split_cap_mb` with its last bucket cut in two; the last bucket's ready time,
    cost and the backward left to hide it, the exposed tail and the predicted step."""
    plans = {str(Plan("ddp", c)): ddp_rule(ins, c) for c in caps_mb}
    if split_cap_mb is not None:
        plans[str(Plan("split", split_cap_mb))] = split_bucket(ddp_rule(ins, split_cap_mb), ins.grads)
    rows = []
    for name, plan in plans.items():
        s = predict(ins, plan, cost)
        last = s.last_bucket
        rows.append({"plan": name, "buckets": len(plan), "first_launch_ms": s.first_launch_ms,
                     "last_ready_ms": last.ready_ms, "last_cost_ms": last.cost_ms,
                     "backward_left_ms": max(0.0, s.backward_ms - last.ready_ms),
                     "exposed_tail_ms": s.exposed_tail_ms, "step_ms": s.step_ms})
    return pd.DataFrame(rows).set_index("plan")


@reading(run="bucket-sweep")
def modelled_tails(run, link: AlphaBeta, plans) -> dict[str, float]:
    """The textbook model's exposed tail (ms) per plan of a run on an emulated link (the loopback line `link`,
    then the link's wire time, at the plan's `Plan.link_bandwidth`, as the rank holds it)."""
    if getattr(run.spec, "link", None) is None:
        raise ValueError(f"run: {run.spec.name!r} ran on loopback; modelled_tails is for a run on Experiment.link")
    ins, textbook = inputs(run), costs(run, link, plans=plans)["textbook"]
    return {p: predict(ins, plan_for(run, p, ins), textbook.link_faster(Plan.parse(p).link_bandwidth)).exposed_tail_ms
            for p in plans}


@reading(run="bucket-sweep")
def tails_beside_model(run, link: AlphaBeta, plans) -> pd.DataFrame:
    """Per plan of a run on an emulated link: the exposed tail (ms) in the textbook model (`modelled_tails`)
    and measured (median over its steps), and each one's saving against the first plan's."""
    model, seen = modelled_tails(run, link, plans), bucket_sweep.steps(run, exposed_tail_ms, list(plans)).median()
    table = pd.DataFrame({"modelled_tail_ms": model, "measured_tail_ms": {p: float(seen[p]) for p in plans}})
    table["modelled_saving_ms"] = table["modelled_tail_ms"].iloc[0] - table["modelled_tail_ms"]
    table["measured_saving_ms"] = table["measured_tail_ms"].iloc[0] - table["measured_tail_ms"]
    return table.rename_axis("plan")


@reading(run="bucket-sweep")
def wire_against_backward(run) -> str:
    """One sentence: how long the whole gradient needs on the run's emulated link against its backward."""
    own = inputs(run)
    wire_ms = run.spec.link.wire_s(own.gradient_bytes, run.world_size) * 1e3
    return (f"the whole gradient needs {wire_ms:.0f} ms on this wire, backward {own.backward_ms:.0f} ms: a smaller late "
            f"bucket helps only as far as the earlier buckets' transfers fit inside backward")
