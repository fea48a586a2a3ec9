"""Tables of global-batch semantics (notebook 06): accumulation with and without no_sync, strong and
weak scaling, two global batch sizes at a matched example budget, and the examples each optimizer
step actually consumed, counted from the ids the ranks recorded (`distinct_examples`).
Notebook 08's first common error is read here too: strong scaling claimed after growing the global batch
(`weak_as_strong`, `fixed_global_batch_setup`, and its row of `common_errors.error_table`, `scaling_error`).
Step times of separate runs are shown, not judged: they did not run interleaved, so no paired claim holds."""

from __future__ import annotations

import statistics

import pandas as pd

from ..units import MIB
from .gradients import check
from .reads import reading



@reading(runs="train", probes=("buckets", "activations", "gradients"))
def accumulation(runs, warmup: int = 1) -> pd.DataFrame:
    """Per run: the batch arithmetic, gradient all-reduces per optimizer step (counted by the bucket
    probe, after DDP's first-iteration single bucket), and saved activations per micro-step."""
    rows = []
    for run in runs:
        s, r0 = run.spec, run.ranks[0]
        if "buckets" not in s.probes or s.steps <= warmup:
            raise ValueError(f"run {s.name!r}: counting all-reduces needs probes=('buckets', ...) and more than "
                             f"warmup={warmup} step(s) (it has {s.steps}); see recipes.accumulation()")
        calls = [len(st.buckets) for st in r0.steps[warmup:]]
        rows.append({"run": s.name, "local_batch": s.local_batch_of(0), "world_size": s.world_size,
                     "accum_steps": s.accum_steps, "global_batch": s.global_batch,
                     "buckets": len({b.index for st in r0.steps[warmup:] for b in st.buckets}),
                     "all_reduces_per_step": statistics.median(calls),
                     "activation_mib_per_micro_step": max(max(st.activation_bytes) for st in r0.steps) / MIB,
                     "reduced_rel_error": check(run)[0]["reduced_rel_error"]})
    return pd.DataFrame(rows).set_index("run")


@reading(run="train")
def examples_per_step(run) -> pd.DataFrame:
    """Per optimizer step, from the ranks' records: the sample ids all ranks consumed (`consumed`,
    counting an id twice if two ranks or micro-steps took it) and how many of them are `distinct`."""
    rows = []
    for i in range(run.spec.steps):
        ids = [j for r in run.ranks for j in r.steps[i].sample_ids]
        rows.append({"step": i, "consumed": len(ids), "distinct": len(set(ids))})
    return pd.DataFrame(rows).set_index("step")


@reading(runs="train", either=("runs",))
def distinct_examples(runs) -> str:
    """One line for one run or several: how many distinct example ids each optimizer step's ranks were
    handed (`examples_per_step`). The ids come from the spec's sharding rule (`spec.sharding`, which
    tests/spec checks), so this is a fact about the rule, printed, not a check of the data path."""
    runs = list(runs) if isinstance(runs, (list, tuple)) else [runs]
    said = []
    for r in runs:
        t = examples_per_step(r)
        counts = "/".join(map(str, sorted(set(t["distinct"]))))
        dup = int((t["consumed"] - t["distinct"]).sum())
        said.append(f"{r.spec.name}: {counts} distinct example ids in each of its {len(t)} optimizer steps"
                    + (f" ({dup} extra copies of ids over those steps)" if dup else ""))
    return "; ".join(said) + " (the sharding rule's ids, as the ranks recorded them)"


@reading(runs="train")
def examples_seen(runs, asked: int, warmup: int = 2) -> pd.DataFrame:
    """Per run: the global batch the experiment meant (`asked`), the fewest distinct examples its ranks
    consumed in one optimizer step, the median step time (slowest rank, after `warmup` steps) and the
    examples per second counted from what the ranks consumed, not from what was asked."""
    rows = []
    for run in runs:
        step_ms = statistics.median(run.step_ms(warmup))
        distinct = int(examples_per_step(run)["distinct"].min())
        rows.append({"run": run.spec.name, "asked_per_step": asked, "distinct_per_step": distinct,
                     "step_ms": step_ms, "examples_per_s": distinct / (step_ms / 1e3)})
    return pd.DataFrame(rows).set_index("run").round(3)


