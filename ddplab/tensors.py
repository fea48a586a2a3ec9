"""Tensor helpers that both sides of the process boundary use: a rank comparing plans, the notebook
comparing saved gradients. torch is imported on use, so importing this module stays cheap.
"""

from __future__ import annotations


def flat_float64(tensors):
    """Every tensor flattened into one float64 vector on the CPU, in order."""
    import torch

    return torch.cat([t.detach().double().cpu().flatten() for t in tensors])


def rel_max_diff(a, b) -> float:
    """max |a - b| / max |b|: 0 for bit-identical vectors."""
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
