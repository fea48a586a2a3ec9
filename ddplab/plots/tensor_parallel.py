"""Figures of tensor parallelism (notebook 09): per layer, the step time of the dense layer, the split
layer and DDP, with the part spent in communication marked. Numbers from `tables/tensor_parallel.py`."""

from __future__ import annotations

from matplotlib.patches import Patch

from ..tables.tensor_parallel import timing
from .canvas import name_link, subplots

WAYS = {"dense": "#7f7f7f", "tensor parallel": "#1f77b4", "ddp": "#2ca02c"}


def _title(run: str, part) -> str:
    """What the panel shows, counted from the run: '...: the split step slower than dense in 3 of 3 layers'."""
    verdicts = part.xs("tensor parallel", level="way")["verdict"].tolist()
    ranks = int(part["ranks"].iloc[0])
    counts = {v: verdicts.count(v) for v in dict.fromkeys(verdicts)}
    found = ", ".join(f"{v} in {n} of {len(verdicts)} layers" for v, n in counts.items())
    return f"{run} ({ranks} ranks): the split step {found}"


def step_times(runs, detached: bool = False):
    """One panel per tensor-parallel run: for every layer a bar per way of running it (median step,
    forward + backward, of the slowest rank; the whisker spans min to max), the hatched part the
    communication the step waited for: tensor parallelism's all-reduces on the critical path, and
    DDP's exposed tail (backward's time after its last gradient was ready, waiting for the
    all-reduce)."""
    table = timing(runs)
    names = list(dict.fromkeys(table.index.get_level_values("run")))
    layers = [list(dict.fromkeys(table.loc[n].index.get_level_values("layer"))) for n in names]
    fig, axes = subplots((8.5, 1.1 + 0.9 * sum(len(x) for x in layers)), nrows=len(names), squeeze=False,
                         detached=detached, gridspec_kw={"height_ratios": [len(x) for x in layers]})
    fig.set_layout_engine("constrained")
    for ax, name, these in zip(axes[:, 0], names, layers):
        part = table.loc[name]
        for i, layer in enumerate(these):
            for j, (way, color) in enumerate(WAYS.items()):
                row = part.loc[(layer, way)]
                y = i + (j - 1) * 0.27
                ax.barh(y, row["step_ms"], height=0.25, color=color, alpha=0.85,
                        xerr=[[row["step_ms"] - row["step_ms_min"]], [row["step_ms_max"] - row["step_ms"]]],
                        error_kw={"elinewidth": 0.8, "capsize": 2})
                waited = row["comm_ms"] if way == "tensor parallel" else \
                    row["exposed_ms"] if way == "ddp" else 0.0
                if waited:
                    ax.barh(y, min(waited, row["step_ms"]), height=0.25, fill=False, hatch="///",
                            edgecolor="black", lw=0)
        ax.set_yticks(range(len(these)), these)
        ax.invert_yaxis()
        ax.set_xlabel("step time, ms (forward + backward, slowest rank)")
        ax.set_title(_title(name, part), loc="left", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=c, label=w) for w, c in WAYS.items()]
    handles.append(Patch(fill=False, hatch="///", label="waiting for communication"))
    fig.legend(handles=handles, loc="outside upper center", ncol=len(handles), fontsize=8.5, frameon=False)
    name_link(fig, runs)
    return fig
