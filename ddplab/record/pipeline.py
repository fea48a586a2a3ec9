"""The pipeline task's record: every stage's operations of every round, and the unsplit check (pure: no torch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageOp:
    """One piece of work on this stage in one step: a microbatch's "forward", its "loss" (last stage
    only) or its "backward", timed on the ranks' shared time base (rank/clock.py), and the activations
    autograd holds on this stage when it ended."""

    kind: str
    microbatch: int
    start_ns: int
    end_ns: int
    in_flight: int          # microbatches forwarded and not yet backwarded on this stage, after this op
    saved_bytes: int        # bytes saved for backward alive on this stage, after this op
    cpu_ns: int | None = None   # CPU time this stage's process spent in the op (process_time_ns): its own
                                # compute, without the time it waited for a message or for a core


@dataclass(frozen=True)
class PipelineStep:
    """One schedule step on this stage: every op, and the peaks of the step."""

    schedule: str
    microbatches: int
    round: int              # -1: the untimed check step that is compared with the unsplit model
    barrier_ns: int         # when this rank left the barrier that starts the step
    ops: list[StageOp]
    peak_saved_bytes: int   # the most bytes saved for backward alive at once on this stage
    peak_in_flight: int


@dataclass(frozen=True)
class UnsplitCheck:
    """This stage's gradient and (last stage) loss after one step of (schedule, m), against the
    unsplit model's on the same global batch, computed in this rank alone."""

    schedule: str
    microbatches: int
    loss: float | None              # the mean of the microbatch losses (last stage only)
    reference_loss: float
    grad_max_abs_error: float       # over this stage's parameters
    reference_grad_max_abs: float   # the scale the error is read against


@dataclass(frozen=True)
class PipelineRecord:
    """A stage's part of rank{r}.json."""

    stage: int
    stages: int
    blocks: list[int]               # the transformer blocks this stage holds
    parameter_names: list[str]      # the unsplit model's names of this stage's parameters
    parameter_bytes: int
    global_batch: int
    checks: list[UnsplitCheck]
    steps: list[PipelineStep]
    cores: list[int] | None = None  # the CPU cores this rank could run on (stages on one core take turns)
