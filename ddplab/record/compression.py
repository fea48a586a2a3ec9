"""The communication-hook comparison's record (notebook 10; pure: no torch).

Per hook arm, what one rank saw: the learning steps (loss, the reduced gradient's error against the
exact float32 average of the same local gradients, the bytes written during backward) and the timed
steps (step, backward, bytes); plus gloo's framing measured in the same launch (all-reduces of known
sizes, `SizeCalls`, every size a hook sends among them), what torch refused, in its own words, and
which parameters require a gradient (the bucket holds only those).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .allreduce_sweep import SizeCalls


@dataclass(frozen=True)
class LearnStep:
    loss: float            # the global mean loss of this step (every rank's, averaged)
    grad_error: float      # |reduced - exact average| / |exact average|, over the whole gradient
    write_bytes: int       # bytes this rank wrote during backward
    magnitude: float = 1.0  # |mean over ranks of |g||| / |exact average|: >= 1, large where the ranks' gradients cancel
    worst_element: float = 0.0   # max over elements of |reduced - exact| / (mean over ranks of |g|), over the
                                 # elements where every rank's |g| / ranks is in fp16's normal range (>= 2^-14)
    cumulative_error: float = 0.0  # |sum of reduced - sum of exact averages| / |sum of exact|, steps so far


@dataclass(frozen=True)
class HookStep:
    round: int
    step_ms: float
    backward_ms: float
    write_bytes: int


@dataclass(frozen=True)
class HookArm:
    hook: str                 # predict.compression.HOOKS
    group: str                # "world": every rank; "local": a one-rank group (communication is free)
    buckets: int              # hook calls per backward (the task keeps the gradient in one bucket)
    learn: list[LearnStep]
    steps: list[HookStep]
    param_gap: float | None   # |theta - theta_fp32| / |theta_fp32 - theta_0| after the learning steps
    first_step: int = 0       # the 0-based step index (PowerSGD's iteration) of the first timed step
    bucket_bytes: int = 0     # bytes of the bucket DDP handed the hook (its gradients that require grad)


@dataclass(frozen=True)
class CompressionRecord:
    parameter_names: list[str]
    parameter_shapes: list[list[int]]
    framing: list[SizeCalls]                  # all-reduces of known sizes on the world group
    arms: list[HookArm]
    refused: dict[str, str] = field(default_factory=dict)   # hook -> torch's error when registered as is
    requires_grad: list[bool] | None = None   # per parameter; DDP's bucket holds those that do (None: all)
