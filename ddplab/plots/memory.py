"""Figures of the per-rank memory ledger (notebook 02): measured beside predicted, and sweeps over
world size, optimizer, bucket views and sharding. Each function returns the Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt

MEMORY_COLORS = {"parameters": "tab:blue", "gradients": "tab:orange", "ddp_buckets": "tab:green",
                 "optimizer_state": "tab:red", "activations": "tab:purple"}


def _stack(ax, x, values: dict, width, hatch=None, labels=True):
    bottom = 0.0
    for c, color in MEMORY_COLORS.items():
        ax.bar(x, values[c], width, bottom=bottom, color=color, hatch=hatch, edgecolor="white",
               label=c.replace("_", " ") if labels else None)
        bottom += values[c]
    return bottom


def memory(table):
    """`tables.memory`: per rank, measured (solid) and predicted (hatched) bytes by category, and
    the measured peak (black tick)."""
    fig, ax = plt.subplots(figsize=(8, 3.8))
    w = 0.38
    for i, rank in enumerate(table.index):
        row = table.loc[rank]
        _stack(ax, i - w / 2, {c: row[(c, "measured")] for c in MEMORY_COLORS}, w, labels=i == 0)
        _stack(ax, i + w / 2, {c: row[(c, "predicted")] for c in MEMORY_COLORS}, w, hatch="//", labels=False)
        ax.plot([i - w, i + w], [row[("peak", "measured")]] * 2, color="black", lw=2,
                label="measured peak" if i == 0 else None)
    ax.set_xticks(range(len(table)), [f"rank {r}\nmeasured | predicted" for r in table.index], fontsize=8)
    ax.set_ylabel("MiB")
    ax.set_title("Every rank holds the same full copy (each category at its largest in the step)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


def memory_sweep(table, title: str):
    """`tables.memory_sweep` (or `tables.sharding`): one stacked bar per run, peak as a black tick."""
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for i, (_, row) in enumerate(table.iterrows()):
        _stack(ax, i, {c: row[c] for c in MEMORY_COLORS}, 0.6, labels=i == 0)
        ax.plot([i - 0.35, i + 0.35], [row["peak"]] * 2, color="black", lw=2, label="measured peak" if i == 0 else None)
        if "checkpoint_over_world_size" in row:
            ax.plot([i - 0.35, i + 0.35], [row["checkpoint_over_world_size"]] * 2, color="black", lw=1.5, ls="--",
                    label="checkpoint / world size" if i == 0 else None)
    ax.set_xticks(range(len(table)), [str(i) for i in table.index], fontsize=8)
    ax.set_ylabel("MiB per rank (rank 0)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig
