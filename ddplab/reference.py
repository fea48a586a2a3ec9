"""The single-process reference: one copy of the model takes optimizer step 0 on the whole global batch.

This is the update data parallelism promises to reproduce: what one process would do with every
example of the global batch, averaged over all its tokens. A rank compares its own parameters after
step 0 with it (`update_rel_error = |theta_rank - theta_ref| / |theta_ref - theta_0|`): about 1e-7
with DDP. Each rank also takes the step a lone replica would take on its own shard only (the
"independent update"), which lands order one away from the reference and differs on every rank.
Used by notebook 00.
"""

from __future__ import annotations

import torch

from . import data, models
from .training import flat_parameters, make_optimizer, parameter_checksum, token_loss_sum


def global_batch(exp, step: int, ranks=None):
    """Every (inputs, targets) pair of optimizer step `step`, one per rank and micro-step (or only `ranks`')."""
    parts = []
    for micro in range(exp.accum_steps):
        for rank in range(exp.world_size) if ranks is None else ranks:
            ids = data.shard_ids(exp.local_batches, exp.accum_steps, step, micro, rank)
            parts.append(data.batch(exp.seed, ids, exp.seq_len_of(rank), exp.vocab_size))
    return parts


def reference_step(exp, device, ranks=None) -> tuple[torch.Tensor, torch.Tensor, str]:
    """One step on the global batch of step 0 (or on only `ranks`' shards), in one process, no DDP:
    (parameters before, parameters after) as flat float64 CPU vectors, and the checksum after."""
    model = models.build(exp).to(device)
    before = flat_parameters(model)
    optimizer = make_optimizer(exp, model.parameters())
    parts = global_batch(exp, step=0, ranks=ranks)
    tokens = sum(y.numel() for _, y in parts)
    for x, y in parts:
        (token_loss_sum(model(x.to(device)), y.to(device)) / tokens).backward()
    optimizer.step()
    return before, flat_parameters(model), parameter_checksum(model)


def distance(mine: torch.Tensor, before: torch.Tensor, after: torch.Tensor) -> dict:
    """How far parameters `mine` are from the reference `after`, absolutely and per unit of update."""
    return {
        "max_abs_diff": float((mine - after).abs().max()),
        "update_rel_error": float((mine - after).norm() / (after - before).norm()),
    }
