"""Figures of buckets and overlap (notebook 05): simulated (and measured) bucket timelines, a bucket
sweep measured against the simulator, and the ready curve every plan is cut from."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..units import MIB
from . import canvas

BUCKET_COLORS = ("#1f77b4", "#6baed6")
MEASURED_COLORS = ("#2ca02c", "#98df8a")
BACKWARD_COLOR = "#bdbdbd"
TAIL_COLOR = "#d62728"
WAIT_COLOR = "#08306b"
MODEL_STYLE = {"textbook": dict(marker="s", ls="--", color="#7f7f7f"),
               "shared_core": dict(marker="^", ls=":", color="#9467bd"),
               "calibrated": dict(marker="o", ls="-", color="#1f77b4")}
PREDICTED, MEASURED = "all-reduce\n(predicted)", "all-reduce\n(measured)"


def _right_ms(s, measured=None) -> float:
    """The latest time a panel draws: the end of backward or of the last all-reduce, predicted or measured."""
    ends = [s.backward_ms, s.comm_end_ms]
    if measured:
        ends += [measured["backward_ms"]] + [b["done_ms"] for b in measured["buckets"]]
    return max(ends)


def _rows(spans) -> list[int]:
    """A row for each (launch_ms, done_ms) span, in launch order, such that no two spans on a row overlap
    (first fit): gloo runs two all-reduces at once and a launched bucket may queue, so measured spans
    overlap, and on one row the later would hide the earlier."""
    ends: list[float] = []
    rows = []
    for launch, done in spans:
        row = next((i for i, end in enumerate(ends) if end <= launch), len(ends))
        ends[row:row + 1] = [done]
        rows.append(row)
    return rows


def _draw(ax, s, measured=None, title: str = ""):
    """Lanes: backward compute, predicted all-reduces, and (if given) measured all-reduces; the title
    ends with the predicted exposed tail (no text inside the axes, so none can run off the edge)."""
    lanes = ["backward", PREDICTED] + ([MEASURED] if measured else [])
    y = {name: i for i, name in enumerate(lanes)}
    ax.broken_barh([(0, s.backward_ms)], (y["backward"] - 0.35, 0.7), facecolors=BACKWARD_COLOR)
    ax.plot([b.ready_ms for b in s.buckets], [y["backward"] + 0.42] * len(s.buckets), ls="", marker="v",
            color="black", ms=4)
    for b in s.buckets:
        c = BUCKET_COLORS[b.index % 2]
        if b.start_ms > b.ready_ms:  # waiting for the channel: drawn above the lane, where no bar hides it
            ax.plot([b.ready_ms, b.start_ms], [y[PREDICTED] - 0.43] * 2, color=WAIT_COLOR, lw=1.5, ls=":")
        ax.broken_barh([(b.start_ms, b.finish_ms - b.start_ms)], (y[PREDICTED] - 0.35, 0.7), facecolors=c,
                       edgecolor="white")
    if s.exposed_tail_ms > 0:
        ax.axvspan(s.backward_ms, s.comm_end_ms, color=TAIL_COLOR, alpha=0.15)
    if measured:
        spans = sorted((b["launch_ms"], b["done_ms"]) for b in measured["buckets"])
        rows = _rows(spans)
        height, drawn = 0.76 / (max(rows, default=0) + 1), {}
        for (launch, done), row in zip(spans, rows):   # a row's neighbours alternate shades, so each one shows
            drawn[row] = drawn.get(row, -1) + 1
            ax.broken_barh([(launch, done - launch)], (y[MEASURED] - 0.38 + row * height, height),
                           facecolors=MEASURED_COLORS[drawn[row] % 2], edgecolor="white", linewidth=0.5)
        ax.axvline(measured["backward_ms"], color=MEASURED_COLORS[0], lw=1.2, ls="--")
    ax.set_yticks(range(len(lanes)), lanes, fontsize=8)
    ax.set_ylim(len(lanes) - 0.4, -0.6)
    tail = f"predicted exposed tail {s.exposed_tail_ms:.1f} ms" if s.exposed_tail_ms > 0 else "no predicted exposed tail"
    ax.set_title(f"{title}; {tail}" if title else tail, fontsize=9, loc="left")
    ax.grid(axis="x", alpha=0.3)


def _legend(fig, schedules, measured: bool):
    """One entry per mark the panels show (the waiting line and the tail only where some panel has them)."""
    handles = [Patch(color=BACKWARD_COLOR, label="backward compute (predicted)"),
               Line2D([], [], ls="", marker="v", color="black", ms=5, label="bucket launched (its last gradient ready)"),
               Patch(color=BUCKET_COLORS[0], label="all-reduce, predicted (shade alternates)")]
    if any(b.start_ms > b.ready_ms for s in schedules for b in s.buckets):
        handles.append(Line2D([], [], ls=":", lw=1.5, color=WAIT_COLOR, label="launched, waiting for the bucket ahead"))
    if any(s.exposed_tail_ms > 0 for s in schedules):
        handles.append(Patch(color=TAIL_COLOR, alpha=0.15, label="exposed tail: all-reduce after backward"))
    if measured:
        handles += [Patch(color=MEASURED_COLORS[0],
                          label="all-reduce, measured (rank 0, median step;\noverlapping buckets on separate rows)"),
                    Line2D([], [], ls="--", lw=1.2, color=MEASURED_COLORS[0], label="backward() returned, measured")]
    fig.legend(handles=handles, loc="outside upper center", ncol=3, fontsize=8, frameon=False)


def timeline(s, measured=None, title: str = "", detached: bool = False):
    """One simulated step from the start of backward: backward compute (grey; triangles: a bucket's
    last gradient is ready), each bucket's all-reduce on the channel, the exposed tail in red; with
    `measured` (tables.bucket_sweep.measured_timeline) the real buckets and backward's return (dashed) below;
    a legend names every mark. `detached`: drawn outside pyplot (the bucket slider's callback displays it)."""
    fig, ax = canvas.subplots((9, 3.4 if measured else 2.8), detached=detached)
    fig.set_layout_engine("constrained")
    _draw(ax, s, measured, title)
    ax.set_xlim(0, 1.03 * _right_ms(s, measured))
    ax.set_xlabel("ms after backward started")
    _legend(fig, [s], bool(measured))
    return fig


def timelines(schedules: dict, measured: dict | None = None, link=None):
    """Several plans' simulated steps, one panel each, on a shared time axis, under one legend; `link`
    (the run whose costs the model fitted, or a caption) is named under the figure."""
    measured = measured or {}
    heights = [3 if measured.get(k) else 2 for k in schedules]
    fig, axes = plt.subplots(len(schedules), 1, figsize=(9, 0.75 * sum(heights) + 1.4), sharex=True,
                             gridspec_kw={"height_ratios": heights}, squeeze=False, layout="constrained")
    for ax, (name, s) in zip(axes[:, 0], schedules.items()):
        _draw(ax, s, measured.get(name), f"{name}: {len(s.buckets)} bucket(s), predicted step {s.step_ms:.0f} ms")
    axes[0, 0].set_xlim(0, 1.03 * max(_right_ms(s, measured.get(k)) for k, s in schedules.items()))
    axes[-1, 0].set_xlabel("ms after backward started")
    _legend(fig, schedules.values(), any(measured.get(k) for k in schedules))
    canvas.name_link(fig, link)
    return fig


def sweep_comparison(table, title: str = "", link=None):
    """Top: measured step time per plan (median of round medians; bar: run-to-run spread) against each
    model's prediction. Bottom: each model's error per plan, with the 5% and 10% bands. Legends sit
    beside the panels, so no bar hides under one. `link` (the sweep's run, or a caption) is named under it."""
    models = [m for m in MODEL_STYLE if f"{m}_ms" in table]
    t = table.sort_values("buckets", ascending=False)
    x = range(len(t))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.6), sharex=True, gridspec_kw={"height_ratios": [3, 2]},
                                      layout="constrained")
    top.errorbar(x, t["measured_ms"], yerr=t["spread_ms"], fmt="o", color="black", ms=7, capsize=4,
                 label="measured (median;\nbar: spread)", zorder=5)
    for m in models:
        top.plot(x, t[f"{m}_ms"], label=f"{m.replace('_', ' ')} model", ms=6, **MODEL_STYLE[m])
    cal = [i for i, c in enumerate(t["calibration_point"]) if c]
    for i in cal:
        top.annotate("calibrated here", (i, t["measured_ms"].iloc[i] + t["spread_ms"].iloc[i]),
                     textcoords="offset points", xytext=(0, 8), ha="center", fontsize=8)
    top.margins(y=0.15)   # room above the highest bar for its note
    top.set_ylabel("step time (ms)")
    top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    top.grid(alpha=0.3)
    top.set_title(title or "bucket sweep: measured step time against the simulator", fontsize=10)
    width = 0.8 / max(len(models), 1)
    for k, m in enumerate(models):
        bottom.bar([i - 0.4 + width * (k + 0.5) for i in x], 100 * t[f"{m}_error"], width,
                   color=MODEL_STYLE[m]["color"], label=m.replace("_", " "))
    for v, ls in ((5, "--"), (10, ":")):
        for sign in (1, -1):
            bottom.axhline(sign * v, color="black", lw=0.8, ls=ls, label=f"\u00b1{v}% band" if sign > 0 else None)
    bottom.axhline(0, color="black", lw=0.8)
    bottom.set_ylabel("error (%)\npredicted vs measured")
    bottom.set_xticks(list(x), [f"{p}\n{n} bkt" for p, n in zip(t.index, t["buckets"])], fontsize=8)
    bottom.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    bottom.grid(axis="y", alpha=0.3)
    canvas.name_link(fig, link)
    return fig


