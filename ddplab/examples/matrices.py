"""A network of matrices only, as a model factory (`model="ddplab.examples.matrices:matrices_only"`):
no bias and no norm scale, so PowerSGD compresses every gradient tensor and its all-reduce of the
uncompressed ones is empty, the case pytorch#58467 broke on gloo (notebook 10 runs it on torch 2.13)."""

from __future__ import annotations

import torch.nn as nn


def matrices_only(vocab_size: int, d_model: int) -> nn.Module:
    """Token ids to logits through an embedding, a hidden layer and an output layer, none with a bias."""
    return nn.Sequential(nn.Embedding(vocab_size, d_model), nn.Linear(d_model, d_model, bias=False), nn.ReLU(),
                         nn.Linear(d_model, vocab_size, bias=False))
