"""Torch's trackers as the planner uses them (rank/planner.py): the categories they file bytes under, mapped to
the plan's; a tracker that keeps only the step's peak; snapshots; and FLOP formulas for the CPU's attention
kernel, which FlopCounterMode lacks.
"""

from __future__ import annotations

import torch

from ..record.plan import CATEGORIES

MEM_TRACKER = {"Parameter": "parameters", "Gradient": "gradients", "Optstate": "optimizer_state",
               "Activation": "activations", "Temp": "temporaries", "Buffer": "buffers", "Other": "temporaries"}
FSDP_TRACKER = {"Sharded Param": "parameters", "Unsharded Param": "comm_buffers", "Buffer": "buffers",
                "Sharded Grad": "gradients", "Unsharded Grad": "gradients", "Activation": "activations",
                "Temp": "temporaries", "All Gather": "comm_buffers", "Reduce Scatter": "comm_buffers",
                "OptState": "optimizer_state", "Inputs": "activations"}


def cpu_attention_flops() -> dict:
    """FLOP formulas for the CPU's attention kernel, which FlopCounterMode lacks (it has the CUDA ones):
    torch's own formulas for scaled dot-product attention, forward and backward."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    aten = torch.ops.aten
    if not hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        return {}

    def forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(query, key, value)

    def backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_backward_flop_count(grad_out, query, key, value)

    return {aten._scaled_dot_product_flash_attention_for_cpu: forward,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: backward}


def global_peak_only(tracker_class):
    """`tracker_class` keeping the step's peak as torch's does, without each module's own peak: torch's
    `_update_peak_stats` walks every tracked module at every op (41 of 63 s of a 7 B DDP plan), and a plan
    reads only the global peak. Where a torch release names its fields otherwise, torch's own method runs."""

    class GlobalPeak(tracker_class):
        def _update_peak_stats(self, peak_state) -> None:
            fields = ("_curr_mem_snap", "_peak_mem", "_peak_mem_snap")
            if not all(hasattr(self, f) for f in fields):
                return super()._update_peak_stats(peak_state)
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap["Total"]:
                    self._peak_mem[dev] = snap["Total"]
                    self._peak_mem_snap[dev] = dict(snap)

    GlobalPeak.__name__ = GlobalPeak.__qualname__ = tracker_class.__name__
    return GlobalPeak


def snapshot(tracker) -> dict[str, tuple[int, dict]]:
    """The tracker's figures now ("current") and at the peak so far ("peak"): (total, bytes by its kinds)."""
    out = {}
    for which in ("current", "peak"):
        snap = next(iter(tracker.get_tracker_snapshot(which).values()), {})
        out[which] = (int(snap.get("Total", 0)), {getattr(k, "value", str(k)): int(v) for k, v in snap.items() if k != "Total"})
    return out


def categories(kinds: dict, names: dict) -> dict[str, int]:
    out = {c: 0 for c in CATEGORIES}
    for kind, b in kinds.items():
        if kind not in names:   # a label a torch release added or renamed: say so rather than misfile it
            raise RuntimeError(f"the memory tracker reports a category the planner does not know: {kind!r}")
        out[names[kind]] += b
    return out
