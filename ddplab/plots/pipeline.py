"""Figures of pipeline parallelism (notebook 09): each stage's timeline of one step as a Gantt chart,
forwards and backwards in their own colours with the microbatch number inside, the idle bubble
left blank, one panel per schedule; the measured bubble against m beside the formula; and each
stage's peak of saved activations against m under each schedule. Numbers from `tables/pipeline.py`."""

from __future__ import annotations

from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..predict.pipeline import bubble_fraction
from .. import tables
from ..tables.pipeline import bubble
from ..tables.pipeline_timing import step_bubble, steps
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
    fig, axes = subplots((9, 0.5 * p * len(chosen) + 1.0 * len(chosen) + 0.6), nrows=len(chosen), squeeze=False,
                         detached=detached, sharex=True)
    for ax, schedule in zip(axes[:, 0], chosen):
        ops = tables.pipeline_timing.timeline(run, schedule, microbatches, round_)
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
                     f"(p-1)/(m+p-1) = {bubble_fraction(p, microbatches):.2f}", loc="left", fontsize=9)
        ax.set_yticks(range(p), [f"stage {s}" for s in range(p)])
        ax.set_ylim(p - 0.5, -0.5)
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("ms after the step's first forward (blank: the stage is idle)")
    fig.legend(handles=[Patch(color=c, label=k) for k, c in COLORS.items()], loc="outside lower center", fontsize=8.5,
               ncols=3, frameon=False)
    fig.set_layout_engine("constrained")
    name_link(fig, run)
    return fig


SCHEDULE_COLORS = {"GPipe": "#1f77b4", "1F1B": "#ff7f0e"}
SCHEDULE_MARKERS = {"GPipe": "o", "1F1B": "s"}
FORMULA_COLOR = "#bdbdbd"


def _schedule_style(schedule: str, i: int) -> tuple[str, str]:
    """(colour, marker) of a schedule: GPipe's and 1F1B's own, any other from the cycle."""
    return SCHEDULE_COLORS.get(schedule, f"C{i + 2}"), SCHEDULE_MARKERS.get(schedule, "^")


def _schedules(table) -> list[str]:
    """The schedules in `table`, GPipe then 1F1B, then any other."""
    known = [s for s in SCHEDULE_COLORS if s in set(table["schedule"])]
    return known + [s for s in dict.fromkeys(table["schedule"]) if s not in known]


def _microbatch_axis(ax, ms) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms, [str(int(m)) for m in ms])
    ax.minorticks_off()


def bubble_vs_microbatches(runs, detached: bool = False):
    """One panel per stage count: the measured bubble (median, with min..max over rounds; solid, filled
    markers) against m, one line per schedule; the replay with the measured compute times and free
    sends (dotted, open markers: a model, beside the measurement); and the formula (p - 1)/(m + p - 1),
    a wide grey line under both, so that neither hides it nor hides behind it."""
    table = bubble(runs).reset_index()
    table = table[table["rounds"] > 0]
    counts = sorted(table["stages"].unique())
    schedules = _schedules(table)
    fig, axes = subplots((4.2 * len(counts) + 0.6, 4.2), ncols=len(counts), squeeze=False, detached=detached,
                         sharey=True)
    for ax, p in zip(axes[0], counts):
        mine = table[table["stages"] == p]
        ms = sorted(mine["microbatches"].unique())
        ax.plot(ms, [bubble_fraction(int(p), int(m)) for m in ms], color=FORMULA_COLOR, lw=6, solid_capstyle="round",
                zorder=1)
        for i, schedule in enumerate(schedules):
            rows = mine[mine["schedule"] == schedule].sort_values("microbatches")
            if rows.empty:
                continue
            color, marker = _schedule_style(schedule, i)
            dodge = 2 ** (0.04 * (i - (len(schedules) - 1) / 2))   # side by side where both ran, on the log axis
            m = rows["microbatches"] * dodge
            ax.plot(m, rows["simulated"], ls=":", lw=1.6, color=color, marker=marker, mfc="white", ms=6, zorder=2)
            ax.errorbar(m, rows["measured"], yerr=[rows["measured"] - rows["measured_min"],
                                                   rows["measured_max"] - rows["measured"]],
                        color=color, marker=marker, ms=6, lw=1.8, capsize=3, zorder=3)
        _microbatch_axis(ax, ms)
        ax.set_title(f"{p} stages", loc="left", fontsize=10)
        ax.set_xlabel("microbatches m (one global batch)")
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("bubble: idle share of the step")
    axes[0, 0].set_ylim(0, 1)
    handles = []
    for i, schedule in enumerate(schedules):
        color, marker = _schedule_style(schedule, i)
        handles += [Line2D([], [], color=color, marker=marker, lw=1.8, label=f"{schedule}, measured (median, min-max)"),
                    Line2D([], [], color=color, marker=marker, mfc="white", ls=":", lw=1.6,
                           label=f"{schedule}, replay: measured compute, free sends (a model)")]
    handles.append(Line2D([], [], color=FORMULA_COLOR, lw=6, label="formula (p-1)/(m+p-1)"))
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    fig.suptitle("Pipeline bubble against the number of microbatches", fontsize=11)
    fig.set_layout_engine("constrained")
    name_link(fig, runs)
    return fig


