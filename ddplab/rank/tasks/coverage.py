"""The data-coverage task (`DataCoverage`, notebook 08): a DistributedSampler and a DataLoader, as a
DDP training script builds them, iterated for a few epochs with nothing but bookkeeping in the loop.

Every rank records the ids of every batch, then the ranks all_gather them, so each record shows what
every rank got (a rank that ran another number of epochs or batches shows there too). Runs inside a rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ...spec.coverage import CoverageRecord, EpochBatches


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
    gathered = [_decode(ids) for ids in _all_gather(_encode(epochs), ctx)]
    return CoverageRecord(task.dataset_size, len(sampler), sampler.total_size, len(loader), epochs, gathered), {}


def _all_gather(flat: list[int], ctx) -> list[list[int]]:
    """Every rank's list of ints (lengths may differ): all_gather the lengths, then the padded lists."""
    n = torch.tensor([len(flat)], dtype=torch.int64, device=ctx.device)
    lengths = [torch.zeros_like(n) for _ in range(ctx.exp.world_size)]
    dist.all_gather(lengths, n, group=ctx.group)
    longest = max(int(x) for x in lengths)
    mine = torch.zeros(longest, dtype=torch.int64, device=ctx.device)
    mine[:len(flat)] = torch.tensor(flat, dtype=torch.int64)
    every = [torch.zeros_like(mine) for _ in range(ctx.exp.world_size)]
    dist.all_gather(every, mine, group=ctx.group)
    return [t[:int(k)].tolist() for t, k in zip(every, lengths)]


def _encode(epochs: list[EpochBatches]) -> list[int]:
    """[epochs, then per epoch: batches, then per batch: its length and its ids]."""
    flat = [len(epochs)]
    for e in epochs:
        flat.append(len(e.batches))
        for b in e.batches:
            flat += [len(b), *b]
    return flat


def _decode(flat: list[int]) -> list[EpochBatches]:
    it = iter(flat)
    epochs = []
    for epoch in range(next(it)):
        batches = [[next(it) for _ in range(next(it))] for _ in range(next(it))]
        epochs.append(EpochBatches(epoch, batches, len(batches)))
    return epochs
