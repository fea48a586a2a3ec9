"""Tables of the four common errors of data parallelism (notebook 08, seed claim C18), each as the
wrong claim's number beside what the runs measured and what the right model says, on the same runs
(`recipes.common_error_runs`, one launch):

- `weak_as_strong`: weak-scaling throughput read as a strong-scaling speed-up, beside the step time
  at a fixed global batch (separate runs: shown, not judged; `fixed_global_batch_setup` prints the setup);
- `divided_state`: model-state memory divided by the data-parallel degree, beside the per-rank
  ledger and the replicated model of `predict/memory.py` (`verify_replicated_state`);
- `summed_as_exposed`: the bucket all-reduce durations summed, beside the exposed tail of the same
  steps (`record.exposed_tail_ms`; `overlap_sentence` prints both as arithmetic);
- `source_as_ready_order`: parameter source order taken for gradient-ready order, beside the order
  the readiness probe measured (`verify_ready_not_source_order`);
- `common_errors_summary.error_table(runs)`: one row per error, with a verdict computed from the numbers.

The `verify_*` checks raise `verify.CheckFailed` when the right claim does not hold on the runs given.
No timing claim is judged here: the step times of separate runs are shown, not judged, and the sum
against the tail is arithmetic (the tail is nearly all time some bucket was in flight, which the sum
counts); notebook 05 (section 6) judges the sum against what DDP adds, on interleaved steps. Numbers
in, DataFrames out (no processes).
"""

from __future__ import annotations

import statistics

import pandas as pd

from .. import record, verify
from ..predict.memory import state_bytes
from ..recipes.common_errors import PREFIX
from ..units import ms_after
from .stats import robust_spread
from .global_batch import examples_per_step, scaling
from .memory import MODEL_STATE
from .readiness import ready_order, traced_step
from .reads import reading, reading_no_run


GROUPS = ("weak", "strong", "memory", "overlap", "ready")


@reading(runs=None, mapping=("runs",))   # the chapter's dict of every run: it picks the train runs by name
def error_runs(runs) -> dict[str, list]:
    """The runs of a `recipes.common_error_runs()` launch (a list, or a dict by name), by group: "weak",
    "strong", "memory", "overlap" ([DDP, compute-only]) and "ready", in launch order. Runs of other
    recipes launched beside them (names without the "errors-" prefix) are left out."""
    runs = list(runs.values()) if isinstance(runs, dict) else list(runs)
    groups: dict[str, list] = {g: [] for g in GROUPS}
    for run in runs:
        name = run.spec.name
        if not name.startswith(PREFIX):
            continue
        group = name[len(PREFIX):].split("-")[0]
        if group not in groups:
            raise ValueError(f"run {name!r} is not one of recipes.common_error_runs(): its names start with "
                             f"{PREFIX!r} and a group ({', '.join(GROUPS)})")
        groups[group].append(run)
    missing = [g for g, rs in groups.items() if not rs]
    if missing:
        raise ValueError(f"no runs of group(s) {', '.join(missing)}: pass every run of recipes.common_error_runs()")
    groups["overlap"].sort(key=lambda r: r.spec.sync != "ddp")   # DDP first, then compute-only
    return groups


# ---- 1. strong scaling claimed after growing the global batch -------------------------------------

