"""A small gradient synchronizer with an explicit bucket plan: any grouping of the parameters into
buckets, all-reduced in the order the plan lists them.

    sync = BucketedSync(module, [["head.weight", "head.bias"], ["blocks.1.ff.weight", ...], ...], group)
    loss_fn(sync(x)).backward()     # each bucket's all-reduce starts as soon as its last gradient is ready
    optimizer.step()                # .grad now holds the average over the ranks, as with DDP

DDP itself takes per-bucket caps: torch 2.13's `DistributedDataParallel(..., bucket_cap_mb_list=[...])`
(`_BucketCapacityConfig.compute_bucket_size_limits` in torch/nn/parallel/distributed.py) uses them from
construction, so there are several buckets from the first step even with the default flags. At
construction DDP fills buckets in the parameters' definition order and reverses the list, so the first
cap bounds the bucket of the earliest-defined parameters, which is reduced last; after the rebuild the
buckets follow the ready order. Whether the last cap repeats for any further buckets is up to the C++
reducer: to split only the final bucket, give as many caps as there are buckets. What this class adds:
a plan is any membership, not only consecutive runs of an order cut by size; it holds from the first
step; and the mechanism is plain Python that the lab can read, timing every bucket itself.

It does what DDP's reducer does: at construction it broadcasts rank 0's parameters (not buffers: the
lab's models have none) and gives each bucket one flat tensor; during backward a post-accumulate-grad
hook counts each bucket's gradients, and when a bucket is complete and every bucket before it in the plan
has started, copies its gradients into the flat tensor, divides by the world size and launches an
asynchronous all-reduce (in plan order, as DDP does, so every rank issues the same sequence of
collectives). A callback queued on the autograd engine runs when backward ends: it waits for every
bucket and copies the averages back into `.grad`. A bucket whose gradients never all arrived (a
parameter unused in this forward) is an error naming them. As a module it is the wrapped module under
the name `module`, as with DDP: `state_dict()` keys are the module's with a `module.` prefix, and
`.to()` moves the flat tensors with the parameters.

Given a `log` (`rank/probes/buckets.BucketLog`, the one bucket recorder, which DDP's comm hook uses
too), every bucket's all-reduce goes through it and `take()` returns what it recorded, so measured
timelines read the same for DDP and for this; the mechanism itself meters nothing. Checked against
DDP's gradients in tests/rank/test_bucketed.py. Used by the bucket sweep (notebook 05).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...record.timeline import BucketEvent
from .. import link


class BucketedSync(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, plan: list[list[str]], group=None, log=None):
        super().__init__()
        if log is not None and log.group is not group:
            raise ValueError("log: its group must be the synchronizer's (BucketLog(group) with the same group)")
        self.log = log   # a `probes.buckets.BucketLog` records every bucket's all-reduce; None: unrecorded
        self.module = module
        self.group = group
        params = dict(module.named_parameters())
        trainable = [n for n, p in params.items() if p.requires_grad]
        seen = [n for b in plan for n in b]
        twice = sorted({n for n in seen if seen.count(n) > 1})
        unknown = sorted(set(seen) - set(trainable))
        missing = sorted(set(trainable) - set(seen))
        if twice or unknown or missing or any(not b for b in plan):
            raise ValueError(f"plan: every trainable parameter must be in exactly one non-empty bucket "
                             f"(twice: {twice}, unknown: {unknown}, missing: {missing})")
        mixed = [j for j, b in enumerate(plan) if len({(params[n].dtype, params[n].device) for n in b}) > 1]
        if mixed:
            raise ValueError(f"plan: bucket(s) {mixed} mix dtypes or devices; one flat buffer needs one of each")
        self.plan = [list(b) for b in plan]
        src = dist.get_global_rank(group, 0) if group is not None else 0
        with torch.no_grad():
            for p in params.values():   # like DDP: every rank starts from rank 0's parameters
                dist.broadcast(p.data, src=src, group=group)
        self._params = [[params[n] for n in b] for b in self.plan]
        # the flat tensors are not registered buffers: like DDP's reducer's, they are not model state
        self._flat = [torch.empty(sum(p.numel() for p in b), dtype=b[0].dtype, device=b[0].device)
                         for b in self._params]
        self._bucket_of = {}
        for j, b in enumerate(self.plan):
            for n in b:
                self._bucket_of[n] = j
                params[n].register_post_accumulate_grad_hook(self._hook_for(n))
        self._reset()

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _apply(self, fn, recurse=True):
        # `.to()`, `.double()` and the like convert the parameters in place (same Parameter objects,
        # so the hooks stay); the flat tensors must follow them
        super()._apply(fn, recurse)
        self._flat = [fn(buf) for buf in self._flat]
        return self

    # ---- during backward --------------------------------------------------------------------
    def _reset(self):
        self._pending = [len(b) for b in self.plan]
        self._futures: list = [None] * len(self.plan)
        self._next = 0        # buckets start in plan order, like DDP's: every rank issues the same sequence
        self._armed = False

    def _hook_for(self, name):
        def hook(param):
            if not self._armed:  # the first gradient of this backward: finish when backward ends
                self._armed = True
                torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            j = self._bucket_of[name]
            self._pending[j] -= 1
            if self._pending[j] < 0:
                raise RuntimeError(f"BucketedSync: {name}'s gradient was ready twice in one backward "
                                   f"(a parameter used twice needs its gradient accumulated once)")
            # launch every complete bucket from the next one in order: a complete bucket whose
            # predecessor is not complete waits, so collectives never cross between ranks
            while self._next < len(self.plan) and self._pending[self._next] == 0:
                self._launch(self._next)
                self._next += 1
        return hook

    def _launch(self, j: int):
        buf, offset = self._flat[j], 0
        for p in self._params[j]:
            n = p.numel()
            buf[offset:offset + n].copy_(p.grad.reshape(-1))
            offset += n
        if self.log is not None:
            self._futures[j] = self.log.launch(j, buf, list(self.plan[j]))
        else:
            buf.div_(dist.get_world_size(self.group))
            self._futures[j] = link.hold(dist.all_reduce(buf, group=self.group, async_op=True).get_future(),
                                         buf.numel() * buf.element_size())   # spec/link.py

    def _finish(self):
        try:
            late = [n for j, b in enumerate(self.plan) if self._pending[j] for n in b]
            if late:
                raise RuntimeError(f"BucketedSync: backward ended before every gradient of these buckets was "
                                   f"ready (a parameter unused in this forward?): {sorted(set(late))[:8]}")
            for j, fut in enumerate(self._futures):
                fut.wait()
                offset = 0
                for p in self._params[j]:
                    n = p.numel()
                    p.grad.copy_(self._flat[j][offset:offset + n].view_as(p.grad))
                    offset += n
        finally:
            self._reset()  # the next backward starts clean, even after an error

    def take(self) -> list[BucketEvent]:
        """The buckets launched since the last call (from its log; none without one)."""
        return self.log.take() if self.log is not None else []
