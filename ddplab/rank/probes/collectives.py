"""A meter of functional collectives (tensor parallelism, notebook 09): `CollectiveLog`, a dispatch mode
like torch's `CommDebugMode`, sees every functional collective DTensor inserts (`_c10d_functional.
all_reduce`, then `wait_tensor` where the result is used) on the rank's own thread and records its
bytes, its group and the time the rank spent issuing and waiting for it: the collective's cost on the
critical path. Runs inside a rank.
"""

from __future__ import annotations

import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from .. import clock


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
