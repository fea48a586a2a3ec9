"""When DDP's buckets are launched and finished: a pass-through communication hook.

`BucketLog` records every bucket DDP launches (index, bytes, member parameters, launch time) and,
from the future's callback on a gloo thread, when the all-reduce finished; it reduces the bucket
exactly as DDP's default hook does (divide by the world size, sum). The bucket layout is therefore
DDP's real one, observed: one bucket for everything in the first iteration, then buckets rebuilt from
the order gradients became ready (docs/ddp-internals.md, "Buckets", "The bucket rebuild" and
"Communication hooks": the hook's parameters must be named `state` and `bucket`). It also keeps each
bucket's flat buffer, which the memory probe counts.
Used by notebooks 02, 04, 05 and 06.
"""

from __future__ import annotations


import torch.distributed as dist

from ...record.timeline import BucketEvent
from . import Probe
from .. import clock, link


class BucketLog:
    """Register with `ddp.register_comm_hook(None, log.hook)` (or hand it to `BucketedSync`); read
    `log.take()` after each step.
    On CUDA, launch and done are when the device got there (`clock.GpuStamps`): the bucket's gradients
    written, and the all-reduce finished on the NCCL stream, not when the host queued them."""

    def __init__(self, group=None, names: dict[int, str] | None = None, cuda: bool = False, bandwidth: float = 1.0):
        self.group, self.bandwidth = group, bandwidth   # bandwidth: times the emulated link's rate (rank/link.py)
        self.names = names or {}
        self.events: list[dict] = []
        self.buffers = {}  # bucket index -> the flat buffer DDP handed over last
        self.stamps = clock.gpu_stamps() if cuda else None

    def hook(self, state, bucket):
        """DDP's communication hook: the bucket's all-reduce, recorded."""
        buf = bucket.buffer()
        self.buffers[bucket.index()] = buf
        return self.launch(bucket.index(), buf, [self.names.get(id(p), "?") for p in bucket.parameters()])

    def launch(self, index: int, buf, params: list[str]):
        """Average `buf` over the group with an async all-reduce and record it as bucket `index` holding
        `params`: the one bucket recorder, for DDP's hook and for `parallel.bucketed.BucketedSync`.
        Returns the all-reduce's future, completed with the reduced buffer."""
        event = {"index": index, "bytes": buf.numel() * buf.element_size(), "params": params,
                 "launch_ns": clock.now_ns()}
        self.events.append(event)
        if self.stamps:
            self.stamps.mark(lambda t: event.__setitem__("launch_ns", t))
        buf.div_(dist.get_world_size(self.group))
        # on an emulated link (spec/link.py) its completion waits for the link too: done_ns is when it arrived
        fut = link.hold(dist.all_reduce(buf, group=self.group, async_op=True).get_future(), event["bytes"],
                        bandwidth=self.bandwidth)

        def done(f):  # gloo: on a worker thread when the all-reduce completes; CUDA: see the class
            event["done_ns"] = clock.now_ns()
            if self.stamps:
                self.stamps.mark(lambda t: event.__setitem__("done_ns", t))
            return f.value()[0]
        return fut.then(done)

    def take(self) -> list[BucketEvent]:
        """The buckets launched since the last call."""
        if self.stamps:
            self.stamps.resolve()
        events, self.events = self.events, []
        return [BucketEvent(**e) for e in events]


class BucketsProbe(Probe):
    """Fills `TrainStep.buckets`: every bucket of the step (needs DDP; without it, nothing)."""

    name = "buckets"

    def __init__(self, at, attached):
        super().__init__(at, attached)
        self.log = None
        if at.ddp is not None:
            self.log = BucketLog(at.ctx.group, {id(p): n for n, p in at.module.named_parameters()},
                                 cuda=at.ctx.device.type == "cuda")
            at.ddp.register_comm_hook(None, self.log.hook)

    def step_fields(self, step: int) -> dict:
        return {"buckets": self.log.take()} if self.log else {}
