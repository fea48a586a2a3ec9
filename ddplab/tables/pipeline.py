"""Tables of pipeline parallelism across schedules (notebook 09; one step's timeline and bubble are
`tables/pipeline_timing.py`): the bubble per (schedule, stages, m) measured over rounds beside the formula
(p - 1)/(m + p - 1) and a replay of the schedule with the measured compute (`predict/pipeline.py`,
a model shown beside the measurement); the activations each stage held against m and the schedule;
the pipeline's loss and gradients against the unsplit model's; and the chapter's checks:
`check_bubble_shrinks` and `check_formula_floor` (timing claims, judged by `claims` on the rounds),
`verify_activation_memory` and `verify_pipeline_matches_unsplit`.

The bubble of one step is each stage's idle fraction of the step's span (the first forward's start
to the last backward's end, over all stages, on the host's one clock), averaged over the stages; a
stage is busy while one of its ops runs, as in `pipeline_timing.timeline`. Every timed round runs every (schedule,
m) once, in alternating order (`rank/tasks/pipeline.py`), so two microbatch counts compared round by
round shared the machine's load: the claims are judged on those paired rounds.
The formula assumes equal work per microbatch on every stage and free communication; `waits` is the
share of the span the measured step lost beyond what its own compute explains (the schedule
replayed with every op's measured compute, the CPU time its process spent in it, and no
communication): the time stages waited for messages and, where stages share a core, for the core.
Counted from what the stages recorded (`spec/pipeline.py`).
"""

from __future__ import annotations

import dataclasses
import statistics

import pandas as pd

from .. import claims, verify
from ..predict.pipeline import bubble_fraction, in_flight
from .pipeline_timing import rounds, steps
from ..units import MIB
from .reads import reading


FLOOR_TOLERANCE = 0.05       # absolute, on a fraction of the span: what uneven microbatches may take off
MEMORY_TOLERANCE = 0.01      # relative, on the peak saved bytes
UNSPLIT_TOLERANCE = 1e-5     # relative to the largest reference gradient (float32 rounding is ~1e-7)


def _runs(runs) -> list:
    return list(runs) if isinstance(runs, (list, tuple)) else [runs]


def _cores(run) -> int | None:
    """How many CPU cores the run's stages ran on, all together (None where the record lacks it)."""
    cores = [getattr(r.result, "cores", None) for r in run.ranks]
    return None if any(c is None for c in cores) else len({c for mine in cores for c in mine})


def _label(schedule: str, p: int, m: int | None = None) -> str:
    return f"{schedule}, {p} stages" + ("" if m is None else f", m={m}")


@reading(runs="pipeline", either=("runs",))
def judge_formula_floor(runs, tolerance: float = FLOOR_TOLERANCE) -> dict[tuple[str, int, int], claims.Verdict]:
    """(schedule, stages, m) -> the verdict on "the stages idle (are not computing) for at least the formula's
    share of the step, (p - 1)/(m + p - 1), less `tolerance`", judged on the rounds' `not_computing`
    minus the formula. With p stages in a chain, a stage can compute at most m of the m + p - 1 slots
    of equal work (`simulate` with any equal-per-microbatch stages never idles less); waiting for
    messages or for a core only adds idle time. `tolerance` covers microbatches of uneven cost
    (one microbatch's backward 1.5x on every stage idles 0.033 below the formula, 1F1B p=2 m=2;
    tests/tasks/test_pipeline.py). A formula that claims more idle time than the stages had is contradicted."""
    pairs = {(schedule, run.world_size, m): per_round for run in _runs(runs)
             for (schedule, m), per_round in rounds(run).items()}
    alpha = claims.family(max(1, len(pairs)))   # checked together (`check_formula_floor`): the family at ALPHA
    out = {}
    for (schedule, p, m), per_round in pairs.items():
        formula = bubble_fraction(p, m)
        out[(schedule, p, m)] = claims.judge(
            f"{_label(schedule, p, m)}: idle share minus the formula ({formula:.3f}) > -{tolerance:g} "
            "((p-1)/(m+p-1); not computing minus formula, per round)",
            [b["not_computing"] - formula for b in per_round.values()], above=-tolerance, unit="", alpha=alpha)
    return out


