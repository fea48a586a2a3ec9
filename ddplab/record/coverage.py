"""The data-coverage task's record: every rank's epochs as its DataLoader yielded them (pure: no torch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EpochBatches:
    """One rank's epoch: the example ids of every batch its DataLoader yielded, in order."""

    epoch: int
    batches: list[list[int]]
    num_batches: int               # how many batches the loop got (a DDP step per batch)

    @property
    def ids(self) -> list[int]:
        return [i for b in self.batches for i in b]


@dataclass(frozen=True)
class CoverageRecord:
    """A rank's part of rank{r}.json: its sampler's arithmetic, its own epochs, and every rank's epochs
    as the all_gather delivered them (`gathered[r]` is rank r's; the same on every rank)."""

    dataset_size: int
    num_samples: int               # len(sampler): ids this rank takes per epoch
    total_size: int                # sampler.total_size: ids over all ranks per epoch, padding included
    loader_len: int                # len(loader): the batches the DataLoader promises per epoch
    epochs: list[EpochBatches]
    gathered: list[list[EpochBatches]]
