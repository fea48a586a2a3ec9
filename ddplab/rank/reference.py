"""The single-process reference: one copy of the model, no DDP, on the whole global batch of step 0.

This is what data parallelism promises to reproduce: the gradient (and the optimizer step) that one
process would compute from every example of the global batch, under the training objective:
the mean over all examples ("global-sample") or over all tokens (otherwise; "rank-mean" is the
naive way to approximate this objective, and the reference is what it should have matched).

A rank compares its own parameters after step 0 with the reference step
(`update_rel_error = |theta_rank - theta_ref| / |theta_ref - theta_0|`, about 1e-7 with DDP), and
also takes the step a lone replica would take on its own shard only (the "independent update"),
which lands order one away. Rank 0 also records the reference gradient itself (gradients probe).
Used by notebooks 00, 01 and 06.
"""

from __future__ import annotations

import torch

from ..record.train import Distance
from ..spec.sharding import shard_ids
from . import models
from .training import flat_parameters, make_optimizer, parameter_checksum, sample_loss_sum, token_loss_sum, torch_dtype


def objective(exp) -> str:
    """The global objective the reference computes: "global-sample" or "global-token"."""
    return "global-sample" if exp.loss_norm == "global-sample" else "global-token"


def global_batch(exp, batch, step: int, ranks=None):
    """Every (inputs, targets) pair of optimizer step `step` (`batch`: the model's examples, `models.Built`),
    one per rank and micro-step (or only `ranks`')."""
    parts = []
    for micro in range(exp.accum_steps):
        for rank in range(exp.world_size) if ranks is None else ranks:
            ids = shard_ids(exp.local_batches, exp.accum_steps, step, micro, rank)
            parts.append(batch(ids, exp.seq_len_of(rank)))
    return parts


def backward_on(model, exp, parts, device) -> None:
    """Accumulate into .grad the gradient of the objective's mean over `parts`, one part at a time."""
    per_sample = objective(exp) == "global-sample"
    total = sum(y.shape[0] if per_sample else y.numel() for _, y in parts)
    loss_sum = sample_loss_sum if per_sample else token_loss_sum
    for x, y in parts:
        (loss_sum(model(x.to(device)), y.to(device)) / total).backward()


def fresh_model(exp, device) -> models.Built:
    """The model every rank starts from, in the run's dtype, with the examples it takes."""
    built = models.build_with_data(exp)
    built.module.to(device=device, dtype=torch_dtype(exp.dtype))
    return built


def reference_gradients(exp, device) -> dict[str, torch.Tensor]:
    """Name -> gradient of the objective on step 0's whole global batch, on the CPU."""
    built = fresh_model(exp, device)
    model = built.module
    backward_on(model, exp, global_batch(exp, built.batch, step=0), device)
    return {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters() if p.grad is not None}


def reference_step(exp, device, ranks=None) -> tuple[torch.Tensor, torch.Tensor, str]:
    """One optimizer step on step 0's global batch (or on only `ranks`' shards), in one process, no DDP:
    (parameters before, parameters after) as flat float64 CPU vectors, and the checksum after."""
    built = fresh_model(exp, device)
    model = built.module
    before = flat_parameters(model)
    backward_on(model, exp, global_batch(exp, built.batch, step=0, ranks=ranks), device)
    make_optimizer(exp.replace(sharding="none"), model.parameters()).step()  # one process: nothing to shard
    return before, flat_parameters(model), parameter_checksum(model)


def distance(mine: torch.Tensor, before: torch.Tensor, after: torch.Tensor) -> Distance:
    """How far parameters `mine` are from the reference `after`, absolutely and per unit of update."""
    return Distance(max_abs_diff=float((mine - after).abs().max()),
                    update_rel_error=float((mine - after).norm() / (after - before).norm()))
