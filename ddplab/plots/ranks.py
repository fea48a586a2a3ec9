"""Figures of who did what (notebook 00): which rank saw which sample ids, step time by phase, and
each rank's distance from the one-process update. Each function returns the Figure."""

from __future__ import annotations

import statistics

import matplotlib.pyplot as plt

from ..spec.sharding import contiguous_spans

PHASES = ("data", "forward", "backward", "optimizer")


def _rank_colors(n: int):
    cmap = plt.get_cmap("tab10")
    return [cmap(i % 10) for i in range(n)]


def sample_ownership(run):
    """Which rank processed which global sample id: one row per rank, one bar per contiguous shard."""
    n = run.world_size
    fig, ax = plt.subplots(figsize=(9, 0.6 * n + 1.4))
    colors = _rank_colors(n)
    for r in run.ranks:
        spans = [(a, b - a + 1) for a, b in contiguous_spans(r.sample_ids)]  # (start, width)
        ax.broken_barh(spans, (r.rank - 0.4, 0.8), facecolors=colors[r.rank], edgecolor="white")
        for x, w in spans:
            ax.text(x + w / 2, r.rank, f"{x}-{x + w - 1}", ha="center", va="center", fontsize=8, color="white")
    g = run.spec.global_batch
    for s in range(run.spec.steps + 1):
        ax.axvline(s * g - 0.5, color="black", lw=1, ls="--")
    ax.set_yticks(range(n), [f"rank {r}" for r in range(n)])
    ax.invert_yaxis()
    ax.set_xlabel("global sample id (dashed lines: optimizer steps, each one global batch)")
    ax.set_title(f"{n} ranks share each global batch of {g} examples: disjoint shards, nothing missing")
    fig.tight_layout()
    return fig


def step_times(run):
    """Median time per phase of a step, stacked, one bar per rank."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    bottoms = [0.0] * run.world_size
    for phase, color in zip(PHASES, plt.get_cmap("Set2").colors):
        vals = [statistics.median(r.step_ms(phase)) for r in run.ranks]
        ax.bar(range(run.world_size), vals, bottom=bottoms, color=color, label=phase)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    ax.set_xticks(range(run.world_size), [f"rank {r.rank}" for r in run.ranks])
    ax.set_ylabel("median time per step (ms)")
    ax.set_title(f"Step time by phase ({run.ranks[0].backend} on {run.ranks[0].device})")
    ax.legend(ncol=4, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.tight_layout()
    return fig


def update_error(run):
    """Distance of each rank's parameters after step 0 from the single-process global-batch update:
    with DDP's averaged gradient, and with the rank's own gradient alone (log scale)."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ranks = [r.rank for r in run.ranks]
    ddp = [max(r.reference.ddp.update_rel_error, 1e-12) for r in run.ranks]
    alone = [r.reference.independent.update_rel_error for r in run.ranks]
    w = 0.38
    ax.bar([x - w / 2 for x in ranks], ddp, w, label="DDP update (all-reduced gradient)")
    ax.bar([x + w / 2 for x in ranks], alone, w, label="independent update (own shard only)")
    ax.set_yscale("log")
    ax.set_ylim(1e-12, 10)
    ax.set_xticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylabel(r"$\|\theta - \theta_{ref}\| \,/\, \|\theta_{ref} - \theta_0\|$")
    ax.set_title("Distance from the one-process update on the whole global batch\n(bars at 1e-12 are exactly 0)")
    ax.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.tight_layout()
    return fig
