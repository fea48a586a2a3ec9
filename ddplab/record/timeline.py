"""Events on one time base, shared by the tasks whose steps time a backward and its buckets: a
gradient's readiness, one bucket's all-reduce, one backward, and the **exposed tail** (pure: no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from ..units import ms_after


@dataclass(frozen=True)
class ReadyEvent:
    """A parameter's gradient was accumulated into `.grad` (its post-accumulate-grad hook fired)."""

    param: str
    t_ns: int


@dataclass(frozen=True)
class BucketEvent:
    """One bucket's all-reduce: handed to the communication hook, and its future completed."""

    index: int
    bytes: int
    params: list[str]              # empty where the task keeps the layout once (a bucket sweep)
    launch_ns: int
    done_ns: int


@dataclass(frozen=True)
class Backward:
    """One backward: its start and return, and (readiness probe) every gradient's ready time."""

    start_ns: int
    end_ns: int
    ready: list[ReadyEvent] | None = None

    def ms(self, t_ns: int) -> float:
        return ms_after(t_ns, self.start_ns)

    @property
    def last_ready_ns(self) -> int:
        return self.ready[-1].t_ns


class Timeline:
    """Shared by the steps that carry a `backward` and `buckets`: times in ms after backward started."""

    backward: Backward | None
    buckets: list[BucketEvent] | None

    def ready_ms(self) -> list[tuple[str, float]]:
        return [(e.param, self.backward.ms(e.t_ns)) for e in self.backward.ready]

    @property
    def last_ready_ms(self) -> float:
        return self.backward.ms(self.backward.last_ready_ns)

    @property
    def first_launch_ms(self) -> float:
        return min(self.backward.ms(b.launch_ns) for b in self.buckets)

    @property
    def comm_end_ms(self) -> float:
        return max(self.backward.ms(b.done_ns) for b in self.buckets)

    @property
    def after_last_ready_ms(self) -> float:
        """Communication after the last gradient was ready: last all-reduce done minus last ready."""
        return self.comm_end_ms - self.last_ready_ms

    @property
    def exposed_tail_ms(self) -> float:
        """This rank's share of the exposed tail: `after_last_ready_ms`, or 0 where communication ended first."""
        return max(0.0, self.after_last_ready_ms)


def exposed_tail_ms(rank_steps) -> float:
    """The lab's one definition of a step's **exposed tail** (ms): over the ranks' records of one step,
    the longest time communication still ran after that rank's last gradient was ready (0 where it
    ended first). The step cannot end before it; summaries take the median over steps. It is not
    everything the step pays for communication: on shared cores the all-reduces also slow backward
    itself (notebooks 05 and 08 measure that beside it)."""
    return max(s.exposed_tail_ms for s in rank_steps)
