"""The pipeline bubble, pure (notebook 09): the formula, each stage's order of work under torch's
GPipe and 1F1B schedules, a small simulator of those schedules, and the microbatches each stage
holds in flight.

With p stages and m microbatches of equal cost, every schedule that runs each stage's microbatches
back to back leaves each stage idle for p - 1 slots out of m + p - 1:

    bubble_fraction(p, m) = (p - 1) / (m + p - 1)

`simulate` replays a schedule with any per-stage forward and backward durations (equal ones give
the formula exactly; measured ones give what the formula's equal-cost assumption leaves out), and
returns each stage's timeline and idle fraction of the span (first forward start to last backward
end over all stages), as `tables/pipeline.py` measures it on a real run.

The stage orders are torch's (`torch.distributed.pipelining.schedules`): GPipe runs every forward,
then every backward, both in microbatch order. 1F1B runs min(m, p - s) forwards on stage s (its
warm-up), then alternates one backward and one forward, then the remaining backwards: stage s never
holds more than min(m, p - s) microbatches' activations, where GPipe holds all m. torch's
Schedule1F1B refuses m < p. Pure: no torch.
References: GPipe, Huang et al. 2019 (arXiv:1811.06965); PipeDream-Flush / 1F1B, Narayanan et al.
2021 (arXiv:2104.04473); https://pytorch.org/docs/stable/distributed.pipelining.html
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("GPipe", "1F1B")


def bubble_fraction(stages: int, microbatches: int) -> float:
    """(p - 1) / (m + p - 1): the idle fraction of every stage when all work costs the same."""
    _check(stages, microbatches)
    return (stages - 1) / (microbatches + stages - 1)


def in_flight(schedule: str, stages: int, microbatches: int, stage: int) -> int:
    """Most microbatches whose forward stage `stage` ran and whose backward it has not yet run: GPipe m,
    1F1B min(m, p - stage)."""
    _check(stages, microbatches, schedule)
    if not 0 <= stage < stages:
        raise ValueError(f"stage must be in 0..{stages - 1} (got {stage!r})")
    return microbatches if schedule == "GPipe" else min(microbatches, stages - stage)


def runs(schedule: str, stages: int, microbatches: int) -> bool:
    """Whether torch's schedule accepts these sizes (Schedule1F1B needs microbatches >= stages)."""
    return schedule == "GPipe" or microbatches >= stages


def order(schedule: str, stages: int, microbatches: int, stage: int) -> list[tuple[str, int]]:
    """Stage `stage`'s work in torch's order: ("F", i) is microbatch i's forward, ("B", i) its backward."""
    _check(stages, microbatches, schedule)
    m = microbatches
    if schedule == "GPipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(m, stages - stage)
    ops = [("F", i) for i in range(warmup)]
    f, b = warmup, 0
    while True:           # 1B1F: a backward, then (while forwards remain) a forward
        ops.append(("B", b))
        b += 1
        if f == m:
            break
        ops.append(("F", f))
        f += 1
    ops += [("B", i) for i in range(b, m)]
    return ops


@dataclass(frozen=True)
class Op:
    """One forward ("F") or backward ("B") of one microbatch on one stage; times in ms."""

    kind: str
    microbatch: int
    start_ms: float
    end_ms: float


@dataclass(frozen=True)
class Simulation:
    schedule: str
    stages: int
    microbatches: int
    timelines: list[list[Op]]       # per stage, in the order it ran
    span_ms: float                  # first forward start to last backward end, over all stages
    stage_bubble: list[float]       # per stage: idle time / span

    @property
    def bubble(self) -> float:
        """The stages' mean idle fraction (each stage's equals the formula when all work costs the same)."""
        return sum(self.stage_bubble) / len(self.stage_bubble)


def simulate(schedule: str, forward_ms, backward_ms, microbatches: int, send_ms: float = 0.0) -> Simulation:
    """Replay `schedule` on len(forward_ms) stages. forward_ms[s] is stage s's forward of a microbatch:
    one number for every microbatch, or a list of one per microbatch (measured ones); backward_ms
    likewise. A forward starts when its stage is free and the previous stage's forward of that
    microbatch is done (plus `send_ms`); a backward when the next stage's backward of it is done
    (plus `send_ms`), on the last stage when its own forward is."""
    stages = len(forward_ms) if isinstance(forward_ms, (list, tuple)) else None
    if stages is None or not isinstance(backward_ms, (list, tuple)) or len(backward_ms) != stages:
        raise ValueError("forward_ms and backward_ms: one entry per stage, the same number of each "
                         f"(got {forward_ms!r} and {backward_ms!r})")
    _check(stages, microbatches, schedule)
    fwd = [_per_microbatch(d, microbatches, "forward_ms") for d in forward_ms]
    bwd = [_per_microbatch(d, microbatches, "backward_ms") for d in backward_ms]
    if not _duration(send_ms):
        raise ValueError(f"send_ms must be a number >= 0 (got {send_ms!r})")
    if not runs(schedule, stages, microbatches):
        raise ValueError(f"microbatches: torch's Schedule1F1B needs at least as many microbatches as stages "
                         f"({stages}) (got {microbatches})")
    orders = [order(schedule, stages, microbatches, s) for s in range(stages)]
    done: dict[tuple[str, int, int], float] = {}     # (kind, stage, microbatch) -> end
    timelines: list[list[Op]] = [[] for _ in range(stages)]
    free = [0.0] * stages
    nxt = [0] * stages
    while any(nxt[s] < len(orders[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            if nxt[s] == len(orders[s]):
                continue
            kind, i = orders[s][nxt[s]]
            if kind == "F":
                dep = ("F", s - 1, i) if s > 0 else None
            else:   # the last stage's backward follows its own forward (the loss), no send between
                dep = ("B", s + 1, i) if s < stages - 1 else ("F", s, i)
            if dep is not None and dep not in done:
                continue
            ready = 0.0 if dep is None else done[dep] + (send_ms if dep[1] != s else 0.0)
            start = max(free[s], ready)
            end = start + (fwd[s][i] if kind == "F" else bwd[s][i])
            done[(kind, s, i)] = end
            timelines[s].append(Op(kind, i, start, end))
            free[s] = end
            nxt[s] += 1
            progressed = True
        assert progressed, "the stage orders deadlock"   # an invariant of torch's orders
    t0 = min(t[0].start_ms for t in timelines)
    span = max(t[-1].end_ms for t in timelines) - t0
    busy = [sum(op.end_ms - op.start_ms for op in t) for t in timelines]
    bubble = [(span - b) / span if span > 0 else 0.0 for b in busy]
    return Simulation(schedule, stages, microbatches, timelines, span, bubble)


def _duration(d) -> bool:
    return isinstance(d, (int, float)) and not isinstance(d, bool) and d >= 0


def _per_microbatch(d, microbatches: int, name: str) -> list[float]:
    """One stage's durations as a list of one per microbatch."""
    values = list(d) if isinstance(d, (list, tuple)) else [d] * microbatches
    if len(values) != microbatches or not all(_duration(v) for v in values):
        raise ValueError(f"{name}: a stage's duration is a number >= 0 or a list of {microbatches}, one per "
                         f"microbatch (got {d!r})")
    return values


def _check(stages, microbatches, schedule: str | None = None) -> None:
    for name, v in (("stages", stages), ("microbatches", microbatches)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer (got {v!r})")
    if schedule is not None and schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)} (got {schedule!r})")
