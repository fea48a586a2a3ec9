"""Notebook 02, replicated memory: the per-rank ledger, its sweeps, and the sharding preview."""

from __future__ import annotations

from ..spec import Experiment


MEMORY_MODEL = dict(d_model=128, n_layers=4, n_heads=4, vocab_size=256, seq_len=16, steps=2, probes=("memory",))


def memory_ledger(world_size: int = 2, local_batch: int = 8, optimizer: str = "adam", **overrides) -> Experiment:
    """Notebook 02: the per-rank memory ledger of a DDP step, for the analytic model to predict."""
    fields = dict(name=f"memory-w{world_size}-{optimizer}", world_size=world_size, local_batch=local_batch,
                  optimizer=optimizer, **MEMORY_MODEL)
    fields.update(overrides)
    return Experiment(**fields)


def memory_sweeps(global_batch: int = 16, world_sizes=(1, 2, 4)) -> dict[str, list[Experiment]]:
    """Notebook 02: world size at a fixed global batch; optimizer choice; gradients as bucket views."""
    return {
        "world_size": [memory_ledger(w, global_batch // w, name=f"memory-w{w}-gb{global_batch}")
                       for w in world_sizes],
        "optimizer": [memory_ledger(2, 8, "sgd"), memory_ledger(2, 8, "sgd", momentum=0.9, name="memory-w2-momentum"),
                      memory_ledger(2, 8, "adam")],
        "bucket_view": [memory_ledger(2, 8, "adam", gradient_as_bucket_view=True, name="memory-w2-bucket-view")],
    }


def sharding_preview(world_size: int = 4, local_batch: int = 4) -> list[Experiment]:
    """Notebook 02: the same model and step with DDP, ZeRO-1 and FSDP2 (all on gloo); DDP and ZeRO-1 also
    count the bytes each rank writes in backward and in the optimizer step (ZeRO-1's broadcast)."""
    return [memory_ledger(world_size, local_batch, "adam", sharding=s, name=f"sharding-{s}",
                          probes=("memory", "bytes") if s != "fsdp2" else ("memory",))
            for s in ("none", "zero1", "fsdp2")]
