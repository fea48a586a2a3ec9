"""Memory a rank holds, by category, sampled at the phases of a step; and the step's peak.

The ledger counts bytes from tensor metadata, each storage once:
- parameters, gradients and optimizer state: the rank's local tensors (a shard, under FSDP2);
- DDP buckets: the flat buffers DDP all-reduces, counted only where no gradient lives inside them
  (with `gradient_as_bucket_view=True` the gradients *are* views into the buckets);
- activations: what autograd saved during the forward for backward (the activations probe's
  `SavedTensorMeter`), each storage once, parameters excluded.
`PeakTracker` follows every tensor the step allocates (a dispatch mode), so its peak includes what
the phases miss: gradients of activations during backward, gathered FSDP layers, temporaries. Process
RSS is a rough cross-check only (the allocator keeps freed memory). On CUDA the caching allocator's own
figures are recorded beside the ledger, and the memory-snapshot probe dumps the allocator's history.
See docs/ddp-internals.md, "Model state memory". Used by notebook 02.
"""

from __future__ import annotations

import os
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ...predict.memory import CATEGORIES
from ...record.train import MemoryRecord, MemoryStep
from ...rundir import snapshot_file
from . import Probe



def local(t: torch.Tensor) -> torch.Tensor:
    """The part of a tensor this rank stores: a DTensor's local shard, or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def storages(tensors) -> dict[int, int]:
    out = {}
    for t in tensors:
        s = local(t).untyped_storage()
        out[s.data_ptr()] = s.nbytes()
    return out


def optimizer_state(optimizer) -> list[torch.Tensor]:
    """Every state tensor of an optimizer (ZeroRedundancyOptimizer keeps its local one in `.optim`)."""
    opt = getattr(optimizer, "optim", optimizer)
    return [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]


def ledger(module, optimizer, bucket_buffers=(), unseen_bucket_bytes: int = 0,
           activation_bytes: int = 0) -> dict[str, int]:
    """Bytes per category held by this rank right now. `unseen_bucket_bytes`: DDP's own report of
    buckets no communication hook has handed out yet (before the first backward)."""
    grads = storages(p.grad for p in module.parameters() if p.grad is not None)
    buckets = {ptr: n for ptr, n in storages(bucket_buffers).items() if ptr not in grads}
    return {"parameters": sum(storages(module.parameters()).values()), "gradients": sum(grads.values()),
            "ddp_buckets": sum(buckets.values()) + unseen_bucket_bytes,
            "optimizer_state": sum(storages(optimizer_state(optimizer)).values()), "activations": activation_bytes}


def construction_bucket_bytes(ddp) -> int:
    """Total bytes of the buckets DDP allocated at construction, from DDP's own logging data."""
    sizes = ddp._get_ddp_logging_data().get("bucket_sizes", "")
    return sum(int(x) for x in str(sizes).replace(",", " ").split())


def rss_bytes() -> int:
    """Resident set size of this process (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def cuda_figures(device) -> dict[str, int]:
    """The CUDA caching allocator's own view: allocated, reserved, and peak allocated bytes."""
    return {"cuda_allocated": torch.cuda.memory_allocated(device), "cuda_reserved": torch.cuda.memory_reserved(device),
            "cuda_peak_allocated": torch.cuda.max_memory_allocated(device)}


class PeakTracker(TorchDispatchMode):
    """Bytes of every storage that ops allocate while active, live until freed; `peak` is the most at
    once. Add it to what was held before (the ledger) to get the step's peak."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = self.peak = 0

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # a view or an in-place result shares an input's storage: only new storages are allocations
        inputs = {storage_of(t)[0] for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and not t.is_meta:
                key, storage = storage_of(t)
                if key and key not in self.live and key not in inputs and storage.nbytes():
                    self.live[key] = storage.nbytes()
                    self.current += storage.nbytes()
                    self.peak = max(self.peak, self.current)
                    weakref.finalize(storage, self._free, key)
        return out


def storage_of(t: torch.Tensor):
    """(data pointer, storage) of a tensor; (0, None) for one whose storage was freed (FSDP2 frees the
    storage of gathered parameters after use)."""
    try:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage
    except RuntimeError:
        return 0, None


class MemoryProbe(Probe):
    """Fills `TrainRecord.memory`: the ledger at construction, after every forward, backward and
    optimizer step, and each step's peak. Reads the buckets DDP handed to the buckets probe and the
    activations probe's meter."""

    name = "memory"
    needs = ("buckets", "activations")

    def __init__(self, at, attached):
        super().__init__(at, attached)
        self.buckets = attached["buckets"].log
        self.meter = attached["activations"].meter
        self.construction_buckets = construction_bucket_bytes(at.ddp) if at.ddp is not None else 0
        self.device = at.ctx.device
        self.constructed = self.sample()
        self.steps: list[MemoryStep] = []

    def sample(self, activation_bytes: int = 0) -> dict:
        seen = list(self.buckets.buffers.values()) if self.buckets else []
        row = ledger(self.at.module, self.at.optimizer, seen, 0 if seen else self.construction_buckets,
                     activation_bytes)
        row["rss"] = rss_bytes()
        if self.device.type == "cuda":
            row.update(cuda_figures(self.device))
        return row

    def start_step(self, step: int) -> None:
        self.phases = {}
        held = self.sample()
        self.held_at_start = sum(held[c] for c in CATEGORIES)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.tracker = PeakTracker()
        self.tracker.__enter__()

    def after_forward(self, step: int, micro: int) -> None:
        self.phases["forward"] = self.sample(self.meter.bytes)

    def after_backward(self, step: int, micro: int) -> None:
        self.phases["backward"] = self.sample()

    def after_optimizer(self, step: int) -> None:
        self.phases["step"] = self.sample()
        self.tracker.__exit__(None, None, None)
        peak = self.held_at_start + self.tracker.peak
        if self.at.ctx.exp.sharding == "fsdp2":
            # FSDP2 allocates some of its all-gather buffers where the dispatch mode does not see them
            # (a clean-clone CI run once saw a phase's ledger hold 0.2 MB more than the tracked peak):
            # its peak is at least every moment the ledger sampled
            peak = max([peak] + [sum(p[c] for c in CATEGORIES) for p in self.phases.values()])
        self.steps.append(MemoryStep(self.phases, self.held_at_start, peak))

    def sections(self) -> dict:
        params = list(self.at.module.parameters())
        return {"memory": MemoryRecord(self.constructed, self.steps, [p.numel() for p in params],
                                       [p.requires_grad for p in params])}


class MemorySnapshotProbe(Probe):
    """CUDA only: the caching allocator's history over training, dumped to rank{r}.memory.pickle
    (open it at https://pytorch.org/memory_viz)."""

    name = "memory-snapshot"
    needs = ("memory",)

    def __init__(self, at, attached):
        super().__init__(at, attached)
        torch.cuda.memory._record_memory_history(max_entries=100_000)

    def finish(self, run_dir) -> None:
        torch.cuda.memory._dump_snapshot(str(snapshot_file(run_dir, self.at.ctx.rank)))
        torch.cuda.memory._record_memory_history(enabled=None)
