"""One step of a pipeline, timed: a run's recorded steps (`record/pipeline.py`), each stage's ops of a
step on the host's one clock (`timeline`), and the step's bubble: its span over all stages, each
stage's idle fraction, the share the stages were not computing, and the schedule replayed with the
measured compute (`predict/pipeline.py`). The claims across schedules (`tables/pipeline.py`) and the
figures of notebook 09 read them."""

from __future__ import annotations

import statistics

import pandas as pd

from ..predict.pipeline import simulate
from ..units import MIB
from .reads import reading, reading_no_run


@reading(run="pipeline")
def steps(run) -> dict[tuple[str, int, int], list]:
    """(schedule, m, round) -> every stage's PipelineStep of that step, in stage order (round -1 is the
    checked step)."""
    out: dict[tuple[str, int, int], list] = {}
    for r in run.ranks:
        for s in r.result.steps:
            out.setdefault((s.schedule, s.microbatches, s.round), [None] * run.world_size)[r.rank] = s
    missing = [k for k, v in out.items() if any(s is None for s in v)]
    if missing:
        raise ValueError(f"run {run.spec.name!r}: not every stage recorded the step {missing[0]}")
    return out


def _durations_ms(step, m: int, cpu: bool = False) -> tuple[list[float], list[float]]:
    """One stage's forward (its loss included) and backward time per microbatch, in ms: wall-clock, or
    (`cpu`) the CPU time the stage's process spent in each op, its own compute alone."""
    fwd, bwd = [0.0] * m, [0.0] * m
    for op in step.ops:
        ms = (op.cpu_ns if cpu else op.end_ns - op.start_ns) / 1e6
        if op.kind == "backward":
            bwd[op.microbatch] += ms
        else:
            fwd[op.microbatch] += ms
    return fwd, bwd


@reading_no_run
def step_bubble(stage_steps: list) -> dict:
    """One step over all stages: its span (ms), each stage's idle fraction, their mean (`bubble`); the
    share of the span the stages' processes were not computing (`not_computing`: the span less their
    ops' CPU time, over the stages; a stage preempted inside an op counts as busy in `bubble`, not
    here); the schedule replayed with free communication and each stage's typical compute
    (`simulated`: every forward, every backward, the median of that stage's, in CPU time, its
    process's own work); and the share of the span lost beyond the replay with every op's own compute
    (`waits`: waiting for messages and, where stages share a core, for it)."""
    first = stage_steps[0]
    m = first.microbatches
    t0 = min(op.start_ns for s in stage_steps for op in s.ops)
    span_ns = max(op.end_ns for s in stage_steps for op in s.ops) - t0
    span_ms = span_ns / 1e6
    stage_bubble = [1 - sum(op.end_ns - op.start_ns for op in s.ops) / span_ns for s in stage_steps]
    cpu = all(op.cpu_ns is not None for s in stage_steps for op in s.ops)   # older records lack it
    computing = [sum(op.cpu_ns for op in s.ops) / span_ns for s in stage_steps] if cpu else \
        [1 - b for b in stage_bubble]
    fwd, bwd = (list(d) for d in zip(*(_durations_ms(s, m, cpu) for s in stage_steps)))
    per_op = simulate(first.schedule, fwd, bwd, m)
    typical = simulate(first.schedule, [statistics.median(f) for f in fwd], [statistics.median(b) for b in bwd], m)
    return {"span_ms": span_ms, "stage_bubble": stage_bubble, "bubble": sum(stage_bubble) / len(stage_bubble),
            "not_computing": 1 - sum(computing) / len(computing), "simulated": typical.bubble,
            "waits": max(0.0, (span_ms - per_op.span_ms) / span_ms), "compute": "cpu" if cpu else "wall"}


@reading(run="pipeline")
def rounds(run) -> dict[tuple[str, int], dict[int, dict]]:
    """(schedule, m) -> round -> `step_bubble` of that timed step: the rounds that pair the arms."""
    out: dict[tuple[str, int], dict[int, dict]] = {}
    for (schedule, m, r), stage_steps in sorted(steps(run).items()):
        if r >= 0:
            out.setdefault((schedule, m), {})[r] = step_bubble(stage_steps)
    return out


@reading(run="pipeline")
def timeline(run, schedule: str, microbatches: int, round_: int = 0) -> pd.DataFrame:
    """Every op of one step: stage, kind ("forward", "loss", "backward"), microbatch, start_ms and
    end_ms after the step's first forward started (any stage), in_flight and saved_mib after it."""
    table = steps(run)
    if (schedule, microbatches, round_) not in table:
        raise ValueError(f"run {run.spec.name!r} has no step {schedule} m={microbatches} round {round_} "
                         f"(it has {sorted({k[:2] for k in table})})")
    stage_steps = table[(schedule, microbatches, round_)]
    t0 = min(op.start_ns for s in stage_steps for op in s.ops)
    return pd.DataFrame([{"stage": stage, "kind": op.kind, "microbatch": op.microbatch,
                          "start_ms": (op.start_ns - t0) / 1e6, "end_ms": (op.end_ns - t0) / 1e6,
                          "in_flight": op.in_flight, "saved_mib": op.saved_bytes / MIB}
                         for stage, s in enumerate(stage_steps) for op in s.ops])
