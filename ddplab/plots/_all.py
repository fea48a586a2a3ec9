"""matplotlib figures of a `Run`. Each function returns the Figure; nothing here launches ranks.

Used by the notebooks.
"""

from __future__ import annotations

import statistics

import matplotlib.pyplot as plt

from .data import contiguous_spans

PHASES = ("data", "forward", "backward", "optimizer")


def _rank_colors(n: int):
    cmap = plt.get_cmap("tab10")
    return [cmap(i % 10) for i in range(n)]


def sample_ownership(run):
    """Which rank processed which global sample id: one row per rank, one bar per contiguous shard."""
    n = run.world_size
    fig, ax = plt.subplots(figsize=(9, 0.6 * n + 1.4))
    colors = _rank_colors(n)
    for r in run.ranks:
        spans = [(a, b - a + 1) for a, b in contiguous_spans(r.sample_ids)]  # (start, width)
        ax.broken_barh(spans, (r.rank - 0.4, 0.8), facecolors=colors[r.rank], edgecolor="white")
        for x, w in spans:
            ax.text(x + w / 2, r.rank, f"{x}-{x + w - 1}", ha="center", va="center", fontsize=8, color="white")
    g = run.spec.global_batch
    for s in range(run.spec.steps + 1):
        ax.axvline(s * g - 0.5, color="black", lw=1, ls="--")
    ax.set_yticks(range(n), [f"rank {r}" for r in range(n)])
    ax.invert_yaxis()
    ax.set_xlabel("global sample id (dashed lines: optimizer steps, each one global batch)")
    ax.set_title(f"{n} ranks share each global batch of {g} examples: disjoint shards, nothing missing")
    fig.tight_layout()
    return fig


def step_times(run):
    """Median time per phase of a step, stacked, one bar per rank."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    bottoms = [0.0] * run.world_size
    for phase, color in zip(PHASES, plt.get_cmap("Set2").colors):
        vals = [statistics.median(r.step_ms(phase)) for r in run.ranks]
        ax.bar(range(run.world_size), vals, bottom=bottoms, color=color, label=phase)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    ax.set_xticks(range(run.world_size), [f"rank {r.rank}" for r in run.ranks])
    ax.set_ylabel("median time per step (ms)")
    ax.set_title(f"Step time by phase ({run.ranks[0].backend} on {run.ranks[0].device})")
    ax.legend(ncol=4, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.tight_layout()
    return fig


def update_error(run):
    """Distance of each rank's parameters after step 0 from the single-process global-batch update:
    with DDP's averaged gradient, and with the rank's own gradient alone (log scale)."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ranks = [r.rank for r in run.ranks]
    ddp = [max(r.reference["update_rel_error"], 1e-12) for r in run.ranks]
    alone = [r.reference["independent"]["update_rel_error"] for r in run.ranks]
    w = 0.38
    ax.bar([x - w / 2 for x in ranks], ddp, w, label="DDP update (all-reduced gradient)")
    ax.bar([x + w / 2 for x in ranks], alone, w, label="independent update (own shard only)")
    ax.set_yscale("log")
    ax.set_ylim(1e-12, 10)
    ax.set_xticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylabel(r"$\|\theta - \theta_{ref}\| \,/\, \|\theta_{ref} - \theta_0\|$")
    ax.set_title("Distance from the one-process update on the whole global batch\n(bars at 1e-12 are exactly 0)")
    ax.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.tight_layout()
    return fig


def _floor(values, floor=1e-17):
    return [max(v, floor) for v in values]


def gradient_check(run):
    """Per rank: relative error of its local gradient and of the reduced gradient against the
    single-process reference (log scale; an exact match is drawn at the floor)."""
    from . import gradients

    rows = gradients.check(run)
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
    """One bar per run of `tables.normalization`: the reduced gradient's relative error (log scale)."""
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


