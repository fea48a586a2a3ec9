"""Tables of the per-rank memory ledger (the memory probe) beside the analytic prediction
(`predict/memory.py`), and its sweeps over world size, optimizer, bucket views and sharding.

The ledger is sampled at three moments of a step (after the forward, the backward, the optimizer
step); `memory_moments` keeps them apart, so a row's categories were held together and add up.
`memory` takes each category at its largest over the step instead (activations are largest after
the forward, gradients after the backward) and gives the step's peak, which falls between samples.
`verify_model_state` is notebook 02's check that the model state is what the model predicts.
Used by notebook 02 and its widget; the figures of `plots/memory.py` draw the moments."""

from __future__ import annotations

import pandas as pd

from .. import verify
from ..predict.memory import CATEGORIES, predict
from ..units import MIB
from .reads import reading, reading_no_run


# the moments the worker samples the ledger at, as figures and tables name them
MOMENTS = {"forward": "after forward", "backward": "after backward", "step": "after optimizer step"}
# the categories that make up the model state (everything but the activations)
MODEL_STATE = ("parameters", "gradients", "ddp_buckets", "optimizer_state")


def _predict(run, r, step: int) -> dict:
    """The memory model for rank result `r`, from the parameters the run recorded (any model: a
    user's model gets its model-state terms, and None for the activations only shapes can tell)."""
    m = r.memory
    if m.parameter_numels:
        return predict(run.spec, r.rank, step, m.parameter_numels, m.trainable)
    return predict(run.spec, r.rank, step)


def _mib(v) -> float:
    return float("nan") if v is None else v / MIB


def _memory_steps(run, step):
    if run.ranks[0].memory is None:
        raise ValueError(f"run {run.spec.name!r} has no memory ledger: run it with probes=('memory',)")
    if not -run.spec.steps <= step < run.spec.steps:
        raise ValueError(f"run {run.spec.name!r} has {run.spec.steps} step(s), so no step {step}; the tables read "
                         f"step 1 by default (the first that holds optimizer state): run steps=2 or pass step=0")
    return [r.memory.steps[step] for r in run.ranks]


@reading(run="train")
def memory_table(run, step: int = 1) -> pd.DataFrame:
    """One row per rank: each category at its largest in step `step` (activations after forward,
    gradients after backward, optimizer state after the step), measured beside predicted, in MiB,
    and the step's measured peak (everything alive at once, temporaries included). The categories
    were not all held at one moment, so they do not add up to anything held: `memory_moments` does."""
    _predicted_by_the_model(run)
    cols = {}
    rows = []
    for r, st in zip(run.ranks, _memory_steps(run, step)):
        pred = _predict(run, r, step)
        row = {}
        for c in CATEGORIES:
            row[(c, "measured")] = max(p[c] for p in st.phases.values()) / MIB
            known = [p[c] for p in pred.values() if p[c] is not None]
            row[(c, "predicted")] = max(known) / MIB if len(known) == len(pred) else float("nan")
        row[("peak", "measured")] = st.peak / MIB
        row[("rss", "measured")] = st.phases["step"]["rss"] / MIB
        rows.append(row)
        cols = list(row)
    df = pd.DataFrame(rows, index=pd.Index([r.rank for r in run.ranks], name="rank"))
    df.columns = pd.MultiIndex.from_tuples(cols, names=["MiB", ""])
    return df.round(3)


@reading_no_run
def verify_model_state(table: pd.DataFrame) -> None:
    """Notebook 02's check, on a `memory_table(run)` table: parameters, gradients, DDP's buckets and the
    optimizer state, each at its largest in the step, are what the model predicts on every rank (MiB
    to 3 decimals). Raises `verify.CheckFailed` where they differ, e.g. for a prediction made for
    another optimizer, dtype, or without DDP's buckets (tests/views/test_key_checks.py). Bucket views do not
    show here: the buckets are allocated from DDP's construction on, so at their largest they are the
    same either way (`memory_moments` tells the moments apart)."""
    for c in MODEL_STATE:
        verify.equal(f"{c} at their largest, on every rank, as predicted (MiB)", table[(c, "measured")].tolist(),
                     table[(c, "predicted")].tolist())


def _predicted_by_the_model(run) -> None:
    if run.spec.sharding not in ("none", "zero1") or run.spec.accum_steps != 1:
        raise ValueError("the analytic memory model covers plain DDP and ZeRO-1 with accum_steps=1; "
                         "use tables.memory.memory_sweep or tables.memory.sharding for this run")


