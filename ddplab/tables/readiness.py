"""Tables of gradient readiness (notebook 04): the order gradients became ready against source order
(and which parameters leave the naive line, and how), each bucket's launch and completion on every
rank, the summed bucket durations against the step's exposed tail (the lab's one definition,
`record.exposed_tail_ms`), and the tail the last-ready gradient leaves.

Notebook 08's third and fourth common errors are read here too, each with its row of
`common_errors.error_table`: the summed all-reduce durations read as the step's exposed overhead
(`summed_as_exposed`, `overlap_sentence`, `overlap_error`) and source order taken for ready order
(`source_as_ready_order`, `verify_ready_not_source_order`, `order_error`). No timing claim is judged
there: the step times of separate runs are shown, not judged, and the sum against the tail is
arithmetic (the tail is nearly all time some bucket was in flight, which the sum counts); notebook 05
(section 6) judges the sum against what DDP adds, on interleaved steps."""

from __future__ import annotations

import statistics

import pandas as pd

from .. import record, verify
from ..units import ms_after
from .reads import reading, reading_no_run
from .stats import moves, robust_spread



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


# ---- notebook 08's third common error: summed all-reduce durations read as exposed overhead ----

def _per_step(run, warmup: int) -> list[dict]:
    """Per step after `warmup`, in ms: the step's exposed tail (`record.exposed_tail_ms`), and on the
    rank it comes from (the rank whose communication ran longest after its own last gradient) its
    buckets' launch-to-done durations summed, their span (first launch to last done), how many buckets
    and how many launched before that rank's last gradient was ready."""
    out = []
    for i in range(warmup, run.spec.steps):
        steps = [traced_step(run, r, i) for r in run.ranks]
        st = max(steps, key=lambda x: x.exposed_tail_ms)
        last = st.backward.last_ready_ns
        out.append({"summed": sum(ms_after(b.done_ns, b.launch_ns) for b in st.buckets),
                    "span": ms_after(max(b.done_ns for b in st.buckets), min(b.launch_ns for b in st.buckets)),
                    "tail": record.exposed_tail_ms(steps), "buckets": len(st.buckets),
                    "during_backward": sum(b.launch_ns < last for b in st.buckets)})
    return out


@reading(ddp_run="train", compute_only_run="train")
def summed_as_exposed(ddp_run, compute_only_run, warmup: int = 4) -> pd.DataFrame:
    """One row per quantity, ms (median over the steps after `warmup`) and its per-step spread
    (1.4826 x MAD): the buckets' all-reduce durations summed (the wrong claim's number), the span they
    cover, the exposed tail (`record.exposed_tail_ms`; the sum and the span on the rank the tail comes
    from), the sum's excess over the tail (per step), and the step's time over the compute-only run's
    (slowest rank; a separate run, not interleaved with this one: shown, not judged). attrs:
    `buckets` and `launched_during_backward` (medians per step), `summed_ms` and `tail_ms` (per step,
    in step order)."""
    if compute_only_run.spec.sync != "none":
        raise ValueError(f"run {compute_only_run.spec.name!r} synchronizes: the compute-only step needs sync='none'")
    steps = _per_step(ddp_run, warmup)
    t_ddp, t_alone = ddp_run.step_ms(warmup), compute_only_run.step_ms(warmup)
    col = {q: [s[q] for s in steps] for q in ("summed", "span", "tail")}
    excess = [s["summed"] - s["tail"] for s in steps]
    rows = {"summed all-reduce durations": col["summed"], "communication span": col["span"],
            "exposed tail": col["tail"], "summed minus exposed tail": excess}
    df = pd.DataFrame([{"quantity": q, "ms": statistics.median(v), "spread_ms": robust_spread(v)}
                       for q, v in rows.items()]).set_index("quantity")
    df.loc["step over compute-only run's step"] = [statistics.median(t_ddp) - statistics.median(t_alone),
                                                   max(robust_spread(t_ddp), robust_spread(t_alone))]
    df = df.round(3)
    df.attrs.update(buckets=statistics.median(s["buckets"] for s in steps),
                    launched_during_backward=statistics.median(s["during_backward"] for s in steps),
                    summed_ms=col["summed"], tail_ms=col["tail"])
    return df


