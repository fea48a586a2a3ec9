"""The rank-weights explorer (notebook 01): one slider per rank for its local batch and sequence
length; redraws from the pure model (`predict/loss_weights.py`), no launch."""

from __future__ import annotations


def rank_weights_explorer(local_batch=(2, 4, 6, 12), seq_len=(16, 16, 16, 16), max_batch: int = 32):
    """One slider per rank for its local batch (and sequence length); redraws how much each rank's
    gradient counts under each loss normalization (notebook 01)."""
    import ipywidgets as w
    from IPython.display import display

    from .. import plots

    batches = [w.IntSlider(value=b, min=1, max=max_batch, description=f"rank {r} batch") for r, b in enumerate(local_batch)]
    lengths = [w.IntSlider(value=s, min=1, max=4 * max(seq_len), description=f"rank {r} seq") for r, s in enumerate(seq_len)]
    out = w.Output()

    def redraw(_=None):
        with out:
            out.clear_output(wait=True)
            display(plots.rank_weights([s.value for s in batches], [s.value for s in lengths], detached=True))

    for s in batches + lengths:
        s.observe(redraw, names="value")
    redraw()
    box = w.VBox([w.HBox([w.VBox(batches), w.VBox(lengths)]), out])
    box.add_class("ddplab-rank-weights")
    return box
