"""A task that dies or stalls in the ways the launcher must name (tests/launch/test_deaths.py): a rank that
ends itself with an exit code, ranks that wait long enough for torchrun to be killed under them, and a
torch.compile whose backend takes `compile_s` seconds (compilation, not a hang). Imported by the ranks too."""

from __future__ import annotations

from dataclasses import dataclass

from ddplab.spec import Phase, TaskSpec, register
from ddplab.spec.tasks import RUN_FIELDS


@dataclass(frozen=True)
class DyingRecord:
    rank_sum: float


@register
@dataclass(frozen=True, kw_only=True)
class Dying(TaskSpec):
    """Every rank waits `wait_s`, compiles `t * 2 + 1` with a backend that sleeps `compile_s` (if > 0),
    then all-reduces [rank + 1]; `exit_rank` ends itself with `os._exit(exit_code)` before the all-reduce."""

    kind = "dying"
    runner = "tests.support.dying_task:run"
    record = DyingRecord
    phases = (Phase("dying wait", 4), Phase("dying compile", 5),
              Phase("dying all-reduce", 6, "the dying task's all_reduce", ends_step=True))
    reads = RUN_FIELDS
    wait_s: float = 0.0
    compile_s: float = 0.0
    exit_rank: int | None = None
    exit_code: int = 7

    def total_steps(self, exp) -> int:
        return 1


def run(ctx):
    import os
    import time

    import torch
    import torch.distributed as dist

    task = ctx.exp.task
    ctx.log.enter("dying wait", 0)
    time.sleep(task.wait_s)
    if ctx.rank == task.exit_rank:
        os._exit(task.exit_code)
    t = torch.tensor([ctx.rank + 1.0])
    if task.compile_s > 0:
        ctx.log.enter("dying compile", 0)

        def slow_backend(gm, example_inputs):   # a compiler that takes its time, as Inductor may on few cores
            time.sleep(task.compile_s)
            return gm.forward

        t = torch.compile(lambda x: x * 2 + 1, backend=slow_backend)(t)
    ctx.log.enter("dying all-reduce", 0)
    dist.all_reduce(t, group=ctx.group)
    return DyingRecord(t.item()), {}
