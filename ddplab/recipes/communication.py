"""Notebook 03, communication per step: all-reduce sweeps, bytes on the wire, compute against comm."""

from __future__ import annotations

from ..spec import AllReduceSweep, Experiment
from ..units import MIB


COMM_MODEL = dict(d_model=128, n_layers=4, n_heads=4, vocab_size=256, seq_len=16)


def allreduce_sweep(world_size: int = 2, min_bytes: int = 4096, max_bytes: int = 64 * MIB,
                    repeats: int = 50, extra_bytes=(), **overrides) -> Experiment:
    """Notebook 03: all_reduce timed over powers of two from min_bytes to max_bytes, in one launch,
    plus any `extra_bytes` (such as a model's exact gradient size, to measure its all-reduce).
    50 repeats per size keep a 2-rank sweep's median steady on a shared machine (bench/allreduce_fit.py)."""
    sizes = []
    n = min_bytes
    while n <= max_bytes:
        sizes.append(n)
        n *= 2
    sizes = sorted(set(sizes) | set(extra_bytes))
    fields = dict(name=f"allreduce-sweep-w{world_size}", world_size=world_size,
                  task=AllReduceSweep(sweep_bytes=tuple(sizes), repeats=repeats))
    return Experiment(**{**fields, **overrides})


def bytes_on_wire(world_sizes=(2, 3, 4), local_batch: int = 8, **overrides) -> list[Experiment]:
    """Notebook 03: count the bytes each rank writes during DDP's gradient all-reduce (at another
    local batch than the default 8, the names say which: the payload should not change)."""
    suffix = "" if local_batch == 8 else f"-b{local_batch}"
    return [Experiment(name=f"bytes-w{w}{suffix}", world_size=w, local_batch=local_batch, steps=2, probes=("bytes",),
                       **{**COMM_MODEL, **overrides}) for w in world_sizes]


def local_batch_sweep(local_batches=(1, 4, 16, 64), world_size: int = 2, steps: int = 12,
                      **overrides) -> list[Experiment]:
    """Notebook 03: the same model at growing local batches, without synchronization (compute only).
    12 steps leave 11 after the warm-up: enough per-step pairs for `claims` to judge a growth."""
    return [Experiment(name=f"compute-b{b}", world_size=world_size, local_batch=b, steps=steps, sync="none",
                       **{**COMM_MODEL, **overrides}) for b in local_batches]
