"""The FSDP2 memory task's meters (notebook 09; `rank/tasks/fsdp_memory.py` says what each category
counts): read-only views of FSDP2's state on this rank (`FsdpView`), the activations autograd still
holds (`LiveActivations`), the step's live storages and peak between samples (`StepTracker`), and the
sampler that writes a `MemorySample` at each moment (`Timeline`). Runs inside a rank.
"""

from __future__ import annotations

import weakref

import torch

from ...record.fsdp_memory import FsdpUnit, MemorySample
from .. import clock
from .activations import SavedTensorMeter
from .memory import PeakTracker, optimizer_state, storage_of, storages


def _fsdp_params(module) -> list:
    group = module._get_fsdp_state()._fsdp_param_group
    return list(group.fsdp_params) if group is not None else []


def _nbytes(t) -> int:
    storage = storage_of(t)[1]   # None for a tensor whose storage cannot be read
    return storage.nbytes() if storage is not None else 0


class FsdpView:
    """Read-only views of FSDP2's state on this rank: the units' shards, gathered parameters and buffers."""

    def __init__(self, model, units):
        self.model = model
        self.units = units
        self.params = [_fsdp_params(m) for _, m in units]

    def unit_records(self, world_size: int) -> list[FsdpUnit]:
        out = []
        for (name, _), params in zip(self.units, self.params):
            numels = [fp._orig_size.numel() for fp in params]
            dim0 = [fp._orig_size[0] for fp in params]
            shard = sum(_nbytes(fp._sharded_param_data) for fp in params)
            gathered = sum(fp._sharded_param_data.numel() * fp._sharded_param_data.element_size() * world_size
                           for fp in params)
            out.append(FsdpUnit(name, numels, dim0, shard, gathered))
        return out

    def sharded_bytes(self) -> int:
        return sum(storages(fp._sharded_param_data for ps in self.params for fp in ps).values())

    def gather_outputs(self) -> list[torch.Tensor]:
        """The tensors FSDP2 all-gathers each parameter into (their storages resized to 0 when resharded)."""
        return [t for ps in self.params for fp in ps for t in getattr(fp, "all_gather_outputs", [])]

    def gathered_per_unit(self) -> list[int]:
        return [sum(_nbytes(t) for fp in ps for t in getattr(fp, "all_gather_outputs", [])) for ps in self.params]

    def gathered_ptrs(self) -> set[int]:
        return {t.untyped_storage().data_ptr() for t in self.gather_outputs() if _nbytes(t)}

    def unsharded_grads(self) -> dict[int, int]:
        grads = []
        for ps in self.params:
            for fp in ps:
                p = getattr(fp, "_unsharded_param", None)
                if p is not None and p.grad is not None:
                    grads.append(p.grad)
        return storages(grads)

    def sharded_grads(self) -> dict[int, int]:
        return storages(fp.sharded_param.grad for ps in self.params for fp in ps if fp.sharded_param.grad is not None)

    def comm_buffers(self) -> dict[int, int]:
        """FSDP2's flat all-gather outputs not yet copied out, and the reduce-scatter inputs it keeps."""
        tensors = []
        ctx = None
        for _, m in self.units:
            group = m._get_fsdp_state()._fsdp_param_group
            if group is None:
                continue
            ctx = group.comm_ctx
            if group._all_gather_result is not None:
                tensors.append(group._all_gather_result.all_gather_output)
        if ctx is not None:
            if getattr(ctx, "all_gather_state", None) is not None:
                tensors.append(ctx.all_gather_state.all_gather_result.all_gather_output)
            tensors += [s.reduce_scatter_input for s in getattr(ctx, "reduce_scatter_states", [])]
        return storages(t for t in tensors if _nbytes(t))


class LiveActivations(SavedTensorMeter):
    """The saved-tensor meter, counting what autograd still holds: a saved storage leaves the count
    when it is freed (in backward), and FSDP2's gathered parameters are not activations."""

    def __init__(self, parameters, view: FsdpView):
        super().__init__(parameters)
        self.view = view
        self.live: dict[int, int] = {}

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr and ptr not in self._param_storages and ptr not in self.live and ptr not in self.view.gathered_ptrs():
            self.live[ptr] = storage.nbytes()
            weakref.finalize(storage, self.live.pop, ptr, None)
        return t

    @property
    def live_bytes(self) -> int:
        return sum(self.live.values())


class StepTracker(PeakTracker):
    """`PeakTracker` plus FSDP2's gathered parameters, which it allocates by resizing storages (unseen
    by a dispatch mode): after every op, the step's live bytes are `current + gathered`, and the most
    of them since the last sample and over the step are kept."""

    def __init__(self, gather_outputs: list[torch.Tensor]):
        super().__init__()
        self.gather_outputs = gather_outputs
        self.window = self.step_peak = 0

    def gathered(self) -> int:
        return sum(_nbytes(t) for t in self.gather_outputs)

    def live_bytes(self) -> int:
        return self.current + self.gathered()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        now = self.live_bytes()
        self.window = max(self.window, now)
        self.step_peak = max(self.step_peak, now)
        return out


class Timeline:
    """The samples of one recorded step: hooks on every unit call `sample` at its pre/post forward and
    pre/post backward."""

    def __init__(self, view: FsdpView, optimizer, meter: LiveActivations, tracker: StepTracker, held: int):
        self.view, self.optimizer, self.meter, self.tracker, self.held = view, optimizer, meter, tracker, held
        self.sharded = view.sharded_bytes()
        self.samples: list[MemorySample] = []

    def sample(self, event: str, unit: int | None = None) -> None:
        tracker = self.tracker
        with torch.utils._python_dispatch._disable_current_modes():   # the bookkeeping allocates nothing of the step's
            per_unit = self.view.gathered_per_unit()
            live = tracker.live_bytes()
            total = self.held + live
            unsharded = self.view.unsharded_grads()
            grads = {k: v for k, v in self.view.sharded_grads().items() if k not in unsharded}
            comm = self.view.comm_buffers()
            row = {"sharded_parameters": self.sharded,
                   "optimizer_state": sum(storages(optimizer_state(self.optimizer)).values()),
                   "gradients": sum(grads.values()), "gathered_parameters": sum(per_unit),
                   "unsharded_gradients": sum(unsharded.values()), "activations": self.meter.live_bytes,
                   "comm_buffers": sum(comm.values())}
            row["other"] = total - sum(row.values())
            peak_since = self.held + max(tracker.window, live)
            tracker.window = live
            tracker.step_peak = max(tracker.step_peak, live)   # the step's peak counts every sample too
            self.samples.append(MemorySample(event, unit, clock.now_ns(), row, total, peak_since,
                                             [i for i, b in enumerate(per_unit) if b]))

    def hooks(self) -> list:
        handles = []
        for i, (_, m) in enumerate(self.view.units):
            handles += [m.register_forward_pre_hook(lambda mod, args, i=i: self.sample("pre-forward", i)),
                        m.register_forward_hook(lambda mod, args, out, i=i: self.sample("post-forward", i)),
                        m.register_full_backward_pre_hook(lambda mod, g, i=i: self.sample("pre-backward", i)),
                        m.register_full_backward_hook(lambda mod, gi, go, i=i: self.sample("post-backward", i))]
        return handles
