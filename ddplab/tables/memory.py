"""Tables of the per-rank memory ledger (the memory probe) beside the analytic prediction
(`predict/memory.py`), and its sweeps over world size, optimizer, bucket views and sharding.
Used by notebook 02 and its widget."""

from __future__ import annotations

import pandas as pd

from ..predict.memory import CATEGORIES, predict
from ..units import MIB


def _memory_steps(run, step):
    if run.ranks[0].memory is None:
        raise ValueError(f"run {run.spec.name!r} has no memory ledger: run it with probes=('memory',)")
    if not -run.spec.steps <= step < run.spec.steps:
        raise ValueError(f"run {run.spec.name!r} has {run.spec.steps} step(s), so no step {step}; the tables read "
                         f"step 1 by default (the first that holds optimizer state): run steps=2 or pass step=0")
    return [r.memory.steps[step] for r in run.ranks]


def memory(run, step: int = 1) -> pd.DataFrame:
    """One row per rank: each category at its largest in step `step` (activations after forward,
    gradients after backward, optimizer state after the step), measured beside predicted, in MiB,
    and the step's measured peak (everything alive at once, temporaries included)."""
    if run.spec.sharding != "none" or run.spec.accum_steps != 1:
        raise ValueError("the analytic memory model covers plain DDP with accum_steps=1; "
                         "use tables.memory_sweep or tables.sharding for this run")
    cols = {}
    rows = []
    for r, st in zip(run.ranks, _memory_steps(run, step)):
        pred = predict(run.spec, r.rank, step)
        row = {}
        for c in CATEGORIES:
            row[(c, "measured")] = max(p[c] for p in st.phases.values()) / MIB
            row[(c, "predicted")] = max(p[c] for p in pred.values()) / MIB
        row[("peak", "measured")] = st.peak / MIB
        row[("rss", "measured")] = st.phases["step"]["rss"] / MIB
        rows.append(row)
        cols = list(row)
    df = pd.DataFrame(rows, index=pd.Index([r.rank for r in run.ranks], name="rank"))
    df.columns = pd.MultiIndex.from_tuples(cols, names=["MiB", ""])
    return df.round(3)


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