def ready_curve(ins, title: str = ""):
    """Gradient bytes ready against time in a backward with no communication: the raw material every
    bucket plan is cut from (first and last gradients named)."""
    fig, ax = plt.subplots(figsize=(9, 3.4), layout="constrained")
    t = [0.0] + [g.ready_ms for g in ins.grads]
    mib = [0.0]
    for g in ins.grads:
        mib.append(mib[-1] + g.bytes / MIB)
    ax.step(t, mib, where="post", color="#1f77b4", label="gradient MiB ready so far")
    ax.plot(t[1:], mib[1:], "o", ms=3, color="#1f77b4", label="one gradient ready")
    ax.axvline(ins.backward_ms, color="black", ls="--", lw=1, label="backward ends")
    first, last = ins.grads[0], ins.grads[-1]
    ax.annotate(f"first: {first.name}", (first.ready_ms, mib[1]), textcoords="offset points", xytext=(10, -14), fontsize=8)
    ax.annotate(f"last: {last.name}", (last.ready_ms, mib[-1]), textcoords="offset points", xytext=(-10, -16),
                ha="right", fontsize=8)
    ax.set_xlabel("ms after backward started (no communication)")
    ax.set_ylabel("gradient MiB ready")
    ax.set_title(title or f"{len(ins.grads)} gradients, {mib[-1]:.1f} MiB, ready over {ins.backward_ms:.0f} ms of backward",
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    return fig
