"""What a plan says when the step cannot be traced under fake tensors (an operation whose output depends on
the data: a boolean mask, `.item()`, `nonzero`): where it failed, and the model state the ZeRO paper's
accounting gives from the meta-device parameter count, labelled as a formula. Used by rank/planner.py.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from ..record.plan import CATEGORIES, Figure, PlanRecord
from ..spec.plan import PlanSpec


@contextlib.contextmanager
def module_stack(model: nn.Module):
    """The modules whose forward is running, innermost last, as "name (Class)" (to say where a trace failed)."""
    names = {id(m): n or "the model" for n, m in model.named_modules()}
    stack: list[str] = []

    def leave(module, args, out):   # returns None: a forward hook's result would replace the output
        if stack:
            stack.pop()

    pre = register_module_forward_pre_hook(lambda m, a: stack.append(f"{names.get(id(m), '?')} ({type(m).__name__})"))
    post = register_module_forward_hook(leave)
    try:
        yield stack
    finally:
        pre.remove()
        post.remove()


def op_of(e: Exception) -> str:
    return str(getattr(e, "func", "") or e).split("\n")[0]


def formula_record(spec: PlanSpec, total: int, local: int, why: str) -> PlanRecord:
    """What a plan can still say without the step: model state from the parameter count (meta-device
    shapes) by the ZeRO paper's accounting, labelled as a formula; no activations, peak or collectives."""
    from ..predict.zero import zero_state_bytes

    stage = {"ddp": 0, "zero1": 1, "fsdp2": 3}[spec.strategy]
    row = zero_state_bytes(total, spec.world_size, stage, "fp32")
    scale = 0.5 if spec.dtype == "bfloat16" else 1.0
    state_per = {"sgd": 0.0, "adam": 1.0, "adamw": 1.0}[spec.optimizer]   # the accounting's 8 B: Adam's two moments
    held = {c: Figure(0, "not traced") for c in CATEGORIES}
    source = "formula (ZeRO accounting, meta-device shapes)"
    held["parameters"] = Figure(round(row["parameters"] * scale), source)
    held["gradients"] = Figure(round(row["gradients"] * scale), source)
    held["optimizer_state"] = Figure(round(row["optimizer_state"] * scale * state_per), source)
    between = held["parameters"].bytes + held["optimizer_state"].bytes
    return PlanRecord(spec.to_dict(), torch.__version__, total, local, held, {c: 0 for c in CATEGORIES}, 0, source,
                      "", between, [], [], 0, 0, {}, [], untraced=why)
