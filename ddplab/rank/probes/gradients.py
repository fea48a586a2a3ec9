"""The gradients probe: each rank's local gradient, the reduced one, and rank 0's reference.

`LocalGradients` sums, per parameter, the gradient each backward of step 0 produces on this rank
alone (a tensor hook, which sees the gradient before DDP's all-reduce overwrites `.grad`); after the
step's last backward, `.grad` holds the reduced gradient; rank 0 also computes the single-process
reference on the whole global batch (`rank/reference.py`). All three go to rank{r}.pt; the notebook
compares them with `tables.gradients.gradient_check`. Used by notebooks 01 and 06.
"""

from __future__ import annotations

import torch

from .. import reference
from . import Probe


class LocalGradients:
    """Sum of this rank's own gradient contributions per parameter, while `active`."""

    def __init__(self, module):
        self.active = False
        self.sums: dict[str, torch.Tensor] = {}
        for name, p in module.named_parameters():
            if p.requires_grad:   # a frozen parameter never gets a gradient
                p.register_hook(self._hook_for(name))

    def _hook_for(self, name):
        def hook(grad):
            if self.active:
                g = grad.detach().cpu().clone()
                self.sums[name] = self.sums[name] + g if name in self.sums else g
            return grad
        return hook


def reduced(module) -> dict[str, torch.Tensor]:
    """Name -> the gradient left in `.grad` (after DDP's all-reduce), on the CPU."""
    return {n: p.grad.detach().cpu().clone() for n, p in module.named_parameters() if p.grad is not None}


class GradientsProbe(Probe):
    """Saves step 0's local and reduced gradients (and, on rank 0, the reference) to rank{r}.pt."""

    name = "gradients"

    def __init__(self, at, attached):
        super().__init__(at, attached)
        self.local = LocalGradients(at.module)
        self.saved: dict = {}
        at.ctx.log.enter("reference")  # rank 0's single-process work: the launcher's watchdog sees it is alive
        if at.ctx.rank == 0:
            self.saved["reference"] = reference.reference_gradients(at.ctx.exp, at.ctx.device)

    def start_step(self, step: int) -> None:
        self.local.active = step == 0

    def before_optimizer(self, step: int) -> None:
        if step == 0:
            self.saved["local"], self.saved["reduced"] = self.local.sums, reduced(self.at.module)
            self.local.active = False

    def tensors(self) -> dict:
        return self.saved
