"""Fault injection, to study failures: which rank misbehaves, how, and in which step (pure).

    Experiment(world_size=2, steps=2, fault=Fault("skip-backward", rank=1, step=1), timeout_s=5)

- "crash": the rank raises in the middle of its step; its peers lose it;
- "skip-backward": the rank skips its synchronized backward and goes on to a barrier, while its peers
  wait in the gradient all-reduce (a mismatched collective: a hang until the process-group timeout);
- "stall": the rank stops (it sleeps) before its backward, outside any collective.
Only the train task injects faults. Used by notebook 00 and `ddplab run --fault`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .checks import bad, is_int

FAULT_KINDS = ("crash", "skip-backward", "stall")


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int | None = None      # None = the last rank
    step: int = 0

    def check(self, exp) -> None:
        if self.kind not in FAULT_KINDS:
            bad("fault.kind", f"must be one of {', '.join(FAULT_KINDS)} (got {self.kind!r})")
        if not is_int(self.rank) or not 0 <= self.rank < exp.world_size:
            bad("fault.rank", f"must be a rank in 0..{exp.world_size - 1} (got {self.rank!r})")
        if not is_int(self.step) or not 0 <= self.step < exp.steps:
            bad("fault.step", f"must be a step in 0..{exp.steps - 1} (got {self.step!r})")
        if self.kind == "skip-backward" and exp.world_size < 2:
            bad("fault", "'skip-backward' needs world_size >= 2: with one rank nobody waits for it")
        if self.kind == "skip-backward" and exp.sync != "ddp":
            bad("fault", "'skip-backward' needs sync='ddp': without synchronization nobody waits for it")

    def hits(self, rank: int, step: int) -> bool:
        return rank == self.rank and step == self.step

    @staticmethod
    def from_dict(d) -> "Fault | None":
        if d is None or isinstance(d, Fault):
            return d
        if isinstance(d, str):
            return Fault(d)
        if not isinstance(d, dict) or set(d) - {"kind", "rank", "step"} or "kind" not in d:
            bad("fault", f"must be Fault(kind, rank, step) or None (got {d!r})")
        return Fault(**d)
