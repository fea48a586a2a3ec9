"""Tables of communication (notebooks 03 and 05): all-reduce sweeps with bus bandwidth, the
alpha-beta fit (`predict/comm.py`), bytes each rank wrote against the ring formula, and compute
against communication as the local batch grows. The chapter's timing claims are judged here by
`claims` on per-repeat or per-step values (`judge_*`), never on a fixed threshold of a few medians."""

from __future__ import annotations

import statistics

import pandas as pd

from .. import claims, verify
from ..predict import comm, zero
from ..units import MIB, rel_error, size_label
from .reads import reading, reading_no_run
from .stats import slowest_rank



@reading(run="allreduce-sweep")
def call_ms(run) -> dict[int, list[float]]:
    """Per message size, every repeat's all-reduce time (ms), each timed by its slowest rank (the
    collective is done only when every rank is), in repeat order. Within a repeat every size ran once,
    in alternating order, so two sizes' lists pair repeat by repeat (`rank/tasks/allreduce_sweep.py`)."""
    if run.spec.task.kind != "allreduce-sweep":
        raise ValueError("this run is not an all-reduce sweep: use recipes.allreduce_sweep()")
    return {per_rank[0].bytes: slowest_rank([c.ms for c in per_rank])
            for per_rank in zip(*[r.result.sizes for r in run.ranks])}


@reading(run="allreduce-sweep")
def allreduce_sweep(run) -> pd.DataFrame:
    """Per message size: the all-reduce time (each repeat timed by its slowest rank; median, min and
    max over repeats), algorithm and bus bandwidth, and bytes each rank wrote against the ring formula."""
    w = run.world_size
    rows = []
    for (n, ms), per_rank in zip(call_ms(run).items(), zip(*[r.result.sizes for r in run.ranks])):
        written = statistics.median(b for c in per_rank for b in c.write_bytes)
        med = statistics.median(ms)
        rows.append({"bytes": n, "ms": med, "ms_min": min(ms), "ms_max": max(ms),
                     "algbw_gb_s": comm.algbw(n, med / 1e3) / 1e9, "busbw_gb_s": comm.busbw(n, med / 1e3, w) / 1e9,
                     "written_over_ring_formula": written / comm.ring_bytes_per_rank(n, w)})
    return pd.DataFrame(rows).set_index("bytes")


@reading_no_run
def fit_sweep(table: pd.DataFrame, min_bytes: int = 0, floor: bool = False):
    """Fit the alpha-beta model (or the floor model) to the sweep's sizes >= min_bytes:
    (model, quality on those sizes)."""
    part = table[table.index >= min_bytes]
    sizes, times = list(part.index), [t / 1e3 for t in part["ms"]]
    model = comm.fit_with_floor(sizes, times) if floor else comm.fit(sizes, times)
    return model, comm.quality(model, sizes, times)


@reading(run="allreduce-sweep")
def call_errors(run, model: comm.AlphaBeta, min_bytes: int = 0) -> dict[int, list[float]]:
    """Per message size >= min_bytes: the model's relative error on every call, (predicted - measured)
    / measured, as the fit's residuals are (`comm.quality`), but per repeat instead of on the median."""
    return {n: [rel_error(model.predict(n) * 1e3, t) for t in ms] for n, ms in call_ms(run).items() if n >= min_bytes}


@reading(run="allreduce-sweep")
def judge_fit(run, model: comm.AlphaBeta, min_bytes: int = 0, misses: float = 0.30) -> claims.Verdict:
    """The fitted line against every call it was fitted to: "it misses no size by `misses`", each size's
    median relative error over its repeats within +-`misses` (judged as a family over the sizes; the
    verdict shown is the weakest size's: a contradicted one first, then an unresolved one, then the
    largest miss). Noise per call widens the intervals; only a line that is off by
    more than the band at a resolved size contradicts. The errors of every call pooled are not judged:
    a line fitted to these very calls has their median error near 0 whatever its shape."""
    errors = call_errors(run, model, min_bytes)
    above = f" of {size_label(min_bytes)} and more" if min_bytes else ""
    alpha = claims.family(len(errors))   # every size at once: the family is wrong by chance at most ALPHA
    return claims.weakest([claims.judge(f"the line misses no message size{above} by {misses:.0%} (weakest size: "
                                        f"{size_label(n)})", es, within=(-misses, misses), unit="",
                                        alpha=alpha, what=f"median over {len(es)} calls")
                           for n, es in errors.items()], then=lambda v: -abs(v.center))   # the largest |median|


