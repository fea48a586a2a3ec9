"""Figures of the per-rank memory ledger (notebook 02 and its widget): what a rank holds at each
moment the ledger was sampled (after the forward, the backward, the optimizer step), measured beside
predicted, and sweeps over world size, optimizer, bucket views and sharding. Every bar is one moment,
so its stacked categories were held together; the step's peak, which falls between the moments, is a
line. Each function returns the Figure."""

from __future__ import annotations

from matplotlib.patches import Patch

from ..tables.memory import MOMENTS, memory_moments, moments_sweep, predicted_moments
from .canvas import subplots

MEMORY_COLORS = {"parameters": "tab:blue", "gradients": "tab:orange", "ddp_buckets": "tab:green",
                 "optimizer_state": "tab:red", "activations": "tab:purple"}
SHORT = {"after forward": "after\nforward", "after backward": "after\nbackward", "after optimizer step": "after\nstep"}
PEAK_LABEL = "measured peak of step {step}: the most held at any one moment, temporaries included"


def _draw(ax, groups, annotate: bool = True):
    """`groups`: [(group label, [(bar label, {category: MiB}, hatched)])]; one stacked bar per moment,
    groups side by side. Returns each group's (left, right) edge, for lines drawn over a group."""
    width, gap = 0.8, 0.6
    x, ticks, labels, spans = 0.0, [], [], []
    for name, bars in groups:
        left = x
        for label, values, hatched in bars:
            bottom = 0.0
            for c, color in MEMORY_COLORS.items():
                ax.bar(x, values[c], width, bottom=bottom, color=color, edgecolor="white",
                       hatch="//" if hatched else None)
                bottom += values[c]
            if annotate:
                ax.text(x, bottom, f"{bottom:.1f}", ha="center", va="bottom", fontsize=7)
            ticks.append(x)
            labels.append(label)
            x += 1
        spans.append((left - width / 2, x - 1 + width / 2))
        ax.annotate(name, ((left + x - 1) / 2, 0), xytext=(0, -30), textcoords="offset points",
                    xycoords=("data", "axes fraction"), ha="center", va="top", fontsize=9)
        x += gap
    ax.set_xticks(ticks, labels, fontsize=7)
    ax.set_xlim(-0.8, x - gap - 0.2)
    return spans


def _legend(ax, extra=()):
    """Below the axes, so the bars keep the figure's width."""
    handles = [Patch(color=color, label=c.replace("_", " ")) for c, color in MEMORY_COLORS.items()]
    ax.legend(handles=[*handles, *extra], fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2),
              frameon=False)


def memory_figure(run, step: int = 1, detached: bool = False):
    """Per sampled moment of step `step`: what each rank held (solid) and the prediction (hatched),
    stacked by category, and the step's measured peak (plain DDP; `tables.memory.memory_moments`)."""
    table = memory_moments(run, step)
    ranks = list(table.index.unique("rank"))
    groups = [(moment, [*((f"r{r}", {c: table.loc[(r, moment), (c, "measured")] for c in MEMORY_COLORS}, False)
                          for r in ranks),
                        ("pred.", {c: table.loc[(ranks[0], moment), (c, "predicted")] for c in MEMORY_COLORS}, True)])
              for moment in MOMENTS.values()]
    fig, ax = subplots((9, 5), detached=detached)
    _draw(ax, groups, annotate=len(ranks) <= 4)
    peak = max(r.memory.steps[step].peak for r in run.ranks) / 2 ** 20
    line = ax.axhline(peak, color="black", lw=1.5, label=PEAK_LABEL.format(step=step)
                      + (" (largest over ranks)" if len(ranks) > 1 else ""))
    ax.text(ax.get_xlim()[1], peak, f"peak {peak:.1f} ", ha="right", va="bottom", fontsize=8)
    ax.set_ylim(0, peak * 1.15)
    ax.set_ylabel("MiB held by one rank")
    ax.set_title(f"{run.spec.name}: what each rank (r0, r1, ...) holds at three moments of step {step}\n"
                 "each bar is one moment; the prediction beside", fontsize=10)
    _legend(ax, [Patch(facecolor="white", edgecolor="gray", hatch="//", label="hatched (pred.): predicted"), line])
    fig.tight_layout()
    return fig


def memory_prediction(exp, step: int = 1, detached: bool = False):
    """The analytic prediction alone (no run): what one rank of `exp` holds at each sampled moment
    of step `step`, stacked by category (`tables/memory.predicted_moments`). The scale is the one
    without bucket views, so switching them on shows as bars that shrink."""
    table = predicted_moments(exp, step=step)
    top = predicted_moments(exp.replace(gradient_as_bucket_view=False), step=step)["total"].max()
    groups = [("predicted, on every rank", [(SHORT[m], {c: table.loc[m, c] for c in MEMORY_COLORS}, True)
                                             for m in table.index])]
    fig, ax = subplots((7, 4.4), detached=detached)
    _draw(ax, groups)
    ax.set_ylim(0, top * 1.15)
    ax.set_ylabel("MiB held by one rank")
    ax.set_title(f"world_size={exp.world_size}, {exp.optimizer}{'+momentum' if exp.momentum else ''}, "
                 f"gradient_as_bucket_view={exp.gradient_as_bucket_view}", fontsize=9)
    _legend(ax)
    fig.tight_layout()
    return fig


def memory_sweep(runs, title: str, step: int = 1, estimate=None):
    """One group per run (rank 0): what it held at each sampled moment of step `step`, stacked by
    category, and its measured peak; `estimate`, one value per run (e.g. `tables.memory.sharding`'s
    checkpoint_over_world_size), is drawn dashed."""
    table = moments_sweep(runs, step)
    names = list(table.index.unique("run"))
    groups = [(name, [(SHORT[m], {c: table.loc[(name, m), c] for c in MEMORY_COLORS}, False) for m in MOMENTS.values()])
              for name in names]
    fig, ax = subplots((9, 5))
    spans = _draw(ax, groups)
    extra = []
    for i, (name, (left, right)) in enumerate(zip(names, spans)):
        peak = table.loc[(name, "after forward"), "peak"]
        extra = ax.plot([left, right], [peak] * 2, color="black", lw=2, label=PEAK_LABEL.format(step=step))
        ax.text(right, peak, f"peak {peak:.1f}", ha="right", va="bottom", fontsize=7)
        if estimate is not None:
            extra += ax.plot([left, right], [list(estimate)[i]] * 2, color="black", lw=1.5, ls="--",
                             label="checkpoint / world size")
    ax.set_ylim(0, max(table["peak"].max(), table["total"].max()) * 1.15)
    ax.set_ylabel("MiB held by rank 0")
    ax.set_title(title, fontsize=10)
    _legend(ax, extra)
    fig.tight_layout()
    return fig