@reading(run="train")
def memory_moments(run, step: int = 1) -> pd.DataFrame:
    """One row per rank and sampled moment of step `step`: each category held at that moment,
    measured beside predicted, and their total, in MiB. The step's peak lies between the moments
    (it holds temporaries none of them sees): see `memory`."""
    _predicted_by_the_model(run)
    rows, index = [], []
    for r, st in zip(run.ranks, _memory_steps(run, step)):
        pred = _predict(run, r, step)
        for phase, moment in MOMENTS.items():
            row = {}
            for c in CATEGORIES:
                row[(c, "measured")] = st.phases[phase][c] / MIB
                row[(c, "predicted")] = _mib(pred[phase][c])
            row[("total", "measured")] = sum(st.phases[phase][c] for c in CATEGORIES) / MIB
            known = list(pred[phase].values())
            row[("total", "predicted")] = _mib(None if None in known else sum(known))
            rows.append(row)
            index.append((r.rank, moment))
    df = pd.DataFrame(rows, index=pd.MultiIndex.from_tuples(index, names=["rank", "moment"]))
    df.columns = pd.MultiIndex.from_tuples(list(rows[0]), names=["MiB", ""])
    return df.round(3)


@reading_no_run
def predicted_moments(exp, rank: int = 0, step: int = 1) -> pd.DataFrame:
    """The analytic prediction alone (no run): one row per sampled moment of step `step` on `rank`,
    each category and their total, in MiB."""
    pred = predict(exp, rank, step)
    df = pd.DataFrame([{**{c: pred[phase][c] / MIB for c in CATEGORIES}, "total": sum(pred[phase].values()) / MIB}
                       for phase in MOMENTS], index=pd.Index(list(MOMENTS.values()), name="moment"))
    return df.round(3)


@reading(runs="train")
def moments_sweep(runs, step: int = 1) -> pd.DataFrame:
    """Per run (rank 0) and sampled moment of step `step`: each category measured at that moment and
    their total, in MiB, beside the step's measured peak (any sharding, any accumulation)."""
    rows, index = [], []
    for run in runs:
        st = _memory_steps(run, step)[0]
        for phase, moment in MOMENTS.items():
            held = {c: st.phases[phase][c] / MIB for c in CATEGORIES}
            rows.append({**held, "total": sum(held.values()), "peak": st.peak / MIB})
            index.append((run.spec.name, moment))
    return pd.DataFrame(rows, index=pd.MultiIndex.from_tuples(index, names=["run", "moment"])).round(3)


@reading(runs="train")
def memory_sweep(runs, step: int = 1) -> pd.DataFrame:
    """One row per run (rank 0): the settings, model state (parameters + gradients + buckets +
    optimizer state after the step), activations and the measured peak, in MiB."""
    rows = []
    for run in runs:
        st = _memory_steps(run, step)[0]
        after = st.phases["step"]
        s = run.spec
        rows.append({"run": s.name, "world_size": s.world_size, "local_batch": s.local_batch_of(0),
                     "global_batch": s.global_batch, "optimizer": s.optimizer + ("+momentum" if s.momentum else ""),
                     "bucket_view": s.gradient_as_bucket_view, "sharding": s.sharding,
                     "parameters": after["parameters"] / MIB, "gradients": after["gradients"] / MIB,
                     "ddp_buckets": after["ddp_buckets"] / MIB, "optimizer_state": after["optimizer_state"] / MIB,
                     "model_state": sum(after[c] for c in ("parameters", "gradients", "ddp_buckets", "optimizer_state")) / MIB,
                     "activations": st.phases["forward"]["activations"] / MIB, "peak": st.peak / MIB})
    return pd.DataFrame(rows).set_index("run").round(3)


@reading(runs="train")
def sharding(runs, step: int = 1) -> pd.DataFrame:
    """Per sharding mode (rank 0; the first run must be plain DDP): what each rank keeps, its peak,
    and the naive estimate "checkpoint / world size" (checkpoint = full parameters + optimizer state)."""
    table = memory_sweep(runs, step).set_index("sharding")
    full = table.iloc[0]
    checkpoint = full["parameters"] + full["optimizer_state"]
    table["checkpoint_over_world_size"] = checkpoint / table["world_size"]
    table["peak_over_estimate"] = table["peak"] / table["checkpoint_over_world_size"]
    keep = ["world_size", "parameters", "gradients", "ddp_buckets", "optimizer_state", "activations", "peak",
            "checkpoint_over_world_size", "peak_over_estimate"]
    return table[keep].round(3)


@reading(run="train")
def memory_cuda(run, step: int = 1) -> pd.DataFrame:
    """On CUDA: per rank and phase, the ledger's total beside the caching allocator's own figures
    (allocated >= ledger: the allocator also holds temporaries, the CUDA context's tensors, rounding)."""
    rows = []
    for r, st in zip(run.ranks, _memory_steps(run, step)):
        for phase, p in st.phases.items():
            if "cuda_allocated" not in p:
                raise ValueError("this run did not run on CUDA: the allocator figures exist only there")
            rows.append({"rank": r.rank, "phase": phase, "ledger": sum(p[c] for c in CATEGORIES) / MIB,
                         "cuda_allocated": p["cuda_allocated"] / MIB, "cuda_reserved": p["cuda_reserved"] / MIB,
                         "ledger_peak": st.peak / MIB, "cuda_peak_allocated": p["cuda_peak_allocated"] / MIB})
    return pd.DataFrame(rows).set_index(["rank", "phase"]).round(3)
