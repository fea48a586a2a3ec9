"""Figures of communication (notebooks 03 and 05): all-reduce time against message size with the
alpha-beta fit and its residuals, and compute against communication as the local batch grows."""

from __future__ import annotations

import matplotlib.pyplot as plt

from ..units import rel_error, size_label


def allreduce_fit(table, model, title: str = ""):
    """All-reduce time against message size (log-log) with the fitted model, and the fit's relative
    residuals per size."""
    sizes = list(table.index)
    pred = [model.predict(n) * 1e3 for n in sizes]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.errorbar(sizes, table["ms"], yerr=[table["ms"] - table["ms_min"], table["ms_max"] - table["ms"]], fmt="o",
               ms=4, capsize=2, label="measured (median, min-max)")
    a.plot(sizes, pred, "-", label=f"fit: {model.alpha_s * 1e3:.2f} ms + S / {model.bandwidth_bytes_per_s / 1e9:.2f} GB/s"
           + (f", floor {model.floor_s * 1e3:.2f} ms" if model.floor_s else ""))
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_xlabel("message size (bytes)")
    a.set_ylabel("all_reduce time (ms)")
    a.set_title(title or "All-reduce time and the alpha-beta fit")
    a.legend(fontsize=8)
    res = [rel_error(p, t) * 100 for p, t in zip(pred, table["ms"])]
    b.axhline(0, color="black", lw=1)
    b.bar(range(len(sizes)), res, color=["tab:red" if abs(r) > 15 else "tab:blue" for r in res])
    b.set_xticks(range(len(sizes)), [size_label(n) for n in sizes], rotation=60, fontsize=7)
    b.set_ylabel("(fit - measured) / measured (%)")
    b.set_title("Residuals (red: beyond 15%)")
    fig.tight_layout()
    return fig


def compute_vs_comm(table):
    """Compute time per local batch (median, min-max over steps) against the gradient all-reduce,
    measured at the gradient's size and as the fit predicts it: the same at every local batch."""
    fig, ax = plt.subplots(figsize=(7, 3.4))
    med = table["compute_ms"]
    ax.errorbar(table.index, med, yerr=[med - table["compute_ms_min"], table["compute_ms_max"] - med], fmt="o-",
                capsize=3, label="forward + backward compute (median, min-max over steps)")
    ax.plot(table.index, table["allreduce_ms"], "s-", label="gradient all-reduce, measured at its size")
    ax.plot(table.index, table["allreduce_ms_fit"], ":", color="gray", label="gradient all-reduce, fitted model")
    for b, ratio in table["compute_to_comm"].items():
        ax.annotate(f"{ratio:.1f}x", (b, med[b]), textcoords="offset points", xytext=(6, -12), fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("local batch (examples per rank)")
    ax.set_ylabel("ms per step")
    ax.set_title("Compute per step against the gradient's all-reduce (labels: compute / all-reduce)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
