"""pandas tables of a `Run`, one row per rank, in the lab's vocabulary and units.

Used by every notebook and by `ddplab run` (which prints `ranks`).
"""

from __future__ import annotations

import statistics

import pandas as pd


def id_ranges(ids: list[int]) -> str:
    """[0, 1, 2, 3, 8, 9] -> '0-3, 8-9'."""
    if not ids:
        return ""
    ids = sorted(ids)
    spans, start, prev = [], ids[0], ids[0]
    for i in ids[1:]:
        if i != prev + 1:
            spans.append((start, prev))
            start = i
        prev = i
    spans.append((start, prev))
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans)


def ranks(run) -> pd.DataFrame:
    """Who did what: process, device, shard of the data, parameter checksums, median step time."""
    rows = []
    for r in run.ranks:
        step_ms = r.step_ms()
        rows.append({
            "rank": r.rank, "pid": r.pid, "backend": r.backend, "device": r.device,
            "local_batch": run.spec.local_batch_of(r.rank), "seq_len": run.spec.seq_len_of(r.rank),
            "sample_ids": id_ranges(r.sample_ids),
            "params_initial": r.param_checksum["initial"], "params_final": r.param_checksum["final"],
            "step_ms_median": round(statistics.median(step_ms), 1),
            "loss_last": round(r.steps[-1]["loss"], 4),
        })
    return pd.DataFrame(rows).set_index("rank")


def steps(run) -> pd.DataFrame:
    """Per rank and step: time of each phase in ms, and the loss."""
    rows = []
    for r in run.ranks:
        for s in r.steps:
            rows.append({"rank": r.rank, "step": s["step"],
                         **{k: round(v, 2) for k, v in s.items() if k.endswith("_ms")}, "loss": s["loss"]})
    return pd.DataFrame(rows).set_index(["rank", "step"])


def reference(run) -> pd.DataFrame:
    """Per rank, after step 0: distance to the single-process global-batch update, for the DDP
    update and for the update the rank would have taken alone (needs the 'reference' probe)."""
    if any(r.reference is None for r in run.ranks):
        raise ValueError("this run has no reference: run it with probes=('reference',)")
    rows = []
    for r in run.ranks:
        ref, alone = r.reference, r.reference["independent"]
        rows.append({"rank": r.rank, "ddp_params": r.steps[0]["param_checksum"],
                     "ddp_update_rel_error": ref["update_rel_error"],
                     "alone_params": alone["param_checksum"], "alone_update_rel_error": alone["update_rel_error"]})
    return pd.DataFrame(rows).set_index("rank")
