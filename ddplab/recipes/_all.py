"""Named experiments, one function per chapter experiment; variants derive with `Experiment.replace`.

Each function returns an `Experiment` and runs nothing. Keyword arguments override any field.
Used by the notebooks, the CLI and the tests.
"""

from __future__ import annotations

from .spec import Experiment


def launch_and_ranks(world_size: int = 4, local_batch: int = 16, **overrides) -> Experiment:
    """Notebook 00: the seed's setup, a global batch of 64 split into 4 local batches of 16, one step,
    with the single-process reference and each rank's independent update recorded."""
    fields = dict(name="launch-and-ranks", world_size=world_size, local_batch=local_batch, seq_len=16,
                  steps=1, probes=("reference",))
    return Experiment(**{**fields, **overrides})


def crash(world_size: int = 2, fault_rank: int = 1, **overrides) -> Experiment:
    """Notebook 00: one rank raises in the middle of a step; the others lose their peer."""
    fields = dict(name="crash", world_size=world_size, steps=2, fault="crash", fault_rank=fault_rank, fault_step=1)
    return Experiment(**{**fields, **overrides})


def skip_backward(world_size: int = 2, fault_rank: int = 1, timeout_s: float = 5.0, **overrides) -> Experiment:
    """Notebook 00: one rank skips its backward, so the others wait in the gradient all-reduce until
    the process group's timeout."""
    fields = dict(name="skip-backward", world_size=world_size, steps=2, fault="skip-backward",
                  fault_rank=fault_rank, fault_step=1, timeout_s=timeout_s)
    return Experiment(**{**fields, **overrides})


def synchronized_gradient(world_size: int = 4, local_batch: int = 8, **overrides) -> Experiment:
    """Notebook 01: every rank records its local and reduced gradient; rank 0 the global-batch reference."""
    fields = dict(name=f"synchronized-gradient-w{world_size}", world_size=world_size, local_batch=local_batch,
                  probes=("gradients",))
    return Experiment(**{**fields, **overrides})


def unequal_work(local_batch=(2, 4, 6, 12), seq_len=(16, 16, 16, 16), **overrides) -> list[Experiment]:
    """Notebook 01: the same unequal shards under each loss normalization (naive rank-mean first)."""
    return [synchronized_gradient(world_size=len(local_batch), local_batch=tuple(local_batch), seq_len=seq_len,
                                  name=f"unequal-{norm}", loss_norm=norm, **overrides)
            for norm in ("rank-mean", "global-sample", "global-token")]


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
    """Notebook 06: the global batch stays fixed; more ranks means smaller local batches."""
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


MEMORY_MODEL = dict(d_model=128, n_layers=4, n_heads=4, vocab_size=256, seq_len=16, steps=2, probes=("memory",))


def replicated_memory(world_size: int = 2, local_batch: int = 8, optimizer: str = "adam", **overrides) -> Experiment:
    """Notebook 02: the per-rank memory ledger of a DDP step, for the analytic model to predict."""
    fields = dict(name=f"memory-w{world_size}-{optimizer}", world_size=world_size, local_batch=local_batch,
                  optimizer=optimizer, **MEMORY_MODEL)
    fields.update(overrides)
    return Experiment(**fields)


