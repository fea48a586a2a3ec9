"""Tables of gradient readiness (notebook 04): the order gradients became ready against source order
(and which parameters leave the naive line, and how), each bucket's launch and completion on every
rank, the summed bucket durations against the step's exposed tail (the lab's one definition,
`record.exposed_tail_ms`), and the tail the last-ready gradient leaves."""

from __future__ import annotations

import statistics

import pandas as pd

from .. import record
from ..units import ms_after
from .reads import reading, reading_no_run



@reading(run="train")
def ready_order(run, step: int = -1, rank: int = 0) -> pd.DataFrame:
    """Per parameter that gets a gradient, in source order (`parameters()`; frozen ones left out): its
    position in the order gradients became ready, the position the naive "reverse source order"
    assumption gives it, and its bucket."""
    st = run.ranks[rank].steps[step]
    if st.backward is None:
        raise ValueError(f"run {run.spec.name!r} recorded no gradient readiness: run it with probes=('readiness',)")
    ready = [e.param for e in st.backward.ready]
    bucket_of = {p: b.index for b in st.buckets for p in b.params}
    source = [n for n in run.ranks[rank].parameter_names if n in set(ready)]
    n = len(source)
    rows = [{"parameter": name, "source_position": i, "reverse_source_position": n - 1 - i,
             "ready_position": ready.index(name), "bucket": bucket_of.get(name)} for i, name in enumerate(source)]
    df = pd.DataFrame(rows).set_index("parameter")
    df["as_assumed"] = df["ready_position"] == df["reverse_source_position"]
    return df


@reading(run="train", probes=("readiness",))
def bucket_timeline(run, step: int = -1) -> pd.DataFrame:
    """Per rank and bucket: launch and completion, ms after the earliest backward start of the step."""
    t0 = min(r.steps[step].backward.start_ns for r in run.ranks)
    rows = []
    for r in run.ranks:
        st = r.steps[step]
        for b in st.buckets:
            rows.append({"rank": r.rank, "bucket": b.index, "bytes": b.bytes, "params": len(b.params),
                         "launch_ms": ms_after(b.launch_ns, t0), "done_ms": ms_after(b.done_ns, t0),
                         "duration_ms": ms_after(b.done_ns, b.launch_ns),
                         "last_grad_ready_ms": ms_after(st.backward.last_ready_ns, t0),
                         "backward_return_ms": ms_after(st.backward.end_ns, t0)})
    return pd.DataFrame(rows).set_index(["rank", "bucket"]).round(3)


@reading(run="train")
def summed_and_tail(run, warmup: int = 2) -> pd.DataFrame:
    """Per step after `warmup` (DDP's first iteration reduces one bucket, the second rebuilds): the
    step's exposed tail (`record.exposed_tail_ms`: over ranks, the longest communication after that
    rank's last gradient was ready), the rank that sets it, and that rank's bucket durations summed;
    and the tail's two parts, on the ranks' one clock (rank/clock.py; across nodes it also holds the
    clocks' alignment error): `skew_ms`, how much later the slowest rank's last gradient was ready than
    the tail rank's (the tail rank waits that long for the slow one's compute), and `after_slowest_ms`,
    the rest of the tail: communication after the slowest rank's last gradient. They add up to the tail."""
    rows = []
    for i in range(warmup, run.spec.steps):
        steps = [r.steps[i] for r in run.ranks]
        tail = record.exposed_tail_ms(steps)
        at = max(range(len(steps)), key=lambda k: steps[k].exposed_tail_ms)
        ready = [s.backward.last_ready_ns for s in steps]
        skew = min(tail, max(0.0, ms_after(max(ready), ready[at])))   # the tail rank's wait for the slowest rank
        rows.append({"step": i, "exposed_tail_ms": tail, "tail_rank": run.ranks[at].rank,
                     "summed_bucket_durations_ms": sum(ms_after(b.done_ns, b.launch_ns) for b in steps[at].buckets),
                     "skew_ms": skew, "after_slowest_ms": tail - skew})
    return pd.DataFrame(rows).set_index("step")


