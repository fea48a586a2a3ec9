"""Model factories whose gradients are not every parameter's: a frozen matrix in the middle (DDP's bucket
leaves it out) and a forward that detaches its output (no parameter gets a gradient). Imported by the
ranks as `model="tests.support.gradient_models:<factory>"`."""

from __future__ import annotations

import torch
import torch.nn as nn


class _FrozenMiddle(nn.Module):
    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, d_model)
        self.mix = nn.Linear(d_model, d_model, bias=False)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, idx):
        return self.head(torch.relu(self.mix(self.emb(idx))))


def frozen_matrix(vocab_size: int, d_model: int):
    """A d_model x d_model matrix frozen between two trained layers: used in every forward, in no bucket."""
    model = _FrozenMiddle(vocab_size, d_model)
    model.mix.weight.requires_grad_(False)
    return model


class _Detached(_FrozenMiddle):
    def forward(self, idx):
        return super().forward(idx).detach().requires_grad_()   # a loss to call backward on, cut off from the model


def detached_output(vocab_size: int, d_model: int):
    """Logits of the right shape that carry no graph back to any parameter: backward runs, and no
    parameter gets a gradient, so training would leave every one where it started."""
    return _Detached(vocab_size, d_model)
