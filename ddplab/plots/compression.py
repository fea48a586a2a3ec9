"""Figures of DDP's communication hooks (notebook 10): bytes each rank wrote per step against the
hook's payload rule, the step per hook (on loopback and on an emulated link, predicted and measured),
and the loss gap to the float32 all-reduce over the learning steps."""

from __future__ import annotations

import matplotlib.pyplot as plt

from ..units import size_label
from .canvas import link_of

COLORS = {"allreduce": "tab:gray", "fp16": "tab:blue", "bf16": "tab:cyan", "powersgd": "tab:red", "noop": "tab:green"}


def bytes_per_hook(table):
    """Bytes one rank writes per step, per hook (compressed steps; log scale): measured (bar) and the
    payload rule's prediction (black tick), with the compression ratio against float32."""
    rows = table.xs("every step", level="steps")
    hooks = [h for h in rows.index if rows.loc[h, "predicted_written"] > 0]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    base = rows.loc["allreduce", "written_median"]
    for i, h in enumerate(hooks):
        ax.bar(i, rows.loc[h, "written_median"], color=COLORS.get(h, "tab:purple"), width=0.6)
        ax.plot([i - 0.35, i + 0.35], [rows.loc[h, "predicted_written"]] * 2, color="black", lw=2)
        ratio = "float32" if h == "allreduce" else f"{base / rows.loc[h, 'written_median']:.3g}x fewer"
        ax.annotate(f"{size_label(int(rows.loc[h, 'written_median']), digits=3)}\n{ratio}",
                    (i, rows.loc[h, "written_median"]), textcoords="offset points", xytext=(0, 4), ha="center",
                    fontsize=8)
    ax.set_xticks(range(len(hooks)), hooks)
    ax.set_yscale("log")
    ax.set_ylim(rows.loc[hooks, "written_median"].min() / 4, base * 8)   # room for the smallest bar to show
    ax.set_ylabel("bytes a rank writes per step")
    ax.set_title("What each hook puts on the wire (bars: measured; black: the payload rule)", fontsize=10)
    fig.tight_layout()
    return fig


def steps_per_hook(tables: dict, sources: dict):
    """One panel per run (a `tables.compression.timing` table, keyed by a label): per hook the measured
    step (bar, median over the paired steps), the model's prediction (black tick) and the hook's own
    cost with communication free (hatched); each panel names its link."""
    fig, axes = plt.subplots(1, len(tables), figsize=(5.2 * len(tables), 3.6), squeeze=False, sharey=True,
                             layout="constrained")
    for ax, (label, table) in zip(axes[0], tables.items()):
        for i, h in enumerate(table.index):
            ax.bar(i, table.loc[h, "measured_ms"], color=COLORS.get(h, "tab:purple"), width=0.6,
                   label="measured step (median)" if i == 0 else None)
            ax.bar(i, table.loc[h, "local_ms"], fill=False, hatch="//", width=0.6, edgecolor="black", lw=0.5,
                   label="the hook on one rank (no wire)" if i == 0 else None)
            ax.plot([i - 0.35, i + 0.35], [table.loc[h, "predicted_ms"]] * 2, color="black", lw=2,
                    label="predicted step" if i == 0 else None)
        ax.set_xticks(range(len(table.index)), table.index, fontsize=8)
        ax.set_title(f"{label}\n{link_of(sources[label])}", fontsize=9)
        ax.set_ylabel("ms per step")
    # below the panels, where it covers no bar
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    return fig


def loss_gaps(gaps: dict, start_iter: int | None = None, summed: dict | None = None):
    """Each hook's global loss minus the float32 all-reduce's, step by step (symlog: fp16's gap is
    a millionth, PowerSGD's can be a tenth), with where PowerSGD starts compressing; with `summed`
    (`tables.compression.summed_errors`), a second panel: each hook's summed gradient error so far."""
    fig, axes = plt.subplots(1, 2 if summed else 1, figsize=(11 if summed else 7, 3.2), squeeze=False)
    ax = axes[0][0]
    for h, g in gaps.items():
        if h != "allreduce":
            ax.plot(range(1, len(g) + 1), g, "o-", ms=3, color=COLORS.get(h, "tab:purple"), label=h)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_yscale("symlog", linthresh=1e-5)
    ax.set_ylabel("loss - float32's loss")
    ax.set_title("What compression did to the loss (same start, same batches)", fontsize=10)
    if summed:
        right = axes[0][1]
        for h, e in summed.items():
            if h != "allreduce":
                right.plot(range(1, len(e) + 1), [100 * x for x in e], "o-", ms=3, color=COLORS.get(h, "tab:purple"), label=h)
        right.set_ylabel("% off the exact sum")
        right.set_title("The gradients it delivered, summed over the steps so far,\nagainst the exact averages summed",
                        fontsize=9)
    for a in axes[0]:
        if start_iter is not None:
            a.axvline(start_iter + 0.5, color="tab:red", ls=":", lw=1, label="PowerSGD starts compressing")
        a.set_xlabel("learning step")
        a.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig
