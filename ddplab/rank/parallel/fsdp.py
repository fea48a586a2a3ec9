"""FSDP2 (`fully_shard`): each rank keeps a shard of every layer's parameters, gradients and optimizer
state, gathering a layer's parameters only while it computes (notebook 02's sharding preview, and
notebook 09's memory over one step)."""

from __future__ import annotations

import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard


def fully_shard_layers(model, group, device, reshard_after_forward: bool = True, prefetch: bool = False,
                       mesh: DeviceMesh | None = None) -> list[tuple[str, nn.Module]]:
    """Shard every layer (each element of a ModuleList or Sequential child, else each child with
    parameters) of the module that holds the blocks (the one whose ModuleList or Sequential child holds the
    most parameters: the model itself, or a Hugging Face model's `transformer` or `model`), then the root,
    over the ranks of `group` (None = all ranks); return the layers' (name, module), the units FSDP2 gathers one at a time, in the
    order the built-in models call them. A layer holding a tied parameter (a head that reuses the embedding)
    is left to the root, with the other layer that holds it: FSDP2 refuses one parameter in two units.
    `reshard_after_forward=False` keeps a unit's gathered parameters from its forward to its backward;
    `prefetch=True` has each unit start gathering the next one in forward and the previous one in
    backward (FSDP2's explicit prefetching). `mesh`: one built already (the planner builds it before it
    enters `FakeTensorMode`, where building one fails)."""
    mesh = mesh or DeviceMesh.from_group(group or dist.group.WORLD, device.type)
    prefix, holder = _holder(model)
    layers = [(".".join(x for x in (prefix, name, sub) if x), layer) for name, child in holder.named_children()
              for sub, layer in (child.named_children() if isinstance(child, (nn.ModuleList, nn.Sequential))
                                 else [("", child)])]
    tied = _tied(model, [layer for _, layer in layers])
    units = []
    for name, layer in layers:
        params = {id(p) for p in layer.parameters()}
        if params and not params & tied:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
            units.append((name, layer))
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    if prefetch:
        modules = [m for _, m in units]
        for i, m in enumerate(modules):
            if i + 1 < len(modules):
                m.set_modules_to_forward_prefetch([modules[i + 1]])
            if i > 0:
                m.set_modules_to_backward_prefetch([modules[i - 1]])
    return units


def _holder(model: nn.Module) -> tuple[str, nn.Module]:
    """(name, module) of the module whose ModuleList or Sequential child holds the most parameters: the
    blocks' parent; the model itself where it has no such child."""
    best = (-1, "", model)
    for name, m in model.named_modules():
        for child in m.children():
            if isinstance(child, (nn.ModuleList, nn.Sequential)):
                n = sum(p.numel() for p in child.parameters())
                if n > best[0]:
                    best = (n, name, m)
    return best[1], best[2]


def _tied(model: nn.Module, layers: list[nn.Module]) -> set[int]:
    """Ids of the parameters held by modules in more than one layer, or in a layer and outside every layer."""
    unit_of = {id(m): i for i, layer in enumerate(layers) for m in layer.modules()}
    where: dict[int, set] = {}
    for m in model.modules():
        for p in m._parameters.values():
            if p is not None:
                where.setdefault(id(p), set()).add(unit_of.get(id(m), -1))
    return {pid for pid, units in where.items() if len(units) > 1}
