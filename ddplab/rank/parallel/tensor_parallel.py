"""Tensor parallelism (Megatron-LM style) with torch's own DTensor API: one layer's weights split over
the ranks of a tensor-parallel group, every rank computing on the whole batch (notebook 09).

    mlp:        Linear(d, 4d) column-parallel (each rank 4d/tp output features), GELU on the local
                part, Linear(4d, d) row-parallel (each rank 4d/tp input features): its partial sums
                are all-reduced in forward; the input's gradient is all-reduced in backward.
    attention:  the fused q/k/v Linear column-parallel (each rank n_heads/tp whole heads, which the
                head-major layout of `layers.HeadMajorAttention` guarantees), attention per head on
                the local heads, the output projection row-parallel: the same two all-reduces.

`parallelize_module` with `ColwiseParallel` / `RowwiseParallel` turns the parameters into DTensors
(`Shard(0)` / `Shard(1)` of the weight) and inserts the collectives as functional collectives
(`_c10d_functional.all_reduce`, then `wait_tensor` where the result is used). The tensor-parallel
task meters them with `rank/probes/collectives.CollectiveLog`. Runs inside a rank.
References: Shoeybi et al., Megatron-LM (2019), section 3;
https://pytorch.org/docs/stable/distributed.tensor.parallel.html
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from ..layers import HeadMajorAttention, HeadMajorBlock

_ATTENTION_PLAN = {"qkv": ColwiseParallel, "proj": RowwiseParallel}
_MLP_PLAN = {"0": ColwiseParallel, "2": RowwiseParallel}
PLANS = {"mlp": _MLP_PLAN, "attention": _ATTENTION_PLAN, "attention-qkv-split": _ATTENTION_PLAN,
         "block": {**{f"attn.{k}": v for k, v in _ATTENTION_PLAN.items()},
                   **{f"mlp.{k}": v for k, v in _MLP_PLAN.items()}}}


def build_layer(layer: str, d_model: int, n_heads: int, seed: int) -> nn.Module:
    """The dense layer, from `seed` (the same on every rank). "attention-qkv-split" is attention with
    the fused weight in q|k|v order, the layer a contiguous split mis-shards."""
    torch.manual_seed(seed)
    if layer == "mlp":
        return nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
    if layer == "attention":
        return HeadMajorAttention(d_model, n_heads)
    if layer == "attention-qkv-split":
        return HeadMajorAttention(d_model, n_heads, layout="qkv")
    if layer == "block":
        return HeadMajorBlock(d_model, n_heads)
    raise ValueError(f"unknown layer {layer!r}")


def split_over_mesh(module: nn.Module, layer: str, mesh) -> nn.Module:
    """Split `module` (in place) over the 1-D device mesh `mesh`: column- then row-parallel Linears."""
    return parallelize_module(module, mesh, {name: style() for name, style in PLANS[layer].items()})
