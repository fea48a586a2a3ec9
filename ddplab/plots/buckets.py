"""Figures of buckets and overlap (notebook 05): simulated (and measured) bucket timelines, a bucket
sweep measured against the simulator, and the ready curve every plan is cut from."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from ..units import MIB
from . import canvas

BUCKET_COLORS = ("#1f77b4", "#6baed6")
MEASURED_COLORS = ("#2ca02c", "#98df8a")
TAIL_COLOR = "#d62728"
MODEL_STYLE = {"textbook": dict(marker="s", ls="--", color="#7f7f7f"),
               "shared_core": dict(marker="^", ls=":", color="#9467bd"),
               "calibrated": dict(marker="o", ls="-", color="#1f77b4")}


def _draw(ax, s, measured=None, title: str = ""):
    """Lanes: backward compute, predicted all-reduces, and (if given) measured all-reduces."""
    lanes = ["backward", "all-reduce\n(predicted)"] + (["all-reduce\n(measured)"] if measured else [])
    y = {name: i for i, name in enumerate(lanes)}
    ax.broken_barh([(0, s.backward_ms)], (y["backward"] - 0.35, 0.7), facecolors="#bdbdbd")
    for b in s.buckets:
        ax.plot([b.ready_ms], [y["backward"] + 0.42], marker="v", color="black", ms=4)
        c = BUCKET_COLORS[b.index % 2]
        lane = y["all-reduce\n(predicted)"]
        if b.start_ms > b.ready_ms:  # waiting for the channel
            ax.plot([b.ready_ms, b.start_ms], [lane, lane], color=c, lw=1, ls=":")
        ax.broken_barh([(b.start_ms, b.finish_ms - b.start_ms)], (lane - 0.35, 0.7), facecolors=c, edgecolor="white")
    if s.exposed_tail_ms > 0:
        ax.axvspan(s.backward_ms, s.comm_end_ms, color=TAIL_COLOR, alpha=0.15)
        ax.text(s.comm_end_ms, y["backward"], f" exposed tail {s.exposed_tail_ms:.1f} ms", color=TAIL_COLOR,
                fontsize=8, va="center", ha="left")
    if measured:
        lane = y["all-reduce\n(measured)"]
        for b in measured["buckets"]:
            ax.broken_barh([(b["launch_ms"], b["done_ms"] - b["launch_ms"])], (lane - 0.35, 0.7),
                           facecolors=MEASURED_COLORS[b["index"] % 2], edgecolor="white", alpha=0.8)
        ax.axvline(measured["backward_ms"], color="#2ca02c", lw=1.2, ls="--")
    ax.set_yticks(range(len(lanes)), lanes, fontsize=8)
    ax.set_ylim(-0.6, len(lanes) - 0.4)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=9, loc="left")
    ax.grid(axis="x", alpha=0.3)


def timeline(s, measured=None, title: str = "", detached: bool = False):
    """One simulated step from the start of backward: backward compute (grey; triangles: a bucket's
    last gradient is ready), each bucket's all-reduce on the channel, the exposed tail in red; with
    `measured` (tables.bucket_sweep.measured_timeline) the real buckets and backward's return (dashed) below.
    `detached`: drawn outside pyplot (the bucket slider's callback displays it)."""
    fig, ax = canvas.subplots((9, 2.6 if measured else 2.1), detached=detached)
    _draw(ax, s, measured, title)
    ax.set_xlabel("ms after backward started")
    fig.tight_layout()
    return fig


def timelines(schedules: dict, measured: dict | None = None):
    """Several plans' simulated steps, one panel each, on a shared time axis."""
    measured = measured or {}
    heights = [3 if measured.get(k) else 2 for k in schedules]
    fig, axes = plt.subplots(len(schedules), 1, figsize=(9, 0.75 * sum(heights) + 0.8), sharex=True,
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (name, s) in zip(axes[:, 0], schedules.items()):
        _draw(ax, s, measured.get(name), f"{name}: {len(s.buckets)} bucket(s), predicted step {s.step_ms:.0f} ms")
    axes[-1, 0].set_xlabel("ms after backward started")
    handles = [Patch(color="#bdbdbd", label="backward compute"), Patch(color=BUCKET_COLORS[0], label="all-reduce (predicted)"),
               Patch(color=TAIL_COLOR, alpha=0.15, label="exposed tail")]
    if measured:
        handles.append(Patch(color=MEASURED_COLORS[0], label="all-reduce (measured)"))
    fig.legend(handles=handles, loc="upper right", fontsize=8, ncol=len(handles), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    return fig


def sweep_comparison(table, title: str = ""):
    """Top: measured step time per plan (median of round medians; bar: run-to-run spread) against each
    model's prediction. Bottom: each model's error per plan, with the 5% and 10% bands."""
    models = [m for m in MODEL_STYLE if f"{m}_ms" in table]
    t = table.sort_values("buckets", ascending=False)
    x = range(len(t))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.4), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    top.errorbar(x, t["measured_ms"], yerr=t["spread_ms"], fmt="o", color="black", ms=7, capsize=4,
                 label="measured (median; bar: spread)", zorder=5)
    for m in models:
        top.plot(x, t[f"{m}_ms"], label=m.replace("_", " "), ms=6, **MODEL_STYLE[m])
    cal = [i for i, c in enumerate(t["calibration_point"]) if c]
    for i in cal:
        top.annotate("calibrated here", (i, t["measured_ms"].iloc[i]), textcoords="offset points", xytext=(0, 14),
                     ha="center", fontsize=8)
    top.set_ylabel("step time (ms)")
    top.legend(fontsize=8, loc="upper right")
    top.grid(alpha=0.3)
    top.set_title(title or "bucket sweep: measured step time against the simulator", fontsize=10)
    width = 0.8 / max(len(models), 1)
    for k, m in enumerate(models):
        bottom.bar([i - 0.4 + width * (k + 0.5) for i in x], 100 * t[f"{m}_error"], width,
                   color=MODEL_STYLE[m]["color"], label=m.replace("_", " "))
    for v, ls in ((5, "--"), (10, ":")):
        for sign in (1, -1):
            bottom.axhline(sign * v, color="black", lw=0.8, ls=ls)
    bottom.axhline(0, color="black", lw=0.8)
    bottom.set_ylabel("error (%)\npredicted vs measured")
    bottom.set_xticks(list(x), [f"{p}\n{n} bkt" for p, n in zip(t.index, t["buckets"])], fontsize=8)
    bottom.legend(fontsize=8, ncol=len(models), loc="lower left")
    bottom.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def ready_curve(ins, title: str = ""):
    """Gradient bytes ready against time in a backward with no communication: the raw material every
    bucket plan is cut from (first and last gradients named)."""
    fig, ax = plt.subplots(figsize=(9, 3.2))
    t = [0.0] + [g.ready_ms for g in ins.grads]
    mib = [0.0]
    for g in ins.grads:
        mib.append(mib[-1] + g.bytes / MIB)
    ax.step(t, mib, where="post", color="#1f77b4")
    ax.plot(t[1:], mib[1:], "o", ms=3, color="#1f77b4")
    ax.axvline(ins.backward_ms, color="black", ls="--", lw=1)
    ax.text(ins.backward_ms, 0.02 * mib[-1], " backward ends", fontsize=8, va="bottom")
    first, last = ins.grads[0], ins.grads[-1]
    ax.annotate(f"first: {first.name}", (first.ready_ms, mib[1]), textcoords="offset points", xytext=(10, -14), fontsize=8)
    ax.annotate(f"last: {last.name}", (last.ready_ms, mib[-1]), textcoords="offset points", xytext=(-10, -16),
                ha="right", fontsize=8)
    ax.set_xlabel("ms after backward started (no communication)")
    ax.set_ylabel("gradient MiB ready")
    ax.set_title(title or f"{len(ins.grads)} gradients, {mib[-1]:.1f} MiB, ready over {ins.backward_ms:.0f} ms of backward",
                 fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
