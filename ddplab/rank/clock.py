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

import os
import time

_SKEW_NS = round(float(os.environ.get("DDPLAB_NODE_CLOCK_SKEW_S", "0") or 0) * 1e9) * \
    int(os.environ.get("GROUP_RANK", "0") or 0)
_ORIGIN = [0]   # the raw reading at the last alignment barrier


def raw_ns() -> int:
    """This host's monotonic clock (shifted by the simulated skew of this node, if any)."""
    return time.perf_counter_ns() + _SKEW_NS


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
