"""ZeRO-1: DDP as usual, but each rank keeps (and updates) only its share of the optimizer state,
then broadcasts its updated parameters (`ZeroRedundancyOptimizer`; notebook 02's sharding preview)."""

from __future__ import annotations

from torch.distributed.optim import ZeroRedundancyOptimizer


def sharded_optimizer(params, optimizer_class, group=None, **kwargs) -> ZeroRedundancyOptimizer:
    return ZeroRedundancyOptimizer(params, optimizer_class=optimizer_class, process_group=group, **kwargs)
