"""Notebook 06, global-batch semantics: accumulation with no_sync, strong and weak scaling, batch size."""

from __future__ import annotations

from ..spec import Experiment


def accumulation(world_size: int = 2, local_batch: int = 4, accum_steps: int = 4, **overrides) -> list[Experiment]:
    """Notebook 06: accumulation with no_sync, the same without it (an all-reduce per micro-step), and
    one big local batch of the same global size. Small buckets, so there is more than one to count."""
    base = dict(world_size=world_size, steps=3, bucket_cap_mb=0.05, probes=("gradients", "buckets", "activations"))
    base.update(overrides)
    return [Experiment(name="accum-no-sync", local_batch=local_batch, accum_steps=accum_steps, **base),
            Experiment(name="accum-sync-every-micro-step", local_batch=local_batch, accum_steps=accum_steps,
                       no_sync=False, **base),
            Experiment(name="one-big-local-batch", local_batch=local_batch * accum_steps, **base)]


SCALING_MODEL = dict(d_model=128, n_layers=2, n_heads=4, seq_len=64, steps=8)


def strong_scaling(global_batch: int = 32, world_sizes=(1, 2, 4), **overrides) -> list[Experiment]:
    """Notebook 06: the global batch stays fixed; more ranks means smaller local batches. A global batch
    that does not split evenly is refused: rounding the local batch down would drop examples silently."""
    for w in world_sizes:
        if global_batch % w:
            raise ValueError(f"strong_scaling: global_batch={global_batch} does not split evenly over {w} ranks; "
                             f"{global_batch // w} per rank would drop {global_batch % w} examples every step")
    return [Experiment(name=f"strong-w{w}", world_size=w, local_batch=global_batch // w,
                       **{**SCALING_MODEL, **overrides}) for w in world_sizes]


def weak_scaling(local_batch: int = 8, world_sizes=(1, 2, 4), **overrides) -> list[Experiment]:
    """Notebook 06: the local batch stays fixed; more ranks means a bigger global batch."""
    return [Experiment(name=f"weak-w{w}", world_size=w, local_batch=local_batch, **{**SCALING_MODEL, **overrides})
            for w in world_sizes]


def batch_size_study(global_batches=(8, 32), examples: int = 1024, world_size: int = 2, **overrides) -> list[Experiment]:
    """Notebook 06: train the same model on the same stream of examples with two global batch sizes
    and the same learning rate, for the same number of examples (so fewer steps for the bigger batch)."""
    fields = dict(world_size=world_size, optimizer="sgd", lr=0.5)
    fields.update(overrides)
    return [Experiment(name=f"batch-{b}", local_batch=b // world_size, steps=examples // b, **fields)
            for b in global_batches]
