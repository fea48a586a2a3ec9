"""Meters of collectives. `CollectiveCounter` counts every collective a step dispatches, c10d's and the
functional ones, with the bytes handed to each (the planner, rank/planner.py; notebook 12). `CollectiveLog` (tensor
parallelism, notebook 09), a dispatch mode like torch's `CommDebugMode`, sees every functional collective DTensor inserts (`_c10d_functional.
all_reduce`, then `wait_tensor` where the result is used) on the rank's own thread and records its
bytes, its group and the time the rank spent issuing and waiting for it: the collective's cost on the
critical path. Runs inside a rank.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ...predict.plan import RING_WIRE
from ...record.plan import Collective
from .. import clock

OPS = {"allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce", "_allgather_base_": "all_gather",
       "allgather_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
       "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_": "reduce_scatter",
       "reduce_scatter_tensor_coalesced_": "reduce_scatter", "broadcast_": "broadcast",
       "all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter"}


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


def _bytes(x) -> int:
    return sum(t.numel() * t.element_size() for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor))


class CollectiveCounter(TorchDispatchMode):
    """Every collective dispatched while active: its kind and its payload (the whole tensor reduced,
    gathered, scattered or broadcast)."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if func.namespace in ("c10d", "_c10d_functional") and name not in ("wait_tensor", "barrier", "monitored_barrier_"):
            op = OPS.get(name, name)   # an op this table does not know is counted under its own name
            if name == "all_gather_into_tensor":   # functional: (shard, group_size, group): the gathered tensor
                payload = _bytes(args[0]) * int(args[1])
            elif op in ("all_gather", "reduce_scatter"):
                payload = max(_bytes(args[0]), _bytes(args[1]))
            else:
                payload = _bytes(args[0])
            self.calls.append((op, payload))
        return func(*args, **(kwargs or {}))

    def collectives(self, world_size: int) -> list[Collective]:
        by_op: dict[str, list[int]] = defaultdict(list)
        for op, payload in self.calls:
            by_op[op].append(payload)
        share = (world_size - 1) / world_size
        return [Collective(op, len(p), sum(p), round(RING_WIRE.get(op, 1.0) * share * sum(p))) for op, p in sorted(by_op.items())]
