"""Notebook 10, fewer bytes on the wire: DDP's communication hooks, on loopback and on an emulated link."""

from __future__ import annotations

from ..spec import Compression, Experiment, Link
from .communication import COMM_MODEL

# 0.86 M parameters, 3.3 MiB of float32 gradients in 53 tensors (19 of them matrices PowerSGD compresses at rank 2)
HOOK_MODEL = dict(COMM_MODEL, local_batch=8)


def hook_comparison(world_size: int = 2, link: str | None = None, learn_steps: int = 12, rounds: int = 6, steps: int = 3,
                    hooks=("allreduce", "fp16", "bf16", "powersgd", "noop"), rank: int = 2, local: bool = True,
                    pin_cpus: bool = True,
                    **overrides) -> Experiment:
    """Notebook 10: every hook of `hooks` on its own copy of the model, the whole gradient in one bucket:
    `learn_steps` training steps (loss, gradient error, bytes), then `rounds` interleaved rounds of
    `steps` timed steps, each hook also on a one-rank group (its own cost, communication free). With
    `link` (a preset of spec.LINKS such as "1GbE"), every hook's all-reduces are held to that link."""
    task = Compression(hooks=tuple(hooks), matrix_approximation_rank=rank, learn_steps=learn_steps, rounds=rounds,
                      steps_per_round=steps, local=local)
    suffix = f"-{link}" if link else ""
    fields = dict(name=f"compression-w{world_size}{suffix}", task=task, world_size=world_size, pin_cpus=pin_cpus,
                  link=Link.named(link) if link else None, **HOOK_MODEL)
    return Experiment(**{**fields, **overrides})
