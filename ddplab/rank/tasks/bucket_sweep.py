"""The bucket sweep (`BucketSweep`): many bucket plans, timed in one launch (notebook 05).

Every plan gets its own copy of the same model (same seed), its own wrapper and optimizer:
- "compute-only": no synchronization at all; its readiness trace (when each gradient became ready,
  with no communication competing) is what the simulator takes as backward's own timeline;
- "ddp:<cap>": torch DDP with that `bucket_cap_mb`, traced by the readiness and bucket probes;
- "bare:<cap>": torch DDP with its own C++ all-reduce and no probe (to price the probes);
- "plan:<cap>" / "split:<cap>": `BucketedSync` with DDP's bucketing rule applied to the measured
  ready order, as is or with the last bucket cut in two;
- "ddp-split:<cap>": the split plan run by torch DDP itself, one `bucket_cap_mb_list` cap per bucket,
  traced by the probes (its real buckets can be compared with the split's, tensor for tensor);
- "ddp-2x:<cap>": "ddp:<cap>" on an emulated link (`Experiment.link`) with twice its bandwidth, the same
  latency (what more bandwidth buys, in the same rounds as a split on the link itself).
Each plan first takes 2 warm-up steps (DDP rebuilds its buckets after the first), then goes back to
the common starting parameters for one check step with its real buckets: the reduced gradients and
updated parameters of every synchronized plan are compared with the first plan's, and so are the
final parameters after the timed steps (every plan takes the same steps on the same batch). Then `rounds`
rounds run every plan for its timed steps in a row (`steps_per_round`), in alternating order, with the compute-only baseline at both ends of each round
(so drift on a shared machine hits every plan alike); every step starts with an untimed barrier, so
the ranks run in lock-step in every plan.
Per step the rank records forward, backward and optimizer time, and (probed plans) when each
gradient became ready and each bucket was launched and finished, on the shared clock (`record/`).
Runs inside a rank.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.distributed as dist

from ... import predict
from ...record.bucket_sweep import BucketSweepRecord, PlanCheck, SweepArm, SweepStep
from ...record.timeline import Backward
from ...record.train import ModelInfo
from ...spec.sharding import shard_ids
from ...spec.bucket_sweep import Plan
from ...tensors import flat_float64, rel_max_diff
from ...units import MIB, ms_after
from .. import models
from ..parallel.ddp import wrap_in_ddp
from ..parallel.bucketed import BucketedSync
from ..probes.buckets import BucketLog
from ..probes.readiness import ReadyLog
from ..training import flat_parameters, token_losses, torch_dtype
from .. import clock

WARMUP_STEPS = 2
PLAN_ALL_REDUCE = "gradient all-reduce of the plan's buckets"


class _Arm:
    """One plan's model, wrapper, optimizer and probes."""

    def __init__(self, name, module, wrapper, ready, buckets):
        self.name, self.module, self.wrapper, self.ready, self.buckets = name, module, wrapper, ready, buckets
        self.optimizer = torch.optim.SGD(module.parameters(), lr=1e-3)
        self.steps: list[SweepStep] = []

    def step(self, x, y, device, group, before_optimizer=None, round_: int = -1) -> SweepStep:
        sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        # every plan, compute-only included, starts its step on all ranks together (untimed): ranks in
        # lock-step compete for memory bandwidth the same way in every plan
        dist.barrier(group=group)
        t0 = clock.now_ns()
        loss = token_losses(self.wrapper(x), y).mean()
        sync()
        t1 = clock.now_ns()
        if self.ready:
            self.ready.active = True
        loss.backward()
        sync()
        t2 = backward_end = clock.now_ns()
        if self.ready:
            self.ready.active = False
        if before_optimizer:
            before_optimizer()
            t2 = clock.now_ns()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        sync()
        t3 = clock.now_ns()
        return SweepStep(round=round_, forward_ms=ms_after(t1, t0), backward_ms=ms_after(t2, t1),
                         optimizer_ms=ms_after(t3, t2), step_ms=ms_after(t3, t0),
                         backward=Backward(t1, backward_end, self.ready.take() if self.ready else None),
                         buckets=self.buckets.take() if self.buckets else None)