def memory_sweeps(global_batch: int = 16, world_sizes=(1, 2, 4)) -> dict[str, list[Experiment]]:
    """Notebook 02: world size at a fixed global batch; optimizer choice; gradients as bucket views."""
    return {
        "world_size": [replicated_memory(w, global_batch // w, name=f"memory-w{w}-gb{global_batch}")
                       for w in world_sizes],
        "optimizer": [replicated_memory(2, 8, "sgd"), replicated_memory(2, 8, "sgd", momentum=0.9, name="memory-w2-momentum"),
                      replicated_memory(2, 8, "adam")],
        "bucket_view": [replicated_memory(2, 8, "adam", gradient_as_bucket_view=True, name="memory-w2-bucket-view")],
    }


def sharding_preview(world_size: int = 4, local_batch: int = 4) -> list[Experiment]:
    """Notebook 02: the same model and step with DDP, ZeRO-1 and FSDP2 (all on gloo)."""
    return [replicated_memory(world_size, local_batch, "adam", sharding=s, name=f"sharding-{s}")
            for s in ("none", "zero1", "fsdp2")]


COMM_MODEL = dict(d_model=128, n_layers=4, n_heads=4, vocab_size=256, seq_len=16)


def allreduce_sweep(world_size: int = 2, min_bytes: int = 4096, max_bytes: int = 64 * 2 ** 20,
                    repeats: int = 50, **overrides) -> Experiment:
    """Notebook 03: all_reduce timed over powers of two from min_bytes to max_bytes, in one launch.
    50 repeats per size keep a 2-rank sweep's median steady on a shared machine (bench/allreduce_fit.py)."""
    sizes = []
    n = min_bytes
    while n <= max_bytes:
        sizes.append(n)
        n *= 2
    fields = dict(name=f"allreduce-sweep-w{world_size}", task="allreduce-sweep", world_size=world_size,
                  sweep_bytes=tuple(sizes), repeats=repeats)
    return Experiment(**{**fields, **overrides})


def bytes_on_wire(world_sizes=(2, 3, 4), **overrides) -> list[Experiment]:
    """Notebook 03: count the bytes each rank writes during DDP's gradient all-reduce."""
    return [Experiment(name=f"bytes-w{w}", world_size=w, steps=2, probes=("bytes",), **{**COMM_MODEL, **overrides})
            for w in world_sizes]


def local_batch_sweep(local_batches=(1, 4, 16, 64), world_size: int = 2, **overrides) -> list[Experiment]:
    """Notebook 03: the same model at growing local batches, without synchronization (compute only)."""
    return [Experiment(name=f"compute-b{b}", world_size=world_size, local_batch=b, steps=4, sync="none",
                       **{**COMM_MODEL, **overrides}) for b in local_batches]


def readiness_cases(bucket_cap_mb: float = 0.001, **overrides) -> list[Experiment]:
    """Notebook 04: ready order against source order, with tiny buckets (one parameter or a Linear's
    pair each): a plain transformer, tied embedding/head, the branchy model, activation checkpointing."""
    base = dict(world_size=2, steps=3, probes=("readiness",), bucket_cap_mb=bucket_cap_mb, n_layers=2)
    base.update(overrides)
    return [Experiment(name="ready-plain", **base), Experiment(name="ready-tied", tie_weights=True, **base),
            Experiment(name="ready-branchy", model="branchy", **base),
            Experiment(name="ready-checkpointing", checkpointing=True, **base)]


def overlap(bucket_cap_mb: float = 0.5, local_batch: int = 16, steps: int = 8, **overrides) -> list[Experiment]:
    """Notebook 04: a DDP step traced bucket by bucket, and the same step without synchronization."""
    base = dict(world_size=2, local_batch=local_batch, steps=steps, **COMM_MODEL)
    base.update(overrides)
    return [Experiment(name="overlap-ddp", bucket_cap_mb=bucket_cap_mb, probes=("readiness",), **base),
            Experiment(name="overlap-no-sync", sync="none", **base)]


# 4.2 M parameters, 16 MiB of float32 gradients in 53 tensors: on 2 CPU ranks backward takes about as
# long as one flat all-reduce of the gradient takes 3-4 times over, so bucket size visibly matters
BUCKET_MODEL = dict(vocab_size=2048, d_model=256, n_layers=4, n_heads=4, local_batch=4, seq_len=64)
ONE_PER_PARAMETER_MB = 1e-4     # below every tensor's size: DDP closes a bucket after each tensor


def bucket_sweep(world_size: int = 2, caps_mb=(ONE_PER_PARAMETER_MB, 0.25, 1, 2, 4, 8, 64), split_cap_mb: float = 4,
                 rounds: int = 5, steps: int = 4, allreduce_repeats: int = 50, pin_cpus: bool = True,
                 **overrides) -> list[Experiment]:
    """Notebook 05: [the all-reduce sweep that fits alpha-beta, the bucket sweep], for one launch
    (`ddplab.run_many`). The bucket sweep times DDP at every cap in `caps_mb` (from one tensor per
    bucket to a single bucket), DDP's default, and `BucketedSync` with DDP's plan at `split_cap_mb`,
    as is and with its last bucket split in two; `rounds` interleaved rounds of `steps` steps each.
    Ranks are pinned one per core by default: the timings are steadier (notes: performance anchors)."""
    plans = tuple(f"ddp:{c:g}" for c in caps_mb) + ("ddp:default", f"plan:{split_cap_mb:g}", f"split:{split_cap_mb:g}")
    sweep = Experiment(**{**dict(name=f"bucket-sweep-w{world_size}", task="bucket-sweep", world_size=world_size,
                                 plans=plans, repeats=rounds, steps=steps, pin_cpus=pin_cpus, **BUCKET_MODEL),
                            **overrides})
    return [allreduce_sweep(world_size, max_bytes=32 * 2 ** 20, repeats=allreduce_repeats, pin_cpus=pin_cpus), sweep]
