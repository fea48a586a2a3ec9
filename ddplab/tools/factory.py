"""What both practitioner tools do before launching: name the factory, make the experiment, check the
model in this process (spec/model.py), and count its parameters here, independently of the ranks."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..spec import Experiment
from ..spec.experiment import BUILTIN_MODELS
from ..units import DTYPE_BYTES


def factory_path(model) -> str:
    """"package.module:factory" for a factory string, or for a function importable by that name (a
    function defined in a notebook or script run as __main__ is not: the ranks are other processes)."""
    if isinstance(model, str):
        return model
    if callable(model):
        module, name = getattr(model, "__module__", None), getattr(model, "__qualname__", "")
        if module in (None, "__main__", "builtins") or not name.isidentifier():
            raise ValueError(f"model: {getattr(model, '__name__', model)!r} is defined in {module or 'no module'}; "
                             f"the ranks are other processes and import the factory by name: put it in a .py file "
                             f"and pass 'module:function'")
        return f"{module}:{name}"
    raise ValueError(f"model: give a factory 'package.module:function' (or the function), got {type(model).__name__}")


# what the tools set themselves (plain DDP steps that rebuild their buckets, on the model they were given)
NOT_YOURS = ("name", "model", "sync", "sharding", "steps", "probes", "task", "accum_steps", "fault", "straggler",
             "find_unused_parameters")


def experiment(model, name: str, fields: dict, **settings) -> Experiment:
    """The tools' Experiment for `model`: their `settings`, and the caller's `fields` (a ValueError
    naming the field for a bad one, or for one the tool sets itself)."""
    fixed = sorted(set(fields) & set(NOT_YOURS))
    if fixed:
        raise ValueError(f"{fixed[0]}: the tool sets it (it measures plain DDP steps); leave it out")
    path = factory_path(model)
    label = path if path in BUILTIN_MODELS else path.rpartition(":")[2]
    return Experiment(name=f"{name}-{re.sub(r'[^A-Za-z0-9_.-]', '-', label)}"[:80], model=path, **settings, **fields)


def repeats_for(payload: int, given: int | None = None) -> int:
    """Timed calls per all-reduce size: `given`, else 20 (5 past 64 MiB of gradient, where each call is long)."""
    return given or (20 if payload <= 64 * 2 ** 20 else 5)


def records(table) -> list[dict]:
    """A DataFrame as JSON-ready rows, its index a column, NaN and infinities as None."""
    frame = table.reset_index()
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
            for row in frame.to_dict(orient="records")]


@dataclass(frozen=True)
class Counted:
    """The model as counted in this process (one tied weight once; frozen tensors apart)."""

    tensors: int
    parameters: int
    trainable_tensors: int
    trainable_parameters: int
    gradient_bytes: int            # what DDP all-reduces each step: the trainable parameters' gradients
    sizes: dict                    # trainable parameter name -> its gradient's bytes, in parameters() order
    activations_per_example: int | None = None   # bytes, measured on the same model (`checked(activations=True)`)


def checked(exp: Experiment, activations: bool = False) -> Counted:
    """Build `exp`'s model here, refuse what cannot be audited (ValueError naming the fix), and count it;
    with `activations`, measure its activations per example on the same model (`preflight.measured_activations`)."""
    from ..launch.keeper import children_stopped
    from ..launch.preflight import _checked_build, measured_activations

    with children_stopped(f"Experiment.model {exp.model}"):   # nothing it starts here outlives the check
        model, built = _checked_build(exp, gradients=True)
        per_example = measured_activations(exp, built) if activations else None
    params = list(model.named_parameters())
    trainable = [(n, p) for n, p in params if p.requires_grad]
    if not trainable:
        raise ValueError(f"Experiment.model: {exp.model} has no trainable parameter: DDP has nothing to synchronize")
    return Counted(len(params), sum(p.numel() for _, p in params), len(trainable),
                   sum(p.numel() for _, p in trainable), sum(p.numel() for _, p in trainable) * DTYPE_BYTES[exp.dtype],
                   {n: p.numel() * DTYPE_BYTES[exp.dtype] for n, p in trainable}, per_example)
