"""Tables of communication (notebooks 03 and 05): all-reduce sweeps with bus bandwidth, the
alpha-beta fit (`predict/comm.py`), bytes each rank wrote against the ring formula, and compute
against communication as the local batch grows."""

from __future__ import annotations

import statistics

import pandas as pd

from ..predict import comm
from ..units import MIB


def allreduce_sweep(run) -> pd.DataFrame:
    """Per message size: the all-reduce time (each repeat timed by its slowest rank; median, min and
    max over repeats), algorithm and bus bandwidth, and bytes each rank wrote against the ring formula."""
    if run.spec.task.kind != "allreduce-sweep":
        raise ValueError("this run is not an all-reduce sweep: use recipes.allreduce_sweep()")
    w = run.world_size
    rows = []
    for per_rank in zip(*[r.result.sizes for r in run.ranks]):
        n = per_rank[0].bytes
        ms = [max(t) for t in zip(*[c.ms for c in per_rank])]
        written = statistics.median(b for c in per_rank for b in c.write_bytes)
        med = statistics.median(ms)
        rows.append({"bytes": n, "ms": med, "ms_min": min(ms), "ms_max": max(ms),
                     "algbw_gb_s": comm.algbw(n, med / 1e3) / 1e9, "busbw_gb_s": comm.busbw(n, med / 1e3, w) / 1e9,
                     "written_over_ring_formula": written / comm.ring_bytes_per_rank(n, w)})
    return pd.DataFrame(rows).set_index("bytes")


def fit_sweep(table: pd.DataFrame, min_bytes: int = 0, floor: bool = False):
    """Fit the alpha-beta model (or the floor model) to the sweep's sizes >= min_bytes:
    (model, quality on those sizes)."""
    part = table[table.index >= min_bytes]
    sizes, times = list(part.index), [t / 1e3 for t in part["ms"]]
    model = comm.fit_with_floor(sizes, times) if floor else comm.fit(sizes, times)
    return model, comm.quality(model, sizes, times)


def fit_summary(model: comm.AlphaBeta, q: comm.FitQuality) -> pd.Series:
    return pd.Series({"alpha_ms": model.alpha_s * 1e3, "bandwidth_gb_s": model.bandwidth_bytes_per_s / 1e9,
                      "floor_ms": model.floor_s * 1e3, "median_rel_error": q.median_rel_error,
                      "max_rel_error": q.max_rel_error, "r2_log": q.r2_log}).round(4)


def bytes_on_wire(runs) -> pd.DataFrame:
    """Per run: the gradient payload, the bytes each rank wrote during the synchronized backward (the
    bytes probe), and the ring formula 2(D-1)/D x payload."""
    rows = []
    for run in runs:
        payload = run.ranks[0].model.payload_bytes
        written = statistics.median(st.write_bytes for r in run.ranks for st in r.steps)
        formula = comm.ring_bytes_per_rank(payload, run.world_size)
        rows.append({"world_size": run.world_size, "local_batch": run.spec.local_batch_of(0), "payload_mib": payload / MIB,
                     "written_mib_per_rank": written / MIB, "ring_formula_mib": formula / MIB,
                     "ratio": written / formula})
    return pd.DataFrame(rows).set_index("world_size")


def compute_vs_comm(runs_alone, sweep: pd.DataFrame, model: comm.AlphaBeta, warmup: int = 1) -> pd.DataFrame:
    """Per local batch: forward+backward compute time (runs without synchronization; median, min and
    max over steps, each step timed by its slowest rank), the gradient payload, the all-reduce of
    exactly that payload as the sweep measured it (`recipes.allreduce_sweep(extra_bytes=...)`) and as
    the fitted model predicts it, and compute over the measured all-reduce."""
    rows = []
    for run in runs_alone:
        per_step = [max(r.steps[i].phase_ms["forward"] + r.steps[i].phase_ms["backward"] for r in run.ranks)
                    for i in range(warmup, run.spec.steps)]
        payload = run.ranks[0].model.payload_bytes
        if payload not in sweep.index:
            raise ValueError(f"the sweep did not time the gradient's size ({payload} bytes): "
                             f"use recipes.allreduce_sweep(extra_bytes=({payload},))")
        measured = sweep.loc[payload, "ms"]
        compute = statistics.median(per_step)
        rows.append({"local_batch": run.spec.local_batch_of(0), "payload_mib": payload / MIB, "compute_ms": compute,
                     "compute_ms_min": min(per_step), "compute_ms_max": max(per_step), "allreduce_ms": measured,
                     "allreduce_ms_fit": model.predict(payload) * 1e3, "compute_to_comm": compute / measured})
    return pd.DataFrame(rows).set_index("local_batch").round(3)
