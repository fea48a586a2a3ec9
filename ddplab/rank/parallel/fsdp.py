"""FSDP2 (`fully_shard`): each rank keeps a shard of every layer's parameters, gradients and optimizer
state, gathering a layer's parameters only while it computes (notebook 02's sharding preview)."""

from __future__ import annotations

import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard


def fully_shard_layers(model, group, device) -> None:
    """Shard every layer (each element of a ModuleList or Sequential child, else each child with
    parameters), then the root, over the ranks of `group` (None = all ranks)."""
    mesh = DeviceMesh.from_group(group or dist.group.WORLD, device.type)
    for child in model.children():
        layers = list(child) if isinstance(child, (nn.ModuleList, nn.Sequential)) else [child]
        for layer in layers:
            if any(True for _ in layer.parameters()):
                fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
