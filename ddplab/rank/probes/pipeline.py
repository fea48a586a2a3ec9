"""The pipeline's meters (notebook 09), one stage per rank.

`StageRecorder` times what the schedule asks of this stage: it wraps the stage's
`forward_one_chunk` and `backward_one_chunk` (the schedule names the microbatch in each call, and a
backward is timed to the moment the schedule gets control back; a module backward hook cannot see
the end of stage 0's backward, whose inputs are token ids) and the loss function (the last stage),
each op on the wall clock and in the CPU time the process spent in it (its own compute, without the
time it waited for a message or for a core it shares with another stage), and meters the
activations saved for backward, alive at once (`LiveSavedBytes`). Runs inside a rank.
"""

from __future__ import annotations

import time

import torch

from ...record.pipeline import StageOp
from .. import clock
from .memory import storages


class _Held:
    """What autograd keeps for a saved tensor while the meter is on: the tensor, and the meter to tell
    when autograd lets go of it (backward ran, or the graph was dropped)."""

    __slots__ = ("tensor", "ptr", "meter")

    def __init__(self, tensor, ptr, meter):
        self.tensor, self.ptr, self.meter = tensor, ptr, meter

    def __del__(self):
        self.meter._release(self.ptr)


class LiveSavedBytes:
    """Saved-tensors hooks that count the bytes saved for backward alive at once, each storage once,
    parameters excluded (as `probes/activations.SavedTensorMeter`, which counts one forward's), and
    integer tensors too: the token ids and targets the embedding and the loss save are not
    activations, and each microbatch's are a view of the global batch's one storage, which counting
    each storage once would charge whole to the first microbatch.
    `with meter:` around the schedule's step; `bytes` now, `peak_bytes` since `reset_peak()`."""

    def __init__(self, parameters):
        self._param_storages = set(storages(parameters))
        self._live: dict[int, list[int]] = {}      # storage pointer -> [bytes, saved tensors holding it]
        self.bytes = 0
        self.peak_bytes = 0

    def _pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self._param_storages or t.device.type == "meta" or not (t.is_floating_point() or t.is_complex()):
            return t
        entry = self._live.get(ptr)
        if entry is None:
            self._live[ptr] = [storage.nbytes(), 1]
            self.bytes += storage.nbytes()
            self.peak_bytes = max(self.peak_bytes, self.bytes)
        else:
            entry[1] += 1
        return _Held(t, ptr, self)

    @staticmethod
    def _unpack(held):
        return held.tensor if isinstance(held, _Held) else held

    def _release(self, ptr: int) -> None:
        entry = self._live[ptr]
        entry[1] -= 1
        if entry[1] == 0:
            del self._live[ptr]
            self.bytes -= entry[0]

    def reset_peak(self) -> None:
        self.peak_bytes = self.bytes

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        return False


class StageRecorder:
    """Records every forward, loss and backward the schedule runs on this stage (see the module
    docstring), with the microbatches in flight and the saved bytes alive after each."""

    def __init__(self, pipe_stage, meter: LiveSavedBytes, device, loss_fn=None):
        self.meter, self.device = meter, device
        self.ops: list[StageOp] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self.on = False
        forward, backward = pipe_stage.forward_one_chunk, pipe_stage.backward_one_chunk

        def timed_forward(fwd_chunk_id, *args, **kwargs):
            return self._timed("forward", fwd_chunk_id, forward, fwd_chunk_id, *args, **kwargs)

        def timed_backward(bwd_chunk_id, *args, **kwargs):
            return self._timed("backward", bwd_chunk_id, backward, bwd_chunk_id, *args, **kwargs)

        pipe_stage.forward_one_chunk, pipe_stage.backward_one_chunk = timed_forward, timed_backward
        self.loss_fn = None if loss_fn is None else self._timed_loss(loss_fn)

    def _timed_loss(self, loss_fn):
        def timed(output, target):
            # the schedules compute a microbatch's loss right after its forward
            forwards = [op.microbatch for op in self.ops if op.kind == "forward"]
            if not self.on or not forwards:
                return loss_fn(output, target)
            return self._timed("loss", forwards[-1], loss_fn, output, target)
        return timed

    def start(self, on: bool = True) -> None:
        """Begin a step: no ops yet, the peaks from what is alive now; `on=False` runs it unrecorded."""
        self.ops, self.in_flight, self.peak_in_flight = [], 0, 0
        self.meter.reset_peak()
        self.on = on

    def stop(self) -> None:
        self.on = False

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _timed(self, kind: str, microbatch: int, fn, *args, **kwargs):
        if not self.on:
            return fn(*args, **kwargs)
        self._sync()
        start, cpu_start = clock.now_ns(), time.process_time_ns()
        out = fn(*args, **kwargs)
        self._sync()
        end, cpu_end = clock.now_ns(), time.process_time_ns()
        self.in_flight += {"forward": 1, "backward": -1}.get(kind, 0)
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self.ops.append(StageOp(kind, int(microbatch), start, end, self.in_flight, self.meter.bytes,
                                cpu_end - cpu_start))
        return out