@reading(weak_runs="train", strong_runs="train")
def weak_as_strong(weak_runs, strong_runs, warmup: int = 2) -> pd.DataFrame:
    """Per world size: the weak runs' global batch, step time (median, min-max over steps) and the
    throughput ratio over the fewest ranks that the wrong claim reads as a speed-up (`claimed_speedup`, and
    `claimed_speedup_low`-`claimed_speedup_high` from the step ranges);
    the strong runs' global batch and step time, and the speed-up at that fixed global batch
    (`speedup` = T1 / TW, `speedup_low`-`speedup_high` from the step ranges). Every world size is a
    separate run, not interleaved with the others: the speed-ups are shown, not judged (no faster or
    slower). The weak and strong runs must cover the same world sizes."""
    weak, strong = scaling(weak_runs, "weak", warmup), scaling(strong_runs, "strong", warmup)
    if weak.index.tolist() != strong.index.tolist():
        raise ValueError(f"the weak runs have world sizes {weak.index.tolist()}, the strong runs "
                         f"{strong.index.tolist()}: give both series the same world sizes")
    t1, lo1, hi1 = strong["step_ms"].iloc[0], strong["step_ms_min"].iloc[0], strong["step_ms_max"].iloc[0]
    grows = weak["global_batch"] / weak["global_batch"].iloc[0]   # examples per step, relative to the fewest ranks'
    df = pd.DataFrame({"weak_global_batch": weak["global_batch"], "weak_step_ms": weak["step_ms"],
                       "weak_step_ms_min": weak["step_ms_min"], "weak_step_ms_max": weak["step_ms_max"],
                       "claimed_speedup": weak["speedup"],
                       "claimed_speedup_low": grows * weak["step_ms_min"].iloc[0] / weak["step_ms_max"],
                       "claimed_speedup_high": grows * weak["step_ms_max"].iloc[0] / weak["step_ms_min"],
                       "strong_global_batch": strong["global_batch"], "strong_step_ms": strong["step_ms"],
                       "strong_step_ms_min": strong["step_ms_min"], "strong_step_ms_max": strong["step_ms_max"],
                       "speedup": t1 / strong["step_ms"], "speedup_low": lo1 / strong["step_ms_max"],
                       "speedup_high": hi1 / strong["step_ms_min"]})
    return df.round(3)


@reading(strong_runs="train", weak_runs="train")
def fixed_global_batch_setup(strong_runs, weak_runs) -> None:
    """The right claim's premise, printed as a plain fact: the strong runs keep one global batch, the
    weak runs grow it, and the distinct examples each strong step consumed (counted from what the ranks
    read; the fewest over a run's steps). The specs set all of it (every rank reads its shard of the
    spec's global batch), so nothing is checked: a `ValueError` names the list of runs that breaks the
    setup (strong runs without one shared global batch at two or more world sizes, weak runs that do
    not grow it)."""
    strong = sorted(strong_runs, key=lambda r: r.world_size)
    weak = sorted(weak_runs, key=lambda r: r.world_size)
    sizes, g = [r.world_size for r in strong], [r.spec.global_batch for r in strong]
    if len(set(sizes)) < 2 or len(set(g)) != 1:
        raise ValueError(f"strong_runs: strong scaling needs one global batch at two or more world sizes (got global "
                         f"batches {g} at world sizes {sizes})")
    wg = [r.spec.global_batch for r in weak]
    if len(set(wg)) != len(wg):
        raise ValueError(f"weak_runs: weak scaling grows the global batch with the world size (got {wg} at world "
                         f"sizes {[r.world_size for r in weak]})")
    print(f"the setup: strong scaling keeps the global batch at {g[0]} on {', '.join(map(str, sizes))} ranks; weak "
          f"scaling grows it, {', '.join(map(str, wg))}")
    counts = [int(examples_per_step(r)["distinct"].min()) for r in strong]
    print("distinct examples per strong step, counted from what the ranks read (the fewest over a run's steps): "
          + ", ".join(f"{c} on {w} rank{'s' if w > 1 else ''}" for c, w in zip(counts, sizes)))


# ---- 2. model-state memory divided by the data-parallel degree -------------------------------------

@reading(run="train")
def replicated_state_bytes(run, rank: int) -> int:
    """The replicated model's model state on `rank` (`predict.memory.state_bytes`, from the parameter
    sizes the run recorded): parameters, gradients, DDP's buckets and optimizer state, in bytes."""
    m = run.ranks[rank].memory
    return sum(state_bytes(run.spec, m.parameter_numels or None, m.trainable or None, rank).values())


def _memory_step(run, step: int):
    if run.ranks[0].memory is None or run.spec.steps <= step:
        raise ValueError(f"run {run.spec.name!r}: needs probes=('memory',) and more than {step} step(s)")
    return [r.memory.steps[step] for r in run.ranks]


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
        for r, st in zip(run.ranks, _memory_step(run, step)):
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


# ---- 3. summed all-reduce durations read as exposed overhead -----------------------------------

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


# ---- 4. source order assumed to be ready order -------------------------------------------------

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
                seen=f"{int(table['at_source_position'].sum())} of {len(table)} at their source position",
                expected="not all")
    verify.that("nor the reverse source order", ready != source[::-1],
                seen=f"{int(table['at_reverse_source_position'].sum())} of {len(table)} at their reverse source "
                     f"position", expected="not all")