@reading(runs="pipeline", either=("runs",))
def check_formula_floor(runs, tolerance: float = FLOOR_TOLERANCE) -> claims.Verdict:
    """Notebook 09's check of the formula against the measurement: `judge_formula_floor` for every
    (schedule, stages, m) run; prints one line, the weakest pair's verdict with the count of the
    others, and raises `verify.CheckFailed` only where a pair contradicts it (`claims.check`)."""
    verdicts = judge_formula_floor(runs, tolerance)
    if not verdicts:
        raise ValueError("no (schedule, microbatches) pair was run")
    held = sum(v.holds for v in verdicts.values())
    open_ = [_label(*k) for k, v in verdicts.items() if not v.resolved]
    bad = [_label(*k) for k, v in verdicts.items() if v.contradicted]
    counts = f"{held} hold" + (f", {len(open_)} cannot resolve ({'; '.join(open_)})" if open_ else "") + \
        (f", {len(bad)} contradicted ({'; '.join(bad)})" if bad else "")
    weakest = claims.weakest(verdicts.values(), then=lambda v: v.low)   # the lowest interval: nearest the floor
    return claims.check(dataclasses.replace(weakest, claim=f"{weakest.claim} [the weakest of {len(verdicts)} "
                                                            f"pairs: {counts}]"))


def _arms(run, ran) -> dict[str, list[tuple[str, int]]]:
    """schedule -> its arms in order of m (`ran`: `rounds(run)`), the fewest microbatches first: where
    torch refused the schedule one microbatch, GPipe's m = 1 stands in (with one microbatch every
    schedule runs the same order: forward through the stages, then backward). A schedule with a
    single arm is left out."""
    out = {}
    for schedule in run.spec.task.schedules:
        arms = [(schedule, m) for s, m in sorted(ran, key=lambda k: k[1]) if s == schedule]
        if arms and arms[0][1] > 1 and ("GPipe", 1) in ran:
            arms.insert(0, ("GPipe", 1))
        if len(arms) > 1:
            out[schedule] = arms
    return out


def _paired(ran, a: tuple[str, int], b: tuple[str, int]) -> list[float]:
    """Per round that ran both arms: bubble(a) - bubble(b)."""
    return [ran[a][r]["bubble"] - ran[b][r]["bubble"] for r in sorted(ran[a]) if r in ran[b]]


def _as(schedule: str, arm: tuple[str, int]) -> str:
    return f" (run as {arm[0]})" if arm[0] != schedule else ""


@reading(runs="pipeline", either=("runs",))
def judge_bubble_shrinks(runs) -> dict[tuple[str, int], claims.Verdict]:
    """(schedule, stages) -> the verdict on "the most microbatches (m) leave a smaller bubble than the
    fewest", judged round by round on the measured bubble: the fewest-microbatch arm's minus the
    most's (`_arms`: m = 1, under GPipe where torch refuses 1F1B's)."""
    out = {}
    for run in _runs(runs):
        ran = rounds(run)
        for schedule, arms in _arms(run, ran).items():
            few, most = arms[0], arms[-1]
            out[(schedule, run.world_size)] = claims.judge(
                f"{_label(schedule, run.world_size)}: m={most[1]} leaves a smaller bubble than m={few[1]}"
                f"{_as(schedule, few)} (measured bubble at m={few[1]} minus at m={most[1]}, per round)",
                _paired(ran, few, most), above=0.0, unit="")
    return out


@reading(runs="pipeline", either=("runs",))
def check_bubble_shrinks(runs) -> list[claims.Verdict]:
    """Notebook 09's check of the lesson on the measurement: `judge_bubble_shrinks` for every schedule
    and stage count, one line each (`claims.check`: only a contradiction raises)."""
    verdicts = judge_bubble_shrinks(runs)
    if not verdicts:
        raise ValueError("no schedule ran at two microbatch counts")
    return [claims.check(v) for v in verdicts.values()]


