"""Tables of who did what in a run, one row per rank: process, device, shard, checksums, timings, and
the distance from the one-process update. Used by notebook 00 and by `ddplab run`."""

from __future__ import annotations

import statistics

import pandas as pd

from ..spec.sharding import contiguous_spans
from .reads import reading, reading_no_run



@reading_no_run
def id_ranges(ids: list[int]) -> str:
    """[0, 1, 2, 3, 8, 9] -> '0-3, 8-9'."""
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in contiguous_spans(ids))


@reading(run="train")
def rank_table(run) -> pd.DataFrame:
    """Who did what: process, device, shard of the data, parameter checksums, median step time."""
    rows = []
    for r in run.ranks:
        rows.append({
            "rank": r.rank, "pid": r.pid, "backend": r.backend, "device": r.device,
            "local_batch": run.spec.local_batch_of(r.rank), "seq_len": run.spec.seq_len_of(r.rank),
            "sample_ids": id_ranges(r.sample_ids),
            "params_initial": r.param_checksum.initial, "params_final": r.param_checksum.final,
            "step_ms_median": round(statistics.median(r.step_ms()), 1),
            "loss_last": round(r.steps[-1].loss, 4),
        })
    return pd.DataFrame(rows).set_index("rank")


@reading(run="train")
def steps(run) -> pd.DataFrame:
    """Per rank and step: time of each phase in ms, and the loss."""
    rows = []
    for r in run.ranks:
        for s in r.steps:
            rows.append({"rank": r.rank, "step": s.step, **{f"{k}_ms": round(v, 2) for k, v in s.phase_ms.items()},
                         "step_ms": round(s.step_ms, 2), "loss": s.loss})
    return pd.DataFrame(rows).set_index(["rank", "step"])


@reading(run="train", probes=("reference",))
def reference(run) -> pd.DataFrame:
    """Per rank, after step 0: distance to the single-process global-batch update, for the DDP
    update and for the update the rank would have taken alone (needs the 'reference' probe)."""
    if any(r.reference is None for r in run.ranks):
        raise ValueError("this run has no reference: run it with probes=('reference',)")
    rows = []
    for r in run.ranks:
        rows.append({"rank": r.rank, "ddp_params": r.steps[0].param_checksum,
                     "ddp_update_rel_error": r.reference.ddp.update_rel_error,
                     "alone_params": r.reference.independent.param_checksum,
                     "alone_update_rel_error": r.reference.independent.update_rel_error})
    return pd.DataFrame(rows).set_index("rank")
