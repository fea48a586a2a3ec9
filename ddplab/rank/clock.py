"""The one clock a rank stamps its events with: `now_ns()`, nanoseconds since the launch's alignment barrier.

Ranks on one host share CLOCK_MONOTONIC (`time.perf_counter_ns`), but two machines' monotonic
clocks have nothing in common: each counts from its own boot. So no rank records raw clock
readings. Once its process groups exist, every rank of a launch (or of a session's job) leaves a
barrier (`align`), twice: the first exchange warms the connections, and on leaving the second the
nodes are within about one message's latency of each other. Each node takes its clock there as its
origin (the reading of its lowest rank, shared with the node's other ranks, which read the same
clock), and every event time a rank records afterwards is `now_ns()`: nanoseconds since that
moment. Ranks of one node compare exactly, as before; ranks on different hosts share a time base
that is off by about the barrier's exit skew between their nodes (a network hop), and no shared
clock (NTP, PTP) is assumed.

$DDPLAB_NODE_CLOCK_SKEW_S shifts the raw clock of node k (torchrun's GROUP_RANK) by k times that many
seconds: simulated nodes on one host then disagree about the time as real machines do, which is how
the tests check that nothing depends on a shared clock.
Runs inside a rank.
"""

from __future__ import annotations

import functools
import os
import time


@functools.cache   # read on first use: a rank forked from torchrun's agent imported this module there
def _skew_ns() -> int:
    raw = os.environ.get("DDPLAB_NODE_CLOCK_SKEW_S", "").strip() or "0"
    try:
        return round(float(raw) * 1e9) * int(os.environ.get("GROUP_RANK", "0") or 0)
    except ValueError:
        raise ValueError(f"DDPLAB_NODE_CLOCK_SKEW_S: seconds, a number, got {raw!r}") from None


_ORIGIN = [0]   # the raw reading at the last alignment barrier


def raw_ns() -> int:
    """This host's monotonic clock (shifted by the simulated skew of this node, if any)."""
    return time.perf_counter_ns() + _skew_ns()


def now_ns() -> int:
    """Nanoseconds since this launch's alignment barrier: every rank's events share this time base."""
    return raw_ns() - _ORIGIN[0]


def align(node: int = 0, device=None, group=None) -> int:
    """Leave a barrier with every rank of `group` (twice) and make that moment 0 on every node; return
    the raw clock reading it happened at on this node (the record keeps it: each host's offset).

    Ranks on one node share its clock, so they share one origin too: the reading of the node's
    lowest rank, gathered from it. Their events then compare exactly, however late each of them
    was scheduled after the barrier (milliseconds when ranks outnumber cores), and only nodes
    differ by the barrier's exit skew."""
    import torch
    import torch.distributed as dist

    dist.barrier(group=group)
    dist.barrier(group=group)
    mine = torch.tensor([node, raw_ns()], dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    _ORIGIN[0] = next(raw for n, raw in (t.tolist() for t in every) if n == node)
    return _ORIGIN[0]


class GpuStamps:
    """Times of GPU work on the same time base as `now_ns()`: when a kernel *ran*, not when the host
    queued it. On CUDA the host runs ahead of the device, and a collective's future completes (its
    callbacks fire) when the work is queued, so host clock readings there would say "done" before an
    all-reduce started. `mark(setter)` records a CUDA event on the current stream (in a future's
    callback that stream waits for the collective); `resolve()` waits for the device, converts each
    event to `now_ns()` time through an anchor (an event recorded on an idle device, whose host time is
    known), calls the setters, and anchors again for the next step. One per rank (`gpu_stamps`)."""

    def __init__(self):
        import torch

        self._cuda = torch.cuda
        self.pending: list = []
        self._anchor()

    def _anchor(self) -> None:
        self._cuda.synchronize()
        self.ref = self._cuda.Event(enable_timing=True)
        self.ref.record()
        self.ref.synchronize()
        self.ref_raw_ns = raw_ns()   # raw: a later `align` (a session's next job) moves the origin, not this

    def mark(self, setter) -> None:
        event = self._cuda.Event(enable_timing=True)
        event.record()
        self.pending.append((event, setter))

    def resolve(self) -> None:
        if not self.pending:
            return
        self._cuda.synchronize()
        anchor_ns = self.ref_raw_ns - _ORIGIN[0]
        for event, setter in self.pending:
            setter(event_ns(anchor_ns, self.ref.elapsed_time(event)))
        self.pending.clear()
        self._anchor()


def event_ns(anchor_ns: int, elapsed_ms: float) -> int:
    """The time of an event `elapsed_ms` (CUDA's Event.elapsed_time) after the anchor event at `anchor_ns`."""
    return anchor_ns + round(elapsed_ms * 1e6)


_GPU: list = []


def gpu_stamps() -> GpuStamps:
    """This rank's GpuStamps (made on first use, on the current CUDA device)."""
    if not _GPU:
        _GPU.append(GpuStamps())
    return _GPU[0]
