"""Notebook 09, FSDP2 memory over time: one launch that records a training step of the built-in
transformer under FSDP2 with `reshard_after_forward` on and off, with and without explicit prefetch,
on 4 ranks; and the lab's own model under DDP, ZeRO-1 and FSDP2 for ZeRO's stages 0, 1 and 3."""

from __future__ import annotations

from ..spec import Experiment
from ..spec.fsdp_memory import FsdpMemory

# parameters dominate (a block is 1.7 MiB gathered, its activations 0.4 MiB), and dims that do not divide
# by 4 ranks (a vocabulary of 250, 18 positions) show FSDP2's padding
FSDP_MODEL = dict(model="transformer", d_model=192, n_layers=3, n_heads=4, vocab_size=250, seq_len=18,
                  optimizer="adam", lr=1e-3)


def fsdp_configs(world_size: int = 4, local_batch: int = 2, reshard_after_forward=(True, False),
                prefetch=(False, True), **overrides) -> Experiment:
    """Notebook 09: every combination of `reshard_after_forward` x `prefetch` in one launch, one recorded
    step each (after one warm-up step), on `world_size` ranks. Keyword arguments override Experiment fields."""
    fields = dict(name=f"fsdp-memory-w{world_size}", world_size=world_size, local_batch=local_batch,
                  task=FsdpMemory(reshard_after_forward=reshard_after_forward, prefetch=prefetch), **FSDP_MODEL)
    fields.update(overrides)
    return Experiment(**fields)


# two tensors dominate (the 4096-row embedding and head, 256 Ki elements each; the blocks together 100 Ki):
# torch's ZeRO-1 gives each whole to one rank, so ranks 0 and 1 hold about 5x the optimizer state of
# ranks 2 and 3, where the paper's even split K Psi / N says every rank holds the same
ZERO_MODEL = dict(model="transformer", d_model=64, n_layers=2, n_heads=4, vocab_size=4096, seq_len=16,
                  optimizer="adam", steps=2, probes=("memory",))


def zero_stages_measured(world_size: int = 4, local_batch: int = 4) -> list[Experiment]:
    """Notebook 09: one model with two dominant tensors (`ZERO_MODEL`) trained with DDP (ZeRO stage 0),
    ZeRO-1 (torch's ZeroRedundancyOptimizer) and FSDP2 (stage 3), each with the memory probe, for one
    `ddplab.run_many` launch; `tables.fsdp_memory.zero_measured` sets them beside the exact prediction and the
    paper's even split (`predict.zero`; torch has no stage 2)."""
    return [Experiment(name=f"zero-{s}-w{world_size}", world_size=world_size, local_batch=local_batch,
                       sharding=s, **ZERO_MODEL) for s in ("none", "zero1", "fsdp2")]
