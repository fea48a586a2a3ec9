"""Refuse what cannot run here before any process starts: one backend and device per launch, no NCCL
rank without a GPU, CUDA-only probes on CUDA, a user's model that maps token ids to logits.
Used by every launch (every notebook).
"""

from __future__ import annotations

import contextlib
import os
import sys

from .. import host
from ..spec import Experiment
from ..spec.experiment import BUILTIN_MODELS


def preflight(exps: list[Experiment]) -> tuple[str, str]:
    """Check every experiment of a launch; return the launch's (backend, device type)."""
    cuda_devices = host.cuda_device_count()
    choices = {host.choose_backend(e.backend, e.device, e.world_size, cuda_devices) for e in exps}
    if len(choices) > 1:
        raise ValueError(f"experiments: one launch runs on one backend and device, but these need "
                         f"{sorted(choices)}; run them in separate launches")
    backend, device = choices.pop()
    if device != "cuda" and any("memory-snapshot" in e.probes for e in exps):
        raise ValueError("Experiment.probes: 'memory-snapshot' needs the ranks on CUDA; this launch runs on the CPU")
    for e in exps:
        if e.model not in BUILTIN_MODELS and (e.task.reads is None or "model" in e.task.reads):
            from ..rank import models  # builds the user's model once here, to say what is wrong in this process

            with _importable_from_here():   # as in the ranks, whose PYTHONPATH starts with this directory
                models.check_model(models.build(e), e)
    return backend, device


@contextlib.contextmanager
def _importable_from_here():
    """The current directory on sys.path while the block runs (a console script's sys.path lacks it)."""
    here = os.getcwd()
    added = here not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        yield
    finally:
        if added and here in sys.path:
            sys.path.remove(here)
