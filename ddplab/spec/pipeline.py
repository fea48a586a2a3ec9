"""The pipeline-parallel task (notebook 09): the built-in transformer cut into `world_size` stages,
one per rank, run by torch's own GPipe and 1F1B schedules at several microbatch counts.

    Pipeline()                                        # every (schedule, m) of GPipe, 1F1B x m = 1, 2, 4, 8
    Pipeline(schedules=("GPipe",), microbatches=(1, 8), rounds=3)

Stage s holds n_layers / world_size consecutive blocks; stage 0 also the token and position
embeddings, the last stage the final norm and the LM head. Every step takes the same global batch
(`global_batch` examples of `seq_len` tokens), cut into m equal microbatches; the loss is the mean
token cross-entropy of each microbatch, and torch divides the gradients by m (scale_grads), so the
step's gradient is the global batch's mean, the unsplit model's. No optimizer step: every step
starts from the same parameters, so every (schedule, m) is compared with the same single-process
reference. torch's Schedule1F1B refuses m < world_size: those pairs run under GPipe only and the
tables list them as not run (`combos`, `not_run`).
Pure: no torch. The rank side is `rank/tasks/pipeline.py` (with `rank/parallel/pipeline.py`), the
pure model `predict/pipeline.py`, the views `tables/pipeline.py` and `plots/pipeline.py`, the
experiments `recipes/pipeline.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..predict.pipeline import SCHEDULES, runs
from ..record.pipeline import PipelineRecord
from .checks import bad, is_int
from .tasks import RUN_FIELDS, Phase, TaskSpec, register

MAX_MICROBATCHES = 64
MAX_ROUNDS = 100
PIPELINE_SEND_RECV = "the pipeline's send/recv of activations and gradients"


@register
@dataclass(frozen=True, kw_only=True)
class Pipeline(TaskSpec):
    """Pipeline parallelism on world_size stages (`rank/tasks/pipeline.py`): for every (schedule, m) of
    `combos`, one checked step against the unsplit model, one warm-up step, then `rounds` interleaved
    rounds of one timed step each."""

    kind = "pipeline"
    runner = "ddplab.rank.tasks.pipeline:run"
    record = PipelineRecord
    phases = (Phase("build", 2), Phase("reference", 3),
              Phase("check", 4, PIPELINE_SEND_RECV), Phase("round", 5, PIPELINE_SEND_RECV))
    reads = RUN_FIELDS | {"model", "vocab_size", "d_model", "n_layers", "n_heads", "tie_weights", "checkpointing",
                          "seed", "dtype", "seq_len"}
    step_unit = "rounds"
    schedules: tuple[str, ...] = SCHEDULES
    microbatches: tuple[int, ...] = (1, 2, 4, 8)
    rounds: int = 5
    global_batch: int = 32          # examples per step, over all microbatches

    def check(self, exp) -> None:
        schedules = list(self.schedules) if isinstance(self.schedules, tuple) else None
        if not schedules or not all(s in SCHEDULES for s in schedules) or len(set(schedules)) != len(schedules):
            bad("task.schedules", f"distinct schedules from {', '.join(SCHEDULES)} (got {self.schedules!r})")
        ms = list(self.microbatches) if isinstance(self.microbatches, tuple) else None
        if not ms or not all(is_int(m) and 1 <= m <= MAX_MICROBATCHES for m in ms) or len(set(ms)) != len(ms):
            bad("task.microbatches", f"distinct microbatch counts in 1..{MAX_MICROBATCHES} (got {self.microbatches!r})")
        if not is_int(self.rounds) or not 1 <= self.rounds <= MAX_ROUNDS:
            bad("task.rounds", f"must be an integer in 1..{MAX_ROUNDS} (got {self.rounds!r})")
        b = self.global_batch
        if not is_int(b) or not 1 <= b <= 4096:
            bad("task.global_batch", f"must be an integer in 1..4096 (got {b!r})")
        uneven = [m for m in ms if b % m]
        if uneven:
            bad("task.global_batch", f"{b} examples do not split into {uneven[0]} equal microbatches; use a multiple "
                                     f"of every microbatch count {ms}")
        if exp.model != "transformer":
            bad("model", f"the pipeline cuts the built-in 'transformer' into stages (got {exp.model!r})")
        if exp.tie_weights:
            bad("tie_weights", "a head tied to the embedding would live on the first and the last stage at once; "
                               "leave it False")
        p = exp.world_size
        if not is_int(p) or p < 2:
            bad("world_size", f"the stages: at least 2 (got {p!r})")
        if exp.n_layers % p:
            bad("n_layers", f"{exp.n_layers} blocks do not split into world_size={p} equal stages; use a multiple of {p}")
        if not is_int(exp.seq_len):
            bad("seq_len", f"every microbatch has the same shape: one seq_len (got {exp.seq_len!r})")
        if "GPipe" not in schedules and self.not_run(exp):
            bad("task.microbatches", f"torch's Schedule1F1B needs at least world_size={p} microbatches (got "
                                     f"{[m for m in ms if m < p]}); drop them or add GPipe")

    def combos(self, exp) -> list[tuple[str, int]]:
        """Every (schedule, m) the ranks run, in the order of a round."""
        return [(s, m) for s in self.schedules for m in self.microbatches if runs(s, exp.world_size, m)]

    def not_run(self, exp) -> list[tuple[str, int]]:
        """The (schedule, m) pairs asked for that torch refuses (1F1B with m < world_size)."""
        return [(s, m) for s in self.schedules for m in self.microbatches if not runs(s, exp.world_size, m)]

    def total_steps(self, exp) -> int:
        return self.rounds
