"""The reference probe: how far this rank's step-0 update is from the one-process global-batch update,
and how far the update it would have taken alone is (`rank/reference.py` computes both).
Used by notebooks 00 and 01.
"""

from __future__ import annotations

from ...record.train import Distance, ReferenceRecord
from .. import reference
from ..training import flat_parameters
from . import Probe


class ReferenceProbe(Probe):
    """Fills `TrainRecord.reference` after step 0."""

    name = "reference"

    def __init__(self, at, attached):
        super().__init__(at, attached)
        ctx = at.ctx
        ctx.log.enter("reference")  # single-process work: the launcher's watchdog sees it is alive
        self.before, self.after, _ = reference.reference_step(ctx.exp, ctx.device)
        _, alone_after, self.alone_checksum = reference.reference_step(ctx.exp, ctx.device, ranks=[ctx.rank])
        self.alone = reference.distance(alone_after, self.before, self.after)
        self.record = None

    def after_optimizer(self, step: int) -> None:
        if step == 0:
            ddp = reference.distance(flat_parameters(self.at.module), self.before, self.after)
            self.record = ReferenceRecord(ddp, Distance(self.alone.max_abs_diff, self.alone.update_rel_error,
                                                        self.alone_checksum))

    def sections(self) -> dict:
        return {"reference": self.record}
