"""When gradients become ready: a post-accumulate-grad hook on every parameter.

The hook fires when the parameter's gradient has been accumulated into `.grad` (and before DDP's own
hook copies it into its bucket), so its timestamp is the moment the gradient is ready. All times are
`clock.now_ns()`, one time base for every rank of a launch (`rank/clock.py`). Used by notebooks 04 and
05 (the bucket sweep's compute-only backward is the simulator's input).
"""

from __future__ import annotations

import contextlib

from ...record.timeline import Backward, ReadyEvent
from . import Probe
from .. import clock


class ReadyLog:
    """Records (parameter name, time) each time a parameter's gradient is ready, while `active`. On
    CUDA the time is when the device finished accumulating it (`clock.GpuStamps`), set at `take()`."""

    def __init__(self, module, cuda: bool = False):
        self.active = False
        self.events: list[ReadyEvent] = []
        self.stamps = clock.gpu_stamps() if cuda else None
        for name, p in module.named_parameters():
            if p.requires_grad:   # a frozen parameter never gets a gradient
                p.register_post_accumulate_grad_hook(self._hook_for(name))

    def _hook_for(self, name):
        def hook(param):
            if self.active:
                self.events.append(ReadyEvent(name, clock.now_ns()))
                if self.stamps:
                    i = len(self.events) - 1
                    self.stamps.mark(lambda t: self.events.__setitem__(i, ReadyEvent(name, t)))
        return hook

    def take(self) -> list[ReadyEvent]:
        if self.stamps:
            self.stamps.resolve()
        events, self.events = self.events, []
        return events


class ReadinessProbe(Probe):
    """Fills `TrainStep.backward`: the last micro-step's backward, with every gradient's ready time
    (and, through the buckets probe it needs, every bucket)."""

    name = "readiness"
    needs = ("buckets",)
    shows = ("buckets",)

    def __init__(self, at, attached):
        super().__init__(at, attached)
        cuda = at.ctx.device.type == "cuda"
        self.log = ReadyLog(at.module, cuda)
        self.stamps = self.log.stamps
        self.start_ns = self.end_ns = 0

    def _set(self, field: str):
        return lambda t: setattr(self, field, t)

    @contextlib.contextmanager
    def backward(self, micro: int, last: bool):
        self.log.active = last
        self.start_ns = clock.now_ns()
        if self.stamps:
            self.stamps.mark(self._set("start_ns"))
        try:
            yield
        finally:
            self.end_ns = clock.now_ns()
            if self.stamps:
                self.stamps.mark(self._set("end_ns"))
            self.log.active = False

    def step_fields(self, step: int) -> dict:
        ready = self.log.take()   # on CUDA: every mark of this step resolved, start and end included
        return {"backward": Backward(self.start_ns, self.end_ns, ready)}
