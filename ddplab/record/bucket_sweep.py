"""The bucket sweep's record: one arm per bucket plan, its layout, check and timed steps (pure: no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from .timeline import Backward, BucketEvent, Timeline
from .train import ModelInfo


@dataclass(frozen=True)
class SweepStep(Timeline):
    round: int
    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    step_ms: float
    backward: Backward
    buckets: list[BucketEvent] | None = None


@dataclass(frozen=True)
class PlanCheck:
    """Relative max difference from the first plan: reduced gradient and update of the check step,
    and the parameters after every timed step."""

    grad_rel_diff: float
    param_rel_diff: float
    final_param_rel_diff: float | None = None


@dataclass(frozen=True)
class SweepArm:
    name: str
    layout: list[list[str]]        # bucket membership as observed (probed plans)
    check: PlanCheck | None
    steps: list[SweepStep]


@dataclass(frozen=True)
class BucketSweepRecord:
    parameter_names: list[str]
    parameter_bytes: dict[str, int]
    model: ModelInfo
    warmup_steps: int
    ready_order: list[str]         # rank 0's, which every rank's explicit plans follow
    copy_bytes_per_s: float
    arms: list[SweepArm]

    def arm(self, name: str) -> SweepArm:
        return next(a for a in self.arms if a.name == name)
