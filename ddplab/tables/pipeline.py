"""Tables of pipeline parallelism (notebook 09): each stage's timeline of forwards, losses and
backwards; the bubble per (schedule, stages, m) measured over rounds beside the formula
(p - 1)/(m + p - 1) and the schedule simulated with the measured durations (`predict/pipeline.py`);
the activations each stage held against m and the schedule; the pipeline's loss and gradients
against the unsplit model's; and the chapter's checks, `verify_bubble_matches_formula`,
`verify_activation_memory` and `verify_pipeline_matches_unsplit`.

The bubble of one step is each stage's idle fraction of the step's span (the first forward's start
to the last backward's end, over all stages, on the host's one clock), averaged over the stages.
The formula assumes equal work per microbatch on every stage and free communication; `waits` is the
share of the span the measured step lost beyond what its own compute explains (the schedule
replayed with every op's measured compute, the CPU time its process spent in it, and no
communication): the time stages waited for messages and, where stages share a core, for the core.
Counted from what the stages recorded (`spec/pipeline.py`).
"""

from __future__ import annotations

import statistics

import pandas as pd

from .. import verify
from ..predict.pipeline import bubble_fraction, formula_range, in_flight, simulate
from ..units import MIB

BUBBLE_TOLERANCE = 0.03      # absolute, on a fraction of the span
MEMORY_TOLERANCE = 0.01      # relative, on the peak saved bytes
UNSPLIT_TOLERANCE = 1e-5     # relative to the largest reference gradient (float32 rounding is ~1e-7)


def _runs(runs) -> list:
    return list(runs) if isinstance(runs, (list, tuple)) else [runs]


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


def step_bubble(stage_steps: list) -> dict:
    """One step over all stages: its span (ms), each stage's idle fraction, their mean (`bubble`); the
    schedule replayed with free communication and each stage's typical compute (`simulated`: every
    forward, every backward, the median of that stage's, in CPU time, its process's own work), with
    the range of formula values that replay's unevenness allows (`formula_low`, `formula_high`,
    `predict.pipeline.formula_range`); and the share of the span lost beyond the replay with every
    op's own compute (`waits`: waiting for messages and, where stages share a core, for it)."""
    first = stage_steps[0]
    m = first.microbatches
    t0 = min(op.start_ns for s in stage_steps for op in s.ops)
    span_ms = (max(op.end_ns for s in stage_steps for op in s.ops) - t0) / 1e6
    stage_bubble = [1 - sum(op.end_ns - op.start_ns for op in s.ops) / 1e6 / span_ms for s in stage_steps]
    cpu = all(op.cpu_ns is not None for s in stage_steps for op in s.ops)   # older records lack it
    fwd, bwd = (list(d) for d in zip(*(_durations_ms(s, m, cpu) for s in stage_steps)))
    per_op = simulate(first.schedule, fwd, bwd, m)
    typical_f, typical_b = [statistics.median(f) for f in fwd], [statistics.median(b) for b in bwd]
    typical = simulate(first.schedule, typical_f, typical_b, m)
    low, high = formula_range(typical.bubble, typical_f, typical_b)
    return {"span_ms": span_ms, "stage_bubble": stage_bubble, "bubble": sum(stage_bubble) / len(stage_bubble),
            "simulated": typical.bubble, "formula_low": low, "formula_high": high,
            "waits": max(0.0, (span_ms - per_op.span_ms) / span_ms), "compute": "cpu" if cpu else "wall"}


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


def _cores(run) -> int | None:
    """How many CPU cores the run's stages ran on, all together (None where the record lacks it)."""
    cores = [getattr(r.result, "cores", None) for r in run.ranks]
    return None if any(c is None for c in cores) else len({c for mine in cores for c in mine})


