"""Memory a rank holds, by category. So far: activations saved for backward.

`SavedTensorMeter` counts the bytes autograd saves during a forward pass (the activations that stay
alive until backward), each storage once, parameters excluded (a Linear saves its weight too; that
memory is the parameters'). Notebook 06 uses it to compare gradient accumulation's micro-steps with
one big local batch. See notes/ddp-internals.md, section 6.
"""

from __future__ import annotations

import torch


class SavedTensorMeter:
    """Context manager: `with meter: loss = model(x)...`; then `meter.bytes`."""

    def __init__(self, parameters):
        self._param_storages = {p.untyped_storage().data_ptr() for p in parameters}
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
