"""The train task: a short DDP training script, run on every rank (`Train`; notebooks 00-02, 04, 06).

Build the same model from the same seed on every rank, wrap it (DDP, FSDP2 or nothing), then for
each optimizer step: for each micro-step take this rank's shard of the global batch, forward,
backward (DDP averages the gradients during the last micro-step's backward; `no_sync` skips the
all-reduce before), then one optimizer step. Probes (`rank/probes/`) record what the lab measures
beyond the timings, attached by name; an injected fault (`spec/fault.py`) misbehaves on one rank, and
a straggler (`spec/straggler.py`) is slower by a known amount in every step.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist

from ...record.train import Checksums, ModelInfo, TrainRecord, TrainStep
from ...spec.sharding import shard_ids
from ...spec.tasks import GRADIENT_ALL_REDUCE
from .. import models
from ..parallel.ddp import wrap_in_ddp
from ..parallel.fsdp import fully_shard_layers
from ..probes import Attachment, attach
from ..runtime import Clock
from ..training import make_optimizer, micro_loss, parameter_checksum, token_losses, torch_dtype


def run(ctx):
    """Build, wrap, train on the ranks of `ctx.group`; return (TrainRecord, tensors for rank{r}.pt).
    The DDP model dies with this frame (see runtime.teardown)."""
    exp, rank, device, log = ctx.exp, ctx.rank, ctx.device, ctx.log
    log.enter("build")
    # seed_per_rank: deliberately different starting points, to watch DDP's construction broadcast
    made = models.build_with_data(_own_model(exp, rank), data_of=exp)
    model = made.module.to(device=device, dtype=torch_dtype(exp.dtype))
    built = parameter_checksum(model)
    model, ddp = wrap(ctx, model)
    module = ddp.module if ddp else model
    optimizer = make_optimizer(exp, model.parameters(), ctx.group)
    side_group = _side_group(ctx)   # the skip-backward fault's barrier, on NCCL
    probes = attach(exp.probes, Attachment(ctx, module, ddp, optimizer))
    initial = parameter_checksum(module)
    clock = Clock(device)
    slow = exp.straggler if exp.straggler and exp.straggler.rank == rank else None   # this rank, slowed
    steps = []
    for step in range(exp.steps):
        clock.mark("start")
        scale, global_count = loss_scale(ctx, step, clock)
        probes.start_step(step)
        sample_ids, loss_sum, tokens = [], 0.0, 0
        for micro in range(exp.accum_steps):
            ids = shard_ids(exp.local_batches, exp.accum_steps, step, micro, rank)
            x, y = (t.to(device) for t in made.batch(ids, exp.seq_len_of(rank)))
            sample_ids += ids
            clock.mark("data")
            last = micro == exp.accum_steps - 1
            # a straggler is slower once per optimizer step: its first batch is late, or it pauses or
            # computes more before its last backward
            if slow and slow.where == "data" and micro == 0:
                delay(slow, device, step)
                clock.mark("straggler")
            synced = ddp is not None and (last or not exp.no_sync)
            with ddp.no_sync() if ddp is not None and not synced else nullcontext():
                log.enter("forward", step, micro)
                with probes.forward(micro), bypassed_mlp(module, _fault(exp, "unused-parameter", rank, step)):
                    losses = token_losses(model(x), y)
                    loss = micro_loss(exp.loss_norm, losses, exp.accum_steps, scale, global_count)
                probes.after_forward(step, micro)
                clock.mark("forward")
                if slow and slow.where != "data" and last:
                    delay(slow, device, step)
                    clock.mark("straggler")
                if exp.fault and exp.fault.hits(rank, step) and inject_fault(ctx, step, micro, synced, side_group):
                    continue
                log.enter("backward", step, micro, collective=GRADIENT_ALL_REDUCE if synced else None)
                with probes.backward(micro, last):
                    loss.backward()
                probes.after_backward(step, micro)
                clock.mark("backward")
            loss_sum += losses.detach().sum().item()
            tokens += y.numel()
        if step == 0:  # a parameter no forward used gets no gradient, and DDP then never reduces its bucket
            unused = [n for n, p in module.named_parameters() if p.requires_grad and p.grad is None]
        log.enter("optimizer", step)
        probes.before_optimizer(step)   # after the progress log's line: the bytes probe counts the step's own writes
        optimizer.step()
        probes.after_optimizer(step)
        optimizer.zero_grad(set_to_none=True)
        clock.mark("optimizer")
        times = clock.durations_ms()
        steps.append(TrainStep(step=step, sample_ids=sample_ids, loss=loss_sum / tokens, loss_sum=loss_sum,
                               tokens=tokens, phase_ms=times, step_ms=sum(times.values()),
                               param_checksum=parameter_checksum(module), **probes.step_fields(step)))
    probes.finish(ctx.run_dir)
    return _record(module, Checksums(built, initial, parameter_checksum(module)), steps, unused, probes), \
        probes.tensors()


def _record(module, checksums: Checksums, steps: list[TrainStep], unused: list[str], probes) -> TrainRecord:
    return TrainRecord(parameter_names=[n for n, _ in module.named_parameters()],
                       model=ModelInfo(models.parameter_count(module),
                                       sum(p.numel() * p.element_size() for p in module.parameters()),
                                       sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)),
                       param_checksum=checksums, steps=steps, unused_parameters=unused, **probes.sections())


def wrap(ctx, model):
    """(the model to call, the DDP wrapper or None): DDP averages gradients; FSDP2 shards in place."""
    exp = ctx.exp
    if exp.sync == "ddp" and exp.sharding != "fsdp2":
        ctx.log.enter("ddp-construct")
        if exp.distributed_debug == "info":   # read by DDP's reducer when it is built
            dist.set_debug_level(dist.DebugLevel.INFO)
        ddp = wrap_in_ddp(model, ctx.device, ctx.group, exp.bucket_cap_mb, exp.gradient_as_bucket_view,
                               exp.find_unused_parameters)
        if exp.distributed_debug == "info":   # this DDP keeps its level; the launch's next experiments do not
            dist.set_debug_level_from_env()
        return ddp, ddp
    if exp.sharding == "fsdp2":
        ctx.log.enter("fsdp-construct")
        fully_shard_layers(model, ctx.group, ctx.device)
    return model, None


def loss_scale(ctx, step: int, clock) -> tuple[float, float]:
    """(scale, global count) for `micro_loss`: a global mean needs the global count of examples
    (tokens), the sum of every rank's count; scale = world size undoes DDP's division by it."""
    exp = ctx.exp
    if exp.loss_norm == "rank-mean":
        return 1.0, 1.0
    per_example = 1 if exp.loss_norm == "global-sample" else exp.seq_len_of(ctx.rank)
    count = torch.tensor([float(exp.local_batch_of(ctx.rank) * per_example * exp.accum_steps)],
                         device=ctx.device, dtype=torch.float64)
    scale = 1.0
    if exp.sync == "ddp":  # DDP and FSDP2 both average gradients over the ranks
        ctx.log.enter("count", step)
        dist.all_reduce(count, group=ctx.group)
        scale = exp.world_size
    clock.mark("count")
    return scale, count.item()


def delay(slow, device, step: int = 0) -> None:
    """The straggler's extra time in step `step` (`spec/straggler.py`: `slow.ms_at(step)`): a pause (a
    late batch, a paused host), or matrix products that keep its core busy that long. On a GPU the queued work finishes first,
    so the delay is not hidden behind it; the products' input is fixed, so no random stream moves."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    ms = slow.ms_at(step)
    if slow.where in ("data", "before-backward"):
        time.sleep(ms / 1e3)
        return
    a = torch.full((128, 128), 1.0 / 128, device=device)
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)
        if device.type == "cuda":
            torch.cuda.synchronize(device)   # wall time is the measure: no queue of kernels left behind


def _side_group(ctx):
    """For the skip-backward fault on NCCL: the gloo group over the same ranks that `Train.extra_groups`
    asked the worker for (a CPU barrier cannot pair with an NCCL bucket), else None."""
    if ctx.exp.fault is None or ctx.exp.fault.kind != "skip-backward" or dist.get_backend(ctx.group) != "nccl":
        return None
    return ctx.extra_groups[0]


def _fault(exp, kind: str, rank: int, step: int) -> bool:
    return exp.fault is not None and exp.fault.kind == kind and exp.fault.hits(rank, step)


def _own_model(exp, rank: int):
    """The experiment this rank builds its model from: deliberately different starting points with
    seed_per_rank (to watch DDP's construction broadcast), one more token with the shape-mismatch fault."""
    if exp.seed_per_rank:
        exp = exp.replace(seed=exp.seed + rank)
    if _fault(exp, "shape-mismatch", rank, 0):
        exp = exp.replace(vocab_size=exp.vocab_size + 1)
    return exp


@contextmanager
def bypassed_mlp(module, bypass: bool):
    """The unused-parameter fault: this forward leaves out the last block's MLP (and its norm)."""
    if not bypass:
        yield
        return
    block = module.blocks[-1]
    block.bypass_mlp = True
    try:
        yield
    finally:
        block.bypass_mlp = False


def inject_fault(ctx, step: int, micro: int, synced: bool, side_group=None) -> bool:
    """Misbehave as `exp.fault` says, on the faulty rank and step, between its forward and its
    backward; True if the backward is skipped."""
    kind = ctx.exp.fault.kind
    if kind == "crash":
        raise RuntimeError(f"injected fault: rank {ctx.rank} crashed in step {step} (fault='crash')")
    if kind == "stall":
        time.sleep(10 ** 6)  # a rank that stops making progress outside any collective
    if kind == "sigkill":
        ctx.log.enter("sigkill", step, micro)
        os.kill(os.getpid(), signal.SIGKILL)   # nothing of this process runs after it: no error file
    if kind == "extra-all-reduce" and synced:
        # one collective its peers never issue: their first gradient bucket is paired with it
        ctx.log.enter("extra-all-reduce", step, micro)
        dist.all_reduce(torch.ones(1, device=ctx.device), group=ctx.group)
    if kind == "skip-backward" and synced:
        # this rank goes on to the next collective while its peers wait in the all-reduce. On NCCL a
        # barrier on their own group is itself a one-element all-reduce, which NCCL would pair with the
        # peers' first bucket; on a gloo group of its own it can only wait, as it does on gloo
        ctx.log.enter("skip-backward", step, micro)
        dist.barrier(group=side_group if side_group is not None else ctx.group)
        return True
    return False