def bubble(runs, tolerance: float = BUBBLE_TOLERANCE) -> pd.DataFrame:
    """Per (schedule, stages, microbatches): the measured bubble over the timed rounds (median, min,
    max), the formula, the replay with the stages' typical compute (`simulated`: median, min, max;
    see `step_bubble`) and the formula values its unevenness allows (`formula_low`..`formula_high`,
    over the rounds), the waits (median share of the span), the cores the stages ran on, and the
    verdict of `verify_bubble_matches_formula` with its reason (`_verdict` with `tolerance`). Pairs
    torch refuses are listed with the verdict "not run"."""
    rows = []
    for run in _runs(runs):
        p, table, cores = run.world_size, steps(run), _cores(run)
        task = run.spec.task
        for schedule, m in task.combos(run.spec):
            per_round = [step_bubble(v) for (s, mb, r), v in sorted(table.items()) if (s, mb) == (schedule, m) and r >= 0]
            measured = [b["bubble"] for b in per_round]
            simulated = [b["simulated"] for b in per_round]
            row = {"schedule": schedule, "stages": p, "microbatches": m, "rounds": len(per_round),
                   "measured": statistics.median(measured), "measured_min": min(measured),
                   "measured_max": max(measured), "formula": bubble_fraction(p, m),
                   "simulated": statistics.median(simulated), "simulated_min": min(simulated),
                   "simulated_max": max(simulated),
                   "formula_low": min(b["formula_low"] for b in per_round),
                   "formula_high": max(b["formula_high"] for b in per_round),
                   "waits": statistics.median(b["waits"] for b in per_round),
                   "span_ms": statistics.median(b["span_ms"] for b in per_round), "cores": cores,
                   "compute": per_round[0]["compute"]}
            row["verdict"], row["why"] = _verdict(row, tolerance)
            rows.append(row)
        for schedule, m in task.not_run(run.spec):
            rows.append({"schedule": schedule, "stages": p, "microbatches": m, "rounds": 0,
                         "formula": bubble_fraction(p, m), "cores": cores, "verdict": "not run",
                         "why": f"torch's Schedule1F1B needs at least {p} microbatches on {p} stages"})
    return pd.DataFrame(rows).set_index(["schedule", "stages", "microbatches"]).sort_index()


def _verdict(row: dict, tolerance: float) -> tuple[str, str]:
    """"matches" when the formula lies within the measured min..max widened by `tolerance`.
    Above that range it "does not match": waiting only lengthens a step, so it cannot excuse a
    measured bubble below the formula. Below that range the stages may have waited (for messages,
    for a core), which the formula leaves out; the gap is excused ("cannot resolve") only where the
    waits explain it: the replay with the stages' typical measured compute and free communication
    gives the formula within `tolerance`, and, where the waits took more than `tolerance` of the
    span (the machine's noise shows, so the compute's unevenness is taken for noise too: stages
    sharing a core slow each other), within what that unevenness allows (`formula_low`..
    `formula_high`). Otherwise the formula "does not match": stages that idle more than it says
    without waiting for anything, as on a split whose stages' work is unequal, are a real mismatch."""
    low, high = row["measured_min"] - tolerance, row["measured_max"] + tolerance
    seen = (f"measured {row['measured']:.3f} [{row['measured_min']:.3f}, {row['measured_max']:.3f}], "
            f"formula {row['formula']:.3f}")
    if low <= row["formula"] <= high:
        return "matches", seen
    compute = "compute" if row.get("compute") == "cpu" else "op times"
    cores = row.get("cores")
    for_core = f" and for a core ({row['stages']} stages on {cores} cores)" if cores and row["stages"] > cores else ""
    waited = f"the stages waited for messages{for_core} for {row['waits']:.0%} of the span"
    noisy = row["waits"] > tolerance      # the machine's noise shows: its unevenness is noise too
    allowed = (row["formula_low"], row["formula_high"]) if noisy else (row["simulated_min"], row["simulated_max"])
    replay = (f"the replay with the stages' measured {compute} and free communication gives "
              f"{row['simulated']:.3f} [{row['simulated_min']:.3f}, {row['simulated_max']:.3f}], which allows "
              f"a formula in [{allowed[0]:.3f}, {allowed[1]:.3f}] +- {tolerance:g}")
    if row["formula"] > high:
        return "does not match", f"{seen}: the stages idled less than the formula says they must ({replay})"
    if allowed[0] - tolerance <= row["formula"] <= allowed[1] + tolerance:
        return "cannot resolve", f"{seen}: {waited}; {replay}: the waits explain the gap"
    return "does not match", f"{seen}: the waits do not explain the gap: {waited}; {replay}"


