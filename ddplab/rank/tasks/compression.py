"""The communication-hook comparison (`Compression`, notebook 10): torch's own DDP hooks, side by side.

Every hook gets its own copy of the same model (same seed), DDP with the whole gradient in one bucket,
and plain SGD at the experiment's `lr`. The hooks are torch's (`default_hooks`, `powerSGD_hook`,
`debugging_hooks.noop_hook`), each called from one thin hook of the lab's that keeps what the lesson
needs and changes nothing they do:
- on an emulated link (spec/link.py) it holds the hook's result until the link would have carried the
  hook's all-reduces (`predict.compression.hook_calls`, one latency per call);
- in the learning steps it keeps the bucket's local gradient before the hook runs, and its result.

1. framing: all-reduces of known sizes, every rank writing its bytes (gloo's framing per call, which
   grows with the size: bench/gloo_framing.py), among them every size a hook's call sends;
2. learning: `learn_steps` steps from the common start, the same batches for every hook: the global
   loss, the reduced gradient against the exact average of the same local gradients (one extra
   all-reduce after backward, outside the hook), the bytes written during backward;
3. rounds: every arm's timed steps interleaved, the order alternating, each step after an untimed
   barrier; `local` arms run the same hook on a one-rank group, where the all-reduces carry nothing.
Runs inside a rank.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import debugging_hooks, default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

from ...predict.compression import PowerSGD, hook_calls
from ...record.allreduce_sweep import SizeCalls
from ...record.compression import CompressionRecord, HookArm, HookStep, LearnStep
from ...spec.sharding import shard_ids
from ...units import MIB, ms_after
from .. import clock, link, models
from ..parallel.ddp import wrap_in_ddp
from ..probes.bytes import io_write_bytes
from ..training import flat_parameters, token_losses

TORCH_HOOKS = {"allreduce": default_hooks.allreduce_hook, "fp16": default_hooks.fp16_compress_hook,
               "bf16": default_hooks.bf16_compress_hook, "powersgd": psgd.powerSGD_hook,
               "noop": debugging_hooks.noop_hook}
FRAMING_REPEATS = 5
WARMUP_STEPS = 2


class _Arm:
    """One hook on one group: its model, DDP, optimizer and the thin hook around torch's."""

    def __init__(self, ctx, hook: str, group, base, one_bucket_mb: float, refused: dict):
        task = ctx.exp.task
        self.hook, self.local = hook, group is not ctx.group
        self.module = copy.deepcopy(base)
        self.ddp = wrap_in_ddp(self.module, ctx.device, group, bucket_cap_mb=one_bucket_mb)
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=ctx.exp.lr)
        self.psgd = PowerSGD(task.matrix_approximation_rank, task.start_powerSGD_iter, task.min_compression_rate)
        self.state = group
        if hook == "powersgd":
            self.state = psgd.PowerSGDState(process_group=group, matrix_approximation_rank=self.psgd.rank,
                                            start_powerSGD_iter=self.psgd.start_iter,
                                            min_compression_rate=self.psgd.min_compression_rate,
                                            use_error_feedback=task.use_error_feedback, warm_start=task.warm_start,
                                            random_seed=ctx.exp.seed)
        if hook == "bf16" and "bf16" not in refused:
            try:   # DDP refuses torch's bf16 hook by its name unless CUDA and NCCL are there: say so
                self.ddp._check_comm_hook(TORCH_HOOKS["bf16"])
            except (TypeError, RuntimeError) as e:
                refused["bf16"] = f"{type(e).__name__}: {e}"
        self.world_size = dist.get_world_size(group)
        self.calls = self.iteration = self.bucket_bytes = 0
        self.keep: dict | None = None
        self.learn: list[LearnStep] = []
        self.sums: list = []   # what the hook delivered and the exact averages, summed over the learning steps
        self.steps: list[HookStep] = []
        self.ddp.register_comm_hook(self.state, self._hook)

    def _hook(self, state, bucket):   # no annotations: DDP compares them with the real classes
        self.calls += 1
        if self.keep is not None:
            self.keep["local"] = bucket.buffer().clone()   # before the hook: PowerSGD adds its error in place
        calls = hook_calls(self.hook, [g.shape for g in bucket.gradients()], self.iteration, self.psgd)
        self.bucket_bytes = bucket.buffer().numel() * bucket.buffer().element_size()   # what DDP hands the hook
        fut = TORCH_HOOKS[self.hook](state, bucket)
        sent = [c for c in calls if c]   # an empty all-reduce sends nothing (predict.compression)
        if not self.local and sent:
            fut = link.hold(fut, sum(sent), len(sent))
        if self.keep is not None:
            fut = fut.then(self._kept)
        return fut

    def _kept(self, fut):
        value = fut.value()
        self.keep["result"] = value.clone()
        return value

    def backward(self, x, y):
        """Forward and backward; (loss, forward end ns, backward end ns, bytes written in backward)."""
        self.calls = 0
        loss = token_losses(self.ddp(x), y).mean()
        t1 = clock.now_ns()
        before = io_write_bytes()
        loss.backward()
        written = io_write_bytes() - before
        self.iteration += 1
        return loss, t1, clock.now_ns(), written

    def learn_step(self, x, y, group) -> None:
        self.keep = {}
        loss, _, _, written = self.backward(x, y)
        local, result = self.keep["local"], self.keep["result"]
        self.keep = None
        exact = local.clone()
        dist.all_reduce(exact, group=group)
        exact.div_(dist.get_world_size(group))
        error = float((result - exact).norm() / exact.norm().clamp_min(1e-30))
        world = dist.get_world_size(group)
        scale = local.abs()   # the mean of the ranks' |g|: what the rounding of a sum is relative to
        dist.all_reduce(scale, group=group)
        scale.div_(world)
        magnitude = float(scale.norm() / exact.norm().clamp_min(1e-30))
        smallest = local.abs()
        dist.all_reduce(smallest, op=dist.ReduceOp.MIN, group=group)
        normal = smallest >= world * 2.0 ** -14   # every rank's share stays in fp16's normal range
        worst = float(((result - exact).abs()[normal] / scale[normal]).max()) if bool(normal.any()) else float("nan")
        self.sums = [result.clone(), exact.clone()] if not self.sums else [self.sums[0] + result, self.sums[1] + exact]
        cumulative = float((self.sums[0] - self.sums[1]).norm() / self.sums[1].norm().clamp_min(1e-30))
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=group)
        self.learn.append(LearnStep(float(mean) / world, error, written, magnitude, worst, cumulative))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def timed_step(self, x, y, group, round_: int) -> None:
        dist.barrier(group=group)   # every arm (a local one too) starts its step on all ranks together, untimed
        t0 = clock.now_ns()
        _, t1, t2, written = self.backward(x, y)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        t3 = clock.now_ns()
        self.steps.append(HookStep(round_, ms_after(t3, t0), ms_after(t2, t1), written))


def _framing(ctx, calls: set[int]) -> list[SizeCalls]:
    """All-reduces of two small sizes and of every size in `calls` (what the hooks send), each after a
    barrier: the time and the bytes this rank wrote (what a call costs beyond its ring share: gloo's
    framing, which depends on the size)."""
    sizes = sorted({4096, 65536} | {n for n in calls if n > 4})   # gloo frames a 4-byte call apart
    # fp16's call of an odd number of elements is no whole number of float32s: it goes as float16
    buffers = {n: torch.ones(n // 4 if n % 4 == 0 else n // 2, device=ctx.device,
                             dtype=torch.float32 if n % 4 == 0 else torch.float16) for n in sizes}
    ms, written = {n: [] for n in sizes}, {n: [] for n in sizes}
    for rep in range(FRAMING_REPEATS + 1):
        for n in sizes if rep % 2 == 0 else reversed(sizes):
            dist.barrier(group=ctx.group)
            before, t0 = io_write_bytes(), clock.now_ns()
            dist.all_reduce(buffers[n], group=ctx.group)
            t1, after = clock.now_ns(), io_write_bytes()
            if rep:   # the first pass warms the connections up
                ms[n].append(ms_after(t1, t0))
                written[n].append(after - before)
    return [SizeCalls(n, ms[n], written[n]) for n in sizes]


def run(ctx):
    """Run the comparison on this rank; return (CompressionRecord, no tensors)."""
    exp, task, group, log = ctx.exp, ctx.exp.task, ctx.group, ctx.log
    built = models.build_with_data(exp)
    base = built.module.to(device=ctx.device)
    names = [n for n, _ in base.named_parameters()]
    trainable = [p for p in base.parameters() if p.requires_grad]   # DDP's buckets hold only these
    grad_bytes = sum(p.numel() * p.element_size() for p in trainable)
    one_bucket_mb = grad_bytes / MIB + 1   # every gradient in one bucket (the first bucket's cap too)
    ones = ctx.extra_groups   # with `local`: a one-rank gloo group per rank (`Compression.extra_groups`)
    log.enter("framing")
    psgd = PowerSGD(task.matrix_approximation_rank, task.start_powerSGD_iter, task.min_compression_rate)
    framing = _framing(ctx, {c for h in task.hooks for step in (0, task.start_powerSGD_iter)
                             for c in hook_calls(h, [p.shape for p in trainable], step, psgd)})
    refused: dict[str, str] = {}
    arms = []
    for i, hook in enumerate(task.hooks):
        log.enter("construct", micro=i, detail=hook)
        arms.append(_Arm(ctx, hook, group, base, one_bucket_mb, refused))
    me = dist.get_rank(group)
    local = [_Arm(ctx, hook, ones[me], base, one_bucket_mb, refused) for hook in task.hooks] if ones else []

    def batch(step):
        ids = shard_ids(exp.local_batches, 1, step, 0, me)
        return [t.to(ctx.device) for t in built.batch(ids, exp.seq_len_of(me))]

    start = flat_parameters(base)
    for t in range(task.learn_steps):
        x, y = batch(t)
        log.enter("learn", t)
        for a in arms:
            a.learn_step(x, y, group)
    baseline = flat_parameters(arms[0].module)
    travelled = float((baseline - start).norm())
    gaps = [float((flat_parameters(a.module) - baseline).norm()) / travelled if task.learn_steps and travelled else None
            for a in arms]
    x, y = batch(0)
    for a in arms + local:   # DDP rebuilds its bucket after its first step; PowerSGD starts compressing
        for _ in range(max(WARMUP_STEPS, task.start_powerSGD_iter - a.iteration)):
            a.timed_step(x, y, group, -1)
        a.steps.clear()
    first = [a.iteration for a in arms + local]
    everyone = arms + local
    for r in range(task.rounds):
        for i in range(task.steps_per_round):
            log.enter("round", r, i)
            order = everyone if (r * task.steps_per_round + i) % 2 == 0 else everyone[::-1]
            for a in order:
                a.timed_step(x, y, group, r)
    out = [HookArm(a.hook, "local" if a.local else "world", a.calls, a.learn, a.steps,
                   gaps[k] if k < len(arms) else None, first[k], a.bucket_bytes) for k, a in enumerate(everyone)]
    shapes = [list(p.shape) for p in base.parameters()]
    return CompressionRecord(names, shapes, framing, out, refused, [p.requires_grad for p in base.parameters()]), {}
