"""One rank of a ddplab run: a short DDP training script, started once per rank by torchrun.

    torchrun --standalone --nnodes=1 --nproc-per-node=4 -m ddplab.worker --spec runs/<name>-<hash>/spec.json

Given several specs, the ranks run them in order (one launch, one `import torch`); an experiment
with a smaller world size runs on ranks 0..world_size-1 of its own process group while the other
ranks go on to the next experiment they belong to.

Each rank builds the same model from the same seed, wraps it in DDP, takes `steps` optimizer steps
on its own shard of every global batch, and writes `rank{r}.json` (and `rank{r}.pt` for tensors)
into the run directory. It logs every phase it enters to `rank{r}.progress`, so the launcher can
show progress and, if the ranks hang, say which rank never reached which collective. A rank that
fails writes `rank{r}.error.json` with its traceback.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import sys
import time
import traceback
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from . import bucket_sweep, data, gradients, models, reference, runtime
from .memory import MemoryProbe, SavedTensorMeter
from .readiness import BucketLog, ReadyLog
from .rundir import (SCHEMA_VERSION, ProgressLog, error_file, rank_file, save_tensors_atomic, tensor_file,
                     write_json_atomic)
from .spec import Experiment
from .training import DTYPES, flat_parameters, make_optimizer, micro_loss, parameter_checksum, token_losses

GRADIENT_ALL_REDUCE = "DDP gradient all-reduce"


def io_write_bytes() -> int:
    """Bytes this process has written so far, by every thread (Linux /proc/self/io `wchar`; 0
    elsewhere). For gloo on one host that includes every byte sent to the other ranks."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("wchar"))
    except OSError:
        return 0


def allreduce_sweep(exp: Experiment, env: runtime.RankEnv, device: torch.device, log: ProgressLog, group=None):
    """Time `all_reduce` of every size in `exp.sweep_bytes`, `exp.repeats` times, in alternating
    order (so drift affects every size alike), after a barrier each time; record bytes written too."""
    buffers = {n: torch.ones(n // 4, device=device) for n in exp.sweep_bytes}
    clock = runtime.Clock(device)
    for n in exp.sweep_bytes:  # warm-up: connections, buffers, caches
        dist.all_reduce(buffers[n], group=group)
    calls = {n: {"ms": [], "write_bytes": []} for n in exp.sweep_bytes}
    for rep in range(exp.repeats):
        log.enter("all-reduce sweep", rep, collective="all_reduce")
        for n in exp.sweep_bytes if rep % 2 == 0 else reversed(exp.sweep_bytes):
            dist.barrier(group=group)
            before = io_write_bytes()
            clock.mark("start")
            dist.all_reduce(buffers[n], group=group)
            clock.mark("all_reduce")
            calls[n]["ms"].append(clock.durations_ms()["all_reduce"])
            calls[n]["write_bytes"].append(io_write_bytes() - before)
    return {"steps": [], "param_checksum": {}, "model": {},
            "allreduce": [{"bytes": n, **calls[n]} for n in exp.sweep_bytes]}, {}


def inject_fault(exp: Experiment, rank: int, step: int, micro: int, synced: bool, log: ProgressLog, group) -> bool:
    """Misbehave as `exp.fault` says, on the faulty rank and step; True if the backward is skipped."""
    if exp.fault == "crash":
        raise RuntimeError(f"injected fault: rank {rank} crashed in step {step} (fault='crash')")
    if exp.fault == "stall":
        time.sleep(10 ** 6)  # a rank that stops making progress outside any collective
    if exp.fault == "skip-backward" and synced:
        # this rank goes on to the next collective while its peers wait in the all-reduce
        log.enter("skip-backward", step, micro, collective=f"barrier instead of the {GRADIENT_ALL_REDUCE}")
        dist.barrier(group=group)
        return True
    return False


def train(exp: Experiment, env: runtime.RankEnv, device: torch.device, log: ProgressLog, group=None):
    """Build, wrap, train on ranks 0..exp.world_size-1 (`group`; None = all ranks); return this rank's
    record and its probe tensors. The DDP model dies with this frame (see runtime.teardown)."""
    rank = env.rank
    ddp = exp.sync == "ddp" and exp.sharding != "fsdp2"
    # seed_per_rank: deliberately different starting points, to watch DDP's construction broadcast
    model = models.build(exp.replace(seed=exp.seed + rank) if exp.seed_per_rank else exp)
    model = model.to(device=device, dtype=DTYPES[exp.dtype])
    built = parameter_checksum(model)
    if ddp:
        log.enter("ddp-construct", collective="broadcast of rank 0's parameters")
        model = DDP(model, device_ids=[device] if device.type == "cuda" else None,
                    bucket_cap_mb=exp.bucket_cap_mb, gradient_as_bucket_view=exp.gradient_as_bucket_view,
                    process_group=group)
    elif exp.sharding == "fsdp2":
        log.enter("fsdp-construct", collective="sharding of the parameters")
        runtime.fully_shard_layers(model, group, device)
    module = model.module if ddp else model
    record = {"param_checksum": {"built": built, "initial": parameter_checksum(module)}, "steps": [],
              "parameter_names": [n for n, _ in module.named_parameters()]}
    optimizer = make_optimizer(exp, model.parameters(), group)
    seq_len = exp.seq_len_of(rank)
    clock = runtime.Clock(device)

    # probes: what this rank records beyond its timings
    probes = set(exp.probes)
    names = {id(p): n for n, p in module.named_parameters()}
    buckets = BucketLog(group, names) if {"buckets", "memory", "readiness"} & probes and ddp else None
    ready = ReadyLog(module) if "readiness" in probes else None
    if buckets:
        model.register_comm_hook(None, buckets.hook)
    memory = MemoryProbe(module, optimizer, device, buckets, model if ddp else None) if "memory" in probes else None
    if memory:
        record["memory"] = {"constructed": memory.constructed, "steps": []}
    if "memory-snapshot" in probes:
        torch.cuda.memory._record_memory_history(max_entries=100_000)  # dumped by main() after training
    local_grads = gradients.LocalGradients(module) if "gradients" in probes else None
    meter = SavedTensorMeter(module.parameters()) if {"activations", "memory"} & probes else None
    tensors = {}
    if {"gradients", "reference"} & probes:
        log.enter("reference")  # single-process work: the launcher's watchdog sees it is alive
    if local_grads and rank == 0:
        tensors["reference"] = reference.reference_gradients(exp, device)
    if "reference" in probes:
        ref_before, ref_after, _ = reference.reference_step(exp, device)
        _, alone_after, alone_checksum = reference.reference_step(exp, device, ranks=[rank])

    for step in range(exp.steps):
        clock.mark("start")
        scale, global_count = 1.0, 1.0
        if exp.loss_norm != "rank-mean":
            # a global mean needs the global count of examples (tokens): sum every rank's count
            per_example = 1 if exp.loss_norm == "global-sample" else seq_len
            count = torch.tensor([float(exp.local_batch_of(rank) * per_example * exp.accum_steps)],
                                 device=device, dtype=torch.float64)
            if exp.sync == "ddp":  # DDP and FSDP2 both average gradients over the ranks
                log.enter("count", step, collective="all-reduce of the example or token counts")
                dist.all_reduce(count, group=group)
                scale = exp.world_size  # undo DDP's division by the world size
            global_count = count.item()
            clock.mark("count")
        if local_grads:
            local_grads.active = step == 0
        if memory:
            memory.start_step()
        sample_ids, loss_sum, tokens, activation_bytes = [], 0.0, 0, []
        for micro in range(exp.accum_steps):
            ids = data.shard_ids(exp.local_batches, exp.accum_steps, step, micro, rank)
            x, y = (t.to(device) for t in data.batch(exp.seed, ids, seq_len, exp.vocab_size))
            sample_ids += ids
            clock.mark("data")
            synced = ddp and (micro == exp.accum_steps - 1 or not exp.no_sync)
            # no_sync: accumulate local gradients without an all-reduce until the last micro-step
            with model.no_sync() if ddp and not synced else nullcontext():
                log.enter("forward", step, micro)
                with meter or nullcontext():
                    losses = token_losses(model(x), y)
                    loss = micro_loss(exp.loss_norm, losses, exp.accum_steps, scale, global_count)
                if meter:
                    activation_bytes.append(meter.bytes)
                if memory:
                    memory.phase("forward", meter.bytes)
                clock.mark("forward")
                if exp.fault and rank == exp.fault_rank and step == exp.fault_step:
                    if inject_fault(exp, rank, step, micro, synced, log, group):
                        continue
                log.enter("backward", step, micro, collective=GRADIENT_ALL_REDUCE if synced else None)
                last = micro == exp.accum_steps - 1
                if ready:
                    ready.active = last
                wchar_before = io_write_bytes() if "bytes" in probes else 0
                backward_start = time.perf_counter_ns()
                loss.backward()
                backward_end = time.perf_counter_ns()
                wchar_after = io_write_bytes() if "bytes" in probes else 0
                if memory:
                    memory.phase("backward")
                clock.mark("backward")
            loss_sum += losses.detach().sum().item()
            tokens += y.numel()
        if local_grads and step == 0:
            tensors["local"], tensors["reduced"] = local_grads.sums, gradients.reduced(module)
            local_grads.active = False
        log.enter("optimizer", step)
        optimizer.step()
        if memory:
            memory.phase("step")
            record["memory"]["steps"].append(memory.end_step())
        optimizer.zero_grad(set_to_none=True)
        clock.mark("optimizer")
        times = clock.durations_ms()
        entry = {"step": step, "sample_ids": sample_ids, "loss": loss_sum / tokens, "loss_sum": loss_sum,
                 "tokens": tokens, **{f"{k}_ms": v for k, v in times.items()}, "step_ms": sum(times.values()),
                 "param_checksum": parameter_checksum(module)}
        launched = buckets.take() if buckets else []
        if {"buckets", "readiness"} & probes and buckets:
            entry["buckets"] = launched
        if ready:
            entry["readiness"] = {"ready": ready.take(), "backward_start_ns": backward_start,
                                  "backward_end_ns": backward_end}
        if "bytes" in probes:  # what this process wrote (gloo's sockets included) during the last backward
            entry["backward_write_bytes"] = wchar_after - wchar_before
        if "activations" in probes:
            entry["activation_bytes"] = activation_bytes
        record["steps"].append(entry)
        if step == 0 and "reference" in probes:
            record["reference"] = {
                **reference.distance(flat_parameters(module), ref_before, ref_after),
                "independent": {**reference.distance(alone_after, ref_before, ref_after),
                                "param_checksum": alone_checksum}}

    record["param_checksum"]["final"] = parameter_checksum(module)
    record["model"] = {"parameter_count": models.parameter_count(module),
                       "parameter_bytes": sum(p.numel() * p.element_size() for p in module.parameters())}
    return record, tensors


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", nargs="+", required=True, help="run_dir/spec.json of each experiment, run in order")
    spec_paths = [Path(p) for p in parser.parse_args(argv).spec]
    env = runtime.rank_env()
    runtime.die_with_parent()
    log = None
    try:
        exps = [Experiment.from_json(p.read_text()) for p in spec_paths]
        mine = [(p.parent, e) for p, e in zip(spec_paths, exps) if env.rank < e.world_size]
        log = ProgressLog(mine[0][0], env.rank)
        cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
        widest = max(exps, key=lambda e: e.world_size)  # the launcher checked they all agree
        backend, device_type = runtime.choose_backend(widest.backend, widest.device, env.world_size, cuda_devices)
        log.enter("init-process-group", collective="rendezvous of all ranks")
        if device_type == "cpu" and any(e.pin_cpus for e in exps):  # pinning is per process
            runtime.pin_to_core(env.local_rank)
        device = runtime.setup(backend, device_type, env, max(e.timeout_s for e in exps))
        groups = runtime.subgroups([e.world_size for e in exps], env.world_size, max(e.timeout_s for e in exps))
        for run_dir, exp in mine:
            if run_dir != log.run_dir:
                log.close()
                log = ProgressLog(run_dir, env.rank)
            t0 = time.time_ns()
            task = {"train": train, "allreduce-sweep": allreduce_sweep, "bucket-sweep": bucket_sweep.run}[exp.task]
            record, tensors = task(exp, env, device, log, groups[exp.world_size])
            if tensors:
                save_tensors_atomic(tensor_file(run_dir, env.rank), tensors)
            if "memory-snapshot" in exp.probes:  # open it at https://pytorch.org/memory_viz
                torch.cuda.memory._dump_snapshot(str(run_dir / f"rank{env.rank}.memory.pickle"))
                torch.cuda.memory._record_memory_history(enabled=None)
            record.update(schema_version=SCHEMA_VERSION, rank=env.rank, local_rank=env.local_rank,
                          world_size=exp.world_size, backend=backend, device=str(device), pid=os.getpid(),
                          host=socket.gethostname(), torch_version=torch.__version__,
                          python=platform.python_version(), spec_hash=exp.hash, t_start_ns=t0, t_end_ns=time.time_ns(),
                          launch_id=os.environ.get("DDPLAB_LAUNCH_ID", ""))
            write_json_atomic(rank_file(run_dir, env.rank), record)
        log.enter("teardown")
        runtime.teardown()
        log.enter("done")
        code = 0
    except BaseException as e:  # noqa: BLE001 - every failure must reach the launcher as a file
        last = log.last if log else {"phase": "start", "step": -1}
        write_json_atomic(error_file(log.run_dir if log else spec_paths[0].parent, env.rank), {
            "rank": env.rank, "phase": last["phase"], "step": last["step"], "t_ns": time.time_ns(),
            "type": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()})
        traceback.print_exc()
        code = 1
    if log:
        log.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter finalization: gloo worker threads racing it abort a good run (notes, section 0)
    os._exit(code)


if __name__ == "__main__":
    main()