@reading(runs="pipeline", either=("runs",))
def bubble_changes(runs) -> pd.DataFrame:
    """Per (schedule, stages, m, next m): what going from m to the next microbatch count changed in the
    measured bubble, round by round: the median of bubble(next m) - bubble(m) over the paired rounds
    (`change`, negative where it shrank), its interval (`low`, `high`: `claims.median_interval`, the
    sign test at `claims.ALPHA` a side), what this run shows (`seen`: "smaller", "larger" or "not
    resolved"), and the medians at both (`from`, `to`; `from_schedule` where GPipe's m = 1 stands in).
    A description of this run, not a claim: the formula leaves out what each extra microbatch costs
    (its sends, its ops' fixed overhead), which can outweigh the shorter fill and drain."""
    rows = []
    for run in _runs(runs):
        ran = rounds(run)
        for schedule, arms in _arms(run, ran).items():
            for a, b in zip(arms, arms[1:]):
                d = [-x for x in _paired(ran, a, b)]
                center, low, high = claims.median_interval(d)
                rows.append({"schedule": schedule, "stages": run.world_size, "microbatches": a[1], "next": b[1],
                             "from_schedule": a[0], "rounds": len(d),
                             "from": statistics.median(x["bubble"] for x in ran[a].values()),
                             "to": statistics.median(x["bubble"] for x in ran[b].values()),
                             "change": center, "low": low, "high": high,
                             "seen": "smaller" if high < 0 else "larger" if low > 0 else "not resolved"})
    return pd.DataFrame(rows).set_index(["schedule", "stages", "microbatches", "next"])


@reading(runs="pipeline", either=("runs",))
def change_sentences(runs) -> list[str]:
    """One sentence per (schedule, stages), read from `bubble_changes`: the bubble's median at each m,
    and what each step up in m did to it in this run, round by round."""
    out = []
    for (schedule, p), part in bubble_changes(runs).groupby(level=["schedule", "stages"], sort=False):
        ms = [m for _, _, m, _ in part.index] + [part.index[-1][3]]
        medians = list(part["from"]) + [part["to"].iloc[-1]]
        stand_in = f" (m={ms[0]} run as GPipe)" if part["from_schedule"].iloc[0] != schedule else ""
        each = [f"{a}->{b} {row['seen']} ({row['change']:+.3f}, interval [{row['low']:+.3f}, {row['high']:+.3f}])"
                for (_, _, a, b), row in part.iterrows()]
        out.append(f"{_label(schedule, p)}: median bubble {' -> '.join(f'{x:.3f}' for x in medians)} at m = "
                   f"{', '.join(map(str, ms))}{stand_in}; over {int(part['rounds'].min())} paired rounds, "
                   f"m {'; '.join(each)}")
    return out


@reading(runs="pipeline", either=("runs",))
def bubble(runs, tolerance: float = FLOOR_TOLERANCE) -> pd.DataFrame:
    """Per (schedule, stages, microbatches): the measured bubble over the timed rounds (median, min,
    max), the share the stages were not computing (median), the formula, the replay with the stages'
    typical compute and free sends (`simulated`: median, min, max; a model, see `pipeline_timing.step_bubble`), the
    waits (median share of the span), the cores the stages ran on, and the outcome of
    `judge_formula_floor` (`floor`). Pairs torch refuses are listed with `rounds` 0 and the floor
    "not run"."""
    rows = []
    floors = judge_formula_floor(runs, tolerance)
    for run in _runs(runs):
        p, cores, task = run.world_size, _cores(run), run.spec.task
        ran = rounds(run)
        for schedule, m in task.combos(run.spec):
            per_round = list(ran[(schedule, m)].values())
            measured = [b["bubble"] for b in per_round]
            simulated = [b["simulated"] for b in per_round]
            rows.append({"schedule": schedule, "stages": p, "microbatches": m, "rounds": len(per_round),
                         "measured": statistics.median(measured), "measured_min": min(measured),
                         "measured_max": max(measured),
                         "not_computing": statistics.median(b["not_computing"] for b in per_round),
                         "formula": bubble_fraction(p, m), "simulated": statistics.median(simulated),
                         "simulated_min": min(simulated), "simulated_max": max(simulated),
                         "waits": statistics.median(b["waits"] for b in per_round),
                         "span_ms": statistics.median(b["span_ms"] for b in per_round), "cores": cores,
                         "compute": per_round[0]["compute"], "floor": floors[(schedule, p, m)].outcome})
        for schedule, m in task.not_run(run.spec):
            rows.append({"schedule": schedule, "stages": p, "microbatches": m, "rounds": 0,
                         "formula": bubble_fraction(p, m), "cores": cores, "floor": "not run"})
    return pd.DataFrame(rows).set_index(["schedule", "stages", "microbatches"]).sort_index()


@reading(runs="pipeline", either=("runs",))
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


@reading(runs="pipeline", either=("runs",))
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


@reading(runs="pipeline", either=("runs",))
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


@reading(runs="pipeline", either=("runs",))
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
