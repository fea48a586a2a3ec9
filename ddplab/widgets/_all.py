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


def bucket_slider(sweep_run, link, model: str = "calibrated", cap_mb: float = 4.0):
    """A bucket-cap slider (log scale, MiB) and a "split the last bucket" switch redraw the simulated
    step (timeline and summary row) from the sweep's readiness trace and the chosen cost model, with
    no launch; "measure" runs that plan for real on the sweep's ranks and model (one launch) and
    overlays the measured buckets (notebook 05)."""
    import math

    import ipywidgets as w
    import matplotlib.pyplot as plt
    import pandas as pd
    from IPython.display import display

    from . import overlap, overlap_plots, schedule
    from .launch import run

    ins, costs = overlap.inputs(sweep_run), overlap.costs(sweep_run, link)
    smallest = min(g.bytes for g in ins.grads) / overlap.MIB
    lo, hi = round(math.log10(smallest / 2), 1), round(math.log10(1.5 * ins.gradient_bytes / overlap.MIB), 1)
    cap = w.FloatLogSlider(value=min(max(cap_mb, 10 ** lo), 10 ** hi), base=10, min=lo, max=hi, step=0.05,
                           description="cap (MiB)", readout_format=".3g", continuous_update=False,
                           layout=w.Layout(width="480px"))
    split = w.Checkbox(value=False, description="split the last bucket in two")
    which = w.ToggleButtons(options=list(costs), value=model, description="model", style={"button_width": "110px"})
    button = w.Button(description="measure", icon="play", tooltip="run this plan for real (one launch)")
    out, status = w.Output(), w.Output()
    measured: dict = {}

    def current():
        plan = overlap.ddp_rule(ins, cap.value)
        splits = split.value and len(plan[-1]) > 1   # a one-tensor bucket cannot be split
        if splits:
            plan = schedule.split_bucket(plan, ins.grads)
        split.description = "split the last bucket in two" + ("" if splits or not split.value else " (one tensor: no split)")
        return f"{'split' if splits else 'ddp'}:{cap.value:.3g}", plan

    def redraw(_=None):
        name, plan = current()
        s = overlap.predict(ins, plan, costs[which.value])
        row = {"plan": name, **overlap.summary(s)}
        if name in measured:
            row["measured_step_ms"] = measured[name]["step_ms"]
        with out:
            out.clear_output(wait=True)
            display(pd.DataFrame([row]).set_index("plan").round(2))
            fig = overlap_plots.timeline(s, measured.get(name, {}).get("timeline"),
                                         f"{name}: {len(plan)} bucket(s), {which.value} model")
            display(fig)
            plt.close(fig)

    def measure(_):
        name, _plan = current()
        exp = sweep_run.spec.replace(name="slider-measure", plans=(name,), repeats=1, steps=3)
        with status:
            status.clear_output()
            r = run(exp)
            measured[name] = {"step_ms": overlap.measured(r).loc[name, "step_ms"],
                              "timeline": overlap.measured_timeline(r, name)}
            print(f"measured {name}: {measured[name]['step_ms']:.1f} ms per step (median of 3 steps, 2 ranks)")
        redraw()

    for control in (cap, split, which):
        control.observe(redraw, names="value")
    button.on_click(measure)
    redraw()
    box = w.VBox([w.HBox([cap, split]), w.HBox([which, button]), status, out])
    box.add_class("ddplab-bucket-slider")
    return box
