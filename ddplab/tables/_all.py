"""pandas tables of a `Run`, one row per rank, in the lab's vocabulary and units.

Used by every notebook and by `ddplab run` (which prints `ranks`).
"""

from __future__ import annotations

import statistics

import pandas as pd


def id_ranges(ids: list[int]) -> str:
    """[0, 1, 2, 3, 8, 9] -> '0-3, 8-9'."""
    from .data import contiguous_spans

    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in contiguous_spans(ids))


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


def gradient_check(run) -> pd.DataFrame:
    """Per rank: local and reduced gradient against the single-process reference (gradients probe)."""
    from . import gradients

    return pd.DataFrame(gradients.check(run)).set_index("rank")


def gradient_values(run, names=None, k: int = 3) -> pd.DataFrame:
    """A few gradient elements: each rank's local value, their mean, the reduced value, the reference."""
    from . import gradients

    return pd.DataFrame(gradients.check_case(run, names, k)).set_index(["tensor", "element"])


def normalization(runs) -> pd.DataFrame:
    """One row per run (e.g. one per loss_norm): how far the reduced gradient is from the reference."""
    from . import gradients

    rows = []
    for run in runs:
        first = gradients.check(run)[0]
        rows.append({"run": run.spec.name, "loss_norm": run.spec.loss_norm, "dtype": run.spec.dtype,
                     "local_batch": list(run.spec.local_batches), "seq_len": list(run.spec.seq_lens),
                     "reduced_rel_error": first["reduced_rel_error"],
                     "identical_on_all_ranks": first["reduced_identical_on_all_ranks"]})
    return pd.DataFrame(rows).set_index("run")


def accumulation(runs, warmup: int = 1) -> pd.DataFrame:
    """Per run: the batch arithmetic, gradient all-reduces per optimizer step (counted by the bucket
    probe, after DDP's first-iteration single bucket), and saved activations per micro-step."""
    from . import gradients

    rows = []
    for run in runs:
        s, r0 = run.spec, run.ranks[0]
        calls = [len(st["buckets"]) for st in r0.steps[warmup:]]
        rows.append({"run": s.name, "local_batch": s.local_batch_of(0), "world_size": s.world_size,
                     "accum_steps": s.accum_steps, "global_batch": s.global_batch,
                     "buckets": len({b["index"] for st in r0.steps[warmup:] for b in st["buckets"]}),
                     "all_reduces_per_step": statistics.median(calls),
                     "activation_mib_per_micro_step": max(max(st["activation_bytes"]) for st in r0.steps) / 2**20,
                     "reduced_rel_error": gradients.check(run)[0]["reduced_rel_error"]})
    return pd.DataFrame(rows).set_index("run")


def scaling(runs, kind: str, warmup: int = 2) -> pd.DataFrame:
    """Strong or weak scaling: per world size, median step time (slowest rank; min-max over steps),
    examples/s, speed-up over one rank and scaling efficiency.

    strong (global batch fixed): efficiency = T1 / (W x TW); weak (local batch fixed): T1 / TW.
    """
    if kind not in ("strong", "weak"):
        raise ValueError(f"kind must be 'strong' or 'weak' (got {kind!r})")
    rows = []
    for run in sorted(runs, key=lambda r: r.world_size):
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


MIB = 2 ** 20


def _memory_steps(run, step):
    if run.ranks[0].raw.get("memory") is None:
        raise ValueError("this run has no memory ledger: run it with probes=('memory',)")
    return [r.raw["memory"]["steps"][step] for r in run.ranks]


