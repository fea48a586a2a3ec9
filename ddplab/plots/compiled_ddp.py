"""Figures of compiled DDP (notebook 11): when each gradient becomes ready, eager and compiled, with
DDPOptimizer's split marked, and the step per cap, eager against compiled."""

from __future__ import annotations

import matplotlib.pyplot as plt


def ready_times(table, split=None, title: str = ""):
    """Each parameter's ready time into backward (a `tables.compiled_ddp.ready_order` table), parameters
    in eager's ready order; compiled's points share the x of their parameter. With `split` (the compiled
    arm's `SplitBucket`s), each compiled graph's parameters get their own color band."""
    t = table.sort_values("eager_position")
    x = range(len(t))
    fig, ax = plt.subplots(figsize=(9, 3.6))
    if split:
        where = {p: i for i, b in enumerate(split) for p in b.params}
        for i, name in enumerate(t.index):
            if name in where:
                ax.axvspan(i - 0.5, i + 0.5, color=plt.cm.Pastel1(where[name] % 9), lw=0)
        ax.plot([], [], "s", color=plt.cm.Pastel1(0), label="band: the compiled graph (DDPOptimizer's bucket) it is in")
    ax.plot(x, t["eager_ms"], "o-", ms=3, lw=1, color="tab:blue", label="eager")
    ax.plot(x, t["compiled_ms"], "s", ms=4, color="tab:red", label="compiled (aot_eager)")
    ax.set_xlabel("parameter, in eager's ready order (last layers first)")
    ax.set_ylabel("ready, ms after backward starts")
    ax.set_title(title or "When each gradient is ready: eager, and under torch.compile", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def steps(table):
    """Per cap, the median step eager and compiled (a `tables.compiled_ddp.steps` table)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    x = range(len(table))
    ax.bar([i - 0.2 for i in x], table["eager_ms"], width=0.4, color="tab:blue", label="eager")
    ax.bar([i + 0.2 for i in x], table["compiled_ms"], width=0.4, color="tab:red", label="compiled")
    ax.set_xticks(list(x), [name.split(":", 1)[1].replace("/", "\n") for name in table.index], fontsize=8)
    ax.set_xlabel("bucket cap (MiB), and the optimize_ddp mode where not ddp_optimizer")
    ax.set_ylabel("ms per step (median)")
    ax.set_title("The step, eager and compiled, per bucket cap (compile time excluded)", fontsize=10)
    top = max(table["eager_ms"].max(), table["compiled_ms"].max())
    ax.set_ylim(0, top * 1.3)   # headroom: the legend sits above the tallest bar, never on it
    ax.legend(fontsize=8, ncol=2, loc="upper center")
    fig.tight_layout()
    return fig
