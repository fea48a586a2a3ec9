"""Tables of global-batch semantics (notebook 06): accumulation with and without no_sync, strong and
weak scaling, two global batch sizes at a matched example budget, and the examples each optimizer
step actually consumed, counted from the ranks' records (`verify_distinct_examples`: the chapter's check).
Step times of separate runs are shown, not judged: they did not run interleaved, so no paired claim holds."""

from __future__ import annotations

import statistics

import pandas as pd

from .. import verify
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


@reading(run="train")
def verify_distinct_examples(run, per_step: int) -> None:
    """Notebook 06's check: every optimizer step of `run` took `per_step` distinct examples, counted
    from the sample ids its ranks recorded (`examples_per_step`), not from what the spec asked for.
    Raises `verify.CheckFailed` for a data path that drops examples or ranks that read the same
    examples (tests/views/test_key_checks.py)."""
    distinct = examples_per_step(run)["distinct"].tolist()
    verify.equal(f"{run.spec.name}: distinct examples in each of its {len(distinct)} optimizer steps", distinct,
                 [per_step] * len(distinct))


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