def run(ctx):
    """Run the sweep on this rank; return (BucketSweepRecord, no tensors)."""
    exp, task, device, group, log = ctx.exp, ctx.exp.task, ctx.device, ctx.group, ctx.log
    built = models.build_with_data(exp)
    base = built.module.to(device=device, dtype=torch_dtype(exp.dtype))
    x, y = (t.to(device) for t in built.batch(shard_ids(exp.local_batches, 1, 0, 0, ctx.rank), exp.seq_len_of(ctx.rank)))
    sizes = {n: p.numel() * p.element_size() for n, p in base.named_parameters()}

    # compute-only first: its warm-up gives the ready order that plan/split buckets follow (rank 0's, so
    # every rank builds the same buckets)
    arms = [_arm(ctx, "compute-only", 0, base, None)]
    log.enter("warm-up", micro=0, detail="compute-only")
    warm = [arms[0].step(x, y, device, group) for _ in range(WARMUP_STEPS)]
    shared = [warm[-1].ready_ms()]
    dist.broadcast_object_list(shared, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    grads = predict.buckets.grads_in_ready_order([n for n, _ in shared[0]], [sizes[n] for n, _ in shared[0]],
                                           [t for _, t in shared[0]])
    copy_bytes_per_s = _copy_bandwidth(sum(sizes.values()), device, dtype=torch_dtype(exp.dtype))
    checks, first = {}, None
    for i, name in enumerate(task.plans, start=1):
        a = _arm(ctx, name, i, base, grads)
        arms.append(a)
        log.enter("warm-up", micro=i, collective=PLAN_ALL_REDUCE, detail=name)
        for _ in range(WARMUP_STEPS):   # DDP rebuilds its buckets at the start of the second step
            a.step(x, y, device, group)
        # the check step: back to the common starting parameters, then one step with the plan's real
        # buckets; keep its reduced gradient and its updated parameters
        with torch.no_grad():
            for p, q in zip(a.module.parameters(), base.parameters()):
                p.copy_(q)
        reduced = []
        a.step(x, y, device, group, before_optimizer=lambda: reduced.append(flat_float64(p.grad for p in a.module.parameters())))
        state = (reduced[0], flat_parameters(a.module))
        first = first or state
        checks[name] = (rel_max_diff(state[0], first[0]), rel_max_diff(state[1], first[1]))

    # interleaved, a step at a time: in every round, step i of each plan runs right after step i of
    # the others, the order alternating from one i to the next (forward, then reversed), with the
    # compute-only baseline at both ends. A shared machine drifts by tens of percent within seconds:
    # a pair's two steps run within one pass over the plans, and consecutive pairs are not a block
    # of steps that shared one moment's load (blocks would make the pairs of a round alike, and the
    # sign test's interval too narrow)
    for r in range(task.rounds):
        for i in range(task.steps_per_round):
            plans = arms[1:] if (r * task.steps_per_round + i) % 2 == 0 else arms[:0:-1]
            log.enter("round", r, i, collective=PLAN_ALL_REDUCE)
            for a in [arms[0], *plans, arms[0]]:
                a.steps.append(a.step(x, y, device, group, round_=r))

    # every synchronized plan took the same steps from the same state on the same batch: its final
    # parameters must match the first plan's (the mathematics is the same; only the schedule differs)
    final = flat_parameters(arms[1].module) if len(arms) > 1 else None
    record = BucketSweepRecord(
        parameter_names=list(sizes), parameter_bytes=sizes,
        model=ModelInfo(models.parameter_count(base), sum(sizes.values())), warmup_steps=WARMUP_STEPS,
        ready_order=[n for n, _ in shared[0]], copy_bytes_per_s=copy_bytes_per_s,
        arms=[SweepArm(a.name, [b.params for b in a.steps[-1].buckets or []],
                       PlanCheck(*checks[a.name], rel_max_diff(flat_parameters(a.module), final))
                       if a.name in checks else None,
                       [_strip(st) for st in a.steps]) for a in arms])
    return record, {}


def _arm(ctx, name: str, index: int, base, grads) -> _Arm:
    """Plan `name`'s own copy of the model, its wrapper and its probes."""
    module = copy.deepcopy(base)
    kind, cap = ("compute", None) if name == "compute-only" else Plan.parse(name)
    cuda = ctx.device.type == "cuda"   # device times, not host queue times (rank/clock.py GpuStamps)
    ready = ReadyLog(module, cuda) if kind != "bare" else None
    if kind == "compute":
        return _Arm(name, module, module, ready, None)
    ctx.log.enter("construct", micro=index, detail=name)
    if kind in ("ddp", "bare", "ddp-2x"):
        wrapper = wrap_in_ddp(module, ctx.device, ctx.group, bucket_cap_mb=cap)
        buckets = None
        if kind != "bare":
            buckets = BucketLog(ctx.group, {id(p): n for n, p in module.named_parameters()}, cuda,
                                bandwidth=Plan.parse(name).link_bandwidth)
            wrapper.register_comm_hook(None, buckets.hook)
        return _Arm(name, module, wrapper, ready, buckets)
    plan = predict.buckets.ddp_plan(grads, cap * MIB)
    if kind in ("split", "ddp-split"):
        if len(plan[-1]) < 2:
            raise ValueError(f"Experiment.task.plans: {name!r}: at this cap the last bucket is one tensor "
                             f"({plan[-1][0]}), so there is nothing to split; use a larger cap")
        plan = predict.buckets.split_bucket(plan, grads)
    if kind == "ddp-split":
        caps = predict.buckets.caps_for(plan, {g.name: g.bytes for g in grads})
        wrapper = wrap_in_ddp(module, ctx.device, ctx.group, bucket_cap_mb_list=caps)
        buckets = BucketLog(ctx.group, {id(p): n for n, p in module.named_parameters()}, cuda)
        wrapper.register_comm_hook(None, buckets.hook)
        return _Arm(name, module, wrapper, ready, buckets)
    buckets = BucketLog(ctx.group, cuda=cuda)
    return _Arm(name, module, BucketedSync(module, plan, ctx.group, log=buckets), ready, buckets)


def _copy_bandwidth(n_bytes: int, device, dtype, repeats: int = 9) -> float:
    """Bytes per second of one tensor copy the size of the whole gradient (what DDP pays to copy
    gradients into its buckets and back); the median of `repeats`."""
    src = torch.ones(n_bytes // torch.finfo(dtype).bits * 8, device=device, dtype=dtype)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = clock.now_ns()
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(clock.now_ns() - t0)
    return src.numel() * src.element_size() / (sorted(times)[repeats // 2] / 1e9)


def _strip(step: SweepStep) -> SweepStep:
    """Bucket membership is kept once per plan (its layout), not per timed step."""
    if not step.buckets:
        return step
    return dataclasses.replace(step, buckets=[dataclasses.replace(b, params=[]) for b in step.buckets])