@reading(run="allreduce-sweep")
def judge_busbw_ceiling(run, ceiling_bytes_per_s: float, what: str = "one loopback TCP stream") -> claims.Verdict:
    """The claim "at its best size, each rank's link carried less than `what` can": per repeat of the
    size with the highest median bus bandwidth, busbw = 2(D-1)/D x size / time over the ceiling (the
    rate `ddplab.doctor.loopback_bandwidth_bytes_per_s` measures on this machine), below 1. It would be
    contradicted if gloo reached more than one socket's rate per rank (several connections a rank, or
    a transport other than TCP)."""
    if not ceiling_bytes_per_s > 0:
        raise ValueError(f"ceiling_bytes_per_s: a positive rate in bytes per second (got {ceiling_bytes_per_s!r})")
    w, ms = run.world_size, call_ms(run)
    if w < 2:
        raise ValueError(f"run: a bus bandwidth needs at least 2 ranks (this run has {w}: one rank sends nothing)")
    best = max(ms, key=lambda n: comm.busbw(n, statistics.median(ms[n]) / 1e3, w))
    ratios = [comm.busbw(best, t / 1e3, w) / ceiling_bytes_per_s for t in ms[best]]
    return claims.judge(f"on {w} ranks each link carried less than {what} can (bus bandwidth at "
                        f"{size_label(best)}, per call, over that rate: {ceiling_bytes_per_s / 1e9:.2f} GB/s)",
                        ratios, below=1.0, unit="x", what=f"median over {len(ratios)} calls")


@reading(run="allreduce-sweep")
def judge_size_ratio(run, small_bytes: int, large_bytes: int, below: float):
    """The claim "`large_bytes` cost less than `below` x the time of `small_bytes`", judged on the
    per-repeat ratio of the two sizes' times (they ran interleaved in every repeat)."""
    ms = call_ms(run)
    return claims.paired(f"fixed cost dominates: {size_label(large_bytes)} take under {below:g}x the time of "
                         f"{size_label(small_bytes)} on {run.world_size} ranks ({large_bytes // small_bytes}x the bytes; "
                         "per-repeat ratio)", ms[large_bytes], ms[small_bytes], ratio=True,
                         below=below)


@reading_no_run
def fit_summary(model: comm.AlphaBeta, q: comm.FitQuality) -> pd.Series:
    return pd.Series({"alpha_ms": model.alpha_s * 1e3, "bandwidth_gb_s": model.bandwidth_bytes_per_s / 1e9,
                      "floor_ms": model.floor_s * 1e3, "median_rel_error": q.median_rel_error,
                      "max_rel_error": q.max_rel_error, "r2_log": q.r2_log}).round(4)


@reading(runs="train", probes=("bytes",))
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


@reading(ddp_run="train", zero_run="train")
def zero1_traffic(ddp_run, zero_run) -> pd.DataFrame:
    """Per run (DDP, then ZeRO-1 around the same model), summed over its ranks: the bytes written during
    the synchronized backward and during the optimizer step (the bytes probe), beside
    `predict.zero.zero1_step_bytes` (all-reduce and broadcast, from the parameter bytes), in MiB."""
    rows = []
    for run in (ddp_run, zero_run):
        if run.spec.task.kind != "train" or "bytes" not in run.spec.probes:
            raise ValueError(f"run {run.spec.name!r}: zero1_traffic reads train runs with the bytes probe")
        last = [r.steps[-1] for r in run.ranks]
        predicted = zero.zero1_step_bytes(run.ranks[0].model.payload_bytes, run.world_size)
        rows.append({"run": run.spec.name, "sharding": run.spec.sharding, "world_size": run.world_size,
                     "backward_mib": sum(s.write_bytes for s in last) / MIB,
                     "optimizer_step_mib": sum(s.optimizer_write_bytes for s in last) / MIB,
                     "all_reduce_predicted_mib": predicted["all_reduce"] / MIB,
                     "broadcast_predicted_mib": predicted["broadcast"] / MIB if run.spec.sharding == "zero1" else 0.0})
    table = pd.DataFrame(rows).set_index("sharding")
    table["total_mib"] = table["backward_mib"] + table["optimizer_step_mib"]
    return table


