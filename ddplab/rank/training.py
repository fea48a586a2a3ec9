"""The pieces of one training step that the ranks and the single-process reference share.

Loss (and its normalization), optimizer and a parameter checksum, so "the same update" means the
same code everywhere. Used by the tasks and `reference.py`; notebooks 00, 01 and 06.
"""

from __future__ import annotations

import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..tensors import flat_float64



def torch_dtype(name: str) -> torch.dtype:
    """"float32" -> torch.float32 (the spec names dtypes; see spec.DTYPES)."""
    return getattr(torch, name)


def token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every target, shape (batch, targets per example: seq_len for tokens, 1 for a
    class label), in at least float32."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    return losses.view(targets.shape[0], -1)


def token_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum of next-token cross-entropy over every token of the batch."""
    return token_losses(logits, targets).sum()


def sample_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum over examples of each example's mean token loss."""
    return token_losses(logits, targets).mean(dim=1).sum()


def micro_loss(loss_norm: str, losses: torch.Tensor, accum_steps: int, scale: float, global_count: float):
    """The loss one rank back-propagates in one micro-step, from its per-token `losses` (batch, seq_len).

    "rank-mean": mean over this micro-batch's tokens / accum_steps; DDP then averages the ranks, which
    weights every rank equally, however many examples it had. "global-sample" / "global-token": the
    sum of per-example (per-token) losses x scale / global_count, with scale = world_size undoing
    DDP's division by the world size, so the synchronized gradient is the global mean.
    """
    if loss_norm == "rank-mean":
        return losses.sum() / losses.numel() / accum_steps
    total = losses.mean(dim=1).sum() if loss_norm == "global-sample" else losses.sum()
    return total * scale / global_count


def make_optimizer(exp, params, group=None) -> torch.optim.Optimizer:
    """The spec's optimizer; with sharding="zero1", wrapped so each rank keeps only its share of the state."""
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[exp.optimizer]
    kwargs = {"lr": exp.lr, **({"momentum": exp.momentum} if exp.optimizer == "sgd" else {})}
    if exp.sharding == "zero1":
        from .parallel.zero import sharded_optimizer

        return sharded_optimizer(params, cls, group, **kwargs)
    return cls(params, **kwargs)


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a sharded DTensor is gathered (a collective: every rank of its mesh must call
    it); a plain tensor is returned as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def parameter_checksum(model: nn.Module) -> str:
    """SHA-256 (16 hex digits) of every parameter's bytes in order: equal iff bit-identical."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(full(p.detach()).cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def flat_parameters(model: nn.Module) -> torch.Tensor:
    """All parameters as one float64 vector on the CPU."""
    return flat_float64(full(p.detach()) for p in model.parameters())
