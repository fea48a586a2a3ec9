"""The compiled-DDP comparison's settings (notebook 11). Its record: `record/compiled_ddp.py`; its rank:
`rank/tasks/compiled_ddp.py`."""

from __future__ import annotations

from dataclasses import dataclass

from ..record.compiled_ddp import CompiledDdpRecord
from .checks import bad, int_in, is_int, is_number, same_work_on_every_rank
from .tasks import GRADIENT_ALL_REDUCE, MODEL_FIELDS, RUN_FIELDS, Phase, TaskSpec, register

BACKENDS = ("aot_eager", "inductor", "eager")
# torch._dynamo.config.optimize_ddp: ddp_optimizer (the default: the graph split at DDPOptimizer's buckets),
# no_optimization (one graph; every all-reduce after backward), python_reducer (compiled autograd traces
# a Python reducer; DDP's C++ Reducer is not used)
MODES = ("ddp_optimizer", "no_optimization", "python_reducer")
FIRST_BUCKET_MB = 1.0   # DDPOptimizer's first bucket, whatever DDP's is (torch/_dynamo/convert_frame.py)


@register
@dataclass(frozen=True, kw_only=True)
class CompiledDdp(TaskSpec):
    """For each cap in `caps_mb` (None: DDP's default) and each of `modes` (`optimize_ddp`; torch's default
    is ddp_optimizer), the same model in DDP eager and under `torch.compile(ddp, backend=backend)`:
    `warmup_steps` steps (the first compiles; timed apart), then `rounds` interleaved rounds of
    `steps_per_round` timed steps, every arm of a round after an untimed barrier."""

    kind = "compiled-ddp"
    feeds_own_data = True
    runner = "ddplab.rank.tasks.compiled_ddp:run"
    record = CompiledDdpRecord
    phases = (Phase("construct", 1, "broadcast of rank 0's parameters"), Phase("warm-up", 2, GRADIENT_ALL_REDUCE),
              Phase("round", 3, GRADIENT_ALL_REDUCE))
    reads = RUN_FIELDS | MODEL_FIELDS
    step_unit = "rounds"
    caps_mb: tuple = (None, 1.0, 4.0)
    backend: str = "aot_eager"
    modes: tuple[str, ...] = ("ddp_optimizer",)
    warmup_steps: int = 3
    rounds: int = 6
    steps_per_round: int = 2

    def check(self, exp) -> None:
        caps = list(self.caps_mb) if isinstance(self.caps_mb, tuple) else None
        if not caps or len(set(caps)) != len(caps) or not all(
                c is None or (is_number(c) and FIRST_BUCKET_MB <= c <= 2 ** 20) for c in caps):
            bad("task.caps_mb", f"distinct caps in MiB, each None (DDP's default) or at least {FIRST_BUCKET_MB:g}: "
                                f"DDPOptimizer asserts its 1 MiB first bucket is no larger than the cap (got {self.caps_mb!r})")
        modes = list(self.modes) if isinstance(self.modes, tuple) else None
        if not modes or len(set(modes)) != len(modes) or not all(m in MODES for m in modes):
            bad("task.modes", f"distinct modes from {', '.join(MODES)} (got {self.modes!r})")
        if self.backend not in BACKENDS:
            bad("task.backend", f"one of {', '.join(BACKENDS)} (got {self.backend!r})")
        if not is_int(self.warmup_steps) or not 2 <= self.warmup_steps <= 100:
            bad("task.warmup_steps", f"an integer in 2..100: DDP rebuilds its buckets after its first step "
                                     f"(got {self.warmup_steps!r})")
        for name in ("rounds", "steps_per_round"):
            int_in(f"task.{name}", getattr(self, name), 1, 10 ** 4)
        if exp.world_size < 2:
            bad("world_size", f"DDP's buckets need at least 2 ranks to mean anything (got {exp.world_size})")
        same_work_on_every_rank(exp, "the comparison")

    def total_steps(self, exp) -> int:
        return self.rounds