def _spread_labels(ys: list[float], gap: float) -> list[float]:
    """`ys` moved apart, in order, so that neighbours are at least `gap` apart (labels beside line ends)."""
    order = sorted(range(len(ys)), key=lambda i: ys[i])
    placed = list(ys)
    for k in range(1, len(order)):
        below, here = order[k - 1], order[k]
        placed[here] = max(placed[here], placed[below] + gap)
    return placed


def activation_memory(runs, detached: bool = False):
    """One panel per stage count: each stage's peak of activations saved for backward (MiB) against m,
    GPipe solid and 1F1B dashed, each in its schedule's colour, the stage named at the line's right end;
    stages whose lines coincide are drawn once and named together ("stages 0-2"). The global batch is
    the same at every m, so GPipe's peak stays flat while 1F1B's falls as min(m, p - stage) / m of it."""
    table = tables.pipeline.activation_memory(runs).reset_index()
    counts = sorted(table["stages"].unique())
    schedules = _schedules(table)
    fig, axes = subplots((4.2 * len(counts) + 0.6, 4.0), ncols=len(counts), squeeze=False, detached=detached)
    for ax, p in zip(axes[0], counts):
        mine = table[table["stages"] == p]
        top = mine["peak_mib"].max() * 1.08
        ends = []   # (y at the line's end, x, label, colour)
        for i, schedule in enumerate(schedules):
            color, marker = _schedule_style(schedule, i)
            lines: list[tuple[list, list, list[int]]] = []   # the same series on several stages: one line, one label
            for stage, rows in mine[mine["schedule"] == schedule].groupby("stage"):
                rows = rows.sort_values("microbatches")
                m, peak = rows["microbatches"].tolist(), rows["peak_mib"].tolist()
                same = [line for line in lines if line[0] == m and
                        all(abs(a - b) <= 0.002 * top for a, b in zip(line[1], peak))]
                if same:
                    same[0][2].append(int(stage))
                else:
                    lines.append((m, peak, [int(stage)]))
            for m, peak, stages in lines:
                ax.plot(m, peak, ls="-" if schedule == "GPipe" else "--", marker=marker, color=color, lw=1.8, ms=6)
                name = f"stage {stages[0]}" if len(stages) == 1 else \
                    f"stages {stages[0]}-{stages[-1]}" if stages == list(range(stages[0], stages[-1] + 1)) else \
                    f"stages {', '.join(map(str, stages))}"
                ends.append((peak[-1], m[-1], name, color))
        for (_, x, name, color), y in zip(ends, _spread_labels([e[0] for e in ends], gap=top * 0.06)):
            ax.text(x * 1.12, y, name, color=color, fontsize=8, va="center")
        ms = sorted(mine["microbatches"].unique())
        _microbatch_axis(ax, ms)
        ax.set_xlim(ms[0] / 1.3, ms[-1] * 2.4)
        ax.set_ylim(0, top)
        ax.set_title(f"{p} stages: peak saved activations per stage", loc="left", fontsize=10)
        ax.set_xlabel("microbatches m (one global batch)")
        ax.set_ylabel("MiB")
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=_schedule_style(s, i)[0], marker=_schedule_style(s, i)[1],
                      ls="-" if s == "GPipe" else "--", lw=1.8, label=s) for i, s in enumerate(schedules)]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8.5, frameon=False)
    fig.set_layout_engine("constrained")
    return fig
