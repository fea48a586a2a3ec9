"""The pieces of one training step that the ranks and the single-process reference share.

Loss, optimizer and a parameter checksum, so "the same update" means the same code everywhere.
"""

from __future__ import annotations

import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F


def token_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum of next-token cross-entropy over every token of the batch."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum")


def make_optimizer(exp, params) -> torch.optim.Optimizer:
    if exp.optimizer == "sgd":
        return torch.optim.SGD(params, lr=exp.lr, momentum=exp.momentum)
    if exp.optimizer == "adam":
        return torch.optim.Adam(params, lr=exp.lr)
    return torch.optim.AdamW(params, lr=exp.lr)


def parameter_checksum(model: nn.Module) -> str:
    """SHA-256 (16 hex digits) of every parameter's bytes in order: equal iff bit-identical."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def flat_parameters(model: nn.Module) -> torch.Tensor:
    """All parameters as one float64 vector on the CPU."""
    return torch.cat([p.detach().double().cpu().flatten() for p in model.parameters()])
