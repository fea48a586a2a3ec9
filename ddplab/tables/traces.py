"""Tables of the profiler's traces (the profile probe, notebook 07): the lab's phases and every
all-reduce on each rank, aligned on the barrier that starts each step, and the profiler's memory
timeline by category.

Each rank's trace is a chrome trace (`traceEvents`, times `ts` and `dur` in microseconds, `ts` after
the trace's `baseTimeNanoseconds`); `ProfilerStep#k` spans step k. The probe starts every step with a
barrier labelled `ddplab:barrier`: every rank leaves it at the same moment, so on every rank its end is
t = 0 of that step. The ranks of one host share a clock and this changes little; across hosts it is
what makes the lanes of one step comparable. The memory timeline's times are Unix-epoch microseconds,
which is `ts + baseTimeNanoseconds / 1000` of the same rank's trace (checked against the ops that
allocate, docs/ddp-internals.md, "Profiler names").

What the memory timeline's categories hold, against the chapter-02 model (`predict.memory`; checked
in tests/tasks/test_profile.py on a DDP run with Adam): the parameters held throughout, the gradients at
their largest and the optimizer state equal the prediction to the byte on every rank (each rank holds
the whole model). The profiler has no category for DDP's flat buckets: they are "unknown", held from
the second profiled step on (the first allocates the buckets DDP rebuilt after step 0). Adam's
per-tensor temporaries (the square root of `exp_avg_sq`) count as parameters while they live, so
the parameters' peak exceeds the parameters by up to the largest tensor. "activations" is what the
profiler saw the forward produce for backward: a few percent above the saved-tensor meter's count.

`rank_events` and `rank_memory_timeline` read one rank's parsed files (pure: dicts in, DataFrames out);
`trace_events` and `memory_timeline` read every rank of a run. Used by notebook 07 and `plots.traces`.
"""

from __future__ import annotations

import bisect
import functools
import json
from pathlib import Path

import pandas as pd

from .. import rundir
from ..folded import working
from .reads import reading, reading_no_run


PHASES = {"barrier": "ddplab:barrier", "forward": "ddplab:forward", "backward": "ddplab:backward",
          "optimizer": "ddplab:optimizer"}
STEP = "ProfilerStep#"
# the memory timeline's categories as the lab names them first; the profiler's others after them
CORE_CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations")
EVENT_COLUMNS = ["rank", "step", "kind", "name", "main_thread", "thread", "start_ms", "end_ms", "dur_ms"]


@reading_no_run
def is_all_reduce(name: str) -> bool:
    """c10d::allreduce_ (the op, on the main thread), gloo:all_reduce (gloo's worker thread),
    nccl:all_reduce and NCCL's AllReduce kernels: any name that says all-reduce."""
    return "allreduce" in name.lower().replace("_", "")


def _rank(trace: dict) -> int:
    info = trace.get("distributedInfo")
    if not isinstance(info, dict) or "rank" not in info:
        raise ValueError("the trace has no distributedInfo.rank: the profiler writes it only when "
                         "torch.distributed is initialized (run the profile probe inside ddplab.run)")
    return info["rank"]


def _complete(trace: dict) -> list[dict]:
    """The trace's complete events ("X": a start and a duration), Python function frames left out."""
    if "traceEvents" not in trace:
        raise ValueError("the trace has no traceEvents: it is not a chrome trace of torch.profiler")
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "python_function"]


def _on_cpu(event: dict) -> bool:
    """A label as the host thread recorded it (on a GPU, each label has a twin on the device stream)."""
    return event.get("cat") == "user_annotation"


def _steps(events: list[dict], rank: int) -> dict[int, dict]:
    """Step -> its ProfilerStep#k event, in time order."""
    steps = {int(e["name"][len(STEP):]): e for e in events if e["name"].startswith(STEP) and _on_cpu(e)}
    if not steps:
        raise ValueError(f"rank {rank}'s trace has no {STEP}<k> events: the profiler writes them only under a "
                         f"schedule with prof.step() after each step (as the profile probe does)")
    return dict(sorted(steps.items(), key=lambda kv: kv[1]["ts"]))


def _step_of(starts: list[float], ts: float) -> int:
    """Index of the last step that started at or before `ts` (the first step for anything earlier)."""
    return max(bisect.bisect_right(starts, ts) - 1, 0)


def _barrier_ends(events: list[dict], steps: dict[int, dict], rank: int) -> dict[int, float]:
    """Step -> ts (µs) where this rank left the step's ddplab:barrier."""
    numbers, starts = list(steps), [e["ts"] for e in steps.values()]
    ends = {}
    for e in sorted(events, key=lambda e: e["ts"]):
        if e["name"] == PHASES["barrier"] and _on_cpu(e):
            ends.setdefault(numbers[_step_of(starts, e["ts"])], e["ts"] + e["dur"])
    missing = [k for k in steps if k not in ends]
    if missing:
        raise ValueError(f"rank {rank}'s trace has no '{PHASES['barrier']}' event in step(s) {missing}: the "
                         f"profile probe labels a barrier at the start of every step, and the traces are "
                         f"aligned on its end; this trace was not written by the probe")
    return ends


