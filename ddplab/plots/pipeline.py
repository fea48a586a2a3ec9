"""Figures of pipeline parallelism (notebook 09): each stage's timeline of one step as a Gantt chart,
forwards and backwards in their own colours with the microbatch number inside, the idle bubble
left blank, one panel per schedule; the measured bubble against m beside the formula; and each
stage's peak of saved activations against m under each schedule. Numbers from `tables/pipeline.py`."""

from __future__ import annotations

from matplotlib.patches import Patch

from ..predict.pipeline import bubble_fraction
from .. import tables
from ..tables.pipeline import bubble
from ..tables.pipeline_steps import step_bubble, steps
from .canvas import name_link, subplots

COLORS = {"forward": "#1f77b4", "loss": "#7f7f7f", "backward": "#ff7f0e"}


def timeline(run, microbatches: int, round_: int = 0, schedules=None, detached: bool = False):
    """One panel per schedule of `run` (or those in `schedules`) that ran with `microbatches`: stages
    down, ms across from the step's first forward, one bar per forward, loss and backward, the
    microbatch number in each; each title gives the measured bubble of this step and the formula."""
    table = steps(run)
    ran = [s for s in run.spec.task.schedules if (s, microbatches, round_) in table]
    chosen = [s for s in (schedules or ran) if s in ran]
    if not chosen:
        raise ValueError(f"run {run.spec.name!r} has no step with microbatches={microbatches} in round {round_} "
                         f"for {list(schedules or run.spec.task.schedules)}")
    p = run.world_size
    fig, axes = subplots((11, 0.55 * p * len(chosen) + 1.2 * len(chosen)), nrows=len(chosen), squeeze=False,
                         detached=detached, sharex=True)
    for ax, schedule in zip(axes[:, 0], chosen):
        ops = tables.pipeline.timeline(run, schedule, microbatches, round_)
        for op in ops.itertuples():
            width = op.end_ms - op.start_ms
            ax.barh(op.stage, width, left=op.start_ms, height=0.7, color=COLORS[op.kind], edgecolor="white",
                    linewidth=0.5)
            if op.kind != "loss":
                ax.text(op.start_ms + width / 2, op.stage, str(op.microbatch), ha="center", va="center",
                        fontsize=8, color="white")
        measured = step_bubble(table[(schedule, microbatches, round_)])
        ax.set_title(f"{schedule}, {p} stages, m={microbatches}: bubble {measured['bubble']:.2f} measured "
                     f"(replayed with these compute times {measured['simulated']:.2f}), formula "
                     f"(p-1)/(m+p-1) = {bubble_fraction(p, microbatches):.2f}", loc="left", fontsize=10)
        ax.set_yticks(range(p), [f"stage {s}" for s in range(p)])
        ax.set_ylim(p - 0.5, -0.5)
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("ms after the step's first forward (blank: the stage is idle)")
    fig.legend(handles=[Patch(color=c, label=k) for k, c in COLORS.items()], loc="lower right", fontsize=8, ncols=3)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    name_link(fig, run)
    return fig


def bubble_vs_microbatches(runs, detached: bool = False):
    """The measured bubble (median, with min..max over rounds) against m, one line per schedule and
    stage count, beside the formula (p - 1)/(m + p - 1) (dashed) and the replay with the measured
    compute times and free communication (dotted: a model, beside the measurement)."""
    table = bubble(runs).reset_index()
    table = table[table["rounds"] > 0]
    fig, ax = subplots((7, 4.2), detached=detached)
    for i, ((schedule, p), rows) in enumerate(table.groupby(["schedule", "stages"])):
        color = f"C{i}"
        m = rows["microbatches"]
        ax.errorbar(m, rows["measured"], yerr=[rows["measured"] - rows["measured_min"],
                                               rows["measured_max"] - rows["measured"]],
                    marker="o", capsize=3, color=color, label=f"{schedule}, {p} stages: measured")
        ax.plot(m, rows["simulated"], ":", color=color,
                label="dotted: replay (a model): the measured compute, free sends" if i == 0 else None)
    for j, p in enumerate(sorted(table["stages"].unique())):
        ms = sorted(table.loc[table["stages"] == p, "microbatches"].unique())
        ax.plot(ms, [bubble_fraction(int(p), int(x)) for x in ms], "k--", linewidth=1,
                label="dashed: the formula (p-1)/(m+p-1)" if j == 0 else None)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("microbatches m")
    ax.set_ylabel("bubble: idle fraction of the step")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    name_link(fig, runs)
    return fig


def activation_memory(runs, detached: bool = False):
    """One panel per stage count: each stage's peak of activations saved for backward (MiB) against m,
    GPipe solid and 1F1B dashed, one colour per stage; the global batch is the same at every m, so
    GPipe's peak stays flat while 1F1B's falls as min(m, p - stage) / m of it."""
    table = tables.pipeline.activation_memory(runs).reset_index()
    counts = sorted(table["stages"].unique())
    fig, axes = subplots((5.2 * len(counts), 3.8), ncols=len(counts), squeeze=False, detached=detached)
    for ax, p in zip(axes[0], counts):
        mine = table[table["stages"] == p]
        for (schedule, stage), rows in mine.groupby(["schedule", "stage"]):
            ax.plot(rows["microbatches"], rows["peak_mib"], "-o" if schedule == "GPipe" else "--s", color=f"C{stage}",
                    label=f"{schedule}, stage {stage}")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, None)
        ax.set_title(f"{p} stages: peak saved activations per stage", loc="left", fontsize=10)
        ax.set_xlabel("microbatches m (one global batch)")
        ax.set_ylabel("MiB")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncols=2)
    fig.tight_layout()
    return fig
