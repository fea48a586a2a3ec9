"""The data-coverage task (`DataCoverage`, notebook 08): a DistributedSampler and a DataLoader, as a
DDP training script builds them, iterated for a few epochs with nothing but bookkeeping in the loop.

Every rank records the ids of every batch, then the ranks all_gather them, so each record shows what
every rank got (a rank that ran another number of epochs or batches shows there too), with torch's
`all_gather_object`. Runs inside a rank.
"""

from __future__ import annotations

import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ...record.coverage import CoverageRecord, EpochBatches


class ExampleIds(Dataset):
    """A data set whose example i is its own id, i: what a batch holds says which examples it took."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> int:
        return i


def run(ctx):
    exp, task = ctx.exp, ctx.exp.task
    ctx.log.enter("build sampler", 0)
    dataset = ExampleIds(task.dataset_size)
    sampler = DistributedSampler(dataset, num_replicas=exp.world_size, rank=ctx.rank, shuffle=task.shuffle,
                                 seed=exp.seed, drop_last=task.drop_last)
    loader = DataLoader(dataset, batch_size=exp.local_batch_of(ctx.rank), sampler=sampler,
                        drop_last=task.loader_drop_last)
    epochs = []
    for epoch in range(task.epochs):
        ctx.log.enter("epoch", epoch)
        if task.set_epoch:
            sampler.set_epoch(epoch)   # reseeds the shuffle with seed + epoch; without it every epoch is epoch 0
        batches = [batch.tolist() for batch in loader]
        epochs.append(EpochBatches(epoch, batches, len(batches)))
    ctx.log.enter("all-gather ids", task.epochs)
    gathered = [None] * exp.world_size   # every rank's epochs as it sent them: ranks that disagree still show
    dist.all_gather_object(gathered, epochs, group=ctx.group)
    return CoverageRecord(task.dataset_size, len(sampler), sampler.total_size, len(loader), epochs, gathered), {}
