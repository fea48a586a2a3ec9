"""The compiled-DDP comparison's record (notebook 11; pure: no torch).

Per arm (a cap, eager or compiled): how long its first steps took (the compile), the split torch's
DDPOptimizer recorded (its buckets, in DDP's order: the first all-reduced first), the graphs the backend
was asked to compile (counted by the lab's wrapper around the backend), DDP's own buckets as its
Reducer all-reduced them (the comm hook), the gradients' ready order and times, and the timed steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .timeline import ReadyEvent


@dataclass(frozen=True)
class SplitBucket:
    bytes: int
    params: list[str]          # module parameter names ("h.0.attn.c_attn.weight")


@dataclass(frozen=True)
class CompiledStep:
    round: int
    step_ms: float
    backward_ms: float


@dataclass(frozen=True)
class CompiledArm:
    name: str                          # "eager:<cap>", "compiled:<cap>" (+ "/<mode>" beside ddp_optimizer)
    cap_mb: float | None               # None: DDP's default (25 MiB, 1 MiB first bucket)
    compiled: bool
    first_steps_s: list[float]         # wall time of each warm-up step (the first compiles)
    graphs_compiled: int               # graphs the backend compiled (the lab's count)
    split: list[SplitBucket] | None    # DDPOptimizer's own record of the split, in DDP's bucket order (None: eager)
    recorded_graphs: int               # graphs torch's records account for: every recorded bucket of every frame
                                       # DDPOptimizer split, plus one per graph it saw without parameters
    ddp_buckets: list[list[str]]       # DDP's Reducer buckets, in the order it all-reduced them
    ready: list[ReadyEvent]            # the last warm-up step's gradients, in ready order (shared clock)
    backward_start_ns: int
    steps: list[CompiledStep] = field(default_factory=list)
    mode: str = "ddp_optimizer"        # torch._dynamo.config.optimize_ddp of the block the arm ran in
    param_gap: float | None = None     # compiled: largest relative difference from the eager arm's parameters
    bucket_launch_ns: list[int] = field(default_factory=list)   # when each of `ddp_buckets` was launched


@dataclass(frozen=True)
class CompiledDdpRecord:
    backend: str
    parameter_bytes: dict[str, int]
    arms: list[CompiledArm]
