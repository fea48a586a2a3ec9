"""The figures of notebooks 04 and 05: every bucket's all-reduce stays visible,
every mark has a legend entry, and no text runs outside the figure or warns while it is laid out."""

import warnings
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from ddplab import plots  # noqa: E402
from ddplab.predict.buckets import Cost, Grad  # noqa: E402
from ddplab.predict.comm import AlphaBeta  # noqa: E402
from ddplab.tables import bucket_sweep, buckets  # noqa: E402

MS = 1_000_000
INS = bucket_sweep.Inputs([Grad(f"p{i}", 2 ** 20, 5.0 * (i + 1)) for i in range(8)], backward_ms=42.0,
                          forward_ms=20.0, optimizer_ms=3.0)
SLOW_LINK = Cost(AlphaBeta(1e-3, 1e-8))   # 1 MiB takes ~11 ms: buckets queue behind each other


def legend_labels(fig) -> list[str]:
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


def texts_outside_the_figure(fig) -> list[str]:
    """Every text drawn beyond the figure's edges (a clipped label), once the figure is laid out."""
    FigureCanvasAgg(fig).draw()
    renderer, box = fig.canvas.get_renderer(), fig.bbox
    drawn = [t for ax in fig.axes if ax.get_visible() for t in ax.xaxis.get_ticklabels() + ax.yaxis.get_ticklabels()
             if t.get_visible() and t.get_text() and _in_view(ax, t)]
    drawn += [t for t in fig.findobj(Text) if t.get_visible() and t.get_text() and not _is_tick_label(t)
              and (t.axes is None or t.axes.get_visible())]
    outside = []
    for t in drawn:
        e = t.get_window_extent(renderer)
        if e.x0 < box.x0 - 1 or e.x1 > box.x1 + 1 or e.y0 < box.y0 - 1 or e.y1 > box.y1 + 1:
            outside.append(t.get_text())
    return outside


def _is_tick_label(t) -> bool:
    return any(t in ax.xaxis.get_ticklabels() + ax.yaxis.get_ticklabels() for ax in t.figure.axes)


def _in_view(ax, t) -> bool:
    """A tick label is drawn only when its tick lies within the axis limits."""
    x, y = t.get_position()
    if t in ax.xaxis.get_ticklabels():
        lo, hi = sorted(ax.get_xlim())
        return lo - 1e-9 <= x <= hi + 1e-9
    lo, hi = sorted(ax.get_ylim())
    return lo - 1e-9 <= y <= hi + 1e-9


def fake_run():
    """Two ranks, three buckets each, in flight at the same time (the case overlapping bars hid)."""
    def step(offset):
        ready = [SimpleNamespace(t_ns=(offset + t) * MS) for t in (1, 2, 4, 6, 9)]
        bks = [SimpleNamespace(index=i, bytes=2 ** 19, launch_ns=(offset + a) * MS, done_ns=(offset + b) * MS)
               for i, (a, b) in enumerate([(2, 8), (4, 9), (9, 14)])]
        backward = SimpleNamespace(start_ns=offset * MS, ready=ready, last_ready_ns=(offset + 9) * MS,
                                   end_ns=(offset + 15) * MS)
        return SimpleNamespace(backward=backward, buckets=bks)
    ranks = [SimpleNamespace(rank=r, steps=[step(r)]) for r in range(2)]
    return SimpleNamespace(world_size=2, ranks=ranks)


def test_backward_timeline_gives_every_bucket_a_lane_and_writes_its_duration():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = plots.readiness.backward_timeline(fake_run())
        assert texts_outside_the_figure(fig) == []
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 2
    for ax in panels:
        assert [t.get_text() for t in ax.get_yticklabels()] == ["gradients ready"] + [
            f"bucket {i} (0.50 MiB)" for i in range(3)]
        durations = sorted((t.get_position()[1], t.get_text()) for t in ax.texts)
        assert durations == [(1, "6.0 ms"), (2, "5.0 ms"), (3, "5.0 ms")]   # beside bucket 0, 1, 2
        for bars in ax.collections[1:]:                                    # [0]: the ready ticks
            ys = {round(y, 6) for path in bars.get_paths() for y in path.vertices[:, 1]}
            assert max(ys) - min(ys) <= 0.7 + 1e-9                          # one lane, never two
    assert legend_labels(fig) == ["a gradient is ready", "all-reduce in flight while backward computes",
                                  "all-reduce in flight after the last gradient",
                                  "last gradient ready (backward compute over)", "backward() returns"]


def test_ready_order_legend_explains_the_dashed_line_and_both_colours():
    t = pd.DataFrame({"source_position": [0, 1, 2], "reverse_source_position": [2, 1, 0], "ready_position": [2, 0, 1]},
                     index=["a", "b", "c"])
    t["as_assumed"] = t["ready_position"] == t["reverse_source_position"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = plots.readiness.ready_order({"x": t, "y": t, "z": t})
        assert texts_outside_the_figure(fig) == []
    assert sum(ax.get_visible() for ax in fig.axes) == 3
    assert legend_labels(fig) == ["naive assumption: exactly reverse source order", "ready where the assumption says",
                                  "ready elsewhere"]


@pytest.mark.parametrize("cap_mb", [0.5, 2, 4, 64])
def test_the_slider_timeline_names_every_mark_and_keeps_its_text_inside(cap_mb):
    s = buckets.predict(INS, buckets.ddp_rule(INS, cap_mb), SLOW_LINK)
    measured = {"buckets": [{"index": 0, "launch_ms": 20.0, "done_ms": 45.0}, {"index": 1, "launch_ms": 30.0, "done_ms": 60.0}],
                "last_ready_ms": 40.0, "backward_ms": 1.5 * s.comm_end_ms}   # past everything predicted
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no layout warning, whatever the cap
        fig = plots.buckets.timeline(s, measured, f"ddp:{cap_mb}: {len(s.buckets)} bucket(s), calibrated model", detached=True)
        assert texts_outside_the_figure(fig) == []
    (ax,) = fig.axes
    assert len(ax.texts) == 0                                  # the tail is named in the title, not on the plot
    assert f"predicted exposed tail {s.exposed_tail_ms:.1f} ms" in ax.get_title(loc="left")
    assert ax.get_xlim()[1] >= measured["backward_ms"]        # the dashed line is on the plot
    labels = legend_labels(fig)
    assert "backward() returned, measured" in labels and any(label.startswith("exposed tail") for label in labels)
    assert any("waiting" in label for label in labels) == any(b.start_ms > b.ready_ms for b in s.buckets)
    halves = sorted(round(p.vertices[:, 1].min(), 6) for c in ax.collections[-2:] for p in c.get_paths())
    assert halves[0] != halves[1]                              # two measured buckets in flight together: both seen


def test_each_of_53_measured_buckets_stays_visible_on_the_slider_timeline():
    """One bucket per parameter, as at the slider's smallest cap: launch-to-done spans overlap up to three
    deep (every fourth bucket waits longer), and next ones touch. A bucket that overlaps another in time
    must sit on another row, and touching ones on a row must differ in shade, else they merge into one bar."""
    ins = bucket_sweep.Inputs([Grad(f"p{i}", 2 ** 14, 0.5 * (i + 1)) for i in range(53)], backward_ms=30.0,
                              forward_ms=10.0, optimizer_ms=1.0)
    s = buckets.predict(ins, buckets.ddp_rule(ins, 0.001), SLOW_LINK)
    spans = [(0.5 * i, 0.5 * i + (1.5 if i % 4 == 0 else 0.5)) for i in range(53)]
    measured = {"buckets": [{"index": i, "launch_ms": a, "done_ms": b} for i, (a, b) in enumerate(spans)],
                "last_ready_ms": 26.5, "backward_ms": 30.0}
    (ax,) = plots.buckets.timeline(s, measured, "ddp:0.001: 53 bucket(s)", detached=True).axes
    lane = 2 - 0.4   # the measured lane, third from the top
    bars = [(v[:, 0].min(), v[:, 0].max(), v[:, 1].min(), v[:, 1].max(), tuple(c.get_facecolor()[0]), c)
            for c in ax.collections for v in [p.vertices for p in c.get_paths()] if len(v) and v[:, 1].min() >= lane]
    assert len(bars) == 53
    for i, (x0, x1, y0, y1, color, c) in enumerate(bars):
        assert tuple(c.get_edgecolor()[0]) == (1.0, 1.0, 1.0, 1.0) and c.get_linewidth()[0] > 0   # a white edge
        for u0, u1, v0, v1, other, _ in bars[i + 1:]:
            if x0 < u1 and u0 < x1:
                assert y1 <= v0 or v1 <= y0, f"buckets over {x0:.1f}-{x1:.1f} and {u0:.1f}-{u1:.1f} ms hide one another"
            elif (y0, y1) == (v0, v1) and (x1 == u0 or u1 == x0):
                assert color != other, f"buckets touching at {max(x0, u0):.1f} ms share a row and a shade"


def test_the_error_bands_of_the_sweep_comparison_are_in_its_legend():
    t = pd.DataFrame({"buckets": [8, 2], "measured_ms": [100.0, 90.0], "spread_ms": [2.0, 3.0], "textbook_ms": [80.0, 85.0],
                      "textbook_error": [-0.2, -0.06], "calibration_point": [True, False]}, index=["ddp:1", "ddp:4"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = plots.buckets.sweep_comparison(t)
        assert texts_outside_the_figure(fig) == []
    bottom = fig.axes[1]
    assert [t.get_text() for t in bottom.get_legend().get_texts()] == ["\u00b15% band", "\u00b110% band", "textbook"]
