"""Tables of the per-rank memory ledger (the memory probe) beside the analytic prediction
(`predict/memory.py`), and its sweeps over world size, optimizer, bucket views and sharding.

The ledger is sampled at three moments of a step (after the forward, the backward, the optimizer
step); `memory_moments` keeps them apart, so a row's categories were held together and add up.
`memory` takes each category at its largest over the step instead (activations are largest after
the forward, gradients after the backward) and gives the step's peak, which falls between samples.
`verify_model_state` is notebook 02's check that the model state is what the model predicts.
Notebook 08's second common error is read here too: model state divided by the world size, beside the
replicated model (`divided_state`, `verify_replicated_state`, and its row of `common_errors.error_table`,
`state_error`). Used by notebooks 02 and 08 and the widget; the figures of `plots/memory.py` draw the moments."""

from __future__ import annotations

import pandas as pd

from .. import verify
from ..predict.memory import CATEGORIES, parameter_numels, predict, state_bytes
from ..spec.experiment import BUILTIN_MODELS
from ..units import MIB
from .reads import reading, reading_no_run


# the moments the worker samples the ledger at, as figures and tables name them
MOMENTS = {"forward": "after forward", "backward": "after backward", "step": "after optimizer step"}
# the categories that make up the model state (everything but the activations)
MODEL_STATE = ("parameters", "gradients", "ddp_buckets", "optimizer_state")


def _predict(run, r, step: int) -> dict:
    """The memory model for rank result `r`: a built-in model's from its spec; a user's model's model-state
    terms from the parameters the run recorded, and None for the activations only shapes can tell."""
    numels, trainable = _counts(run, r)
    return predict(run.spec, r.rank, step, numels, trainable) if numels else predict(run.spec, r.rank, step)


def _counts(run, r) -> tuple[list[int] | None, list[bool] | None]:
    """The parameter sizes a prediction starts from: a built-in model's from its spec (the ranks' own
    counts would check themselves), a user's model's as its ranks recorded them; `trainable` as recorded."""
    m = r.memory
    numels = parameter_numels(run.spec) if run.spec.model in BUILTIN_MODELS else (m.parameter_numels or None)
    if numels and m.trainable and len(m.trainable) != len(numels):
        raise ValueError(f"run {run.spec.name!r}: rank {r.rank} recorded {len(m.trainable)} parameters, the spec has "
                         f"{len(numels)}: the ranks did not build the model the spec describes")
    return numels, (m.trainable or None)


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


# ---- notebook 08's second common error: model state divided by the data-parallel degree ----

@reading(run="train")
def replicated_state_bytes(run, rank: int) -> int:
    """The replicated model's model state on `rank` (`predict.memory.state_bytes`, from the parameter
    sizes of `_counts`): parameters, gradients, DDP's buckets and optimizer state, in bytes."""
    return sum(state_bytes(run.spec, *_counts(run, run.ranks[rank]), rank).values())


@reading(memory_runs="train", probes=("memory",))
def divided_state(memory_runs, predicted=replicated_state_bytes, step: int = 1) -> pd.DataFrame:
    """Per world size and rank: the model state the memory probe measured after the optimizer step of
    step `step` (parameters + gradients + buckets + optimizer state, bytes), the wrong claim's number
    (one replica's state divided by the world size), `predicted(run, rank)` (the replicated model by
    default), the ratios of measured to each, and the activations measured after the forward (they,
    not the model state, shrink with the local batch at a fixed global batch)."""
    rows = []
    for run in sorted(memory_runs, key=lambda r: r.world_size):
        w = run.world_size
        for r, st in zip(run.ranks, _memory_steps(run, step)):
            measured = sum(st.phases["step"][c] for c in MODEL_STATE)
            divided = replicated_state_bytes(run, r.rank) / w
            right = predicted(run, r.rank)
            rows.append({"world_size": w, "rank": r.rank, "local_batch": run.spec.local_batch_of(r.rank),
                         "model_state_bytes": measured, "divided_bytes": divided, "predicted_bytes": right,
                         "measured_over_divided": measured / divided, "measured_over_predicted": measured / right,
                         "activation_bytes": st.phases["forward"]["activations"]})
    return pd.DataFrame(rows).set_index(["world_size", "rank"])


@reading_no_run
def verify_replicated_state(table: pd.DataFrame) -> None:
    """On a `divided_state` table: every rank at every world size holds the same model-state bytes,
    exactly what the prediction says; then prints by how much the divided prediction misses (the world
    size, which follows from the two checks). Raises `verify.CheckFailed` for a prediction divided by W,
    or ranks whose state differs (sharding)."""
    measured = table["model_state_bytes"].tolist()
    verify.equal("model state per rank (bytes) is the same on every rank at every world size", measured,
                 [measured[0]] * len(measured))
    verify.equal("the prediction gives every rank's model state exactly (bytes)", table["predicted_bytes"].tolist(),
                 measured)
    misses = table.groupby(level="world_size")["measured_over_divided"].max()
    print("so 'one replica's state / world size' is short by a factor of "
          + ", ".join(f"{m:g} on {w} ranks" for w, m in misses.items()))


@reading(memory_runs="train", probes=("memory",))
def state_error(memory_runs) -> dict:
    """Notebook 08's second common error on these runs, as its row of `common_errors.error_table`: what
    they `says` (model state per rank and divided by W, activations, MiB) and a `verdict` computed from
    the bytes the ranks recorded ("wrong: ..." or "not shown: ...")."""
    t = divided_state(memory_runs)
    by_w = t.groupby(level="world_size")
    sizes = by_w["model_state_bytes"].agg(["min", "max"])
    says = "; ".join(f"{w} ranks: {lo / MIB:.3f}-{hi / MIB:.3f} MiB per rank" if lo != hi else
                     f"{w} ranks: {lo / MIB:.3f} MiB on every rank" for w, (lo, hi) in sizes.iterrows())
    divided = by_w["divided_bytes"].first()
    says += "; divided by W: " + ", ".join(f"{d / MIB:.3f} MiB" for d in divided)
    acts = by_w[["local_batch", "activation_bytes"]].max()
    says += "; activations: " + ", ".join(f"{a / MIB:.3f} MiB on {w} (local batch {lb})"
                                          for w, (lb, a) in acts.iterrows())
    replicated = t["model_state_bytes"].nunique() == 1 and (t["model_state_bytes"] == t["predicted_bytes"]).all()
    if replicated:
        ratios = ", ".join(f"{r:g}x" for r in by_w["measured_over_divided"].first())
        verdict = (f"wrong: every rank holds the whole model state at every world size; dividing by W is off by "
                   f"{ratios}, the replicated model is exact")
    else:
        verdict = "not shown: the ranks' model state differs across ranks or world sizes, or from the replicated model"
    return {"says": says, "verdict": verdict}
