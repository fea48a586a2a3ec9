"""A straggler on purpose: one rank made slower by a known amount in every step, to study how a
synchronous reduction waits for its slowest participant (pure).

    Experiment(world_size=2, steps=12, straggler=Straggler(rank=1, where="before-backward", ms=20))

- "data": the rank's first batch of the step arrives `ms` late (a slow data loader, stood in for by a
  pause before its forward);
- "before-backward": the rank pauses `ms` before its last backward (a host-side stall);
- "compute": the rank does `ms` of extra compute before its last backward (matrix products that keep
  its core busy, as an extra layer or a monitoring hook would).
Once per optimizer step, whatever `accum_steps`: the step's all-reduce waits `ms` more. The delay the
rank really lost is recorded as its step's "straggler" phase (`TrainStep.phase_ms`).
`ms` may also be a cycle of delays, one per step in turn (0 for none): `ms=(0, 20, 40, 80)` runs every
delay once in each cycle of 4 steps, a sweep of delays interleaved in one run, so every delay is
measured beside the steps without one, at the same moment of the machine (`ms_at(step)`). Cycles
alternate direction (0 20 40 80, then 80 40 20 0, ...), so a drift of the machine within a cycle
pushes the even cycles' slopes one way and the odd cycles' the other by as much, instead of every
slope the same way.
A rank with longer sequences is the fourth kind, and needs no straggler: give `seq_len` per rank.
Only the train task injects stragglers. Used by notebook 07.
"""

from __future__ import annotations

from dataclasses import dataclass

from .checks import bad, is_int, is_number

WHERE = ("data", "before-backward", "compute")
MAX_MS = 10_000.0   # ten seconds a step: far beyond any lesson here, and under any collective timeout


@dataclass(frozen=True)
class Straggler:
    rank: int = 1
    where: str = "before-backward"
    ms: float | tuple[float, ...] = 20.0   # or a cycle of delays, one per step in turn

    def __post_init__(self):
        if isinstance(self.ms, list):   # from JSON
            object.__setattr__(self, "ms", tuple(self.ms))

    @property
    def cycle(self) -> tuple[float, ...]:
        """The delays in turn, one per step (a single one for a fixed delay)."""
        return self.ms if isinstance(self.ms, tuple) else (self.ms,)

    def ms_at(self, step: int) -> float:
        """The delay of optimizer step `step`: position k mod n of cycle k // n, read forwards in even
        cycles and backwards in odd ones (every cycle holds every delay once)."""
        n = len(self.cycle)
        cycle, k = divmod(step, n)
        return self.cycle[k if cycle % 2 == 0 else n - 1 - k]

    def check(self, exp) -> None:
        if exp.world_size < 2:
            bad("straggler", "needs world_size >= 2: with one rank nobody waits for it")
        if self.where not in WHERE:
            bad("straggler.where", f"must be one of {', '.join(WHERE)} (got {self.where!r})")
        if not is_int(self.rank) or not 0 <= self.rank < exp.world_size:
            bad("straggler.rank", f"must be a rank in 0..{exp.world_size - 1} (got {self.rank!r})")
        if isinstance(self.ms, tuple):
            if not 2 <= len(self.ms) <= 16 or not all(is_number(x) and 0 <= x <= MAX_MS for x in self.ms) \
                    or not any(x > 0 for x in self.ms):
                bad("straggler.ms", f"a cycle must hold 2-16 delays in [0, {MAX_MS:g}] ms, at least one above 0 "
                                    f"(got {self.ms!r})")
        elif not is_number(self.ms) or not 0 < self.ms <= MAX_MS:
            bad("straggler.ms", f"must be a number of milliseconds in (0, {MAX_MS:g}], or a cycle of them "
                                f"(got {self.ms!r})")
        if exp.sync != "ddp":
            bad("straggler", "needs sync='ddp': without synchronization nobody waits for the slow rank")
        if exp.sharding == "fsdp2":
            bad("straggler", "the arrivals are read from DDP's buckets (the buckets probe), and fsdp2 has none; "
                             "use sharding 'none' or 'zero1'")
        if max(self.cycle) >= 1000 * exp.timeout_s:
            bad("straggler.ms", f"a delay of {max(self.cycle):g} ms reaches the collective timeout ({exp.timeout_s:g} s): "
                                "the peers would time out instead of waiting")

    @staticmethod
    def from_dict(d) -> "Straggler | None":
        if d is None or isinstance(d, Straggler):
            return d
        if not isinstance(d, dict) or set(d) - {"rank", "where", "ms"}:
            bad("straggler", f"must be Straggler(rank, where, ms) or None (got {d!r})")
        return Straggler(**d)
