"""The memory explorer (notebook 02): the predicted per-rank memory redrawn as you change world
size, optimizer and bucket views; a button measures the same experiment on real ranks."""

from __future__ import annotations


def memory_explorer(exp, measure):
    """Dropdowns for world size and optimizer and a bucket-view switch redraw the *predicted* per-rank
    memory instantly (pure model); "measure" hands the experiment to `measure` (`ddplab.run`: real
    ranks) and shows the measured table beside it (notebook 02)."""
    import ipywidgets as w
    import pandas as pd
    from IPython.display import display

    from .. import tables
    from ..predict import memory as memory_model
    from ..units import MIB
    from .measuring import OneAtATime

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
        rows = {c: max(p[c] for p in pred.values()) / MIB for c in pred["forward"]}
        with predicted:
            predicted.clear_output(wait=True)
            print(f"predicted MiB on each of the {e.world_size} ranks (the same on every rank):")
            display(pd.DataFrame([rows] * e.world_size, index=pd.Index(range(e.world_size), name="rank")).round(3))

    def on_measure():
        e = current()   # the settings of the click, whatever the controls say by the time it ends
        with measured:
            measured.clear_output()
            print(f"measured with world_size={e.world_size}, optimizer={opt.value}, "
                  f"gradient_as_bucket_view={e.gradient_as_bucket_view} (measurement {guard.runs}):")
            display(tables.memory(measure(e)))

    for control in (world, opt, views):
        control.observe(redraw, names="value")
    guard = OneAtATime(button)
    button.on_click(guard.handler(on_measure))
    redraw()
    box = w.VBox([w.HBox([world, opt, views, button]), predicted, measured])
    box.add_class("ddplab-memory-explorer")
    return box
