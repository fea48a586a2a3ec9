"""Notebook 01, the synchronized gradient: local, reduced and reference gradients; unequal work."""

from __future__ import annotations

from ..spec import Experiment


def gradient_run(world_size: int = 4, local_batch: int = 8, **overrides) -> Experiment:
    """Notebook 01: every rank records its local and reduced gradient; rank 0 the global-batch reference."""
    fields = dict(name=f"synchronized-gradient-w{world_size}", world_size=world_size, local_batch=local_batch,
                  probes=("gradients",))
    return Experiment(**{**fields, **overrides})


def unequal_work(local_batch=(2, 4, 6, 12), seq_len=(16, 16, 16, 16), **overrides) -> list[Experiment]:
    """Notebook 01: the same unequal shards under each loss normalization (naive rank-mean first)."""
    return [gradient_run(world_size=len(local_batch), local_batch=tuple(local_batch), seq_len=seq_len,
                                  name=f"unequal-{norm}", loss_norm=norm, **overrides)
            for norm in ("rank-mean", "global-sample", "global-token")]