@reading_no_run
def verify_zero1_traffic(table: pd.DataFrame, rel: float = 0.02) -> None:
    """On a `zero1_traffic` table: both runs' backwards write the ring all-reduce's bytes (ZeRO-1 keeps
    DDP's all-reduce), ZeRO-1's optimizer step writes the broadcast's (D - 1) x P, within `rel` (headers),
    and DDP's step next to nothing (under 1% of the all-reduce). Raises `verify.CheckFailed` otherwise."""
    verify.close("both runs' backwards write DDP's ring all-reduce, summed over the ranks (MiB)",
                 table["backward_mib"], table["all_reduce_predicted_mib"], rel=rel)
    verify.close("ZeRO-1's optimizer step writes the broadcast of every rank's shard to the others, (D - 1) x "
                 "the parameter bytes (MiB, summed over the ranks)", table.loc["zero1", "optimizer_step_mib"],
                 table.loc["zero1", "broadcast_predicted_mib"], rel=rel)
    verify.below("the counter's baseline: DDP's optimizer step (plain Adam, no collective) writes next to nothing "
                 "(its bytes written as a share of the all-reduce's)",
                 table.loc["none", "optimizer_step_mib"] / table.loc["none", "all_reduce_predicted_mib"], 0.01)


@reading(run="train")
def compute_ms(run, warmup: int = 1) -> list[float]:
    """Forward + backward of each step after `warmup`, timed by its slowest rank (ms)."""
    return [max(r.steps[i].phase_ms["forward"] + r.steps[i].phase_ms["backward"] for r in run.ranks)
            for i in range(warmup, run.spec.steps)]


@reading(runs_alone="train")
def compute_vs_comm(runs_alone, sweep: pd.DataFrame, model: comm.AlphaBeta, warmup: int = 1) -> pd.DataFrame:
    """Per local batch: forward+backward compute time (runs without synchronization; median, min and
    max over steps, each step timed by its slowest rank), the gradient payload, the all-reduce of
    exactly that payload as the sweep measured it (`recipes.allreduce_sweep(extra_bytes=...)`) and as
    the fitted model predicts it, and compute over the measured all-reduce."""
    rows = []
    for run in runs_alone:
        per_step = compute_ms(run, warmup)
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


@reading(small_run="train", large_run="train")
def judge_compute_growth(small_run, large_run, above: float = 1.0, warmup: int = 1):
    """The claim "`large_run`'s local batch takes more than `above` x the compute of `small_run`'s",
    judged on per-step ratios: step i of one against step i of the other. The two runs ran one after
    the other in one launch (seconds apart, not interleaved), so a change of load between them shifts
    the ratios; the claim's margin (2x for 64x the examples) is what keeps it honest."""
    a, b = compute_ms(large_run, warmup), compute_ms(small_run, warmup)
    n = min(len(a), len(b))
    lb, sb = large_run.spec.local_batch_of(0), small_run.spec.local_batch_of(0)
    return claims.judge(f"compute grows with the batch: {lb} examples take over {above:g}x the time of {sb} "
                        "(per-step ratio, forward + backward)", [x / y for x, y in zip(a[:n], b[:n])], above=above,
                        unit="x", what=f"median of {n} ratios, step i of one run over step i of the other (the runs "
                                       "one after the other, not interleaved)")


@reading(runs="train")
def compute_growth(runs, warmup: int = 1) -> pd.DataFrame:
    """From each local batch to the next: the per-step compute ratio (median and interval, `claims`)
    and what it says: "grew" where it is resolved above 1, "shrank" where resolved below, else "not
    resolved here" (the two runs' step times too close for their noise)."""
    rows = []
    for a, b in zip(runs, runs[1:]):
        v = judge_compute_growth(a, b, above=1.0, warmup=warmup)
        said = {claims.HOLDS: "grew", claims.CONTRADICTED: "shrank"}.get(v.outcome, "not resolved here")
        rows.append({"from_local_batch": a.spec.local_batch_of(0), "to_local_batch": b.spec.local_batch_of(0),
                     "ratio": v.center, "ratio_low": v.low, "ratio_high": v.high, "steps": v.n, "compute": said})
    return pd.DataFrame(rows).set_index(["from_local_batch", "to_local_batch"]).round(3)
