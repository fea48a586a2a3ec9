"""Run an unchanged training script with the guard on every DDP model it builds:

    torchrun --nproc-per-node 2 -m ddplab.guard train.py --its --own --flags
    DDPLAB_GUARD_EVERY=1 DDPLAB_GUARD_ON_PROBLEM=warn torchrun ... -m ddplab.guard train.py

Every `DistributedDataParallel` the script constructs gets a guard (`ddplab.guard.attach`) that hooks
every optimizer updating its parameters, and watches the `DistributedSampler`s the script made since
the DDP before it (a sampler made after the last DDP feeds that one's guard). What the script never hands over is not checked: the
loss's weighting needs `guard.loss` in the loop (a Hugging Face `output.loss` is read alone). With
several optimizers on one model, only the first to step is followed (attach one guard per optimizer
in the script instead).
"""

from __future__ import annotations

import os
import runpy
import sys

from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from ddplab.guard import attach
from ddplab.guard.sampler import watch

GUARDS: list = []
_SAMPLERS: list = []


def _setting(name: str, default: str) -> str:
    return os.environ.get(f"DDPLAB_GUARD_{name}", "").strip() or default


def install() -> None:
    """Wrap DDP's and DistributedSampler's constructors so each new one is guarded or watched."""
    every = _setting("EVERY", "10")
    if not every.isdigit() or int(every) < 1:
        raise ValueError(f"DDPLAB_GUARD_EVERY: expected a whole number of steps, at least 1, got {every!r}")
    on_problem = _setting("ON_PROBLEM", "raise")
    ddp_init, sampler_init = DistributedDataParallel.__init__, DistributedSampler.__init__

    def guarded_ddp(self, *args, **kwargs):
        ddp_init(self, *args, **kwargs)
        guard = attach(self, None, every=int(every), on_problem=on_problem)
        for sampler in _SAMPLERS:   # the samplers made since the last DDP belong to this one
            watch(sampler, guard)
        _SAMPLERS.clear()
        GUARDS.append(guard)

    def watched_sampler(self, *args, **kwargs):
        sampler_init(self, *args, **kwargs)
        if GUARDS:   # made after a DDP: it feeds the latest, unless another DDP comes next
            watch(self, GUARDS[-1])
        _SAMPLERS.append(self)

    DistributedDataParallel.__init__ = guarded_ddp
    DistributedSampler.__init__ = watched_sampler


def main(argv: list[str]) -> None:
    if not argv or not argv[0].endswith(".py"):
        sys.exit("usage: torchrun [torchrun flags] -m ddplab.guard train.py [its flags]")
    install()
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))   # as `python train.py` would
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
