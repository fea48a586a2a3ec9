"""Where a resumed run departs from the uninterrupted one (notebook 08): the relative parameter
distance per step, one line per resume, on a log scale; a bit-identical resume has no distance to
draw and is named in the legend instead."""

from __future__ import annotations

from matplotlib.ticker import MaxNLocator

from ..tables.resume import departure
from .canvas import subplots

FLOOR = 1e-12   # below float64 resolution of these distances: where an exact zero is drawn


def departures(reference, resumed: list, detached: bool = False):
    """Relative parameter distance ||p - p_ref|| / ||p_ref|| after every resumed step, against
    `reference`; the checkpoint's step marked."""
    fig, ax = subplots((8.0, 3.8), detached=detached)
    start = None
    for run in resumed:
        d = departure(reference, run)
        start = d.index[0] if start is None else min(start, d.index[0])
        if d.attrs["first_departure"] is None:
            ax.plot([], [], color="black", lw=0, label=f"{run.spec.name}: bit-identical at every step")
            continue
        ax.plot(d.index, d["param_distance"].clip(lower=FLOOR), marker="o", ms=4, label=run.spec.name)
    ax.set_yscale("log")
    ax.axvline(start - 0.5, color="0.5", ls="--", lw=1)
    ax.text(start - 0.45, 0.98, " resumed from the checkpoint", transform=ax.get_xaxis_transform(), va="top",
            fontsize=8, color="0.35")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("relative parameter distance\nto the uninterrupted run")
    ax.legend(fontsize=8, loc="lower right", frameon=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig
