"""What autograd saves during the forward for backward: the activations a rank holds at its peak.

`SavedTensorMeter` is a saved-tensors hook: every tensor autograd packs during the forward is
counted once by its storage, parameters excluded (a Linear saves its weight too; that memory is the
parameters'). Used by notebooks 02 and 06.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
from torch.multiprocessing.reductions import StorageWeakRef

from .memory import storages
from . import Probe


def is_parameter(t: torch.Tensor) -> bool:
    """A parameter, or a view of one (a Linear's transposed weight): under FSDP2 a unit's gathered parameters,
    which are not the parameters the meter was built with, and are the parameters' memory, not activations."""
    return isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter)


class SavedTensorMeter:
    """Context manager: `with meter: loss = model(x)...`; then `meter.bytes`."""

    def __init__(self, parameters):
        self._param_storages = set(storages(parameters))
        self.bytes = 0
        self._saved: dict[StorageWeakRef, int] = {}

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in self._param_storages and not is_parameter(t):
            # keyed by the storage itself: a storage freed during the forward (FSDP2 frees each unit's gathered
            # parameters after it) leaves its address to the next one, which a data pointer would count once
            self._saved[StorageWeakRef(storage)] = storage.nbytes()
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
class ActivationsProbe(Probe):
    """Fills `TrainStep.activation_bytes`: bytes saved for backward in each micro-step's forward."""

    name = "activations"

    def __init__(self, at, attached):
        super().__init__(at, attached)
        self.meter = SavedTensorMeter(at.module.parameters())
        self.per_micro: list[int] = []

    @contextlib.contextmanager
    def forward(self, micro: int):
        if micro == 0:
            self.per_micro = []
        with self.meter:
            yield
        self.per_micro.append(self.meter.bytes)

    def step_fields(self, step: int) -> dict:
        return {"activation_bytes": self.per_micro}