@reading(runs="train")
def scaling(runs, kind: str, warmup: int = 2) -> pd.DataFrame:
    """Strong or weak scaling: per world size, median step time (slowest rank; min-max over steps),
    examples/s, speed-up over one rank and scaling efficiency.

    strong (global batch fixed): efficiency = T1 / (W x TW); weak (local batch fixed): T1 / TW.
    """
    if kind not in ("strong", "weak"):
        raise ValueError(f"kind must be 'strong' or 'weak' (got {kind!r})")
    rows = []
    for run in sorted(runs, key=lambda r: r.world_size):
        if run.spec.steps <= warmup:
            raise ValueError(f"run {run.spec.name!r} has {run.spec.steps} step(s), all of them warm-up "
                             f"(warmup={warmup}): run more steps or pass a smaller warmup")
        t = run.step_ms(warmup)
        rows.append({"world_size": run.world_size, "local_batch": run.spec.local_batch_of(0),
                     "global_batch": run.spec.global_batch, "step_ms": statistics.median(t),
                     "step_ms_min": min(t), "step_ms_max": max(t)})
    df = pd.DataFrame(rows).set_index("world_size")
    df["examples_per_s"] = df["global_batch"] / (df["step_ms"] / 1e3)
    t1 = df["step_ms"].iloc[0]
    df["speedup"] = df["examples_per_s"] / df["examples_per_s"].iloc[0]
    df["efficiency"] = t1 / (df.index * df["step_ms"]) if kind == "strong" else t1 / df["step_ms"]
    df.attrs["kind"] = kind
    return df.round(3)


@reading(run="train")
def loss_by_examples(run, bin_examples: int = 64) -> pd.Series:
    """Global training loss averaged over bins of `bin_examples` examples seen (every example is new,
    so this is also a held-out loss); indexed by examples seen at the end of each bin."""
    g = run.spec.global_batch
    if bin_examples % g:
        raise ValueError(f"bin_examples={bin_examples} must be a multiple of the global batch {g}")
    per_bin = bin_examples // g
    losses = run.global_loss()
    bins = [losses[i:i + per_bin] for i in range(0, len(losses) - per_bin + 1, per_bin)]
    return pd.Series([sum(b) / len(b) for b in bins], index=[(i + 1) * bin_examples for i in range(len(bins))],
                     name=f"global batch {g}")


@reading(runs="train")
def batch_size_study(runs, target_loss: float, bin_examples: int = 64) -> pd.DataFrame:
    """Per global batch: steps, examples/s, and examples, steps and seconds to reach `target_loss`."""
    rows = []
    for run in runs:
        curve = loss_by_examples(run, bin_examples)
        hit = curve[curve <= target_loss]
        examples = int(hit.index[0]) if len(hit) else None
        step_s = statistics.median(run.step_ms(warmup=2)) / 1e3
        g = run.spec.global_batch
        rows.append({"global_batch": g, "steps": run.spec.steps, "examples_per_s": g / step_s,
                     "examples_to_target": examples, "steps_to_target": examples // g if examples else None,
                     "seconds_to_target": examples / g * step_s if examples else None,
                     "final_loss": float(curve.iloc[-1])})
    return pd.DataFrame(rows).set_index("global_batch").round(3)


# ---- notebook 08's first common error: strong scaling claimed after growing the global batch ----

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


@reading(weak_runs="train", strong_runs="train")
def scaling_error(weak_runs, strong_runs) -> dict:
    """Notebook 08's first common error on these runs, as its row of `common_errors.error_table`: what
    they `says` (the weak runs' throughput ratios, the speed-ups at the fixed global batch: shown, not
    judged) and a `verdict` computed from their global batches ("wrong: ..." or "not shown: ...")."""
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
