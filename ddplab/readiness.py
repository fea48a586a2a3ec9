"""When gradient buckets are handed to the all-reduce, and how big they are.

`BucketLog` is a pass-through DDP communication hook: it records every bucket DDP launches (index,
bytes, parameter count, launch time), then all-reduces the bucket exactly as DDP's default hook
does (divide by the world size, sum). Notebook 06 counts the records per optimizer step to show
that `no_sync` skips the all-reduce on all but the last micro-step. See notes/ddp-internals.md,
section 2: the hook's parameters must be named `state` and `bucket`; with a hook registered, DDP
leaves the division by the world size to the hook.
"""

from __future__ import annotations

import time

import torch.distributed as dist


class BucketLog:
    """Register with `ddp.register_comm_hook(None, log.hook)`; read `log.take()` after each step."""

    def __init__(self, group=None):
        self.group = group
        self.events: list[dict] = []
        self.buffers = {}  # bucket index -> the flat buffer DDP handed over last (the memory probe counts them)

    def hook(self, state, bucket):
        buf = bucket.buffer()
        self.buffers[bucket.index()] = buf
        self.events.append({"index": bucket.index(), "bytes": buf.numel() * buf.element_size(),
                            "params": len(bucket.gradients()), "launch_ns": time.perf_counter_ns()})
        buf.div_(dist.get_world_size(self.group))
        fut = dist.all_reduce(buf, group=self.group, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    def take(self) -> list[dict]:
        """The buckets launched since the last call."""
        events, self.events = self.events, []
        return events