def verify_bubble_matches_formula(runs, tolerance: float = BUBBLE_TOLERANCE) -> None:
    """Notebook 09's check: for every (schedule, stages, m) run, the formula (p - 1)/(m + p - 1) lies
    within the measured bubble's min..max over rounds, widened by `tolerance`, or below it by a gap
    the measured waits explain (see `_verdict`; named as not resolved on this machine, with the
    reason). Raises `verify.CheckFailed` for a pair that does not match. The evidence is the pairs
    that match with m >= 2 (with one microbatch there is no microbatching to speak of); where there
    is none it says it cannot verify, and prints no "verified" line."""
    table = bubble(runs, tolerance)
    table = table[table["verdict"] != "not run"]
    if not len(table):
        raise ValueError("no (schedule, microbatches) pair was run")
    label = lambda k: f"{k[0]} p={k[1]} m={k[2]}"  # noqa: E731
    for key, row in table[table["verdict"] == "cannot resolve"].iterrows():
        print(f"cannot resolve on this machine: {label(key)}: {row['why']}")
    wrong = table[table["verdict"] == "does not match"]
    matched = table[table["verdict"] == "matches"]
    evidence = matched[matched.index.get_level_values("microbatches") >= 2]
    claim = f"the measured bubble matches (p - 1)/(m + p - 1) within the rounds' spread +- {tolerance:g}"
    if len(wrong):
        key, row = next(iter(wrong.iterrows()))
        verify.that(claim, False, seen=f"{label(key)}: {row['why']}",
                    expected="the formula inside the measured range, or below it by what the waits explain")
    if not len(evidence):   # nothing with microbatches resolved: no claim either way, and no "verified" line
        m1 = f"; only m = 1 matched ({', '.join(map(label, matched.index))})" if len(matched) else ""
        print(f"cannot verify on this machine: {claim}: none of the {len(table)} pairs with m >= 2 was resolved{m1}")
        return
    n, m1, rest = len(evidence), len(matched) - len(evidence), len(table) - len(matched)
    if rest:   # a claim about every pair, some unresolved: no "verified" line for what this run could not judge
        print(f"cannot resolve here now: {claim}: {n} pair{'s' * (n != 1)} with m >= 2 match "
              f"({', '.join(map(label, evidence.index))}), {rest} of {len(table)} not resolved on this run "
              "(the waits explain their gap); more rounds or more compute per stage would resolve them")
        return
    verify.that(claim, True, seen=f"{n} pair{'s' * (n != 1)} with m >= 2 match{'es' * (n == 1)} "
                                 f"({', '.join(map(label, evidence.index))})"
                                 + (f"; {m1} with m = 1 match{'es' * (m1 == 1)} too" if m1 else ""),
                expected="every pair")


def activation_memory(runs) -> pd.DataFrame:
    """Per (schedule, stages, microbatches, stage): the most microbatches in flight (measured and
    predicted: GPipe m, 1F1B min(m, p - stage)), the bytes one microbatch's forward (and loss) left
    saved, the peak saved bytes over the recorded steps, and the peak the prediction gives
    (in flight x one microbatch's bytes), in MiB."""
    rows = []
    for run in _runs(runs):
        p = run.world_size
        by_combo: dict[tuple[str, int], list[list]] = {}
        for (schedule, m, _), stage_steps in steps(run).items():
            by_combo.setdefault((schedule, m), []).append(stage_steps)
        for (schedule, m), recorded in by_combo.items():
            for stage in range(p):
                mine = [v[stage] for v in recorded]
                first = mine[0]
                one = max(op.saved_bytes for op in first.ops if op.microbatch == 0 and op.kind != "backward")
                predicted = in_flight(schedule, p, m, stage)
                rows.append({"schedule": schedule, "stages": p, "microbatches": m, "stage": stage,
                             "in_flight": max(s.peak_in_flight for s in mine), "predicted_in_flight": predicted,
                             "microbatch_mib": one / MIB,
                             "peak_mib": max(s.peak_saved_bytes for s in mine) / MIB,
                             "predicted_peak_mib": predicted * one / MIB})
    return pd.DataFrame(rows).set_index(["schedule", "stages", "microbatches", "stage"]).sort_index()


def verify_activation_memory(runs, tolerance: float = MEMORY_TOLERANCE) -> None:
    """Notebook 09's check: on every stage, the most microbatches in flight is GPipe's m and 1F1B's
    min(m, p - stage), exactly, and the peak of saved activations is that many microbatches' bytes
    (within `tolerance`, relative). Raises `verify.CheckFailed` naming the first row that is not."""
    table = activation_memory(runs)
    label = lambda k: f"{k[0]} p={k[1]} m={k[2]} stage {k[3]}"  # noqa: E731
    claim = "each stage holds GPipe's m, 1F1B's min(m, p - stage) microbatches' activations at its peak"
    for key, row in table.iterrows():
        if row["in_flight"] != row["predicted_in_flight"]:
            verify.that(claim, False, seen=f"{label(key)}: {int(row['in_flight'])} in flight",
                        expected=f"{int(row['predicted_in_flight'])}")
        if abs(row["peak_mib"] - row["predicted_peak_mib"]) > tolerance * row["predicted_peak_mib"]:
            verify.that(claim, False, seen=f"{label(key)}: peak {row['peak_mib']:.2f} MiB",
                        expected=f"{int(row['predicted_in_flight'])} x {row['microbatch_mib']:.2f} = "
                                 f"{row['predicted_peak_mib']:.2f} MiB within {tolerance:.0%}")
    worst = max(abs(table["peak_mib"] - table["predicted_peak_mib"]) / table["predicted_peak_mib"])
    verify.that(claim, True, seen=f"all {len(table)} stage rows, peaks off by at most {worst:.2%}",
                expected=f"in flight exactly, peak within {tolerance:.0%}")


def unsplit(runs) -> pd.DataFrame:
    """Per (stages, schedule, microbatches, stage): this stage's largest gradient error against the
    unsplit model on the same global batch, relative to the largest reference gradient, and (last
    stage) the pipeline's loss beside the unsplit model's."""
    rows = []
    for run in _runs(runs):
        for r in run.ranks:
            for c in r.result.checks:
                rows.append({"schedule": c.schedule, "stages": run.world_size, "microbatches": c.microbatches,
                             "stage": r.rank, "grad_max_abs_error": c.grad_max_abs_error,
                             "grad_rel_error": c.grad_max_abs_error / c.reference_grad_max_abs,
                             "loss": c.loss, "reference_loss": c.reference_loss})
    return pd.DataFrame(rows).set_index(["schedule", "stages", "microbatches", "stage"]).sort_index()


def verify_pipeline_matches_unsplit(runs, tolerance: float = UNSPLIT_TOLERANCE) -> None:
    """Notebook 09's check: every stage's gradient, under every schedule and m, equals the unsplit
    model's up to float rounding (largest error below `tolerance` x the largest reference gradient),
    and the last stage's loss is the unsplit model's (within `tolerance`, relative)."""
    table = unsplit(runs)
    losses = table.dropna(subset=["loss"])
    loss_rel = (abs(losses["loss"] - losses["reference_loss"]) / losses["reference_loss"].abs()).tolist()
    verify.below("every stage's pipeline gradient is the unsplit model's (relative error)",
                 table["grad_rel_error"].tolist(), tolerance)
    verify.below("the pipeline's loss is the unsplit model's (relative error)", loss_rel, tolerance)
