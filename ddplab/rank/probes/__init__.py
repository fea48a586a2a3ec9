"""Probes: what a training rank records beyond its timings, attached by name through one lifecycle.

    probes = attach(exp.probes, Attachment(ctx, module, ddp, optimizer))   # dependencies first
    with probes.forward(micro):   loss = ...              # e.g. the saved-tensor meter
    with probes.backward(micro, last):   loss.backward()  # e.g. ready times, bytes written
    probes.before_optimizer(step); optimizer.step(); probes.after_optimizer(step)
    TrainStep(..., **probes.step_fields(step));  TrainRecord(..., **probes.sections())

Each probe is one module: a mechanism (a hook, a meter) and a `Probe` subclass that says when it acts
and which field of the step (`record.TrainStep`) or section of the record (`record.TrainRecord`) it
fills. `needs` names the probes it reads from, attached before it; a probe attached only because
another needs it records nothing of its own, unless that one `shows` it (readiness shows the buckets).
Probes are attached in one fixed order (`ORDER`), so their contexts nest the same way however the
probes are listed: the ready-time window of a backward sits inside the bytes count. Runs inside a rank.
Used by notebooks 00-04, 06 and 07.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ClassVar


@dataclass
class Attachment:
    """What a probe may look at: the task's context, the bare module, DDP (None without it), the optimizer."""

    ctx: object
    module: object
    ddp: object
    optimizer: object


class Probe:
    name: ClassVar[str]
    needs: ClassVar[tuple[str, ...]] = ()   # probes attached before this one, which it reads from
    shows: ClassVar[tuple[str, ...]] = ()   # of those, the ones whose fields its record includes

    def __init__(self, at: Attachment, attached: dict[str, "Probe"]):
        self.at = at

    def start_step(self, step: int) -> None: ...
    def forward(self, micro: int):
        return contextlib.nullcontext()
    def after_forward(self, step: int, micro: int) -> None: ...
    def backward(self, micro: int, last: bool):
        return contextlib.nullcontext()
    def after_backward(self, step: int, micro: int) -> None: ...
    def before_optimizer(self, step: int) -> None: ...
    def after_optimizer(self, step: int) -> None: ...

    def step_fields(self, step: int) -> dict:
        """Fields of this step's `TrainStep` that this probe fills."""
        return {}

    def sections(self) -> dict:
        """Fields of the `TrainRecord` that this probe fills, at the end of training."""
        return {}

    def tensors(self) -> dict:
        """Tensors for rank{r}.pt."""
        return {}

    def finish(self, run_dir) -> None:
        """After training, before the record is written (e.g. dump a snapshot)."""


class ProbeSet:
    """The attached probes, called in attachment order at every point of the lifecycle."""

    def __init__(self, probes: list[Probe], recorded: set[str]):
        self.probes = probes
        self.recorded = recorded   # the probes whose fields go into the record

    def _each(self, hook, *args) -> None:
        for p in self.probes:
            getattr(p, hook)(*args)

    def start_step(self, step: int) -> None:
        self._each("start_step", step)

    def after_forward(self, step: int, micro: int) -> None:
        self._each("after_forward", step, micro)

    def after_backward(self, step: int, micro: int) -> None:
        self._each("after_backward", step, micro)

    def before_optimizer(self, step: int) -> None:
        self._each("before_optimizer", step)

    def after_optimizer(self, step: int) -> None:
        self._each("after_optimizer", step)

    def finish(self, run_dir) -> None:
        self._each("finish", run_dir)

    @contextlib.contextmanager
    def _nested(self, hook, *args):
        with contextlib.ExitStack() as stack:
            for p in self.probes:
                stack.enter_context(getattr(p, hook)(*args))
            yield

    def forward(self, micro: int):
        return self._nested("forward", micro)

    def backward(self, micro: int, last: bool):
        return self._nested("backward", micro, last)

    def _merged(self, hook, *args) -> dict:
        out = {}
        for p in self.probes:
            fields = getattr(p, hook)(*args)   # every probe is asked, so each drains what it collected
            if p.name in self.recorded:
                out.update(fields)
        return out

    def step_fields(self, step: int) -> dict:
        return self._merged("step_fields", step)

    def sections(self) -> dict:
        return self._merged("sections")

    def tensors(self) -> dict:
        return self._merged("tensors")


# the order probes are attached and their contexts entered (outermost first); the profiler first, so
# its labels span each phase as the other probes see it and its barrier runs before they start a step
ORDER = ("profile", "reference", "gradients", "buckets", "activations", "memory", "memory-snapshot", "bytes",
         "readiness")


def registry() -> dict[str, type]:
    """Probe name (as in Experiment.probes) -> class."""
    from .activations import ActivationsProbe
    from .buckets import BucketsProbe
    from .bytes import BytesProbe
    from .gradients import GradientsProbe
    from .memory import MemoryProbe, MemorySnapshotProbe
    from .profile import ProfileProbe
    from .readiness import ReadinessProbe
    from .reference import ReferenceProbe

    classes = (ReferenceProbe, GradientsProbe, BucketsProbe, ActivationsProbe, MemoryProbe, MemorySnapshotProbe,
               ReadinessProbe, BytesProbe, ProfileProbe)
    return {c.name: c for c in classes}


def attach_order(names, classes: dict[str, type]) -> tuple[list[str], set[str]]:
    """(the probes to attach: the named ones and those they need, in `ORDER`, which lists every
    probe after the ones it needs; the ones whose fields are recorded)."""
    wanted, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo += classes[name].needs
    return sorted(wanted, key=ORDER.index), set(names) | {shown for name in names for shown in classes[name].shows}


def attach(names, at: Attachment) -> ProbeSet:
    """Attach the named probes and the probes they need, each once (see `attach_order`)."""
    classes = registry()
    order, recorded = attach_order(names, classes)
    attached: dict[str, Probe] = {}
    for name in order:
        attached[name] = classes[name](at, attached)
    return ProbeSet(list(attached.values()), recorded)
