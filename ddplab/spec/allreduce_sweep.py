"""The all-reduce sweep's settings (notebook 03). Its record: `record/allreduce_sweep.py`; its rank:
`rank/tasks/allreduce_sweep.py`."""

from __future__ import annotations

from dataclasses import dataclass

from ..record.allreduce_sweep import AllReduceSweepRecord
from .checks import bad, is_int
from .tasks import RUN_FIELDS, Phase, TaskSpec, register


@register
@dataclass(frozen=True, kw_only=True)
class AllReduceSweep(TaskSpec):
    """Time all_reduce of every size in `sweep_bytes`, `repeats` times, sizes in alternating order."""

    kind = "allreduce-sweep"
    runner = "ddplab.rank.tasks.allreduce_sweep:run"
    record = AllReduceSweepRecord
    phases = (Phase("allocate buffers", 4), Phase("all-reduce sweep", 5, "all_reduce"))
    reads = RUN_FIELDS
    step_unit = "repeats"
    sweep_bytes: tuple[int, ...] = ()
    repeats: int = 20

    def check(self, exp) -> None:
        sizes = list(self.sweep_bytes) if isinstance(self.sweep_bytes, tuple) else None
        if not sizes or not all(is_int(n) and n >= 4 and n % 4 == 0 for n in sizes) or len(set(sizes)) != len(sizes):
            bad("task.sweep_bytes", f"an all-reduce sweep needs distinct message sizes, multiples of 4 bytes "
                                    f"(float32 elements) (got {sizes!r})")
        if not is_int(self.repeats) or not 1 <= self.repeats <= 10 ** 5:
            bad("task.repeats", f"must be an integer in 1..100000 (got {self.repeats!r})")
        if sum(self.sweep_bytes) > 2 ** 32:
            bad("task.sweep_bytes", f"at most 4 GiB of buffers in all (got {sum(self.sweep_bytes)} bytes)")

    def total_steps(self, exp) -> int:
        return self.repeats