@reading(run_ddp="train", run_alone="train")
def exposed_vs_summed(run_ddp, run_alone, warmup: int = 2) -> pd.Series:
    """The common error, measured (medians over steps): the bucket durations summed against the step's
    exposed tail (`summed_and_tail`), and the step with DDP against the step without synchronization
    (`step_added_ms`: two runs one after the other, so a comparison across moments, shown, not judged;
    on shared cores it also holds what the all-reduces took from backward's compute)."""
    per_step = summed_and_tail(run_ddp, warmup)
    with_ddp, without = statistics.median(run_ddp.step_ms(warmup)), statistics.median(run_alone.step_ms(warmup))
    return pd.Series({"summed_bucket_durations_ms": per_step["summed_bucket_durations_ms"].median(),
                      "exposed_tail_ms": per_step["exposed_tail_ms"].median(), "step_ms_ddp": with_ddp,
                      "step_ms_no_sync": without, "step_added_ms": with_ddp - without}).round(3)


@reading_no_run
def off_line(order: pd.DataFrame) -> pd.DataFrame:
    """The parameters a `ready_order` table has off the naive line, each with its module and whether
    it merely swapped places with the other parameter of that module (a weight/bias pair whose two
    ready positions are each other's reverse-source positions)."""
    off = order[~order["as_assumed"]]
    rows = []
    for name, row in off.iterrows():
        module = name.rpartition(".")[0]
        pair = [p for p in order.index if p.rpartition(".")[0] == module and p != name]
        swapped = len(pair) == 1 and order.loc[pair[0], "reverse_source_position"] == row["ready_position"] \
            and order.loc[pair[0], "ready_position"] == row["reverse_source_position"]
        rows.append({"parameter": name, "module": module, "swapped_within_module": bool(swapped)})
    return pd.DataFrame(rows, columns=["parameter", "module", "swapped_within_module"]).set_index("parameter")


@reading(run="train")
def traced_step(run, rank_result, step: int):
    """`rank_result`'s step `step`, which must carry bucket and readiness events (else ValueError)."""
    st = rank_result.steps[step]
    if not st.buckets or not st.backward or not st.backward.ready:
        raise ValueError(f"run {run.spec.name!r}: step {step} has no bucket or readiness events; run it with "
                         f"probes=('readiness', 'buckets') and a synchronizing step")
    return st


@reading(run="train")
def dependency_tail(run, step: int = -1) -> pd.DataFrame:
    """Per rank: the last gradient to become ready, the bucket launched last and whether it holds that
    gradient, when it launched after that gradient and how long its all-reduce took, how many other
    buckets were still in flight at that moment, this rank's share of the exposed tail (last completion
    minus last ready, 0 if communication ended first: `record.Timeline.exposed_tail_ms`) and the
    backward compute before it (backward start to last ready)."""
    rows = []
    for r in run.ranks:
        st = traced_step(run, r, step)
        last_bucket = max(st.buckets, key=lambda b: b.launch_ns)
        last_ready = st.backward.last_ready_ns
        rows.append({"rank": r.rank, "last_ready": st.backward.ready[-1].param, "last_bucket": last_bucket.index,
                     "holds_last_ready": st.backward.ready[-1].param in last_bucket.params,
                     "launch_after_last_ready_ms": ms_after(last_bucket.launch_ns, last_ready),
                     "last_bucket_ms": ms_after(last_bucket.done_ns, last_bucket.launch_ns),
                     "others_in_flight": sum(b.done_ns > last_ready for b in st.buckets if b is not last_bucket),
                     "exposed_tail_ms": st.exposed_tail_ms,
                     "backward_compute_ms": ms_after(last_ready, st.backward.start_ns)})
    return pd.DataFrame(rows).set_index("rank").round(3)
