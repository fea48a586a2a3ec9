"""The profiler's view of one step on every rank (notebook 07): the lab's phases and every all-reduce,
one lane per thread of each rank, all aligned on the end of the barrier that starts the step
(`tables.traces`). Returns the Figure."""

from __future__ import annotations

from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..tables.traces import trace_events
from .canvas import name_link, subplots

PHASE_COLORS = {"barrier": "#d9d9d9", "forward": "#1f77b4", "backward": "#ff7f0e", "optimizer": "#2ca02c"}
PHASE_LABELS = {"barrier": "ddplab:barrier (waiting for every rank)", "forward": "ddplab:forward",
                "backward": "ddplab:backward", "optimizer": "ddplab:optimizer"}
ALL_REDUCE_COLORS = ("#d62728", "#ff9896")   # consecutive all-reduces alternate, so none hides the next
LAUNCH_COLOR = "black"
PAUSE_COLOR = "#6a3d9a"   # the injected pause
WAIT_COLOR = "black"     # a bucket waiting for its peer


def _lanes(events) -> list[tuple[int, str]]:
    """(rank, thread) per lane, top to bottom: each rank's main thread, then each other thread that has
    events in the step (gloo's workers, which run two all-reduces at once; a GPU stream), in the order
    they started work."""
    lanes = []
    for rank in sorted(events["rank"].unique()):
        lanes.append((rank, "main"))
        others = events[(events["rank"] == rank) & ~events["main_thread"]].sort_values("start_ms")
        lanes += [(rank, t) for t in dict.fromkeys(others["thread"])]
    return lanes


def _lane_label(rank: int, thread: str, lanes, events) -> str:
    """"main thread", or what the lane's thread is: a gloo worker (whatever the trace called the thread:
    gloo runs its collectives on threads of its own, and one Python started keeps Python's name), else
    the trace's name for it; numbered per rank in the order they started work."""
    if thread == "main":
        return f"rank {rank}\nmain thread"
    others = [t for r, t in lanes if r == rank and t != "main"]
    names = set(events.loc[(events["rank"] == rank) & (events["thread"] == thread), "name"])
    what = "gloo worker" if names and all(n.startswith("gloo:") for n in names) else thread.rsplit(" ", 1)[0]
    return f"rank {rank}\n{what} {others.index(thread) + 1}"


def _mark_pause(ax, run, events, y) -> None:
    """The injected straggler's pause (`Experiment.straggler`), where the trace shows it as a gap on the
    slow rank's main thread: before its backward (between forward and backward), or a late batch
    (between the barrier and the forward). A delay inside compute leaves no gap, so no mark."""
    straggler = getattr(run.spec, "straggler", None)
    if straggler is None or straggler.where not in ("before-backward", "data"):
        return
    mine = events[(events["rank"] == straggler.rank) & events["main_thread"]]
    spans = {k: mine[mine["kind"] == k] for k in ("barrier", "forward", "backward")}
    if straggler.where == "before-backward" and len(spans["forward"]) and len(spans["backward"]):
        start, end = spans["forward"]["end_ms"].iloc[0], spans["backward"]["start_ms"].iloc[0]
    elif straggler.where == "data" and len(spans["barrier"]) and len(spans["forward"]):
        start, end = spans["barrier"]["end_ms"].iloc[0], spans["forward"]["start_ms"].iloc[0]
    else:
        return
    lane = y[(straggler.rank, "main")]
    ax.annotate("", xy=(start, lane), xytext=(end, lane),
                arrowprops={"arrowstyle": "<->", "color": PAUSE_COLOR, "lw": 1.5, "shrinkA": 0, "shrinkB": 0})
    ax.text((start + end) / 2, lane - 0.12, f"rank {straggler.rank} pauses {end - start:.1f} ms (the straggler)",
            ha="center", va="bottom", fontsize=8.5, color=PAUSE_COLOR, fontweight="bold")


def _mark_waiting_bucket(ax, events, y) -> None:
    """The first all-reduce of the rank that launched first, on its worker lane, and the moment the last
    rank launched the same all-reduce (gloo matches collectives in launch order): the bucket waits on
    the worker thread from its start until the last rank has joined. Marked where that wait is more
    than 5% of the step's span (with ranks that launch together there is nothing to see)."""
    launches = events[(events["kind"] == "all_reduce") & events["main_thread"]]
    running = events[(events["kind"] == "all_reduce") & ~events["main_thread"]]
    if launches["rank"].nunique() < 2 or running.empty:
        return
    first = launches.groupby("rank")["start_ms"].min()
    early, late = first.idxmin(), first.idxmax()
    mine = running[running["rank"] == early].sort_values("start_ms")
    if mine.empty:
        return
    bucket = mine.iloc[0]
    joined = first[late]
    span = events["end_ms"].max() - events["start_ms"].min()
    if joined - bucket["start_ms"] < 0.05 * span:   # the ranks launched together: nothing worth marking
        return
    lane, peer = y[(early, bucket["thread"])], y[(late, "main")]
    tip = lane + 0.38 if lane < peer else lane - 0.38   # the bar's edge that faces the peer's launch marks
    ax.annotate("", xy=(joined, tip), xytext=(joined, peer - 0.5),
                arrowprops={"arrowstyle": "->", "color": WAIT_COLOR, "lw": 1.3, "ls": "--"})
    wait = f"first bucket: its all-reduce waits {joined - bucket['start_ms']:.1f} ms"
    _place_note(ax, f"{wait} for rank {late} to join (▼)", bucket, lane, joined, (lane + peer) / 2, 0.01 * span)


def _inside(ax, note, left: float, right: float) -> bool:
    """Whether `note`, as the figure is laid out now, lies between x = `left` and `right` (data)."""
    box = note.get_window_extent()
    lo, hi = (ax.transData.transform((x, 0))[0] for x in (left, right))
    return lo <= box.x0 and box.x1 <= hi


def _place_note(ax, text: str, bucket, lane: float, joined: float, mid: float, pad: float) -> None:
    """The waiting bucket's note, whole: white inside its bar where it fits there, else on a white ground
    beside the arrow, right of it or left of it, else on two lines. Measured on the laid-out figure: a note
    longer than its room would be cut at the bar's end or at the axes' edge, losing its unit."""
    ax.figure.draw_without_rendering()   # lay the figure out: the axes' width in pixels is known from here
    style = {"va": "center", "fontsize": 8.5, "fontweight": "bold", "clip_on": True}
    note = ax.text(bucket["start_ms"] + pad, lane, text, ha="left", color="white", **style)
    if _inside(ax, note, bucket["start_ms"], bucket["end_ms"]):
        return
    note.remove()
    style |= {"color": WAIT_COLOR, "bbox": {"facecolor": "white", "edgecolor": "none", "alpha": 0.85}}
    left, right = ax.get_xlim()
    lines = (text, text.replace(" for rank", "\nfor rank"))
    for words, ha in ((words, ha) for words in lines for ha in ("left", "right")):
        note = ax.text(joined + pad if ha == "left" else joined - pad, mid, words, ha=ha, **style)
        if _inside(ax, note, left, right):
            return
        note.remove()
    wide = "left" if right - joined > joined - left else "right"   # no room anywhere: the wider side, unclipped
    ax.text(joined + pad if wide == "left" else joined - pad, mid, lines[1], ha=wide, **style | {"clip_on": False})


def _names(events) -> str:
    return ", ".join(sorted(set(events["name"])))


def trace_timeline(run, step: int | None = None, detached: bool = False):
    """One profiled step (default: the last) of every rank: on each rank's main thread the barrier
    wait, forward, backward and optimizer step, with a triangle where an all-reduce is launched; below
    it one lane per thread that ran all-reduces (gloo's workers, or the GPU). t = 0 is where each rank
    left the step's barrier; a legend names every mark drawn."""
    events = trace_events(run)
    steps = sorted(int(k) for k in events["step"].unique())
    step = steps[-1] if step is None else step
    if step not in steps:
        raise ValueError(f"step {step} was not profiled in run {run.spec.name!r}; the profiled steps are {steps}")
    events = events[events["step"] == step]
    lanes = _lanes(events)
    y = {lane: i for i, lane in enumerate(lanes)}
    fig, ax = subplots((9, 0.55 * len(lanes) + 2.0), detached=detached)
    fig.set_layout_engine("constrained")
    shown = set()
    for (rank, thread), i in y.items():
        main = thread == "main"
        mine = events[(events["rank"] == rank) & (events["thread"] == thread)]
        for kind, color in PHASE_COLORS.items():
            bars = mine[mine["kind"] == kind]
            if not bars.empty:
                ax.broken_barh(list(zip(bars["start_ms"], bars["dur_ms"])), (i - 0.35, 0.7), facecolors=color,
                               edgecolor="white", linewidth=0.5)
                shown.add(kind)
        comm = mine[mine["kind"] == "all_reduce"]
        if main and not comm.empty:   # the op that hands the tensor to the backend: brief, so a mark
            ax.plot(comm["start_ms"], [i - 0.45] * len(comm), ls="", marker="v", color=LAUNCH_COLOR, ms=6)
            shown.add("launch")
        elif not comm.empty:
            for n, (start, dur) in enumerate(zip(comm["start_ms"], comm["dur_ms"])):
                ax.broken_barh([(start, dur)], (i - 0.35, 0.7), facecolors=ALL_REDUCE_COLORS[n % 2],
                               edgecolor="white", linewidth=0.5)
            shown.add("all_reduce")
    ax.axvline(0, color="black", lw=1, ls="--")
    for i in range(1, len(lanes)):   # a rule between ranks
        if lanes[i][0] != lanes[i - 1][0]:
            ax.axhline(i - 0.5, color="#969696", lw=0.8)
    ax.set_yticks(range(len(lanes)), [_lane_label(r, t, lanes, events) for r, t in lanes], fontsize=8)
    _mark_pause(ax, run, events, y)
    ax.set_ylim(len(lanes) - 0.4, -0.7)
    ax.set_xlabel("ms after the rank left the step's barrier (the barrier releases every rank at once)")
    ax.grid(axis="x", alpha=0.3)
    reduces = events[(events["kind"] == "all_reduce") & ~events["main_thread"]]
    ranks = events["rank"].nunique()
    per_rank = sorted(set(reduces.groupby("rank").size()))
    ax.set_title(f"step {step} on {ranks} ranks: {' or '.join(map(str, per_rank))} all-reduce(s) per rank, the longest "
                 f"{reduces['dur_ms'].max():.2f} ms" if not reduces.empty else
                 f"step {step} on {ranks} ranks: no all-reduce ran off the main thread", fontsize=9, loc="left")
    handles = [Patch(color=PHASE_COLORS[k], label=PHASE_LABELS[k]) for k in PHASE_COLORS if k in shown]
    launches = events[(events["kind"] == "all_reduce") & events["main_thread"]]
    if "launch" in shown:
        handles.append(Line2D([], [], ls="", marker="v", color=LAUNCH_COLOR, ms=6,
                              label=f"all-reduce launched ({_names(launches)})"))
    if "all_reduce" in shown:
        alternates = ";\nshade alternates" if reduces.groupby(["rank", "thread"]).size().max() > 1 else ""
        handles.append(Patch(color=ALL_REDUCE_COLORS[0], label=f"all-reduce running ({_names(reduces)}{alternates})"))
    handles.append(Line2D([], [], color="black", lw=1, ls="--", label="barrier released: t = 0 on every rank"))
    fig.legend(handles=handles, loc="outside upper center", ncol=3, fontsize=8, frameon=False)
    name_link(fig, run)
    _mark_waiting_bucket(ax, events, y)   # last: where its note fits depends on the figure's layout
    return fig