def memory(run, step: int = 1) -> pd.DataFrame:
    """One row per rank: each category at its largest in step `step` (activations after forward,
    gradients after backward, optimizer state after the step), measured beside predicted, in MiB,
    and the step's measured peak (everything alive at once, temporaries included)."""
    from .memory import CATEGORIES
    from .memory_model import predict

    if run.spec.sharding != "none" or run.spec.accum_steps != 1:
        raise ValueError("the analytic memory model covers plain DDP with accum_steps=1; "
                         "use tables.memory_sweep or tables.sharding for this run")
    cols = {}
    rows = []
    for r, st in zip(run.ranks, _memory_steps(run, step)):
        pred = predict(run.spec, r.rank, step)
        row = {}
        for c in CATEGORIES:
            row[(c, "measured")] = max(p[c] for p in st["phases"].values()) / MIB
            row[(c, "predicted")] = max(p[c] for p in pred.values()) / MIB
        row[("peak", "measured")] = st["peak"] / MIB
        row[("rss", "measured")] = st["phases"]["step"]["rss"] / MIB
        rows.append(row)
        cols = list(row)
    df = pd.DataFrame(rows, index=pd.Index([r.rank for r in run.ranks], name="rank"))
    df.columns = pd.MultiIndex.from_tuples(cols, names=["MiB", ""])
    return df.round(3)


def memory_sweep(runs, step: int = 1) -> pd.DataFrame:
    """One row per run (rank 0): the settings, model state (parameters + gradients + buckets +
    optimizer state after the step), activations and the measured peak, in MiB."""
    rows = []
    for run in runs:
        st = _memory_steps(run, step)[0]
        after = st["phases"]["step"]
        s = run.spec
        rows.append({"run": s.name, "world_size": s.world_size, "local_batch": s.local_batch_of(0),
                     "global_batch": s.global_batch, "optimizer": s.optimizer + (f"+momentum" if s.momentum else ""),
                     "bucket_view": s.gradient_as_bucket_view, "sharding": s.sharding,
                     "parameters": after["parameters"] / MIB, "gradients": after["gradients"] / MIB,
                     "ddp_buckets": after["ddp_buckets"] / MIB, "optimizer_state": after["optimizer_state"] / MIB,
                     "model_state": sum(after[c] for c in ("parameters", "gradients", "ddp_buckets", "optimizer_state")) / MIB,
                     "activations": st["phases"]["forward"]["activations"] / MIB, "peak": st["peak"] / MIB})
    return pd.DataFrame(rows).set_index("run").round(3)


def sharding(runs, step: int = 1) -> pd.DataFrame:
    """Per sharding mode (rank 0; the first run must be plain DDP): what each rank keeps, its peak,
    and the naive estimate "checkpoint / world size" (checkpoint = full parameters + optimizer state)."""
    table = memory_sweep(runs, step).set_index("sharding")
    full = table.iloc[0]
    checkpoint = full["parameters"] + full["optimizer_state"]
    table["checkpoint_over_world_size"] = checkpoint / table["world_size"]
    table["peak_over_estimate"] = table["peak"] / table["checkpoint_over_world_size"]
    keep = ["world_size", "parameters", "gradients", "ddp_buckets", "optimizer_state", "activations", "peak",
            "checkpoint_over_world_size", "peak_over_estimate"]
    return table[keep].round(3)


def memory_cuda(run, step: int = 1) -> pd.DataFrame:
    """On CUDA: per rank and phase, the ledger's total beside the caching allocator's own figures
    (allocated >= ledger: the allocator also holds temporaries, the CUDA context's tensors, rounding)."""
    from .memory import CATEGORIES

    rows = []
    for r, st in zip(run.ranks, _memory_steps(run, step)):
        for phase, p in st["phases"].items():
            if "cuda_allocated" not in p:
                raise ValueError("this run did not run on CUDA: the allocator figures exist only there")
            rows.append({"rank": r.rank, "phase": phase, "ledger": sum(p[c] for c in CATEGORIES) / MIB,
                         "cuda_allocated": p["cuda_allocated"] / MIB, "cuda_reserved": p["cuda_reserved"] / MIB,
                         "ledger_peak": st["peak"] / MIB, "cuda_peak_allocated": p["cuda_peak_allocated"] / MIB})
    return pd.DataFrame(rows).set_index(["rank", "phase"]).round(3)
