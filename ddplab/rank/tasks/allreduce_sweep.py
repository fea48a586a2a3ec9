"""The all-reduce sweep (`AllReduceSweep`): time all_reduce of every message size, repeatedly.

Sizes alternate in order from repeat to repeat (so drift on a shared machine affects every size
alike), each call starts after a barrier, and each records the bytes this process wrote (gloo's
traffic: `rank/probes/bytes.py`). Runs inside a rank; notebooks 03 and 05 fit the alpha-beta model to it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...record.allreduce_sweep import AllReduceSweepRecord, SizeCalls
from ..probes.bytes import io_write_bytes
from ..runtime import Clock


def run(ctx):
    task, group = ctx.exp.task, ctx.group
    ctx.log.enter("allocate buffers")   # a rank killed for memory here is named in this phase, not the one before
    buffers = {n: torch.ones(n // 4, device=ctx.device) for n in task.sweep_bytes}
    clock = Clock(ctx.device)
    for n in task.sweep_bytes:  # warm-up: connections, buffers, caches
        dist.all_reduce(buffers[n], group=group)
    ms = {n: [] for n in task.sweep_bytes}
    written = {n: [] for n in task.sweep_bytes}
    for rep in range(task.repeats):
        ctx.log.enter("all-reduce sweep", rep)
        for n in task.sweep_bytes if rep % 2 == 0 else reversed(task.sweep_bytes):
            dist.barrier(group=group)
            before = io_write_bytes()
            clock.mark("start")
            dist.all_reduce(buffers[n], group=group)
            clock.mark("all_reduce")
            ms[n].append(clock.durations_ms()["all_reduce"])
            written[n].append(io_write_bytes() - before)
    return AllReduceSweepRecord([SizeCalls(n, ms[n], written[n]) for n in task.sweep_bytes]), {}
