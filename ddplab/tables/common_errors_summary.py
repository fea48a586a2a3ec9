"""The four common errors of notebook 08 side by side (`tables/common_errors.py` has each one's table and
check): one row per error with the misclaim, what the runs say (numbers from them), and a verdict
computed from the runs (what their specs set and what they recorded), never from timing: step times of
separate runs are shown, not judged, and the summed durations against the tail are arithmetic. Numbers
in, a DataFrame out (no processes)."""

from __future__ import annotations

import statistics

import pandas as pd

from ..units import MIB
from .common_errors import divided_state, error_runs, source_as_ready_order, summed_as_exposed, weak_as_strong
from .reads import reading



def _scaling_row(weak_runs, strong_runs) -> dict:
    t = weak_as_strong(weak_runs, strong_runs)
    weak_gb, strong_gb = sorted(set(t["weak_global_batch"])), sorted(set(t["strong_global_batch"]))
    base = t.iloc[0]
    claimed = ", ".join(f"{r['claimed_speedup']:.2f}x ({r['claimed_speedup_low']:.2f}-{r['claimed_speedup_high']:.2f}) "
                        f"on {w}" for w, r in t.iloc[1:].iterrows())
    fixed = ", ".join(f"{r['speedup']:.2f}x ({r['speedup_low']:.2f}-{r['speedup_high']:.2f}) on {w}"
                      for w, r in t.iloc[1:].iterrows())
    says = (f"weak runs (global batch {', '.join(map(str, weak_gb))}): examples/s over {t.index[0]} rank {claimed}; "
            f"at a fixed global batch of {', '.join(map(str, strong_gb))} ({base['strong_step_ms']:.1f} ms a step on "
            f"{t.index[0]}, {base['strong_step_ms_min']:.1f}-{base['strong_step_ms_max']:.1f}): speed-up {fixed} "
            f"(one separate run per world size: shown, not judged)")
    if len(strong_gb) != 1 or len(weak_gb) == 1:
        verdict = "not shown: the strong runs must share one global batch and the weak runs must not"
    else:
        verdict = (f"wrong: the weak runs changed the global batch ({weak_gb[0]} to {weak_gb[-1]}), so their "
                   f"throughput ratio compares different steps, not the same step on more ranks; the same step's "
                   f"speed-up is the one at the fixed global batch")
    return {"says": says, "verdict": verdict}


def _memory_row(memory_runs) -> dict:
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


def _overlap_row(ddp_run, compute_only_run) -> dict:
    t = summed_as_exposed(ddp_run, compute_only_run)
    summed, tail = t.attrs["summed_ms"], t.attrs["tail_ms"]
    n, during, buckets = len(summed), t.attrs["launched_during_backward"], t.attrs["buckets"]
    larger = sum(s > x for s, x in zip(summed, tail))
    says = (f"{during:g} of {buckets:g} buckets launched during backward (medians per step); per step, median of "
            f"{n}: summed durations {statistics.median(summed):.1f} ms, exposed tail {statistics.median(tail):.1f} "
            f"ms, the sum the larger in {larger} of {n} steps (arithmetic: the tail is nearly all time some bucket "
            f"was in flight, which the sum counts)")
    judged = ("notebook 05 (section 6) judges the sum against what DDP adds to the step, on steps interleaved with "
              "steps without synchronization")
    if during > 0:
        verdict = (f"wrong: the sum is not the step's cost: {during:g} of {buckets:g} buckets launched while backward "
                   f"still computed, and the sum counts their time as if nothing ran beside it; {judged}")
    else:
        verdict = f"not shown: no bucket launched during backward on this run; {judged}"
    return {"says": says, "verdict": verdict}


def _order_row(run) -> dict:
    t = source_as_ready_order(run)
    n = len(t)
    first = t["ready_position"].idxmin()
    says = (f"{run.spec.model}: {int(t['at_source_position'].sum())} of {n} gradients ready at their source position, "
            f"{int(t['at_reverse_source_position'].sum())} at their reverse source position; ready first: {first} "
            f"(source position {t.loc[first, 'source_position']})")
    ready = t["ready_position"].sort_values().index.tolist()
    if ready in (t.index.tolist(), t.index.tolist()[::-1]):
        which = "the source order" if ready == t.index.tolist() else "the reverse source order"
        verdict = f"not shown: on this model the ready order is {which}"
    else:
        verdict = "wrong: the ready order is neither the source order nor its reverse; the executed graph decides"
    return {"says": says, "verdict": verdict}


MISCLAIMS = {
    "global batch": "weak-scaling runs (global batch grows with the ranks) show a strong-scaling speed-up",
    "replicated memory": "model-state memory per rank is the one-process state divided by the world size",
    "summed all-reduce": "the bucket all-reduce durations, summed, are the communication overhead of a step",
    "ready order": "gradients become ready in parameter source order (or its reverse)",
}


@reading(runs=None, mapping=("runs",))   # the chapter's dict of every run: it picks the train runs by name
def error_table(runs) -> pd.DataFrame:
    """One row per error of a `recipes.common_error_runs()` launch (the list `run_many` returned, or a dict
    by name): the misclaim, what these runs say (numbers from them), and a verdict computed from the runs
    ("wrong: ..." or "not shown: ...")."""
    g = error_runs(runs)
    rows = {"global batch": _scaling_row(g["weak"], g["strong"]), "replicated memory": _memory_row(g["memory"]),
            "summed all-reduce": _overlap_row(*g["overlap"]), "ready order": _order_row(g["ready"][0])}
    return pd.DataFrame([{"error": e, "misclaim": MISCLAIMS[e], **row} for e, row in rows.items()]).set_index("error")
