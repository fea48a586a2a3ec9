"""The memory explorer (notebook 02): what one rank is predicted to hold at each moment the ledger
samples (after the forward, the backward, the optimizer step), redrawn as you change world size,
optimizer and bucket views; a button measures the same experiment on real ranks."""

from __future__ import annotations


def memory_explorer(exp, measure):
    """Dropdowns for world size and optimizer and a bucket-view switch redraw the *predicted* per-rank
    memory at each sampled moment instantly (pure model: with bucket views the buckets' separate copy
    leaves the after-backward and after-step moments); "measure" hands the experiment to `measure`
    (`ddplab.run`: real ranks) and shows what every rank held at each moment beside the prediction."""
    import io

    import ipywidgets as w
    from IPython.display import Image, display

    from ..plots.memory import memory_figure
    from ..plots.memory import memory_prediction
    from ..tables.memory import memory_moments, predicted_moments
    from .measuring import OneAtATime, measure_with_progress

    world = w.Dropdown(options=[1, 2, 4, 8], value=exp.world_size, description="world_size")
    opt = w.Dropdown(options=["sgd", "sgd+momentum", "adam"], value="adam", description="optimizer")
    views = w.Checkbox(value=exp.gradient_as_bucket_view, description="gradient_as_bucket_view")
    button = w.Button(description="measure for real", icon="play", layout=w.Layout(width="auto"))   # never "measure for ..."
    predicted, measured = w.Output(), w.Output()
    # the launch's progress line: a label, updated by value (an Output would freeze a display-id line)
    progress = w.Label(value="")
    progress.add_class("ddplab-progress")

    stem = exp.name.split("-w")[0]

    def current():
        name = opt.value
        label = f"{stem}-w{world.value}-{name.replace('+', '-')}" + ("-bucket-view" if views.value else "")
        return exp.replace(name=label, world_size=world.value, optimizer=name.split("+")[0],   # named as it runs
                           momentum=0.9 if name == "sgd+momentum" else 0.0, gradient_as_bucket_view=views.value)

    def png(fig) -> Image:
        """The figure as an image, drawn before the output changes: the output then redraws at once, so
        it never shows the new settings' text beside the old figure while the kernel is still drawing."""
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
        return Image(buf.getvalue())

    def redraw(_=None):
        e = current()
        table, figure = predicted_moments(e, step=1), png(memory_prediction(e, step=1, detached=True))
        with predicted:
            predicted.clear_output(wait=True)
            print(f"predicted MiB on each of the {e.world_size} ranks (the same on every rank), at three moments "
                  f"of step 1, gradient_as_bucket_view={e.gradient_as_bucket_view}:")
            display(table)
            display(figure)

    def on_measure():
        e = current()   # the settings of the click, whatever the controls say by the time it ends
        with measured:
            measured.clear_output()
            print(f"measured with world_size={e.world_size}, optimizer={opt.value}, "
                  f"gradient_as_bucket_view={e.gradient_as_bucket_view} (measurement {guard.runs}):")
            run = measure_with_progress(measure, e, progress)
            display(memory_moments(run))
            display(png(memory_figure(run, detached=True)))

    for control in (world, opt, views):
        control.observe(redraw, names="value")
    guard = OneAtATime(button)
    button.on_click(guard.handler(on_measure))
    redraw()
    box = w.VBox([w.HBox([world, opt, views, button]), progress, predicted, measured])
    box.add_class("ddplab-memory-explorer")
    return box
