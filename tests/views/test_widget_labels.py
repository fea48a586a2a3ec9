"""The rank-weights explorer of notebook 01: every slider shows its whole label, and the two
columns of sliders fit JupyterLab's width."""

import ipywidgets as w
import matplotlib
from matplotlib.font_manager import FontProperties
from matplotlib.textpath import TextPath

matplotlib.use("Agg")

from ddplab import widgets

JUPYTERLAB_PX = 900       # the notebook's width in a default JupyterLab window
FONT_PX = 13              # ipywidgets' --jp-widgets-font-size
TRACK_AND_READOUT_PX = 180   # the least a slider needs beside its label to stay usable


def text_px(text: str) -> float:
    """The width of `text` at the widgets' font size, in a sans-serif font (DejaVu Sans: wide, so an upper bound)."""
    return TextPath((0, 0), text, size=FONT_PX, prop=FontProperties(family="DejaVu Sans")).get_extents().width


def test_every_rank_weights_slider_shows_its_whole_label():
    box = widgets.gradients.rank_weights_explorer(local_batch=(2, 4, 6, 12), seq_len=(8, 16, 16, 32))
    columns = box.children[0].children
    sliders = [s for column in columns for s in column.children]
    assert all(isinstance(s, w.IntSlider) for s in sliders) and len(sliders) == 8
    assert [s.description for s in columns[0].children] == [f"rank {r} local_batch" for r in range(4)]
    for s in sliders:
        # "initial": the label takes its text's width (ipywidgets' default, 80 px, cut "rank 0 batch" short)
        assert s.style.description_width == "initial", s.description
        width = float(s.layout.width.removesuffix("px"))
        assert text_px(s.description) + TRACK_AND_READOUT_PX <= width, (s.description, text_px(s.description), width)
    assert sum(float(column.children[0].layout.width.removesuffix("px")) for column in columns) <= JUPYTERLAB_PX - 100
