"""Figures of data coverage (notebook 08): which rank's DistributedSampler took which example in
each epoch, with the dropped and the duplicated examples marked. Numbers from `tables/coverage.py`."""

from __future__ import annotations

from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from ..tables.coverage import coverage_table
from .. import tables
from .canvas import subplots
from .stragglers import RANK_COLORS

DROPPED = "#d62728"


def _color(rank: int):
    return RANK_COLORS[rank % len(RANK_COLORS)]


def _batch_of(run, epoch: int) -> dict[tuple[int, int], int]:
    """(rank, example id) -> the index of the rank's batch that held it in `epoch`."""
    return {(r.rank, i): b for r in run.ranks for b, ids in enumerate(r.result.epochs[epoch].batches) for i in ids}


def _per_epoch(counts: list[int], what: str) -> str:
    return f"{counts[0]} {what} per epoch" if len(set(counts)) == 1 else f"{sum(counts)} {what} in {len(counts)} epochs"


def _title(run) -> str:
    """What the panel shows, counted from the run: '...: 2 duplicated per epoch, same order every epoch'."""
    t, table = run.spec.task, coverage_table(run)
    dropped, duplicated = [len(x) for x in table["dropped"]], [len(x) for x in table["duplicated"]]
    found = [_per_epoch(c, what) for c, what in ((dropped, "dropped"), (duplicated, "duplicated")) if any(c)]
    found = found or ["every example exactly once"]
    if len(table) > 1 and not any(any(c) for c in table["order_changed"].iloc[1:]):
        found.append("the same order every epoch")
    setting = f"drop_last={t.drop_last}" + ("" if t.set_epoch else ", no set_epoch")
    return f"{run.spec.name} ({t.dataset_size} examples, {run.spec.world_size} ranks, {setting}): {', '.join(found)}"


def sample_grid(runs, detached: bool = False):
    """One panel per run (a Run or a list of them): example ids across, epochs down, each cell in the
    color of the rank that took the example, with the index of that rank's batch inside; a cell split
    in two is an example two ranks took (the sampler's padding), a red cross one that no rank took."""
    runs = list(runs) if isinstance(runs, (list, tuple)) else [runs]
    widest = max(r.spec.task.dataset_size for r in runs)
    heights = [len(r.ranks[0].result.epochs) + 1.4 for r in runs]
    fig, axes = subplots((max(7.0, 0.34 * widest + 1.6), 0.42 * sum(heights) + 0.8), nrows=len(runs), squeeze=False,
                         detached=detached, gridspec_kw={"height_ratios": heights})
    fig.set_layout_engine("constrained")   # room for the legend outside the panels
    for ax, run in zip(axes[:, 0], runs):
        grid = tables.coverage.sample_grid(run)
        n, n_epochs = grid.shape
        for e in range(n_epochs):
            batch = _batch_of(run, e)
            for i in range(n):
                ranks = grid.at[i, e]
                if not ranks:
                    ax.add_patch(Rectangle((i - 0.5, e - 0.5), 1, 1, facecolor="white", edgecolor="0.8", lw=0.5))
                    ax.plot(i, e, "x", color=DROPPED, ms=9, mew=2.2)
                    continue
                width = 1 / len(ranks)
                for k, rank in enumerate(ranks):
                    ax.add_patch(Rectangle((i - 0.5 + k * width, e - 0.5), width, 1, facecolor=_color(rank),
                                           edgecolor="white", lw=0.8))
                if len(ranks) > 1:
                    ax.add_patch(Rectangle((i - 0.47, e - 0.47), 0.94, 0.94, fill=False, edgecolor="black", lw=1.8))
                    ax.text(i, e, f"x{len(ranks)}", ha="center", va="center", fontsize=7, color="white",
                            fontweight="bold")
                else:
                    ax.text(i, e, str(batch[(ranks[0], i)]), ha="center", va="center", fontsize=7, color="white")
        ax.set_xlim(-0.5, widest - 0.5)
        ax.set_ylim(n_epochs - 0.5, -0.5)
        ax.set_xticks(range(0, widest, 2 if widest > 30 else 1))
        ax.tick_params(axis="x", labelsize=7)
        ax.set_yticks(range(n_epochs), [f"epoch {e}" for e in range(n_epochs)])
        ax.set_title(_title(run), fontsize=9, loc="left")
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[-1, 0].set_xlabel("example id (the number in a cell: which of the rank's batches held it)")
    world = max(r.spec.world_size for r in runs)
    handles = [Patch(color=_color(r), label=f"rank {r}") for r in range(world)]
    handles += [Patch(facecolor="white", edgecolor="black", lw=1.8, label="x2: taken twice (padding)"),
                Line2D([], [], marker="x", color=DROPPED, ms=8, mew=2, ls="none", label="dropped: no rank took it")]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8, frameon=False)
    return fig

