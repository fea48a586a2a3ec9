"""Figures of FSDP2's memory over one step (notebook 09): per configuration, a rank's live bytes sample by
sample, stacked by category, with each unit's gather and free marked and the reduce-scatters shaded,
the measured peak, the predicted timeline and the naive estimate checkpoint / world size drawn across.
Numbers from `tables/fsdp_memory.py`."""

from __future__ import annotations

from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..spec.fsdp_memory import SAMPLE_CATEGORIES
from .. import tables
from ..units import MIB
from .canvas import subplots

FSDP_COLORS = {"sharded_parameters": "tab:blue", "optimizer_state": "tab:purple", "gradients": "tab:orange",
               "gathered_parameters": "tab:cyan", "unsharded_gradients": "gold", "activations": "tab:red",
               "comm_buffers": "tab:green", "other": "0.7"}
SHORT = {"pre-forward": "F>", "post-forward": "F<", "pre-backward": "B>", "post-backward": "B<"}


def _tick(event: str, unit: str) -> str:
    if event in SHORT:
        return f"{SHORT[event]} {unit}"
    return event


def memory_over_step(run, rank: int = 0, configs=None, detached: bool = False):
    """One panel per configuration (default: all of the run's): rank `rank`'s live MiB at every sample
    (x: the samples in order, F> / F< a unit's pre / post forward, B> / B< its pre / post backward),
    stacked by category; the black line is the most live between samples (the step's real envelope),
    the dashed one the predicted total, the dotted one checkpoint / world size, a red star the measured
    peak (`tables.fsdp_memory.peaks`' `at`); a triangle marks a
    unit gathered at that sample, a shaded column a reduce-scatter (sharded gradients arrived since the last sample)."""
    configs = list(configs) if configs is not None else tables.fsdp_memory._configs(run)
    fig, axes = subplots((13, 3.4 * len(configs)), nrows=len(configs), squeeze=False, detached=detached)
    estimate = tables.fsdp_memory.shard_estimate_bytes(run) / MIB
    top = max(tables.fsdp_memory._config(run, rank, *c).peak_bytes for c in configs) / MIB * 1.12
    for ax, (reshard, prefetch) in zip(axes[:, 0], configs):
        t = tables.fsdp_memory.timeline(run, reshard, prefetch, rank)
        x = list(range(len(t)))
        ax.stackplot(x, *[t[c].clip(lower=0) for c in SAMPLE_CATEGORIES], colors=[FSDP_COLORS[c] for c in SAMPLE_CATEGORIES],
                     alpha=0.85, step="mid")
        ax.plot(x, t["peak_since_last_mib"], color="black", lw=1.4, drawstyle="steps-mid")
        ax.plot(x, t["predicted_total_mib"], color="black", lw=1.2, ls="--", drawstyle="steps-mid")
        ax.axhline(estimate, color="0.3", lw=1.2, ls=":")
        grads = t["gradients"].tolist()
        for i, row in t.iterrows():
            if i + 1 < len(t) and grads[i + 1] > grads[i]:   # sharded gradients arrived: a reduce-scatter ran
                ax.axvspan(i + 0.5, i + 1.5, color="tab:green", alpha=0.08, lw=0)
            if row["unit"] and row["unit"] in row["gathered_units"]:
                ax.plot(i, top * 0.97, marker="v", color="tab:cyan", ms=5, mec="black", mew=0.4)
        c = tables.fsdp_memory._config(run, rank, reshard, prefetch)
        at = max(x, key=lambda i: c.samples[i].peak_since_last)   # the measured peak: in the window ending here
        ax.plot(at, c.peak_bytes / MIB, marker="*", color="tab:red", ms=11, mec="black", mew=0.5, ls="")
        ax.set_title(f"{tables.fsdp_memory.config_label(reshard, prefetch)} (rank {rank}): measured peak {c.peak_bytes / MIB:.1f} MiB, "
                     f"{c.peak_bytes / MIB / estimate:.1f}x checkpoint / world size", fontsize=10, loc="left")
        ax.set_xticks(x, [_tick(e, u) for e, u in zip(t["event"], t["unit"])], rotation=90, fontsize=7)
        ax.set_xlim(-0.5, len(t) - 0.5)
        ax.set_ylim(0, top)
        ax.set_ylabel("live memory (MiB)")
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[-1, 0].set_xlabel("sample in the step (F> / F<: a unit's forward starts / ends; B> / B<: its backward)")
    handles = [Patch(color=FSDP_COLORS[c], label=c.replace("_", " ")) for c in SAMPLE_CATEGORIES]
    handles += [Line2D([], [], color="black", lw=1.4, label="most live between samples (measured)"),
                Line2D([], [], color="black", lw=1.2, ls="--", label="predicted total (predict.fsdp_memory)"),
                Line2D([], [], color="0.3", lw=1.2, ls=":", label="checkpoint / world size"),
                Line2D([], [], color="tab:cyan", marker="v", ls="", mec="black", label="the sample's unit is gathered"),
                Line2D([], [], color="tab:red", marker="*", ls="", mec="black", ms=9,
                       label="measured peak (in the window ending at this sample)"),
                Patch(color="tab:green", alpha=0.15, label="gradients reduce-scattered since the last sample")]
    axes[0, 0].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.suptitle(f"{run.spec.name}: FSDP2 memory over one step, {run.spec.world_size} ranks", fontsize=11)
    fig.set_layout_engine("constrained")
    return fig
