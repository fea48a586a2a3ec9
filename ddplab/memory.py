"""Memory a rank holds, by category, sampled at the phases of a step; and the step's peak.

The ledger counts bytes from tensor metadata, each storage once:
- parameters, gradients and optimizer state: the rank's local tensors (a shard, under FSDP2);
- DDP buckets: the flat buffers DDP all-reduces, counted only where no gradient lives inside them
  (with `gradient_as_bucket_view=True` the gradients *are* views into the buckets);
- activations: what autograd saved during the forward for backward (`SavedTensorMeter`), each storage
  once, parameters excluded (a Linear saves its weight too; that memory is the parameters').
`PeakTracker` follows every tensor the step allocates (a dispatch mode), so its peak includes what
the phases miss: gradients of activations during backward, gathered FSDP layers, temporaries. Process
RSS is a rough cross-check only (the allocator keeps freed memory). On CUDA the caching allocator's own
figures are recorded beside the ledger. See notes/ddp-internals.md, section 6. Used by notebook 02.
"""

from __future__ import annotations

import os
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

CATEGORIES = ("parameters", "gradients", "ddp_buckets", "optimizer_state", "activations")


def local(t: torch.Tensor) -> torch.Tensor:
    """The part of a tensor this rank stores: a DTensor's local shard, or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _storages(tensors) -> dict[int, int]:
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
    grads = _storages(p.grad for p in module.parameters() if p.grad is not None)
    buckets = {ptr: n for ptr, n in _storages(bucket_buffers).items() if ptr not in grads}
    return {"parameters": sum(_storages(module.parameters()).values()), "gradients": sum(grads.values()),
            "ddp_buckets": sum(buckets.values()) + unseen_bucket_bytes,
            "optimizer_state": sum(_storages(optimizer_state(optimizer)).values()), "activations": activation_bytes}


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


class SavedTensorMeter:
    """Context manager: `with meter: loss = model(x)...`; then `meter.bytes`."""

    def __init__(self, parameters):
        self._param_storages = set(_storages(parameters))
        self.bytes = 0
        self._saved: dict[int, int] = {}

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self._param_storages:
            self._saved[ptr] = storage.nbytes()
        return t

    def __enter__(self):
        self._saved = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        self.bytes = sum(self._saved.values())
        return False


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
        inputs = {_storage(t)[0] for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and not t.is_meta:
                key, storage = _storage(t)
                if key and key not in self.live and key not in inputs and storage.nbytes():
                    self.live[key] = storage.nbytes()
                    self.current += storage.nbytes()
                    self.peak = max(self.peak, self.current)
                    weakref.finalize(storage, self._free, key)
        return out


def _storage(t: torch.Tensor):
    """(data pointer, storage) of a tensor; (0, None) for one whose storage was freed (FSDP2 frees the
    storage of gathered parameters after use)."""
    try:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage
    except RuntimeError:
        return 0, None


def ddp_bucket_bytes(ddp) -> int:
    """Total bytes of the buckets DDP allocated at construction, from DDP's own logging data."""
    sizes = ddp._get_ddp_logging_data().get("bucket_sizes", "")
    return sum(int(x) for x in str(sizes).replace(",", " ").split())


class MemoryProbe:
    """The memory probe of one rank: the ledger at each phase of every step, and each step's peak."""

    def __init__(self, module, optimizer, device, bucket_log=None, ddp=None):
        self.module, self.optimizer, self.device, self.bucket_log = module, optimizer, device, bucket_log
        self.construction_buckets = ddp_bucket_bytes(ddp) if ddp is not None else 0
        self.phases: dict[str, dict] = {}
        self.constructed = self.sample()

    def sample(self, activation_bytes: int = 0) -> dict:
        seen = list(self.bucket_log.buffers.values()) if self.bucket_log else []
        row = ledger(self.module, self.optimizer, seen, 0 if seen else self.construction_buckets, activation_bytes)
        row["rss"] = rss_bytes()
        if self.device.type == "cuda":
            row.update(cuda_figures(self.device))
        return row

    def start_step(self) -> None:
        self.phases = {}
        held = self.sample()
        self.held_at_start = sum(held[c] for c in CATEGORIES)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.tracker = PeakTracker()
        self.tracker.__enter__()

    def phase(self, name: str, activation_bytes: int = 0) -> None:
        self.phases[name] = self.sample(activation_bytes)

    def end_step(self) -> dict:
        self.tracker.__exit__(None, None, None)
        return {"phases": self.phases, "held_at_start": self.held_at_start,
                "peak": self.held_at_start + self.tracker.peak}
