"""When gradients become ready, and when DDP's buckets are launched and finished.

`ReadyLog` puts a post-accumulate-grad hook on every parameter: it fires when the parameter's
gradient has been accumulated into `.grad` (and before DDP's own hook copies it into its bucket), so
its timestamp is the moment the gradient is ready. `BucketLog` is a pass-through DDP communication
hook: it records every bucket DDP launches (index, bytes, member parameters, launch time) and, from
the future's callback on a gloo thread, when the all-reduce finished; it reduces the bucket exactly
as DDP's default hook does (divide by the world size, sum). The bucket layout is therefore DDP's
real one, observed: one bucket for everything in the first iteration, then buckets rebuilt from the
order gradients became ready (notes/ddp-internals.md, sections 1-3; the hook's parameters must be
named `state` and `bucket`). All times are `time.perf_counter_ns()`, one clock for every rank on a
host. Used by notebooks 04 and 06.
"""

from __future__ import annotations

import time

import torch.distributed as dist


class BucketLog:
    """Register with `ddp.register_comm_hook(None, log.hook)`; read `log.take()` after each step."""

    def __init__(self, group=None, names: dict[int, str] | None = None):
        self.group = group
        self.names = names or {}
        self.events: list[dict] = []
        self.buffers = {}  # bucket index -> the flat buffer DDP handed over last (the memory probe counts them)

    def hook(self, state, bucket):
        buf = bucket.buffer()
        self.buffers[bucket.index()] = buf
        event = {"index": bucket.index(), "bytes": buf.numel() * buf.element_size(),
                 "params": [self.names.get(id(p), "?") for p in bucket.parameters()],
                 "launch_ns": time.perf_counter_ns()}
        self.events.append(event)
        buf.div_(dist.get_world_size(self.group))
        fut = dist.all_reduce(buf, group=self.group, async_op=True).get_future()

        def done(f):  # runs on a gloo worker thread when the all-reduce completes
            event["done_ns"] = time.perf_counter_ns()
            return f.value()[0]
        return fut.then(done)

    def take(self) -> list[dict]:
        """The buckets launched since the last call."""
        events, self.events = self.events, []
        return events


class ReadyLog:
    """Records (parameter name, time) each time a parameter's gradient is ready, while `active`."""

    def __init__(self, module):
        self.active = False
        self.events: list[tuple[str, int]] = []
        for name, p in module.named_parameters():
            p.register_post_accumulate_grad_hook(self._hook_for(name))

    def _hook_for(self, name):
        def hook(param):
            if self.active:
                self.events.append((name, time.perf_counter_ns()))
        return hook

    def take(self) -> list[tuple[str, int]]:
        events, self.events = self.events, []
        return events
