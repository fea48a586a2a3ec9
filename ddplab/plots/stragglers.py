"""Figures of stragglers (notebook 07): every rank's wait and other time per step, run by run, and the
step time against the delay injected into one rank. Numbers from `tables/stragglers.py`."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from . import canvas

RANK_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray")


def waits(tables: dict, title: str = "", link=None):
    """One row of boxes per run (`tables`: run name -> `compute_and_wait(run)`): for each rank, the
    per-step wait at the final bucket (left) and the rest of its step (right), over the run's steps;
    a box's black line is its median, so a rank that never waits shows as a tick at 0. `title` replaces
    the default one; `link` (the runs, or a caption) is named under the figure."""
    names = list(tables)
    ranks = sorted({r for t in tables.values() for r in t.index.get_level_values("rank")})
    fig, axes = plt.subplots(1, 2, figsize=(9, 0.5 * len(names) * len(ranks) + 1.9), sharey=True,
                             layout="constrained")
    height = 0.8 / len(ranks)
    for ax, column, label in ((axes[0], "wait_ms", "wait at the final bucket (ms)"),
                              (axes[1], "other_ms", "the rest of the step (ms)")):
        for j, rank in enumerate(ranks):
            data = [tables[n].xs(rank, level="rank")[column].tolist() for n in names]
            pos = [i + (j - (len(ranks) - 1) / 2) * height for i in range(len(names))]
            box = ax.boxplot(data, positions=pos, widths=height * 0.85, vert=False, patch_artist=True,
                             manage_ticks=False, flierprops={"markersize": 3},
                             medianprops={"color": "black", "linewidth": 1.8})
            for patch in box["boxes"]:
                patch.set_facecolor(RANK_COLORS[j % len(RANK_COLORS)])
                patch.set_alpha(0.75)
        ax.set_xlabel(label)
        ax.grid(axis="x", alpha=0.3)
        right = ax.get_xlim()[1]
        ax.set_xlim(-0.02 * right, right)   # a little left of 0: a median at 0 stays visible
    axes[0].set_yticks(range(len(names)), names)
    axes[0].invert_yaxis()
    handles = [Patch(color=RANK_COLORS[j % len(RANK_COLORS)], alpha=0.75, label=f"rank {rank}")
               for j, rank in enumerate(ranks)]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=9, frameon=False,
               title="boxes: the steps of one run (median, quartiles, whiskers to 1.5 IQR)", title_fontsize=8.5)
    fig.suptitle(title or "Who waits for whom: per run and rank, the wait at the final bucket and the rest of the step",
                 fontsize=10.5)
    canvas.name_link(fig, link)
    return fig


def delay_response(table, fit=None, title: str = "", link=None, against: str = "the run without a straggler"):
    """The step time each run lost against its baseline, and the early ranks' extra wait, against the
    delay the slow rank lost (`table`: `tables.stragglers.delay_response`, its measured delay); the line
    y = x is where the step follows the slowest rank exactly; `fit` (`cycle_slopes`) adds the fitted line;
    `link` (the runs, or a caption) is named under the figure; `against`: what the y values are set
    against (the baseline)."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2), layout="constrained")
    x = table["measured_delay_ms"]
    top = max(x.max(), table["step_added_ms"].max(), table["extra_wait_ms"].max()) * 1.1
    ax.plot([0, top], [0, top], color="0.6", lw=1, ls="--", label="y = the delay")
    ax.scatter(x, table["step_added_ms"], s=40, color="tab:red", label="step time added", zorder=3)
    ax.scatter(x, table["extra_wait_ms"], s=40, marker="x", color="tab:blue",
               label="early ranks' extra wait", zorder=3)
    if fit is not None:
        slope, intercept = fit["slope"], fit["intercept"]
        ax.plot([0, top], [intercept, intercept + slope * top], color="tab:red", lw=1,
                label=f"fit: step added = {slope:.2f} x delay {intercept:+.1f} ms")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("delay one rank lost in that step (ms, as its own clock measured it)")
    ax.set_ylabel(f"ms, against {against}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9, loc="upper left")
    if title:
        ax.set_title(title)
    canvas.name_link(fig, link)
    return fig
