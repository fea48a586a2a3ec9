"""The FSDP2 memory task (`FsdpMemory`, notebook 09): one rank's live bytes through one training step of
a `fully_shard`ed model, sampled at every unit's pre/post forward and pre/post backward, for each
configuration of `reshard_after_forward` x prefetch, the model rebuilt from the seed for each.

How each category of a sample (`spec.fsdp_memory.SAMPLE_CATEGORIES`) is counted, from tensor metadata, each
storage once:
- sharded_parameters: every unit's padded shard (FSDP2's `_sharded_param_data`), fixed for the run;
- optimizer_state: the optimizer's state tensors (local shards);
- gradients: the sharded gradients the reduce-scatters have delivered so far;
- gathered_parameters: the unsharded parameters allocated now (FSDP2 allocates and frees them by
  resizing their storages, which no dispatch mode sees, so they are read from FSDP2's parameters);
- unsharded_gradients: a unit's full gradients, alive from its backward until its reduce-scatter;
- activations: what autograd saved for backward and still holds (the saved-tensor meter, gathered
  parameters excluded: a Linear saves its weight, which is the gathered parameter);
- comm_buffers: FSDP2's flat all-gather outputs in flight (a prefetched unit) and the reduce-scatter
  inputs it keeps until the next reduce-scatter;
- other: everything else live (gradients of activations, logits, loss temporaries): the total less
  the categories above.
The total is what was held at the step's start (sharded parameters, optimizer state) plus every
storage the step's ops allocated and have not freed (`probes.memory.PeakTracker`) plus the gathered
parameters; the tracker checks it after every op, so the step's peak falls between samples too.
On CUDA the record also keeps `torch.cuda.max_memory_allocated` over the step: the tally counts
storages, not the caching allocator's blocks (rounded up, with NCCL's and the streams' own), so the two
differ; the memory model (`predict/fsdp_memory.py`) is validated against the tally, on the CPU.
FSDP2's internals read here (`_get_fsdp_state`, `_fsdp_param_group`, `all_gather_outputs`) are
private to torch 2.13 and are read only, never changed. Runs inside a rank.
"""

from __future__ import annotations

import gc
import warnings

import torch

from ...record.fsdp_memory import FsdpConfigRecord, FsdpMemoryRecord
from ...spec.sharding import shard_ids
from .. import data, models
from ..parallel.fsdp import fully_shard_layers
from ..probes.fsdp_memory import FsdpView, LiveActivations, StepTracker, Timeline
from ..probes.memory import local, optimizer_state, storages
from ..training import make_optimizer, token_losses, torch_dtype
from .. import clock


def _train_step(model, optimizer, x, y) -> float:
    loss = token_losses(model(x), y).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def _batch(ctx):
    exp, rank = ctx.exp, ctx.rank
    ids = shard_ids(exp.local_batches, 1, 0, 0, rank)   # step 0's batch, every step
    return [t.to(ctx.device) for t in data.batch(exp.seed, ids, exp.seq_len_of(rank), exp.vocab_size)]


def measure(ctx, reshard_after_forward: bool, prefetch: bool, index: int):
    """Build, shard, warm up, then record one step of one configuration: (units, parameter bytes, record)."""
    exp, log = ctx.exp, ctx.log
    log.enter("build", index)
    model = models.build(exp).to(device=ctx.device, dtype=torch_dtype(exp.dtype))
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    log.enter("fsdp-construct", index)
    units = fully_shard_layers(model, ctx.group, ctx.device, reshard_after_forward, prefetch)
    view = FsdpView(model, units)
    optimizer = make_optimizer(exp, model.parameters())
    log.enter("warm-up", index)
    for _ in range(exp.task.warmup_steps):
        _train_step(model, optimizer, *_batch(ctx))
    log.enter("measured step", index)
    held = view.sharded_bytes() + sum(storages(optimizer_state(optimizer)).values()) + \
        sum(view.sharded_grads().values())
    meter = LiveActivations((local(p) for p in model.parameters()), view)
    tracker = StepTracker(view.gather_outputs())
    timeline = Timeline(view, optimizer, meter, tracker, held)
    handles = timeline.hooks()
    cuda = ctx.device.type == "cuda"
    if cuda:   # the allocator's peak, beside the tally (which counts storages, not allocator blocks)
        torch.cuda.synchronize(ctx.device)
        torch.cuda.reset_peak_memory_stats(ctx.device)
    start = clock.now_ns()
    with warnings.catch_warnings():
        # a full backward hook on a unit whose inputs need no gradient (the embeddings) fires on its
        # outputs' gradients, and torch says so every time
        warnings.filterwarnings("ignore", message=".*[Ff]ull backward hook.*")
        with tracker:
            timeline.sample("step-start")
            x, y = _batch(ctx)
            with meter:
                loss = token_losses(model(x), y).mean()
            timeline.sample("loss")
            loss.backward()
            timeline.sample("backward-end")
            optimizer.step()
            timeline.sample("optimizer-end")
            loss_value = loss.item()
            del loss, x, y
    if cuda:
        torch.cuda.synchronize(ctx.device)
    step_ms = (clock.now_ns() - start) / 1e6
    cuda_peak = torch.cuda.max_memory_allocated(ctx.device) if cuda else None
    for h in handles:
        h.remove()
    peak = held + tracker.step_peak
    record = FsdpConfigRecord(reshard_after_forward, prefetch, timeline.samples, held, peak, loss_value, step_ms,
                              cuda_peak)
    unit_records = view.unit_records(exp.world_size)
    optimizer.zero_grad(set_to_none=True)
    del model, optimizer, view, timeline, tracker, meter, units
    gc.collect()
    return unit_records, parameter_bytes, record


def run(ctx):
    configs, units, parameter_bytes = [], [], 0
    for index, (reshard, prefetch) in enumerate(ctx.exp.task.configs()):
        units, parameter_bytes, record = measure(ctx, reshard, prefetch, index)
        configs.append(record)
    return FsdpMemoryRecord(units, parameter_bytes, configs), {}
