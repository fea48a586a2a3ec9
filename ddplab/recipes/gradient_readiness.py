"""Notebook 04, gradient readiness: ready order against source order, and one backward traced."""

from __future__ import annotations

from ..spec import Experiment
from .communication import COMM_MODEL


def readiness_cases(bucket_cap_mb: float = 0.001, **overrides) -> list[Experiment]:
    """Notebook 04: ready order against source order, with tiny buckets (one parameter or a Linear's
    pair each): a plain transformer, tied embedding/head, the branchy model, activation checkpointing
    (the activations probe shows what it saves), and the plain model with find_unused_parameters=True
    (DDP's other bucketing path: buckets fixed at construction, never rebuilt)."""
    base = dict(world_size=2, steps=3, probes=("readiness", "activations"), bucket_cap_mb=bucket_cap_mb, n_layers=2)
    base.update(overrides)
    return [Experiment(name="ready-plain", **base), Experiment(name="ready-tied", tie_weights=True, **base),
            Experiment(name="ready-branchy", model="branchy", **base),
            Experiment(name="ready-checkpointing", checkpointing=True, **base),
            Experiment(name="ready-find-unused", find_unused_parameters=True, **base)]


def backward_trace(bucket_cap_mb: float = 0.5, local_batch: int = 16, steps: int = 14, **overrides) -> list[Experiment]:
    """Notebook 04: a DDP step traced bucket by bucket, and the same step without synchronization.
    14 steps leave 12 after DDP's first iteration and its rebuild: enough for `claims` to judge per step."""
    base = dict(world_size=2, local_batch=local_batch, steps=steps, **COMM_MODEL)
    base.update(overrides)
    return [Experiment(name="overlap-ddp", bucket_cap_mb=bucket_cap_mb, probes=("readiness",), **base),
            Experiment(name="overlap-no-sync", sync="none", **base)]
