"""The PyTorch profiler on every rank: one chrome trace per rank and the memory timeline by category.

`torch.profiler.profile` records every op of the profiled steps (CPU, and CUDA kernels on a GPU), with
shapes, memory and Python stacks (the memory timeline needs the stacks to tell parameters and optimizer
state apart). The lab's phases carry labels, so a trace reads in its vocabulary:

    ddplab:barrier     dist.barrier() at the start of every step: every rank leaves it together, so its
                       end is a common time point on every rank (how traces of several hosts are aligned)
    ddplab:forward     the forward (and the loss) of a micro-step
    ddplab:backward    its backward: DDP's all-reduces are launched inside it (c10d::allreduce_ on the
                       main thread; on gloo the work itself is gloo:all_reduce on gloo's own threads)
    ddplab:optimizer   optimizer.step()

The schedule skips step 0 as the profiler's warm-up (it traces, then drops what it saw): step 0 is not
a typical step anyway (DDP rebuilds its buckets after it, the optimizer creates its state in it) and
the profiler's own start-up cost lands there. With one step there is nothing to skip, and that step is
profiled. The barrier costs a few microseconds per step and lands in the step's "data" phase time;
everything profiled is slower than without the profiler, so compare phases within a profiled run.

At the end each rank writes traces/rank{r}.pt.trace.json (every rank's in one folder, which Holistic
Trace Analysis reads: `TraceAnalysis(trace_dir=...)`, the rank from the trace's `distributedInfo`) and
rank{r}.memory-timeline.json (bytes per category over the profiled steps, categories named as the lab
names them). See https://pytorch.org/docs/stable/profiler.html and docs/ddp-internals.md, "Profiler names".
Used by notebook 07.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, record_function
from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, Category

from ...record.train import ProfileRecord
from ...rundir import memory_timeline_file, trace_dir, trace_file
from . import Probe

# the profiler's memory categories in the lab's words (None: storage it could not attribute)
CATEGORY_NAMES = {Category.PARAMETER: "parameters", Category.GRADIENT: "gradients",
                  Category.OPTIMIZER_STATE: "optimizer_state", Category.ACTIVATION: "activations",
                  Category.INPUT: "inputs", Category.TEMPORARY: "temporaries",
                  Category.AUTOGRAD_DETAIL: "autograd_detail", None: "unknown"}


def schedule(steps: int):
    """Skip step 0 as warm-up and record every later step; with one step, record it."""
    warmup = 1 if steps >= 2 else 0
    with warnings.catch_warnings():   # "won't be using warmup": a one-step run has none to spare
        warnings.simplefilter("ignore")
        return torch.profiler.schedule(wait=0, warmup=warmup, active=steps - warmup, repeat=1)


def profiled_steps(steps: int) -> list[int]:
    return list(range(1 if steps >= 2 else 0, steps))


def memory_timeline(prof, device: torch.device) -> dict:
    """The profiler's memory timeline for `device`: {"device", "categories", "times_us", "bytes"}, one
    row of bytes per time, one column per category, named by `CATEGORY_NAMES`; times in epoch µs.

    `export_memory_timeline` writes [times, sizes]: sizes[i][0] is always 0 (the base the profiler's
    own plot stacks on) and sizes[i][k + 1] is the category with `_CATEGORY_TO_INDEX[category] == k`."""
    assert set(_CATEGORY_TO_INDEX) == set(CATEGORY_NAMES), f"the profiler's categories: {list(_CATEGORY_TO_INDEX)}"
    columns = sorted(_CATEGORY_TO_INDEX, key=_CATEGORY_TO_INDEX.get)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)   # deprecated for CUDA's allocator snapshots: none on CPU
        try:
            prof.export_memory_timeline(os.path.join(tmp, "timeline.json"), device=str(device))
        except AssertionError as e:   # torch's analyzer fails on some traces (pytorch/pytorch#167838): say so
            return {"device": str(device), "categories": [CATEGORY_NAMES[c] for c in columns], "times_us": [],
                    "bytes": [], "unavailable": f"torch's memory profiler failed on this rank's trace "
                                                f"(AssertionError: {str(e)[:160]}; pytorch/pytorch#167838)"}
        with open(os.path.join(tmp, "timeline.json")) as f:
            times, sizes = json.load(f)
    return {"device": str(device), "categories": [CATEGORY_NAMES[c] for c in columns], "times_us": times,
            "bytes": [[row[_CATEGORY_TO_INDEX[c] + 1] for c in columns] for row in sizes]}


def _write_atomic(path: Path, write) -> None:
    """`write(temporary path)`, then rename; the temporary name does not end in .json, so no reader
    of the folder (HTA takes every *.json in it for a trace) picks up a half-written file."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


class ProfileProbe(Probe):
    """Fills `TrainRecord.profile` and writes the trace and memory timeline of this rank."""

    name = "profile"

    def __init__(self, at, attached):
        super().__init__(at, attached)
        ctx = at.ctx
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.device.type == "cuda" else [])
        self.prof = torch.profiler.profile(activities=activities, schedule=schedule(ctx.exp.steps),
                                           record_shapes=True, profile_memory=True, with_stack=True)
        self.optimizer_label = None
        self.record = None

    def start_step(self, step: int) -> None:
        if step == 0:
            self.prof.start()
        with record_function("ddplab:barrier"):
            dist.barrier(group=self.at.ctx.group)

    def forward(self, micro: int):
        return record_function("ddplab:forward")

    def backward(self, micro: int, last: bool):
        return record_function("ddplab:backward")

    def before_optimizer(self, step: int) -> None:
        self.optimizer_label = record_function("ddplab:optimizer")
        self.optimizer_label.__enter__()

    def after_optimizer(self, step: int) -> None:
        self.optimizer_label.__exit__(None, None, None)
        self.prof.step()

    def finish(self, run_dir) -> None:
        # each step of the export named in the progress log: on a loaded machine each can take a minute, and
        # the launcher's watchdog (no progress for the collective timeout) must see the rank is alive
        log = self.at.ctx.log
        log.enter("profile-stop")
        self.prof.stop()
        rank, run_dir = self.at.ctx.rank, Path(run_dir)
        trace_dir(run_dir).mkdir(exist_ok=True)
        log.enter("profile-export-trace")
        _write_atomic(trace_file(run_dir, rank), lambda tmp: self.prof.export_chrome_trace(str(tmp)))
        log.enter("profile-memory-timeline")
        timeline = memory_timeline(self.prof, self.at.ctx.device)
        _write_atomic(memory_timeline_file(run_dir, rank), lambda tmp: tmp.write_text(json.dumps(timeline)))
        peaks = [max(column, default=0) for column in zip(*timeline["bytes"])]
        self.record = ProfileRecord(steps=profiled_steps(self.at.ctx.exp.steps),
                                    trace=str(trace_file(run_dir, rank).relative_to(run_dir)),
                                    memory_timeline=memory_timeline_file(run_dir, rank).name,
                                    peak_bytes=dict(zip(timeline["categories"], peaks)))

    def sections(self) -> dict:
        return {"profile": self.record}
