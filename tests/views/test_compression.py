"""The figures of notebook 10: byte labels a reader can take in at a glance, and a legend that hides
no bar; the size labels they use."""

import re

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from ddplab import plots  # noqa: E402
from ddplab.units import size_label  # noqa: E402

HOOKS = ("allreduce", "fp16", "bf16", "powersgd", "noop")


def significant_digits(number: str) -> int:
    return len(number.replace(".", "").lstrip("0"))


def test_size_labels_keep_the_digits_asked_for_and_never_an_exponent():
    assert size_label(1802334, digits=3) == "1.72 MiB" and size_label(1802334) == "1.71884 MiB"
    assert size_label(1023 * 1024 + 5, digits=3) == "0.999 MiB"   # not '1023 KiB', nor '1.02e+03 KiB'
    assert [size_label(n) for n in (12, 4096, 3 * 2 ** 20, 1005)] == ["12 B", "4 KiB", "3 MiB", "1005 B"]


def test_byte_labels_carry_at_most_three_significant_digits():
    written = [3444244, 1722122, 1722122, 102208]   # what the notebook's run wrote, to the byte
    index = pd.MultiIndex.from_tuples([(h, "every step") for h in HOOKS[:4]] + [("noop", "every step")],
                                      names=["hook", "steps"])
    table = pd.DataFrame({"written_median": written + [0], "predicted_written": written + [0]}, index=index)
    labels = [t.get_text() for t in plots.compression.bytes_per_hook(table).axes[0].texts]
    assert len(labels) == 4, labels
    for label in labels:
        number = re.match(r"([\d.]+) (MiB|KiB|B)\n", label)
        assert number and significant_digits(number[1]) <= 3, f"{label!r}: at most 3 significant digits"


def test_the_step_legend_covers_no_bar():
    table = pd.DataFrame({"measured_ms": [21.7, 22.9, 21.3, 30.3, 17.8], "local_ms": [18.0, 19.1, 19.0, 26.5, 18.2],
                          "predicted_ms": [22.6, 22.4, 22.1, 32.1, 18.2]}, index=list(HOOKS))
    fig = plots.compression.steps_per_hook({"loopback": table, "1 GbE": table * 1.5},
                                           {"loopback": "loopback", "1 GbE": "emulated 1GbE"})
    fig.draw_without_rendering()
    [legend] = fig.legends
    box = legend.get_window_extent()
    marks = [a for ax in fig.axes for a in ax.patches + ax.lines if isinstance(a, Rectangle) or a.get_xydata().size]
    assert len(marks) == 2 * 3 * len(HOOKS)   # per panel and hook: the bar, its hatched part, the prediction
    for mark in marks:
        assert not box.overlaps(mark.get_window_extent()), f"the legend {box} covers a bar or tick at {mark.get_window_extent()}"
