"""Figures of gradient readiness (notebook 04): ready position against source position, and one
backward per rank with its gradients ready and its buckets in flight."""

from __future__ import annotations

import matplotlib.pyplot as plt

from ..units import ms_after


def ready_order(tables_by_case: dict):
    """Ready position against source position, one panel per case; the dashed line is the naive
    assumption (backward runs in exactly reverse source order)."""
    n = len(tables_by_case)
    fig, axes = plt.subplots(1, n, figsize=(3.2 * n, 3.4), squeeze=False)
    for ax, (case, t) in zip(axes[0], tables_by_case.items()):
        ok = t["as_assumed"]
        ax.plot(t["source_position"], t["reverse_source_position"], "--", color="gray", lw=1)
        ax.scatter(t["source_position"][ok], t["ready_position"][ok], s=14, color="tab:blue", label="as assumed")
        ax.scatter(t["source_position"][~ok], t["ready_position"][~ok], s=22, color="tab:red", label="not as assumed")
        ax.set_title(f"{case}: {int((~ok).sum())} of {len(t)} differ", fontsize=9)
        ax.set_xlabel("source position")
    axes[0][0].set_ylabel("ready position")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def backward_timeline(run, step: int = -1):
    """Per rank, one backward: a tick per gradient ready, a bar per bucket from launch to completion,
    the last gradient ready (end of backward compute) and backward()'s return."""
    fig, ax = plt.subplots(figsize=(10, 0.9 * run.world_size + 1.6))
    t0 = min(r.steps[step].backward.start_ns for r in run.ranks)
    ms = lambda ns: ms_after(ns, t0)  # noqa: E731
    colors = plt.get_cmap("tab10")
    for r in run.ranks:
        st = r.steps[step]
        y = r.rank
        ax.vlines([ms(e.t_ns) for e in st.backward.ready], y + 0.05, y + 0.35, color="black", lw=0.8,
                  label="gradient ready" if y == 0 else None)
        for b in st.buckets:
            ax.barh(y - 0.2, ms(b.done_ns) - ms(b.launch_ns), left=ms(b.launch_ns), height=0.3,
                    color=colors(b.index % 10), alpha=0.8, edgecolor="black", lw=0.5)
        end_compute = ms(st.backward.last_ready_ns)
        ax.plot([end_compute] * 2, [y - 0.45, y + 0.45], color="tab:green", lw=2,
                label="last gradient ready" if y == 0 else None)
        ax.plot([ms(st.backward.end_ns)] * 2, [y - 0.45, y + 0.45], color="tab:red", lw=2,
                label="backward() returns" if y == 0 else None)
    ax.set_yticks(range(run.world_size), [f"rank {r}" for r in range(run.world_size)])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first rank started backward (bars: bucket all-reduces, launch to completion)")
    ax.set_title("One backward pass: communication overlaps compute until the last bucket")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig
