"""Figures of gradient readiness (notebook 04): ready position against source position, and one
backward per rank with its gradients ready and each bucket's all-reduce in a lane of its own."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ..units import MIB, ms_after
from .canvas import name_link

AS_ASSUMED, NOT_AS_ASSUMED, NAIVE = "tab:blue", "tab:red", "gray"
DURING_COMPUTE, AFTER_COMPUTE = "#6baed6", "#fd8d3c"
LAST_READY, RETURNS = "tab:green", "tab:red"


def ready_order(tables_by_case: dict):
    """Ready position against source position, one panel per case (two per row); the dashed line is
    the naive assumption (backward runs in exactly reverse source order)."""
    n = len(tables_by_case)
    ncols = min(n, 2)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.9 * nrows + 0.5), squeeze=False,
                             layout="constrained")
    for ax, (case, t) in zip(axes.flat, tables_by_case.items()):
        ok = t["as_assumed"]
        ax.plot(t["source_position"], t["reverse_source_position"], "--", color=NAIVE, lw=1)
        ax.scatter(t["source_position"][ok], t["ready_position"][ok], s=16, color=AS_ASSUMED, zorder=3)
        ax.scatter(t["source_position"][~ok], t["ready_position"][~ok], s=28, color=NOT_AS_ASSUMED, zorder=3)
        ax.set_title(f"{case}: {int((~ok).sum())} of {len(t)} parameters off the dashed line", fontsize=10)
        ax.set_xlabel("source position (parameters() order)")
        ax.set_ylabel("ready position in backward")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    handles = [Line2D([], [], ls="--", color=NAIVE, label="naive assumption: exactly reverse source order"),
               Line2D([], [], ls="", marker="o", color=AS_ASSUMED, label="ready where the assumption says"),
               Line2D([], [], ls="", marker="o", color=NOT_AS_ASSUMED, label="ready elsewhere")]
    fig.legend(handles=handles, loc="outside upper center", ncol=3, fontsize=9, frameon=False)
    return fig


def backward_timeline(run, step: int = -1):
    """One backward per rank, one panel each: a tick per gradient ready (top lane), then one lane per
    bucket with its all-reduce from launch to completion (light blue while backward still computes,
    orange once the rank's last gradient is ready) and its duration written beside it; the last
    gradient ready (end of backward compute) and backward()'s return span the panel."""
    n_lanes = 1 + max(len(r.steps[step].buckets) for r in run.ranks)
    fig, axes = plt.subplots(run.world_size, 1, figsize=(10, 0.3 * n_lanes * run.world_size + 1.5), sharex=True,
                             squeeze=False, layout="constrained")
    t0 = min(r.steps[step].backward.start_ns for r in run.ranks)
    ms = lambda ns: ms_after(ns, t0)  # noqa: E731
    right = max(ms(max([r.steps[step].backward.end_ns] + [b.done_ns for b in r.steps[step].buckets])) for r in run.ranks)
    for ax, r in zip(axes[:, 0], run.ranks):
        st = r.steps[step]
        last = ms(st.backward.last_ready_ns)
        ax.vlines([ms(e.t_ns) for e in st.backward.ready], -0.35, 0.35, color="black", lw=0.8)
        for lane, b in enumerate(st.buckets, start=1):
            launch, done = ms(b.launch_ns), ms(b.done_ns)
            if launch < last:
                ax.broken_barh([(launch, min(done, last) - launch)], (lane - 0.35, 0.7), facecolors=DURING_COMPUTE)
            if done > last:
                ax.broken_barh([(max(launch, last), done - max(launch, last))], (lane - 0.35, 0.7),
                               facecolors=AFTER_COMPUTE)
            ax.text(done + 0.006 * right, lane, f"{done - launch:.1f} ms", fontsize=7, va="center", ha="left",
                    zorder=4, bbox=dict(facecolor="white", edgecolor="none", pad=0.3, alpha=0.85))
        ax.axvline(last, color=LAST_READY, lw=2)
        ax.axvline(ms(st.backward.end_ns), color=RETURNS, lw=2)
        labels = ["gradients ready"] + [f"bucket {b.index} ({b.bytes / MIB:.2f} MiB)" for b in st.buckets]
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.set_ylim(n_lanes - 0.5, -0.6)
        ax.set_title(f"rank {r.rank}: {len(st.buckets)} buckets, backward() returns "
                     f"{ms(st.backward.end_ns) - last:.1f} ms after its last gradient is ready", fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[0, 0].set_xlim(0, right * 1.08)   # room for the last bar's duration
    axes[-1, 0].set_xlabel("ms since the first rank started backward")
    handles = [Line2D([], [], color="black", lw=0.8, marker="|", ls="", ms=10, label="a gradient is ready"),
               Patch(color=DURING_COMPUTE, label="all-reduce in flight while backward computes"),
               Patch(color=AFTER_COMPUTE, label="all-reduce in flight after the last gradient"),
               Line2D([], [], color=LAST_READY, lw=2, label="last gradient ready (backward compute over)"),
               Line2D([], [], color=RETURNS, lw=2, label="backward() returns")]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle("One backward pass, one lane per bucket (the number beside a bar: its launch-to-completion time)",
                 fontsize=10)
    name_link(fig, run)
    return fig
