"""The all-reduce sweep's record: every size's timed calls (pure: no torch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SizeCalls:
    bytes: int
    ms: list[float]
    write_bytes: list[int]


@dataclass(frozen=True)
class AllReduceSweepRecord:
    sizes: list[SizeCalls]
