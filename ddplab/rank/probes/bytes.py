"""Bytes this rank really sends: what the process wrote during its synchronized backward, during the
optimizer step (where ZeRO-1's `ZeroRedundancyOptimizer` broadcasts each rank's updated shard), and during
the forward (where FSDP2 all-gathers each unit's parameters).

Linux `/proc/self/io` `wchar` counts every byte written by every thread of the process, gloo's
`writev` to the other ranks included; on one host that is the traffic the ring all-reduce formula
2(D-1)/D x payload predicts (docs/ddp-internals.md, "Bytes on the wire"). Used by notebooks 02 and 03.
"""

from __future__ import annotations

import contextlib

from . import Probe


def io_write_bytes() -> int:
    """Bytes this process has written so far, by every thread (0 where /proc/self/io is missing)."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("wchar"))
    except OSError:
        return 0


class BytesProbe(Probe):
    """Fills `TrainStep.write_bytes` (bytes written during the step's last backward),
    `TrainStep.optimizer_write_bytes` (during its optimizer step) and `TrainStep.forward_write_bytes`
    (during its last forward)."""

    name = "bytes"
    written: int | None = None   # None until a backward has run
    stepped: int | None = None   # None until an optimizer step has run
    forwarded: int | None = None   # None until a forward has run
    _before_step = 0

    @contextlib.contextmanager
    def forward(self, micro: int):
        before = io_write_bytes()
        yield
        self.forwarded = io_write_bytes() - before

    @contextlib.contextmanager
    def backward(self, micro: int, last: bool):
        before = io_write_bytes()
        yield
        self.written = io_write_bytes() - before

    def before_optimizer(self, step: int) -> None:
        self._before_step = io_write_bytes()

    def after_optimizer(self, step: int) -> None:
        self.stepped = io_write_bytes() - self._before_step

    def step_fields(self, step: int) -> dict:
        return {"write_bytes": self.written, "optimizer_write_bytes": self.stepped,
                "forward_write_bytes": self.forwarded}
