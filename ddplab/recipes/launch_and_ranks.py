"""Notebook 00, launch and ranks: the seed's setup, and one crash and one hang to diagnose."""

from __future__ import annotations

from ..spec import Experiment, Fault


def first_launch(world_size: int = 4, local_batch: int = 16, **overrides) -> Experiment:
    """Notebook 00: the seed's setup, a global batch of 64 split into 4 local batches of 16, one step,
    with the single-process reference and each rank's independent update recorded."""
    fields = dict(name="launch-and-ranks", world_size=world_size, local_batch=local_batch, seq_len=16,
                  steps=1, probes=("reference",))
    return Experiment(**{**fields, **overrides})


def crash(world_size: int = 2, fault_rank: int = 1, **overrides) -> Experiment:
    """Notebook 00: one rank raises in the middle of a step; the others lose their peer."""
    fields = dict(name="crash", world_size=world_size, steps=2, fault=Fault("crash", rank=fault_rank, step=1))
    return Experiment(**{**fields, **overrides})


def skip_backward(world_size: int = 2, fault_rank: int = 1, timeout_s: float = 5.0, **overrides) -> Experiment:
    """Notebook 00: one rank skips its backward, so the others wait in the gradient all-reduce until
    the process group's timeout."""
    fields = dict(name="skip-backward", world_size=world_size, steps=2,
                  fault=Fault("skip-backward", rank=fault_rank, step=1), timeout_s=timeout_s)
    return Experiment(**{**fields, **overrides})