def _thread_names(trace: dict) -> dict:
    """tid -> what the trace calls the thread (in "thread 4711 (pt_gloo_runloop)", the name in
    parentheses); a thread Python started and gloo renamed has both names, and keeps gloo's."""
    names = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            name = str(e.get("args", {}).get("name", ""))
            name = name[name.find("(") + 1:-1] if name.endswith(")") and "(" in name else name
            if names.get(e["tid"]) in (None, "python"):
                names[e["tid"]] = name
    return names


@reading_no_run
def rank_events(trace: dict) -> pd.DataFrame:
    """One rank's parsed chrome trace: a row per ddplab phase label and per all-reduce event of each
    profiled step (`EVENT_COLUMNS`): its kind ("barrier", "forward", "backward", "optimizer",
    "all_reduce"), the event's own name, whether it ran on the thread that runs the steps (False: a
    gloo worker thread or a GPU stream), which thread ("main", else the trace's name for it and its id,
    e.g. "pt_gloo_runloop 4711"), and start, end and duration in ms after the end of this rank's
    ddplab:barrier in the same step."""
    rank = _rank(trace)
    events = _complete(trace)
    steps = _steps(events, rank)
    ends = _barrier_ends(events, steps, rank)
    numbers, starts = list(steps), [e["ts"] for e in steps.values()]
    main = {e["tid"] for e in steps.values()}
    kinds = {label: kind for kind, label in PHASES.items()}
    names = _thread_names(trace)
    rows, outer_end = [], {}
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        kind = kinds.get(e["name"]) or ("all_reduce" if is_all_reduce(e["name"]) else None)
        if kind is None:
            continue
        # one op can sit inside another of its name (a Python comm hook's c10d::allreduce_): keep the outer
        key = (e["tid"], e["name"])
        if e["ts"] + e["dur"] <= outer_end.get(key, float("-inf")):
            continue
        outer_end[key] = e["ts"] + e["dur"]
        step = numbers[_step_of(starts, e["ts"])]
        thread = "main" if e["tid"] in main else f"{names.get(e['tid'], 'thread')} {e['tid']}"
        rows.append({"rank": rank, "step": step, "kind": kind, "name": e["name"], "main_thread": e["tid"] in main,
                     "thread": thread,
                     "start_ms": (e["ts"] - ends[step]) / 1e3, "end_ms": (e["ts"] + e["dur"] - ends[step]) / 1e3,
                     "dur_ms": e["dur"] / 1e3})
    return pd.DataFrame(rows, columns=EVENT_COLUMNS).sort_values(["step", "start_ms"], ignore_index=True)


@reading_no_run
def rank_memory_timeline(timeline: dict, trace: dict) -> pd.DataFrame:
    """One rank's memory timeline (as the probe writes it: categories, times_us, bytes) against its
    trace: a row per sample with the step it falls in, `t_ms` after that step's barrier end (as in
    `rank_events`), and bytes per category (`CORE_CATEGORIES` first)."""
    rank = _rank(trace)
    for key in ("categories", "times_us", "bytes"):
        if key not in timeline:
            raise ValueError(f"rank {rank}'s memory timeline has no {key!r}: it is not one the profile probe wrote")
    events = _complete(trace)
    steps = _steps(events, rank)
    ends = _barrier_ends(events, steps, rank)
    numbers, starts = list(steps), [e["ts"] for e in steps.values()]
    base_us = trace.get("baseTimeNanoseconds", 0) / 1e3   # memory times are epoch µs, trace ts are after base
    rows = []
    for t_us, sizes in zip(timeline["times_us"], timeline["bytes"]):
        ts = t_us - base_us
        step = numbers[_step_of(starts, ts)]
        rows.append({"rank": rank, "step": step, "t_ms": (ts - ends[step]) / 1e3,
                     **dict(zip(timeline["categories"], sizes))})
    categories = [c for c in CORE_CATEGORIES if c in timeline["categories"]] + \
                 [c for c in timeline["categories"] if c not in CORE_CATEGORIES]
    return pd.DataFrame(rows, columns=["rank", "step", "t_ms", *categories])


def _profiles(run) -> list:
    if "profile" not in run.spec.probes:
        raise ValueError(f"run {run.spec.name!r} has no profiler traces: run it with probes=('profile',)")
    return [(r.rank, r.result.profile) for r in run.ranks]


