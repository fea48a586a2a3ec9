"""Figures of the synchronized gradient (notebook 01): local and reduced gradients against the
reference, the reduced gradient under each loss normalization, and each rank's weight (pure)."""

from __future__ import annotations

import matplotlib.pyplot as plt

from .. import predict
from . import canvas
from ..tables.gradients import check


def _floor(values, floor=1e-17):
    return [max(v, floor) for v in values]


def gradient_check(run):
    """Per rank: relative error of its local gradient and of the reduced gradient against the
    single-process reference (log scale; an exact match is drawn at the floor)."""
    rows = check(run)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ranks = [r["rank"] for r in rows]
    w = 0.38
    ax.bar([x - w / 2 for x in ranks], [r["local_rel_error"] for r in rows], w, label="local gradient g_r")
    ax.bar([x + w / 2 for x in ranks], _floor([r["reduced_rel_error"] for r in rows]), w,
           label="reduced gradient (after all-reduce)")
    ax.set_yscale("log")
    ax.set_ylim(1e-17, 10)
    ax.axhline(1e-5, color="black", lw=1, ls="--")
    ax.text(ranks[-1] + 0.45, 1e-5, "1e-5", va="bottom", ha="right", fontsize=8)
    ax.set_xticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylabel(r"$\|g - g_{ref}\| \,/\, \|g_{ref}\|$")
    ax.set_title(f"Gradients against the one-process reference on the global batch ({run.spec.dtype})\n"
                 "bars at 1e-17 are exactly 0")
    ax.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.tight_layout()
    return fig


def normalization_errors(table):
    """One bar per run of `tables.gradients.normalization`: the reduced gradient's relative error (log scale)."""
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(table) + 1.8))
    labels = [f"{norm}, batches {'/'.join(map(str, b))}, seq_len {'/'.join(map(str, s))}"
              + (f" ({dt})" if dt != "float32" else "")
              for norm, b, s, dt in zip(table["loss_norm"], table["local_batch"], table["seq_len"], table["dtype"])]
    errs = _floor(list(table["reduced_rel_error"]))
    colors = ["tab:red" if e > 1e-5 else "tab:green" for e in errs]
    ax.barh(range(len(errs)), errs, color=colors)
    ax.set_yticks(range(len(errs)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(1e-17, 10)
    ax.axvline(1e-5, color="black", lw=1, ls="--")
    ax.set_xlabel("relative error vs the global-batch reference (log; 1e-17 = exact)")
    ax.set_title("Reduced gradient with unequal work (green: matches, below 1e-5)")
    fig.tight_layout()
    return fig


def rank_weights(local_batches, seq_lens, detached: bool = False):
    """How much each rank's mean gradient counts under each loss normalization (pure, instant);
    `detached`: drawn outside pyplot (the widget's callback displays it)."""
    norms = ("rank-mean", "global-sample", "global-token")
    n = len(local_batches)
    fig, ax = canvas.subplots((7, 3.2), detached=detached)
    w = 0.27
    for k, norm in enumerate(norms):
        ax.bar([r + (k - 1) * w for r in range(n)], predict.loss_weights.rank_weights(local_batches, seq_lens, norm), w, label=norm)
    ax.set_xticks(range(n), [f"rank {r}\n{b} ex x {s} tok" for r, b, s in zip(range(n), local_batches, seq_lens)],
                  fontsize=8)
    ax.set_ylabel("weight of its mean gradient")
    ax.set_title("rank-mean weighs every rank equally;\nthe global objectives weigh each rank by its share of the work")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
