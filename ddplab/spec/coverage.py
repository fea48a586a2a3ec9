"""The data-coverage task (notebook 08): which examples each rank's `DistributedSampler` hands its
`DataLoader`, epoch after epoch, and which ones no rank saw or two ranks saw.

    DataCoverage(dataset_size=22, epochs=3, drop_last=False)   # 22 ids over 4 ranks: 2 padded
    DataCoverage(dataset_size=22, epochs=3, drop_last=True)    # 22 ids over 4 ranks: 2 dropped
    DataCoverage(dataset_size=24, epochs=3, set_epoch=False)   # the forgotten set_epoch: one order

A fast step that silently drops examples or trains on some twice is a failure, so the record keeps
every batch's ids, in order, on every rank, and every rank's copy of all of them (an all_gather).
The sampler's arithmetic (torch.utils.data.DistributedSampler): each rank takes
`num_samples = ceil(N / W)` ids, the permutation padded with its own first ids up to `W x num_samples`;
with `drop_last=True`, `floor(N / W)`, the permutation's last `N mod W` ids cut off. The shuffle is
seeded with `seed + epoch`, so an epoch repeats the last one's order unless `set_epoch(epoch)` is called.
Pure: no torch. The rank side is `rank/tasks/coverage.py`, the views `tables/coverage.py` and
`plots/coverage.py`, the experiments `recipes/coverage.py`.
Reference: https://pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler
"""

from __future__ import annotations

from dataclasses import dataclass

from ..record.coverage import CoverageRecord
from .checks import bad, is_int
from .tasks import RUN_FIELDS, Phase, TaskSpec, register

MAX_DATASET_SIZE = 10 ** 5
MAX_EPOCHS = 1000
MAX_RECORDED_IDS = 10 ** 6   # dataset_size x epochs: every id of every epoch goes into every rank's record


@register
@dataclass(frozen=True, kw_only=True)
class DataCoverage(TaskSpec):
    """Every rank iterates `epochs` epochs of a DataLoader (batch_size=local_batch, `loader_drop_last`)
    over a DistributedSampler of the ids 0..dataset_size-1 (`shuffle`, seed=Experiment.seed,
    `drop_last`), calling `set_epoch(epoch)` before each epoch unless `set_epoch=False`, and records the
    ids of every batch; then the ranks all_gather them (`rank/tasks/coverage.py`)."""

    kind = "data-coverage"
    runner = "ddplab.rank.tasks.coverage:run"
    record = CoverageRecord
    phases = (Phase("build sampler", 2), Phase("epoch", 4),
              Phase("all-gather ids", 6, "all_gather of every rank's batch ids", after_steps=True))
    reads = RUN_FIELDS | {"seed", "local_batch"}
    step_unit = "epochs"
    dataset_size: int = 22
    epochs: int = 2
    shuffle: bool = True
    drop_last: bool = False        # the sampler's: cut the tail instead of padding with repeated ids
    loader_drop_last: bool = False  # the DataLoader's: drop each rank's last, smaller batch
    set_epoch: bool = True          # False: the forgotten sampler.set_epoch(epoch)

    def check(self, exp) -> None:
        for name in ("shuffle", "drop_last", "loader_drop_last", "set_epoch"):
            if not isinstance(getattr(self, name), bool):
                bad(f"task.{name}", f"must be True or False (got {getattr(self, name)!r})")
        n = self.dataset_size
        if not is_int(n) or not 1 <= n <= MAX_DATASET_SIZE:
            bad("task.dataset_size", f"must be an integer in 1..{MAX_DATASET_SIZE} (got {n!r})")
        if is_int(exp.world_size) and n < exp.world_size:
            bad("task.dataset_size", f"{n} examples cannot give each of world_size={exp.world_size} ranks one")
        if not is_int(self.epochs) or not 1 <= self.epochs <= MAX_EPOCHS:
            bad("task.epochs", f"must be an integer in 1..{MAX_EPOCHS} (got {self.epochs!r})")
        if n * self.epochs > MAX_RECORDED_IDS:
            bad("task.epochs", f"dataset_size x epochs is at most {MAX_RECORDED_IDS} ids, each recorded on every rank "
                               f"(got {n} x {self.epochs})")
        if not self.set_epoch and not self.shuffle:
            bad("task.set_epoch", "set_epoch only reseeds the shuffle: with shuffle=False every epoch has the same "
                                  "order anyway; leave it True")
        if not self.set_epoch and self.epochs < 2:
            bad("task.set_epoch", "a forgotten set_epoch shows from the second epoch on: set epochs >= 2")

    def total_steps(self, exp) -> int:
        return self.epochs
