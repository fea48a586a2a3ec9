"""Figures of global-batch semantics (notebook 06): strong and weak scaling, and loss against
examples and against steps for two global batch sizes."""

from __future__ import annotations

import matplotlib.pyplot as plt

from ..tables.global_batch import loss_by_examples


def scaling(strong, weak):
    """Examples/s and scaling efficiency against world size, for `tables.global_batch.scaling` of each kind."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for df, label, color in ((strong, "strong (global batch fixed)", "tab:blue"),
                             (weak, "weak (local batch fixed)", "tab:orange")):
        ws = list(df.index)
        a.plot(ws, df["examples_per_s"], "o-", color=color, label=label)
        a.plot(ws, [df["examples_per_s"].iloc[0] * w for w in ws], ":", color=color, lw=1)
        b.plot(ws, df["efficiency"], "o-", color=color, label=label)
    a.set_xlabel("world size (ranks)")
    a.set_ylabel("examples / s")
    a.set_title("Throughput (dotted: ideal linear)")
    b.axhline(1.0, color="black", lw=1, ls=":")
    b.set_xlabel("world size (ranks)")
    b.set_ylabel("scaling efficiency")
    b.set_ylim(0, 1.2)
    b.set_title("Efficiency (1 = ideal)")
    for ax in (a, b):
        ax.set_xticks(list(strong.index))
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def batch_size_study(runs, target_loss: float, bin_examples: int = 64):
    """Global loss against examples seen and against optimizer steps, one line per global batch, each
    over every step it ran (the smaller batch runs more steps for the same examples)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for run in runs:
        curve = loss_by_examples(run, bin_examples)
        g = run.spec.global_batch
        a.plot(curve.index, curve.values, "o-", ms=3, label=f"global batch {g}")
        b.plot([e / g for e in curve.index], curve.values, "o-", ms=3, label=f"global batch {g}")
    for ax, xlabel in ((a, "examples seen"), (b, "optimizer steps")):
        ax.axhline(target_loss, color="black", lw=1, ls="--", label=f"target loss {target_loss}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"loss (mean over {bin_examples}-example bins)")
        ax.legend(fontsize=8)
    a.set_title("Same examples: which batch size learned more?")
    b.set_title("Same steps: the bigger batch saw more data")
    b.set_xlim(0, max(run.spec.steps for run in runs) * 1.03)
    fig.tight_layout()
    return fig
