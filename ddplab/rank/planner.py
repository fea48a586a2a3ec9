"""One planned step: rank 0 of a fake process group of `world_size` ranks runs the model's step under
`FakeTensorMode`, and torch's own trackers say what it holds and issues. Its own process:

    python -m ddplab.rank.planner specs.json plan      # what launch/plan.py starts: plan.0.json, plan.1.json, ...

The fake process group (`init_process_group("fake")`) answers every collective at once without
sending anything, and fake tensors carry shapes and no data, so torch's DDP, ZeroRedundancyOptimizer
and FSDP2 run their real code paths for a cluster's world size on one CPU, in seconds. What each
figure comes from:
- memory by category and the peak: `MemTracker` (DDP, ZeRO-1) or `FSDPMemTracker` (FSDP2), from
  `torch.distributed._tools`, over one training step;
- optimizer state, cross-checked against the optimizer's own state tensors (`optimizer.state`): the
  trackers file every tensor made in the optimizer step as state, and where they disagree (far more in a
  first step with foreach, docs/at-scale.md) the plan keeps the direct count and names the tool
  (`Correction`);
- DDP's buckets: their bytes from DDP's logging data (`bucket_sizes`); the buckets of a step after the first
  from torch's own assignment (`_compute_bucket_assignment_by_size`) over the traced ready order, as DDP
  rebuilds them;
- collectives: every c10d op the step dispatches (`CollectiveCounter`, rank/probes/collectives.py);
- FLOPs: `FlopCounterMode` over the forward and backward.
Three things the fake world needs (docs/at-scale.md): the device mesh is built before entering
`FakeTensorMode`; DDP is built with `init_sync=False` (its shape check reads data) and a comm hook
that all-reduces each bucket on the fake group and returns it (the fake group's built-in path hands
DDP no tensor back); a steady step is planned after one warm-up optimizer step on zero gradients (the
state exists then, as in every step after the first), so DDP's bucket rebuild, which reads data, never
runs. Used by notebook 12 and `ddplab plan`.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException,
                                           UnsupportedOperatorException)

from ..record.plan import CATEGORIES, Correction, Figure, PlanRecord
from ..spec.plan import MAX_PARAMETERS, PlanSpec
from .probes.collectives import CollectiveCounter
from .probes.memory import local, optimizer_state
from .trackers import (FSDP_TRACKER, MEM_TRACKER, categories, cpu_attention_flops, global_peak_only,
                       snapshot)
from .untraced import formula_record, module_stack, op_of

UNTRACEABLE = (DataDependentOutputException, DynamicOutputShapeException, UnsupportedOperatorException)


def build_model(spec: PlanSpec) -> tuple[nn.Module, int]:
    """The model (on the current default device or fake mode) and its vocabulary size."""
    if spec.model.startswith("hf:"):
        from transformers import AutoConfig, AutoModelForCausalLM

        fields = spec.hf_config
        if fields is not None:
            config = AutoConfig.for_model(**fields)
        else:
            fields = json.loads(Path(spec.model[3:]).read_text())   # data only: no model code runs
            config = AutoConfig.for_model(fields.pop("model_type"), **fields)
        model = AutoModelForCausalLM.from_config(config)
        if spec.checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model, config.vocab_size
    from ..spec.experiment import Experiment
    from .models import build

    exp = Experiment(model=spec.model, vocab_size=spec.vocab_size, d_model=spec.d_model, n_layers=spec.n_layers,
                     n_heads=spec.n_heads, tie_weights=spec.tie_weights, seq_len=spec.seq_len,
                     checkpointing=spec.checkpointing and spec.model == "transformer")
    model = build(exp)
    if spec.checkpointing and spec.model != "transformer":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

        layers = {id(m) for m in _blocks(model)}
        if not layers:
            raise ValueError(f"PlanSpec.checkpointing: {spec.model} has no repeated layers (no ModuleList or "
                             f"Sequential) to checkpoint")
        apply_activation_checkpointing(model, check_fn=lambda m: id(m) in layers)
    return model, spec.vocab_size


def _blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated layers: the elements (with parameters) of the ModuleList or Sequential holding the most
    parameters, the blocks FSDP2 shards one by one (rank/parallel/fsdp.py)."""
    lists = [m for m in model.modules() if isinstance(m, (nn.ModuleList, nn.Sequential))]
    if not lists:
        return []
    blocks = max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))
    return [b for b in blocks if any(True for _ in b.parameters())]


def wrap(spec: PlanSpec, model: nn.Module, mesh):
    """(the model as the strategy wraps it, DDP or None, the layers FSDP2 shards or checkpointing wraps)."""
    if spec.strategy == "fsdp2":
        from .parallel.fsdp import fully_shard_layers

        units = fully_shard_layers(model, None, torch.device("cpu"), spec.reshard_after_forward, mesh=mesh)
        return model, None, len(units)
    from torch.nn.parallel import DistributedDataParallel as DDP

    cap = {} if spec.bucket_cap_mb is None else {"bucket_cap_mb": spec.bucket_cap_mb}
    ddp = DDP(model, init_sync=False, **cap)
    ddp.planner_hook = {"world_size": spec.world_size, "calls": 0}   # its calls: DDP's all-reduces of a step
    ddp.register_comm_hook(ddp.planner_hook, _fake_allreduce)
    return ddp, ddp, len(_blocks(model))


def optimizer(spec: PlanSpec, net: nn.Module):
    """The spec's optimizer over `net`'s parameters; ZeroRedundancyOptimizer around it under ZeRO-1."""
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[spec.optimizer]
    kwargs = {"lr": 1e-3, **({} if spec.foreach is None else {"foreach": spec.foreach})}
    if spec.strategy == "zero1":
        from .parallel.zero import sharded_optimizer

        return sharded_optimizer(net.parameters(), cls, **kwargs)
    return cls(net.parameters(), **kwargs)


def _fake_allreduce(state: dict, bucket):
    """DDP's all-reduce of one bucket, on the fake group: the same collective, answered at once."""
    buf = bucket.buffer()
    dist.all_reduce(buf)
    state["calls"] += 1
    done = torch.futures.Future()
    done.set_result(buf.div_(state["world_size"]))
    return done


def state_bytes(opt) -> int:
    """Bytes of the optimizer's own state tensors (a local shard's, for DTensors), each storage once. Keyed by
    the storage itself (`StorageWeakRef`), not by its data pointer as the probes' `storages`: every fake
    tensor's data pointer is 0."""
    from torch.multiprocessing.reductions import StorageWeakRef

    held = {StorageWeakRef(s): s.nbytes() for s in (local(t).untyped_storage() for t in optimizer_state(opt))}
    return sum(held.values())


def plan(spec: PlanSpec) -> PlanRecord:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import DeviceMesh
    from torch.utils.flop_counter import FlopCounterMode

    try:
        from torch._C._distributed_c10d import FakeStore   # where torch 2.14 keeps it
    except ImportError:
        from torch.testing._internal.distributed.fake_pg import FakeStore

    seconds = {}
    t0 = time.perf_counter()
    torch.set_default_dtype(getattr(torch, spec.dtype))   # before any build: the meta model FSDP2 shards too
    with torch.device("meta"):   # shapes only: counted, and (FSDP2) sharded before any fake tensor exists
        meta_model, vocab = build_model(spec)
    total = sum(p.numel() for p in meta_model.parameters())
    if total > MAX_PARAMETERS:
        raise ValueError(f"PlanSpec.model: {spec.model} has {total:,} parameters; at most {MAX_PARAMETERS:,} are planned")
    dist.init_process_group("fake", rank=0, world_size=spec.world_size, store=FakeStore())
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")   # outside FakeTensorMode: building one there fails
    if spec.strategy == "fsdp2":
        # fully_shard splits every parameter into world_size chunks: on meta tensors, not fake ones (at 1,024
        # ranks the fake tensors' dispatch took 33 s), then to_empty gives the shards fake storage
        model, vocab = meta_model, vocab
        seconds["build"] = time.perf_counter() - t0
        net, ddp, layers = wrap(spec, model, mesh)
    with FakeTensorMode(allow_non_fake_inputs=True):
        if spec.strategy == "fsdp2":
            net.to_empty(device="cpu")
        else:
            model, vocab = build_model(spec)
            seconds["build"] = time.perf_counter() - t0
            net, ddp, layers = wrap(spec, model, mesh)
        opt = optimizer(spec, net)
        local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in net.parameters())
        if not spec.first_step:   # warm-up: the optimizer creates its state, as before any later step
            for p in net.parameters():
                p.grad = torch.zeros_like(p)
            opt.step()
            opt.zero_grad(set_to_none=True)
        seconds["wrap"] = time.perf_counter() - t0 - seconds["build"]
        tracker = global_peak_only(FSDPMemTracker)(net, opt) if spec.strategy == "fsdp2" \
            else global_peak_only(MemTracker)()
        if spec.strategy != "fsdp2":
            tracker.track_external(net, getattr(opt, "optim", opt))   # ZeRO-1: its local optimizer
        counter, flops = CollectiveCounter(), FlopCounterMode(display=False, custom_mapping=cpu_attention_flops())
        tokens = torch.randint(0, vocab, (spec.local_batch, spec.seq_len))
        snaps, ready = {}, []
        hooks = [p.register_post_accumulate_grad_hook(ready.append) for p in net.parameters()
                 if ddp is not None and p.requires_grad]
        try:
            with tracker, counter, module_stack(model) as stack:
                with flops:
                    out = net(tokens)
                    logits = getattr(out, "logits", out)
                    snaps["forward"] = snapshot(tracker)
                    F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens.reshape(-1)).backward()
                snaps["backward"] = snapshot(tracker)
                for h in hooks:
                    h.remove()
                opt.step()
                snaps["optimizer"] = snapshot(tracker)
                opt.zero_grad(set_to_none=True)
        except UNTRACEABLE as e:
            where = stack[-1] if stack else "the step outside any module"
            return formula_record(spec, total, local, f"{type(e).__name__} on {op_of(e)} in {where}: an operation whose "
                                                 f"output depends on the data, which fake tensors do not have")
        seconds["trace"] = time.perf_counter() - t0 - seconds["build"] - seconds["wrap"]
    return _record(spec, tracker, snaps, opt, ddp, counter, flops, total, local, layers, seconds, ready)


def rebuilt_buckets(ready: list, params: list, bucket_cap_mb: float | None, first_cap: int | None = None) -> list[int]:
    """The buckets DDP rebuilds after its first step, from torch's own assignment: the parameters in the
    order their gradients became ready (`ready`; any never ready last), DDP's first bucket cap (`first_cap`,
    read from DDP: 1 MiB by default, the cap itself where one was set), then the cap. (DDP's first step puts
    every parameter in one bucket unless it looks for unused parameters.)"""
    seen = {id(p) for p in ready}
    order = list({id(p): p for p in ready}.values()) + [p for p in params if id(p) not in seen and p.requires_grad]
    cap = int((25 if bucket_cap_mb is None else bucket_cap_mb) * 2**20)
    if first_cap is None:
        first_cap = dist._DEFAULT_FIRST_BUCKET_BYTES if bucket_cap_mb is None else cap
    limits = [first_cap, cap]
    indices, _ = dist._compute_bucket_assignment_by_size(order, limits, [False] * len(order))
    return [sum(order[i].numel() * order[i].element_size() for i in bucket) for bucket in indices]


def _record(spec, tracker, snaps, opt, ddp, counter, flops, total, local, layers, seconds, ready) -> PlanRecord:
    tool = type(tracker).__name__
    names = FSDP_TRACKER if spec.strategy == "fsdp2" else MEM_TRACKER
    peak_bytes, kinds = snaps["optimizer"]["peak"]
    phase = next(p for p in ("forward", "backward", "optimizer") if snaps[p]["peak"][0] == peak_bytes)
    at_peak = categories(kinds, names)
    # each category at its largest: activations saved at the end of the forward, gradients after the
    # backward, optimizer state after the step
    now = {p: categories(snaps[p]["current"][1], names) for p in snaps}
    held = {c: Figure(max(now[p][c] for p in now), tool) for c in CATEGORIES}
    corrections = []
    direct = state_bytes(opt)
    said = max(held["optimizer_state"].bytes, at_peak["optimizer_state"])
    if said != direct:
        # the trackers file every tensor made in the optimizer step as its state; at the peak the excess may be
        # real (foreach's temporaries) or not, so the peak keeps it, as temporaries
        excess = max(0, at_peak["optimizer_state"] - direct)
        corrections.append(Correction(tool, "optimizer_state", said, direct, "optimizer.state",
                                      f"{tool} counted {said:,} B of optimizer state; the optimizer's own state "
                                      f"tensors hold {direct:,} B" + (f"; the peak keeps the other {excess:,} B, as "
                                                                      f"temporaries" if excess else "")))
        held["optimizer_state"] = Figure(direct, "optimizer.state")
        at_peak["optimizer_state"] -= excess
        at_peak["temporaries"] += excess
    buckets, collectives = [], counter.collectives(spec.world_size)
    if ddp is not None:
        sizes = str(ddp._get_ddp_logging_data().get("bucket_sizes", ""))
        buckets = [int(x) for x in sizes.replace(",", " ").split()]
        # the flat buffers DDP allocated at construction, before the tracker started: live all along
        held["ddp_buckets"] = Figure(sum(buckets), "DDP logging data (bucket_sizes)")
        at_peak["ddp_buckets"] = sum(buckets)
        peak_bytes += sum(buckets)
        if not spec.first_step:   # a later step all-reduces the rebuilt buckets: the same bytes, more calls
            first_cap = getattr(getattr(ddp, "_bucket_config", None), "first_bucket_bytes_cap", None)
            buckets = rebuilt_buckets(ready, list(ddp.parameters()), spec.bucket_cap_mb, first_cap)
            more = len(buckets) - ddp.planner_hook["calls"]
            collectives = [dataclasses.replace(c, count=c.count + more) if c.op == "all_reduce" else c
                           for c in collectives]
    between = sum(held[c].bytes for c in ("parameters", "buffers", "optimizer_state", "ddp_buckets"))
    return PlanRecord(spec.to_dict(), torch.__version__, total, local, held, at_peak, peak_bytes, tool, phase,
                      between, collectives, buckets, layers, int(flops.get_total_flops()),
                      {k: round(v, 2) for k, v in seconds.items()}, corrections)


def main(argv: list[str]) -> int:
    """Plan each spec of the JSON list in `argv[0]`, one after another in this process (torch and the
    model's library imported once), writing `argv[1]`.N.json as each is done."""
    spec_path, out_path = map(Path, argv)
    for i, d in enumerate(json.loads(spec_path.read_text())):
        try:
            record = plan(PlanSpec.from_dict(d))
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            torch.set_default_dtype(torch.float32)
        tmp = out_path.with_suffix(f".{i}.tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(record), indent=1))
        tmp.rename(out_path.with_suffix(f".{i}.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
