"""The bucket slider (notebook 05): a bucket cap and a split switch redraw the simulated step from a
sweep's readiness trace in milliseconds; a button measures the chosen plan on real ranks."""

from __future__ import annotations


def bucket_slider(sweep_run, link, measure, model: str = "calibrated", cap_mb: float = 4.0):
    """A bucket-cap slider (log scale, MiB) and a "split the last bucket" switch redraw the simulated
    step (timeline and summary row) from the sweep's readiness trace and the chosen cost model, with
    no launch; "measure" hands that plan, on the sweep's ranks and model, to `measure` (`ddplab.run`:
    one launch, called with `progress=`, a callable that updates the progress line, if it takes one) and overlays the measured buckets (notebook 05)."""
    import dataclasses
    import threading

    import ipywidgets as w
    import pandas as pd
    from IPython.display import display

    from .. import plots
    from .. import predict
    from ..tables import bucket_sweep, buckets
    from .measuring import OneAtATime, measure_with_progress

    ins, costs = bucket_sweep.inputs(sweep_run), buckets.costs(sweep_run, link)
    cap = _cap_slider(ins, cap_mb)
    split = w.Checkbox(value=False, description="split the last bucket in two")
    which = w.ToggleButtons(options=list(costs), value=model, description="model", style={"button_width": "110px"})
    button = w.Button(description="measure", icon="play", tooltip="run this plan for real (one launch)")
    out, status = w.Output(), w.Output()
    # the launch's progress line: a label, updated by value (an Output would freeze a display-id line)
    progress = w.Label(value="")
    progress.add_class("ddplab-progress")
    measured: dict = {}

    def current():
        plan = buckets.ddp_rule(ins, cap.value)
        splits = split.value and len(plan[-1]) > 1   # a one-tensor bucket cannot be split
        if splits:
            plan = predict.buckets.split_bucket(plan, ins.grads)
        split.description = "split the last bucket in two" + ("" if splits or not split.value else " (one tensor: no split)")
        return f"{'split' if splits else 'ddp'}:{cap.value:.3g}", plan

    drawing = threading.Lock()

    def redraw(_=None):
        # one drawing at a time, each of the controls' values as they are when it starts: ipykernel may run a
        # slider's callback on another thread while the measurement's own redraw is drawing the plan of the
        # click, and without the lock the older of the two could land last (a measured plan shown under a
        # slider that has moved on). The lock makes the drawing that starts last, the current one, land last.
        with drawing:
            name, plan = current()
            s = buckets.predict(ins, plan, costs[which.value])
            row = {"plan": name, **buckets.summary(s)}
            if name in measured:
                row["measured_step_ms"] = measured[name]["step_ms"]
            with out:
                out.clear_output(wait=True)
                display(pd.DataFrame([row]).set_index("plan").round(2))
                display(plots.buckets.timeline(s, measured.get(name, {}).get("timeline"),
                                              f"{name}: {len(plan)} bucket(s), {which.value} model", detached=True))

    def on_measure():
        name, _plan = current()   # the plan of the click, whatever the slider says by the time it ends
        task = dataclasses.replace(sweep_run.spec.task, plans=(name,), rounds=1, steps_per_round=3)
        exp = sweep_run.spec.replace(name="slider-measure", task=task)
        with status:
            status.clear_output()
            r = measure_with_progress(measure, exp, progress)
            measured[name] = {"step_ms": bucket_sweep.measured(r).loc[name, "step_ms"],
                              "timeline": bucket_sweep.measured_timeline(r, name)}
            print(f"measured {name}: {measured[name]['step_ms']:.1f} ms per step (median of 3 steps, "
                  f"{exp.world_size} ranks; measurement {guard.runs})")
        redraw()

    for control in (cap, split, which):
        control.observe(redraw, names="value")
    guard = OneAtATime(button)
    button.on_click(guard.handler(on_measure))
    redraw()
    box = w.VBox([w.HBox([cap, split]), w.HBox([which, button]), progress, status, out])
    box.add_class("ddplab-bucket-slider")
    return box


def _cap_slider(ins, cap_mb: float):
    """A log-scale cap slider from half the smallest gradient to 1.5 x all of them (MiB)."""
    import math

    import ipywidgets as w

    from ..units import MIB

    smallest = min(g.bytes for g in ins.grads) / MIB
    lo, hi = round(math.log10(smallest / 2), 1), round(math.log10(1.5 * ins.gradient_bytes / MIB), 1)
    return w.FloatLogSlider(value=min(max(cap_mb, 10 ** lo), 10 ** hi), base=10, min=lo, max=hi, step=0.05,
                            description="cap (MiB)", readout_format=".3g", continuous_update=False,
                            layout=w.Layout(width="480px"))
