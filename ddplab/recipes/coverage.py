"""Notebook 08, data coverage: what DistributedSampler does with a data set that does not divide by
the world size (pads with repeated ids, or drops the tail), one that does, and a forgotten set_epoch."""

from __future__ import annotations

from ..spec import Experiment
from ..spec.coverage import DataCoverage


def data_coverage(world_size: int = 4, dataset_size: int = 22, divisible_size: int | None = None,
                  local_batch: int = 2, epochs: int = 3, seed: int = 0, **overrides) -> list[Experiment]:
    """Notebook 08, four experiments for one `ddplab.run_many` launch, every one shuffled with `seed`:
    "coverage-padded" (drop_last=False on `dataset_size` ids: the sampler repeats its first ids so every
    rank gets ceil(N/W)), "coverage-drop-last" (drop_last=True: it cuts N mod W ids), "coverage-divisible"
    (`divisible_size` ids, by default the multiple of world_size above dataset_size: every id once) and
    "coverage-no-set-epoch" (the same, without sampler.set_epoch: every epoch in one order).
    Keyword arguments override Experiment fields."""
    if divisible_size is None:
        divisible_size = -(-dataset_size // world_size) * world_size if isinstance(world_size, int) else dataset_size
    base = dict(world_size=world_size, local_batch=local_batch, seed=seed, **overrides)
    return [Experiment(name="coverage-padded", task=DataCoverage(dataset_size=dataset_size, epochs=epochs), **base),
            Experiment(name="coverage-drop-last", task=DataCoverage(dataset_size=dataset_size, epochs=epochs,
                                                                   drop_last=True), **base),
            Experiment(name="coverage-divisible", task=DataCoverage(dataset_size=divisible_size, epochs=epochs), **base),
            Experiment(name="coverage-no-set-epoch", task=DataCoverage(dataset_size=divisible_size, epochs=epochs,
                                                                      set_epoch=False), **base)]