def rank_weights(local_batches, seq_lens):
    """How much each rank's mean gradient counts under each loss normalization (pure, instant)."""
    from .gradients import rank_weights as weights

    norms = ("rank-mean", "global-sample", "global-token")
    n = len(local_batches)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    w = 0.27
    for k, norm in enumerate(norms):
        ax.bar([r + (k - 1) * w for r in range(n)], weights(local_batches, seq_lens, norm), w, label=norm)
    ax.set_xticks(range(n), [f"rank {r}\n{b} ex x {s} tok" for r, b, s in zip(range(n), local_batches, seq_lens)],
                  fontsize=8)
    ax.set_ylabel("weight of its mean gradient")
    ax.set_title("rank-mean weighs every rank equally;\nthe global objectives weigh each rank by its share of the work")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def scaling(strong, weak):
    """Examples/s and scaling efficiency against world size, for `tables.scaling` of each kind."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for df, label, color in ((strong, "strong (global batch fixed)", "tab:blue"),
                             (weak, "weak (local batch fixed)", "tab:orange")):
        ws = list(df.index)
        a.plot(ws, df["examples_per_s"], "o-", color=color, label=label)
        a.plot(ws, [df["examples_per_s"].iloc[0] * w for w in ws], ":", color=color, lw=1)
        b.plot(ws, df["efficiency"], "o-", color=color, label=label)
    a.set_xlabel("world size (ranks)")
    a.set_ylabel("examples / s")
    a.set_title("Throughput (dotted: ideal linear)")
    b.axhline(1.0, color="black", lw=1, ls=":")
    b.set_xlabel("world size (ranks)")
    b.set_ylabel("scaling efficiency")
    b.set_ylim(0, 1.2)
    b.set_title("Efficiency (1 = ideal)")
    for ax in (a, b):
        ax.set_xticks(list(strong.index))
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def batch_size_study(runs, target_loss: float, bin_examples: int = 64):
    """Global loss against examples seen and against optimizer steps, one line per global batch."""
    from .tables import loss_by_examples

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for run in runs:
        curve = loss_by_examples(run, bin_examples)
        g = run.spec.global_batch
        a.plot(curve.index, curve.values, "o-", ms=3, label=f"global batch {g}")
        b.plot([e / g for e in curve.index], curve.values, "o-", ms=3, label=f"global batch {g}")
    for ax, xlabel in ((a, "examples seen"), (b, "optimizer steps")):
        ax.axhline(target_loss, color="black", lw=1, ls="--")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"loss (mean over {bin_examples}-example bins)")
        ax.legend(fontsize=8)
    b.set_xlim(0, 2 * min(run.spec.steps for run in runs))
    a.set_title("Same examples: which batch size learned more?")
    b.set_title("Same steps: the bigger batch saw more data")
    fig.tight_layout()
    return fig


def allreduce_fit(table, model, title: str = ""):
    """All-reduce time against message size (log-log) with the fitted model, and the fit's relative
    residuals per size."""
    sizes = list(table.index)
    pred = [model.predict(n) * 1e3 for n in sizes]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.errorbar(sizes, table["ms"], yerr=[table["ms"] - table["ms_min"], table["ms_max"] - table["ms"]], fmt="o",
               ms=4, capsize=2, label="measured (median, min-max)")
    a.plot(sizes, pred, "-", label=f"fit: {model.alpha_s * 1e3:.2f} ms + n / {model.bandwidth_bytes_per_s / 1e9:.2f} GB/s"
           + (f", floor {model.floor_s * 1e3:.2f} ms" if model.floor_s else ""))
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_xlabel("message size (bytes)")
    a.set_ylabel("all_reduce time (ms)")
    a.set_title(title or "All-reduce time and the alpha-beta fit")
    a.legend(fontsize=8)
    res = [(p - t) / t * 100 for p, t in zip(pred, table["ms"])]
    b.axhline(0, color="black", lw=1)
    b.bar(range(len(sizes)), res, color=["tab:red" if abs(r) > 15 else "tab:blue" for r in res])
    b.set_xticks(range(len(sizes)), [_size_label(n) for n in sizes], rotation=60, fontsize=7)
    b.set_ylabel("(fit - measured) / measured (%)")
    b.set_title("Residuals (red: beyond 15%)")
    fig.tight_layout()
    return fig


def _size_label(n: int) -> str:
    for unit, scale in (("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def compute_vs_comm(table):
    """Compute time grows with the local batch; the gradient all-reduce does not."""
    fig, ax = plt.subplots(figsize=(7, 3.4))
    ax.plot(table.index, table["compute_ms"], "o-", label="forward + backward compute")
    ax.plot(table.index, table["allreduce_ms_predicted"], "s--", label="gradient all-reduce (fitted model)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("local batch (examples per rank)")
    ax.set_ylabel("ms per step")
    ax.set_title("The payload is fixed by the model; compute grows with the local batch")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


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
    t0 = min(r.steps[step]["readiness"]["backward_start_ns"] for r in run.ranks)
    ms = lambda ns: (ns - t0) / 1e6
    colors = plt.get_cmap("tab10")
    for r in run.ranks:
        st = r.steps[step]
        y = r.rank
        ax.vlines([ms(t) for _, t in st["readiness"]["ready"]], y + 0.05, y + 0.35, color="black", lw=0.8,
                  label="gradient ready" if y == 0 else None)
        for b in st["buckets"]:
            ax.barh(y - 0.2, ms(b["done_ns"]) - ms(b["launch_ns"]), left=ms(b["launch_ns"]), height=0.3,
                    color=colors(b["index"] % 10), alpha=0.8, edgecolor="black", lw=0.5)
        end_compute = ms(st["readiness"]["ready"][-1][1])
        ax.plot([end_compute] * 2, [y - 0.45, y + 0.45], color="tab:green", lw=2,
                label="last gradient ready" if y == 0 else None)
        ax.plot([ms(st["readiness"]["backward_end_ns"])] * 2, [y - 0.45, y + 0.45], color="tab:red", lw=2,
                label="backward() returns" if y == 0 else None)
    ax.set_yticks(range(run.world_size), [f"rank {r}" for r in range(run.world_size)])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first rank started backward (bars: bucket all-reduces, launch to completion)")
    ax.set_title("One backward pass: communication overlaps compute until the last bucket")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig
