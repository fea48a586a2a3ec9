"""The communication-hook comparison's settings (notebook 10). Its record: `record/compression.py`; its
rank: `rank/tasks/compression.py`; the payload rule and the step model: `predict/compression.py`."""

from __future__ import annotations

from dataclasses import dataclass

from ..predict.compression import HOOKS
from ..record.compression import CompressionRecord
from .checks import bad, int_in, is_int, is_number, same_work_on_every_rank
from .tasks import GRADIENT_ALL_REDUCE, MODEL_FIELDS, RUN_FIELDS, Phase, TaskSpec, register

# hooks torch ships that fail with gloo, and what happens (checked on every verified release: ddplab/releases)
BROKEN_ON_GLOO = {
    "batched_powersgd": "torch's batched_powerSGD_hook raises AssertionError at its first compressed step "
                        "(_orthogonalize asserts a 3-D batch of matrices; the batched hook passes one 2-D matrix)",
}


@register
@dataclass(frozen=True, kw_only=True)
class Compression(TaskSpec):
    """Every hook in `hooks` on its own copy of the model, the whole gradient in one bucket: `learn_steps`
    training steps from the same start on the same batches (loss, gradient error, bytes), then `rounds`
    interleaved rounds of `steps_per_round` timed steps; with `local`, each hook also on a one-rank
    group, where communication is free (what the hook's own work costs). The first hook is the
    baseline the others are compared with. PowerSGD's settings are torch's (`PowerSGDState`).
    One bucket for every hook: on gloo, PowerSGD with two or more buckets deadlocks (its callbacks wait
    on gloo's worker threads) or, with more threads, mismatches collectives across ranks."""

    kind = "compression"
    runner = "ddplab.rank.tasks.compression:run"
    record = CompressionRecord
    phases = (Phase("construct", 1, "broadcast of rank 0's parameters"), Phase("framing", 2, "all_reduce"),
              Phase("learn", 3, GRADIENT_ALL_REDUCE), Phase("round", 4, GRADIENT_ALL_REDUCE))
    reads = RUN_FIELDS | MODEL_FIELDS | {"link", "lr"}
    step_unit = "rounds"
    hooks: tuple[str, ...] = HOOKS
    matrix_approximation_rank: int = 2
    start_powerSGD_iter: int = 2
    min_compression_rate: float = 2.0
    use_error_feedback: bool = True
    warm_start: bool = True
    learn_steps: int = 12
    rounds: int = 6
    steps_per_round: int = 2
    local: bool = True

    def extra_groups(self, exp) -> tuple[tuple[tuple[int, ...], str | None], ...]:
        # with `local`, a one-rank gloo group per rank, where each hook's communication is free
        return tuple(((r,), "gloo") for r in range(exp.world_size)) if self.local else ()

    def check(self, exp) -> None:
        hooks = list(self.hooks) if isinstance(self.hooks, tuple) else None
        for h in hooks or []:
            if h in BROKEN_ON_GLOO:
                bad("task.hooks", f"{h!r} is left out: {BROKEN_ON_GLOO[h]}")
        if not hooks or not all(h in HOOKS for h in hooks) or len(set(hooks)) != len(hooks):
            bad("task.hooks", f"distinct hook names from {', '.join(HOOKS)} (got {self.hooks!r})")
        if hooks[0] != "allreduce":
            bad("task.hooks", f"start with 'allreduce': the float32 all-reduce is the baseline (got {hooks[0]!r})")
        if not is_int(self.matrix_approximation_rank) or not 1 <= self.matrix_approximation_rank <= 1024:
            bad("task.matrix_approximation_rank", f"an integer in 1..1024 (got {self.matrix_approximation_rank!r})")
        for name in ("use_error_feedback", "warm_start", "local"):
            if not isinstance(getattr(self, name), bool):
                bad(f"task.{name}", f"must be True or False (got {getattr(self, name)!r})")
        low = 2 if (self.use_error_feedback or self.warm_start) else 0
        if not is_int(self.start_powerSGD_iter) or not low <= self.start_powerSGD_iter <= 10 ** 4:
            why = " (torch's PowerSGDState needs > 1 with error feedback or warm start)" if low else ""
            bad("task.start_powerSGD_iter", f"an integer in {low}..10000{why} (got {self.start_powerSGD_iter!r})")
        if not is_number(self.min_compression_rate) or not 0 < self.min_compression_rate <= 1e6:
            bad("task.min_compression_rate", f"a number in (0, 1e6] (got {self.min_compression_rate!r})")
        for name, lo in (("learn_steps", 0), ("rounds", 1), ("steps_per_round", 1)):
            int_in(f"task.{name}", getattr(self, name), lo, 10 ** 4)
        if "powersgd" in hooks and 0 < self.learn_steps <= self.start_powerSGD_iter:
            bad("task.learn_steps", f"PowerSGD compresses from step {self.start_powerSGD_iter} on: give more learning "
                                    f"steps than start_powerSGD_iter, or 0 (got {self.learn_steps})")
        if exp.backend == "nccl" or exp.device == "cuda":
            bad("backend", "the bytes each rank writes are counted in /proc/self/io, which NCCL's GPU traffic "
                           "bypasses: run the comparison on gloo and CPU")
        if exp.world_size < 2:
            bad("world_size", f"a communication hook needs at least 2 ranks to talk to (got {exp.world_size})")
        if exp.dtype != "float32":
            bad("dtype", f"the hooks compress float32 gradients; use dtype='float32' (got {exp.dtype!r})")
        same_work_on_every_rank(exp, "the hook comparison")

    def total_steps(self, exp) -> int:
        return self.rounds