@reading_no_run
def overlap_sentence(table: pd.DataFrame) -> str:
    """What one `summed_as_exposed` table says, as arithmetic in two lines: the per-step sum and tail
    (medians) and in how many steps the sum is the larger, then the step's time over the compute-only
    run's (a separate run, not interleaved: shown, not judged). Nothing here is a finding: the tail is
    nearly all time some bucket was still in flight, and the sum counts every bucket's time in flight."""
    summed, tail = table.attrs["summed_ms"], table.attrs["tail_ms"]
    n, larger = len(summed), sum(s > t for s, t in zip(summed, tail))
    added = table.loc["step over compute-only run's step", "ms"]
    return (f"per step, median of {n}: the tail rank's bucket durations sum to {statistics.median(summed):.1f} ms, the "
            f"exposed tail is {statistics.median(tail):.1f} ms; the sum is the larger in {larger} of {n} steps\n"
            f"the step took {added:+.1f} ms over the compute-only run's step (medians; a separate run, not interleaved "
            f"with this one: shown, not judged)")


@reading(ddp_run="train", compute_only_run="train")
def overlap_error(ddp_run, compute_only_run) -> dict:
    """Notebook 08's third common error on these runs, as its row of `common_errors.error_table`: what
    they `says` (buckets launched during backward, the per-step sum beside the tail: arithmetic) and a
    `verdict` computed from when the buckets launched ("wrong: ..." or "not shown: ...")."""
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


# ---- notebook 08's fourth common error: source order assumed to be ready order ----

@reading(run="train")
def source_as_ready_order(run, step: int = -1, rank: int = 0) -> pd.DataFrame:
    """Per parameter in source order (`named_parameters()`): its source position (the wrong claim's
    ready position), the reverse source position (the claim DDP's first buckets make), the ready
    position the readiness probe measured, its bucket, and whether it is at either assumed position."""
    df = ready_order(run, step, rank).rename(columns={"as_assumed": "at_reverse_source_position"})
    df["at_source_position"] = df["ready_position"] == df["source_position"]
    return df


@reading_no_run
def verify_ready_not_source_order(table: pd.DataFrame) -> None:
    """On a `source_as_ready_order` table: the measured ready order is neither the source order nor its
    reverse (the executed graph decides). Raises `verify.CheckFailed` for a model where one of them
    holds (a chain of layers, like the MLP, is ready in reverse source order)."""
    ready = table["ready_position"].sort_values().index.tolist()
    source = table.index.tolist()
    verify.that("the ready order is not the source order", ready != source,
                seen=f"{moves(source, ready)} of {len(table)} gradients out of the source order", expected="at least 1")
    verify.that("nor the reverse source order", ready != source[::-1],
                seen=f"{moves(source[::-1], ready)} of {len(table)} gradients out of the reverse source order (the "
                     "fewest that, moved, would give it)", expected="at least 1")


@reading(run="train")
def order_error(run) -> dict:
    """Notebook 08's fourth common error on this run, as its row of `common_errors.error_table`: what it
    `says` (how many gradients are out of the source and reverse source orders) and a `verdict` computed from
    the order the readiness probe recorded ("wrong: ..." or "not shown: ...")."""
    t = source_as_ready_order(run)
    n = len(t)
    first = t["ready_position"].idxmin()
    ready = t["ready_position"].sort_values().index.tolist()
    says = (f"{run.spec.model}: {moves(t.index.tolist(), ready)} of {n} gradients out of the source order, "
            f"{moves(t.index.tolist()[::-1], ready)} out of the reverse source order (the fewest that, moved, give it); "
            f"ready first: {first} (source position {t.loc[first, 'source_position']})")
    if ready in (t.index.tolist(), t.index.tolist()[::-1]):
        which = "the source order" if ready == t.index.tolist() else "the reverse source order"
        verdict = f"not shown: on this model the ready order is {which}"
    else:
        verdict = "wrong: the ready order is neither the source order nor its reverse; the executed graph decides"
    return {"says": says, "verdict": verdict}
