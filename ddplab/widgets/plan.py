"""Will it fit? (notebook 12): pick ranks, strategy, sequence, batch and checkpointing, and a plan of the
model on a fake process group answers whether one rank's peak fits a device, and what makes the peak.
The widget is handed the planning callable (`ddplab.plan`) and a first plan, which it shows at once; every
answer after that comes from a plan made for the settings of the click (about ten seconds for a 7 B model).
"""

from __future__ import annotations

GIB = 1 << 30


def fit_line(plan, device_gib: float) -> str:
    """One line: the settings, whether the peak fits, and its largest parts."""
    rec, spec = plan.record, plan.spec
    what = (f"{spec.strategy}{'' if spec.reshard_after_forward else ' (keep gathered)'}"
            f"{' + checkpointing' if spec.checkpointing else ''} on {spec.world_size} ranks, "
            f"{spec.local_batch} x {spec.seq_len} tokens a rank")
    if rec.untraced:
        return f"{what}: not traced ({rec.untraced})"
    parts = sorted(((b, c) for c, b in rec.at_peak.items() if b), reverse=True)[:3]
    from ..tables.plan import PLAIN

    made = ", ".join(f"{PLAIN.get(c, c)} {b / GIB:.1f}" for b, c in parts)
    verdict = "fits" if rec.peak_bytes <= device_gib * GIB else "does not fit"
    return (f"{what}: {verdict} in {device_gib:g} GiB: peak {rec.peak_bytes / GIB:.1f} GiB in {rec.peak_phase} "
            f"({made} GiB)")


def fit_widget(first, plan, device_gib: float = 80.0):
    """Dropdowns for ranks, strategy, sequence length and local batch, a checkpointing switch, and a "plan"
    button that calls `plan(spec)` for the chosen settings and says whether the peak fits `device_gib`.
    `first`: a plan already made, shown before any click (its settings are the widgets' first values)."""
    import ipywidgets as w

    from .measuring import OneAtATime

    spec = first.spec
    ranks = w.Dropdown(options=sorted({8, 64, 1024, spec.world_size}), value=spec.world_size, description="ranks")
    strategy = w.Dropdown(options=["ddp", "zero1", "fsdp2"], value=spec.strategy, description="strategy")
    seq = w.Dropdown(options=sorted({512, 1024, 2048, 4096, spec.seq_len}), value=spec.seq_len, description="seq_len")
    batch = w.Dropdown(options=sorted({1, 2, 4, 8, spec.local_batch}), value=spec.local_batch,
                       description="local_batch")
    ckpt = w.Checkbox(value=spec.checkpointing, description="activation checkpointing")
    button = w.Button(description="plan it", icon="play", layout=w.Layout(width="auto"))
    answer = w.HTML(value=fit_line(first, device_gib))
    answer.add_class("ddplab-fit")

    def on_plan():
        chosen = spec.replace(world_size=ranks.value, strategy=strategy.value, seq_len=seq.value,
                              local_batch=batch.value, checkpointing=ckpt.value, reshard_after_forward=True)
        answer.value = f"planning {chosen.strategy} on {chosen.world_size} ranks..."
        try:
            answer.value = fit_line(plan(chosen), device_gib)
        except (ValueError, RuntimeError, TimeoutError) as e:
            answer.value = f"could not plan it: {e}"

    button.on_click(OneAtATime(button, "planning...").handler(on_plan))
    box = w.VBox([w.HBox([ranks, strategy]), w.HBox([seq, batch]), w.HBox([ckpt, button]), answer])
    box.add_class("ddplab-fit-widget")
    return box