def _load(path: Path) -> dict:
    stat = Path(path).stat()
    return _parsed(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _parsed(path: str, mtime_ns: int, size: int) -> dict:
    """A trace file's JSON, parsed once per version of the file (its readers only read it)."""
    with open(path) as f:
        return json.load(f)


@reading(run="train")
def trace_events(run) -> pd.DataFrame:
    """Every rank's `rank_events`, one table (rank, step, kind, name, main_thread, thread, start/end/dur
    in ms after the step's barrier end on that rank)."""
    profiles = _profiles(run)
    with working(f"reading {len(profiles)} ranks' profiler traces"):
        return pd.concat([rank_events(_load(Path(run.path) / p.trace)) for _, p in profiles], ignore_index=True)


@reading(run="train")
def memory_timeline(run) -> pd.DataFrame:
    """Every rank's `rank_memory_timeline`, one table: bytes per category over the profiled steps."""
    profiles, gaps = _profiles(run), memory_gaps(run)
    if len(gaps) == len(profiles):
        raise ValueError(f"run {run.spec.name!r}: no rank has a memory timeline: " + "; ".join(gaps.values()))
    with working(f"reading {len(profiles)} ranks' memory timelines"):
        table = pd.concat([rank_memory_timeline(_load(Path(run.path) / p.memory_timeline), _load(Path(run.path) / p.trace))
                           for rank, p in profiles if rank not in gaps], ignore_index=True)
    table.attrs["unavailable"] = gaps
    return table


@reading(run="train")
def memory_gaps(run) -> dict[int, str]:
    """The ranks whose memory timeline torch could not build (the probe keeps the reason), and why: the
    rest of the lesson reads the other ranks, and says so."""
    return {rank: str(t["unavailable"]) for rank, p in _profiles(run)
            if "unavailable" in (t := _load(Path(run.path) / p.memory_timeline))}


@reading(run="train")
def memory_gap_reading(run) -> str:
    """One line per rank without a memory timeline (`memory_gaps`), "" where every rank has one."""
    return "\n".join(f"rank {rank} has no memory timeline: {why}; what follows reads the other ranks"
                      for rank, why in memory_gaps(run).items())


@reading_no_run
def memory_timeline_peaks(timeline: pd.DataFrame) -> pd.DataFrame:
    """Per rank (rows), each category's largest bytes over a `memory_timeline`, and `total`: the most
    held at one moment over all categories (the categories peak at different moments, so they do not
    add up to it)."""
    categories = [c for c in timeline.columns if c not in ("rank", "step", "t_ms")]
    peaks = timeline.groupby("rank")[categories].max()
    peaks["total"] = timeline[categories].sum(axis=1).groupby(timeline["rank"]).max()
    return peaks


@reading(run="train")
def trace_folder(run) -> Path:
    """The folder that holds every rank's trace and nothing else: `TraceAnalysis(trace_dir=...)` of
    Holistic Trace Analysis reads it."""
    _profiles(run)
    return rundir.trace_dir(run.path)


@reading(run="train")
def hta_analysis(run):
    """Holistic Trace Analysis over every rank's trace of `run` (`hta.trace_analysis.TraceAnalysis`,
    every profiled step kept, the last included), without the progress lines its parser logs (at
    WARNING, from its worker processes too): logging is switched off up to WARNING while it parses."""
    import logging

    from hta.trace_analysis import TraceAnalysis

    folder = str(trace_folder(run))
    logging.disable(logging.WARNING)
    try:
        with working("Holistic Trace Analysis parsing every rank's trace"):
            return TraceAnalysis(trace_dir=folder, include_last_profiler_step=True)
    finally:
        logging.disable(logging.NOTSET)


@reading(run="train")
def backward_lag(run, slow_rank: int) -> pd.DataFrame:
    """Per profiled step, from the traces: how much longer every other rank's `ddplab:backward` lasted
    than the slow rank's (`lag_ms`, the median over the other ranks), and the slow rank's pause between
    the end of its forward and the start of its backward (`pause_ms`). An early rank's backward cannot
    return before the slow rank has joined its last all-reduce, so the lag should be the pause."""
    ev = trace_events(run)
    main = ev[ev["main_thread"] & ev["kind"].isin(["forward", "backward"])]
    if slow_rank not in set(main["rank"]):
        raise ValueError(f"slow_rank: {slow_rank} is not a rank of {run.spec.name} (ranks {sorted(set(main['rank']))})")
    span = main.pivot_table(index=["step", "rank"], columns="kind", values=["start_ms", "end_ms", "dur_ms"], aggfunc="first")
    rows = []
    for step in sorted(set(main["step"])):
        s = span.xs(step, level="step")
        others = [r for r in s.index if r != slow_rank]
        rows.append({"step": step,
                     "lag_ms": float((s.loc[others, ("dur_ms", "backward")] - s.loc[slow_rank, ("dur_ms", "backward")]).median()),
                     "pause_ms": float(s.loc[slow_rank, ("start_ms", "backward")] - s.loc[slow_rank, ("end_ms", "forward")])})
    return pd.DataFrame(rows).set_index("step")
