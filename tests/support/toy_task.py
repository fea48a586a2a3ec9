"""A task declared outside ddplab, the way a new task is added: one module, one registration.

It declares its spec section (settings, the Experiment fields it reads, its phases), its record and
its run function; `@register` makes it known, and spec.json names this module so every rank finds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddplab.spec import Phase, TaskSpec, register
from ddplab.spec.checks import bad
from ddplab.spec.tasks import RUN_FIELDS


@dataclass(frozen=True)
class ToyRecord:
    rank_sum: float


@register
@dataclass(frozen=True, kw_only=True)
class Toy(TaskSpec):
    """Every rank all-reduces [rank + 1]; `hang_rank` sleeps instead, outside any collective."""

    kind = "toy"
    runner = "tests.support.toy_task:run"
    record = ToyRecord
    phases = (Phase("toy prepare", 4), Phase("toy all-reduce", 5, "the toy's all_reduce", ends_step=True))
    reads = RUN_FIELDS
    hang_rank: int | None = None

    def check(self, exp) -> None:
        if self.hang_rank is not None and self.hang_rank not in range(exp.world_size):
            bad("task.hang_rank", f"must be a rank in 0..{exp.world_size - 1} or None (got {self.hang_rank!r})")

    def total_steps(self, exp) -> int:
        return 1


def run(ctx):
    import time

    import torch
    import torch.distributed as dist

    ctx.log.enter("toy prepare", 0)
    if ctx.rank == ctx.exp.task.hang_rank:
        time.sleep(10 ** 6)
    ctx.log.enter("toy all-reduce", 0)
    t = torch.tensor([ctx.rank + 1.0])
    dist.all_reduce(t, group=ctx.group)
    return ToyRecord(t.item()), {}
