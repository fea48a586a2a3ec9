"""Tensor parallelism (Megatron-LM style) with torch's own DTensor API: one layer's weights split over
the ranks of a tensor-parallel group, every rank computing on the whole batch (notebook 09).

    mlp:        Linear(d, 4d) column-parallel (each rank 4d/tp output features), GELU on the local
                part, Linear(4d, d) row-parallel (each rank 4d/tp input features): its partial sums
                are all-reduced in forward; the input's gradient is all-reduced in backward.
    attention:  the fused q/k/v Linear column-parallel (each rank n_heads/tp whole heads, which the
                head-major layout of `models.HeadMajorAttention` guarantees), attention per head on
                the local heads, the output projection row-parallel: the same two all-reduces.

`parallelize_module` with `ColwiseParallel` / `RowwiseParallel` turns the parameters into DTensors
(`Shard(0)` / `Shard(1)` of the weight) and inserts the collectives as functional collectives
(`_c10d_functional.all_reduce`, then `wait_tensor` where the result is used). `CollectiveLog`, a
dispatch mode like torch's `CommDebugMode`, sees every one of them on the rank's own thread and
records its bytes, its group and the time the rank spent issuing and waiting for it: the collective's
cost on the critical path. Runs inside a rank.
References: Shoeybi et al., Megatron-LM (2019), section 3;
https://pytorch.org/docs/stable/distributed.tensor.parallel.html
"""

from __future__ import annotations


import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils._python_dispatch import TorchDispatchMode

from ..models import HeadMajorAttention, HeadMajorBlock
from .. import clock

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


def tensor_parallel(module: nn.Module, layer: str, mesh) -> nn.Module:
    """Split `module` (in place) over the 1-D device mesh `mesh`: column- then row-parallel Linears."""
    return parallelize_module(module, mesh, {name: style() for name, style in PLANS[layer].items()})


def group_ranks(group_name: str) -> list[int]:
    """The global ranks of the process group a functional collective names."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    return dist.get_process_group_ranks(_resolve_process_group(group_name))


class CollectiveLog(TorchDispatchMode):
    """Record every functional collective dispatched on this thread (forward and backward alike):
    `events` gets {"phase", "op", "bytes", "group", "issue_ns"}, and `comm_ns[phase]` adds up the time
    spent in the collective calls and in the `wait_tensor` calls that block on them. Set `phase`
    before each part of the step. Like any dispatch mode it slows the ops it sees: time with it only
    the collectives, and the step without it. Host time: on CUDA a wait only orders the streams, so
    there it says when the host was free again, not how long the link took."""

    def __init__(self):
        super().__init__()
        self.phase = "forward"
        self.events: list[dict] = []
        self.comm_ns: dict[str, int] = {}
        self._ranks: dict[str, list[int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = func.overloadpacket.__name__
        if func.namespace not in ("_c10d_functional", "c10d_functional") or op.startswith("_"):
            return func(*args, **kwargs)   # computation, or a functional collective's autograd wrapper
        t0 = clock.now_ns()
        out = func(*args, **kwargs)
        spent = clock.now_ns() - t0
        self.comm_ns[self.phase] = self.comm_ns.get(self.phase, 0) + spent
        if op != "wait_tensor":
            tensor = args[0]
            name = kwargs.get("group_name") or [a for a in args if isinstance(a, str)][-1]   # the last str argument
            if name not in self._ranks:
                self._ranks[name] = group_ranks(name)
            self.events.append({"phase": self.phase, "op": op, "bytes": tensor.numel() * tensor.element_size(),
                                "group": self._ranks[name], "issue_ns": spent})
        return out

    def take(self) -> tuple[list[dict], dict[str, int]]:
        """The events and the per-phase time since the last call; clears both."""
        events, comm = self.events, self.comm_ns
        self.events, self.comm_ns = [], {}
        return events, comm
