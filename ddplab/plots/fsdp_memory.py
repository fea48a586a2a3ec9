"""Figures of FSDP2's memory over one step (notebook 09): per configuration, a rank's live bytes sample by
sample, stacked in five groups (the shards the checkpoint estimate counts, then what it leaves out), with
the measured envelope, the prediction and the naive estimate checkpoint / world size drawn across and the
measured peak starred. Numbers from `tables/fsdp_memory.py`."""

from __future__ import annotations

from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from .. import tables
from ..units import MIB
from .canvas import subplots

# the memory model's categories, drawn in five groups: the shards (grey: what "checkpoint / world size"
# foresees, plus the gradients' shards) below, then in strong, distinct colours what the estimate leaves out
GROUPS = {"shards: parameters, optimizer state, gradients": ("sharded_parameters", "optimizer_state", "gradients"),
          "gathered parameters (whole units)": ("gathered_parameters",),
          "whole gradients (before reduce-scatter)": ("unsharded_gradients",),
          "activations": ("activations",),
          "comm buffers (and other)": ("comm_buffers", "other")}
GROUP_COLORS = ("#c7c7c7", "#1f77b4", "#ff7f0e", "#d62728", "#9467bd")
ESTIMATE_COLOR = "#2ca02c"


def _ticks(t) -> tuple[list[int], list[str]]:
    """A labelled tick where each unit's forward or backward starts (its name), and at the step's loss,
    backward end and optimizer end; the samples in between get unlabelled minor ticks."""
    at, labels = [], []
    for i, (event, unit) in enumerate(zip(t["event"], t["unit"])):
        if event in ("pre-forward", "pre-backward"):
            at.append(i), labels.append(unit)
        elif event in ("loss", "optimizer-end"):
            at.append(i), labels.append(event.replace("-end", " step"))
    return at, labels


def memory_over_step(run, rank: int = 0, configs=None, detached: bool = False):
    """One panel per configuration (default: all of the run's), sharing the axes: rank `rank`'s live MiB
    at every sample of one step (a sample before and after each unit's forward and backward, in time
    order), stacked in `GROUPS`; the black line is the most live between samples (the step's real
    envelope), the dashed one the predicted total, the green dotted one checkpoint / world size, the red
    star the measured peak (`tables.fsdp_memory.peaks`' `at`). The x ticks name the unit whose forward
    (left of the loss) or backward (right of it) starts there."""
    configs = list(configs) if configs is not None else tables.fsdp_memory._configs(run)
    fig, axes = subplots((9, 2.15 * len(configs) + 1.3), nrows=len(configs), squeeze=False, detached=detached,
                         sharex=True, sharey=True)
    estimate = tables.fsdp_memory.shard_estimate_bytes(run) / MIB
    top = max(tables.fsdp_memory._config(run, rank, *c).peak_bytes for c in configs) / MIB * 1.15
    for ax, (reshard, prefetch) in zip(axes[:, 0], configs):
        t = tables.fsdp_memory.timeline(run, reshard, prefetch, rank)
        x = list(range(len(t)))
        stacks = [sum(t[c].clip(lower=0) for c in members) for members in GROUPS.values()]
        ax.stackplot(x, *stacks, colors=GROUP_COLORS, step="mid", lw=0)
        ax.plot(x, t["peak_since_last_mib"], color="black", lw=1.4, drawstyle="steps-mid")
        ax.plot(x, t["predicted_total_mib"], color="black", lw=1.2, ls=(0, (4, 2)), drawstyle="steps-mid")
        ax.axhline(estimate, color=ESTIMATE_COLOR, lw=2, ls=":")
        loss = t.index[t["event"] == "loss"]
        if len(loss):   # forward left of the loss, backward right of it
            ax.axvline(loss[0], color="0.4", lw=0.8)
            ax.text(loss[0] - 0.4, top * 0.97, "forward", ha="right", va="top", fontsize=8, color="0.3")
            ax.text(loss[0] + 0.4, top * 0.97, "backward", ha="left", va="top", fontsize=8, color="0.3")
        c = tables.fsdp_memory._config(run, rank, reshard, prefetch)
        at = max(x, key=lambda i: c.samples[i].peak_since_last)   # the measured peak: in the window ending here
        ax.plot(at, c.peak_bytes / MIB, marker="*", color="red", ms=14, mec="black", mew=0.6, ls="", zorder=5)
        ax.set_title(f"{tables.fsdp_memory.config_label(reshard, prefetch)} (rank {rank}): measured peak "
                     f"{c.peak_bytes / MIB:.1f} MiB, {c.peak_bytes / MIB / estimate:.1f}x checkpoint / world size",
                     fontsize=9.5, loc="left")
        ax.set_ylabel("live memory (MiB)", fontsize=9)
        ax.tick_params(labelsize=8)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    t = tables.fsdp_memory.timeline(run, *configs[-1], rank)
    at, labels = _ticks(t)
    bottom = axes[-1, 0]
    bottom.set_xticks(at, labels, rotation=90, fontsize=8)
    bottom.set_xticks(range(len(t)), minor=True)
    bottom.set_xlim(-0.5, len(t) - 0.5)
    bottom.set_ylim(0, top)
    bottom.set_xlabel("one training step, sample by sample "
                      "(a tick names the unit whose forward or backward starts there)", fontsize=9)
    handles = [Patch(color=color, label=label) for label, color in zip(GROUPS, GROUP_COLORS)]
    handles += [Line2D([], [], color="red", marker="*", ms=12, mec="black", ls="", label="measured peak"),
                Line2D([], [], color="black", lw=1.4, label="most live between samples (measured)"),
                Line2D([], [], color="black", lw=1.2, ls=(0, (4, 2)), label="predicted (predict.fsdp_memory)"),
                Line2D([], [], color=ESTIMATE_COLOR, lw=2, ls=":", label="checkpoint / world size")]
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    fig.suptitle(f"{run.spec.name}: FSDP2's live memory over one step on rank {rank} of {run.spec.world_size}; "
                 f"compare the star with the green line", fontsize=10.5)
    fig.set_layout_engine("constrained")
    return fig
