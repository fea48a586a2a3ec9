"""The rank-weights explorer (notebook 01): one slider per rank for its local batch and sequence
length; redraws from the pure model (`predict/loss_weights.py`), no launch."""

from __future__ import annotations

SLIDER_WIDTH = "370px"   # two columns side by side fit JupyterLab's ~900 px


def rank_weights_explorer(local_batch=(2, 4, 6, 12), seq_len=(16, 16, 16, 16), max_batch: int = 32):
    """One slider per rank for its local batch (and sequence length); redraws how much each rank's
    gradient counts under each loss normalization (notebook 01)."""
    import ipywidgets as w
    from IPython.display import display

    from .. import plots

    # description_width "initial": the label is as wide as its text (the default 80 px cut "rank 0 batch" to
    # "rank 0 bat..."); the slider is widened so that the track keeps its length beside the label
    def slider(description: str, value: int, top: int):
        return w.IntSlider(value=value, min=1, max=top, description=description,
                           style={"description_width": "initial"}, layout=w.Layout(width=SLIDER_WIDTH))

    batches = [slider(f"rank {r} local_batch", b, max_batch) for r, b in enumerate(local_batch)]
    lengths = [slider(f"rank {r} seq_len", s, 4 * max(seq_len)) for r, s in enumerate(seq_len)]
    out = w.Output()

    def redraw(_=None):
        with out:
            out.clear_output(wait=True)
            display(plots.gradients.rank_weights([s.value for s in batches], [s.value for s in lengths], detached=True))

    for s in batches + lengths:
        s.observe(redraw, names="value")
    redraw()
    box = w.VBox([w.HBox([w.VBox(batches), w.VBox(lengths)]), out])
    box.add_class("ddplab-rank-weights")
    return box
