"""ipywidgets controls for the notebooks. Imported only by notebooks; ipywidgets loads on use.

Each control redraws from a pure model (no ranks are launched), so a slider move takes milliseconds.
"""

from __future__ import annotations


def rank_weights_explorer(local_batch=(2, 4, 6, 12), seq_len=(16, 16, 16, 16), max_batch: int = 32):
    """One slider per rank for its local batch (and sequence length); redraws how much each rank's
    gradient counts under each loss normalization (notebook 01)."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import display

    from . import plots

    batches = [w.IntSlider(value=b, min=1, max=max_batch, description=f"rank {r} batch") for r, b in enumerate(local_batch)]
    lengths = [w.IntSlider(value=s, min=1, max=4 * max(seq_len), description=f"rank {r} seq") for r, s in enumerate(seq_len)]
    out = w.Output()

    def redraw(_=None):
        with out:
            out.clear_output(wait=True)
            fig = plots.rank_weights([s.value for s in batches], [s.value for s in lengths])
            display(fig)
            plt.close(fig)

    for s in batches + lengths:
        s.observe(redraw, names="value")
    redraw()
    box = w.VBox([w.HBox([w.VBox(batches), w.VBox(lengths)]), out])
    box.add_class("ddplab-rank-weights")
    return box


def memory_explorer(exp):
    """Dropdowns for world size and optimizer and a bucket-view switch redraw the *predicted* per-rank
    memory instantly (pure model); "measure" runs the experiment for real and shows the measured table
    beside it (notebook 02)."""
    import ipywidgets as w
    import pandas as pd
    from IPython.display import display

    from . import memory_model, tables
    from .launch import run

    world = w.Dropdown(options=[1, 2, 4, 8], value=exp.world_size, description="world_size")
    opt = w.Dropdown(options=["sgd", "sgd+momentum", "adam"], value="adam", description="optimizer")
    views = w.Checkbox(value=exp.gradient_as_bucket_view, description="gradient_as_bucket_view")
    button = w.Button(description="measure for real", icon="play")
    predicted, measured = w.Output(), w.Output()

    def current():
        name = opt.value
        return exp.replace(world_size=world.value, optimizer=name.split("+")[0],
                           momentum=0.9 if name == "sgd+momentum" else 0.0, gradient_as_bucket_view=views.value)

    def redraw(_=None):
        e = current()
        pred = memory_model.predict(e, step=1)
        rows = {c: max(p[c] for p in pred.values()) / 2**20 for c in pred["forward"]}
        with predicted:
            predicted.clear_output(wait=True)
            print(f"predicted MiB on each of the {e.world_size} ranks (the same on every rank):")
            display(pd.DataFrame([rows] * e.world_size, index=pd.Index(range(e.world_size), name="rank")).round(3))

    def measure(_):
        with measured:
            measured.clear_output()
            display(tables.memory(run(current())))

    for control in (world, opt, views):
        control.observe(redraw, names="value")
    button.on_click(measure)
    redraw()
    box = w.VBox([w.HBox([world, opt, views, button]), predicted, measured])
    box.add_class("ddplab-memory-explorer")
    return box
