"""The balance study's record: calibration, the fitted cost model, one arm per policy (pure: no torch)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..units import ms_after
from .train import ModelInfo


@dataclass(frozen=True)
class CalibrationPoint:
    """One calibration micro-batch: `count` sequences of `length` tokens, forward+backward on one rank
    alone (no synchronization), timed `len(ms)` times."""

    count: int
    length: int
    rank: int                      # the rank that measured it
    ms: list[float]

    @property
    def tokens(self) -> int:
        return self.count * self.length

    @property
    def sum_sq(self) -> int:
        return self.count * self.length ** 2

    @property
    def median_ms(self) -> float:
        return statistics.median(self.ms)


@dataclass(frozen=True)
class CostFit:
    """The cost model every rank fitted to the calibration points (`predict.balance.CostModel`)."""

    c_ms: float
    a_ms_per_token: float
    b_ms_per_sq: float


@dataclass(frozen=True)
class BalanceStep:
    """One timed step on one rank: forward+backward of its sequences from `start_ns` (every rank
    leaves a barrier together) to `arrival_ns` (its flattened gradient ready), then the all-reduce,
    which every rank leaves at `returned_ns`."""

    round: int
    start_ns: int
    arrival_ns: int
    returned_ns: int
    compute_ms: float              # start to arrival
    wait_ms: float                 # its own arrival to the last rank's arrival

    @property
    def allreduce_ms(self) -> float:
        return ms_after(self.returned_ns, self.arrival_ns)

    @property
    def step_ms(self) -> float:
        return ms_after(self.returned_ns, self.start_ns)


@dataclass(frozen=True)
class BalanceArm:
    """One policy on one rank: the sequences it was given (fixed for every step), what the cost model
    predicted for them, the check step's reduced gradient against the first policy's, the timed steps."""

    policy: str
    sequences: list[int]           # indices into the pool
    lengths: list[int]
    tokens: int
    sum_sq: int
    predicted_ms: float
    grad_rel_diff: float
    steps: list[BalanceStep]


@dataclass(frozen=True)
class BalanceRecord:
    model: ModelInfo
    pool: list[int]
    global_tokens: int
    warmup_steps: int
    calibration: list[CalibrationPoint]   # every rank's points, gathered (the same on every rank)
    fit: CostFit
    arms: list[BalanceArm]

    def arm(self, policy: str) -> BalanceArm:
        return next(a for a in self.arms if a.policy == policy)
