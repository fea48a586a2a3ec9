"""Figures of compiled DDP (notebook 11): when each gradient becomes ready, eager and compiled, with
DDPOptimizer's split marked, and the step per cap, eager against compiled."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np


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
    """Per compiled arm, the median step eager and compiled, whiskers from each one's first to third
    quartile over the paired steps, and above each pair this run's finding on compiled against eager
    with its interval (a `tables.compiled_ddp.steps` table)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6), layout="constrained")
    x = np.arange(len(table))
    for kind, shift, color in (("eager", -0.2, "tab:blue"), ("compiled", 0.2, "tab:red")):
        median = table[f"{kind}_ms"]
        ax.bar(x + shift, median, width=0.4, color=color, label=kind, capsize=4, error_kw={"lw": 1},
               yerr=[median - table[f"{kind}_q1_ms"], table[f"{kind}_q3_ms"] - median])
    top = table[["eager_q3_ms", "compiled_q3_ms"]].max(axis=1)
    for i, (arm, row) in enumerate(table.iterrows()):
        ax.annotate(f"compiled - eager: {row['interval_ms']} ms\ncompiled faster? {row['compiled faster?']}",
                    (i, top[arm]), xytext=(0, 6), textcoords="offset points", ha="center", va="bottom", fontsize=7.5)
    arms = [name.split(":", 1)[1] for name in table.index]   # "2", or "1/no_optimization" in another mode
    ax.set_xticks(list(x), [arm.replace("/", "\n") for arm in arms], fontsize=8)
    ax.set_xlabel("bucket cap (MiB)" + (", and the optimize_ddp mode where not ddp_optimizer"
                                        if any("/" in arm for arm in arms) else ""))
    ax.set_ylabel("ms per step")
    ax.set_title("The step, eager and compiled, per bucket cap (compile time excluded)", fontsize=10)
    ax.set_ylim(0, top.max() * 1.3)   # headroom for the findings above the whiskers
    fig.legend(loc="outside lower center", ncol=2, fontsize=8, frameon=False,
               title="bars: median step; whiskers: interquartile range of the paired steps", title_fontsize=8)
    return fig
