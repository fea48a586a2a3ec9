"""How much each rank's examples count in the synchronized gradient, under each loss normalization
(pure). DDP averages the ranks' gradients, so a rank's *mean* gradient counts 1/world_size whatever its
size, unless the loss is normalized by the global count (`rank/training.micro_loss`). Used by
notebook 01 and its widget.
"""

from __future__ import annotations


def rank_weights(local_batches: list[int], seq_lens: list[int], loss_norm: str) -> list[float]:
    """How much rank r's local *mean* gradient counts in the synchronized gradient (pure).

    "rank-mean": every rank counts 1/world_size, whatever its size. The global objectives weight a
    rank by its share of the examples ("global-sample") or tokens ("global-token").
    """
    w = len(local_batches)
    if loss_norm == "rank-mean":
        return [1 / w] * w
    sizes = local_batches if loss_norm == "global-sample" else [b * s for b, s in zip(local_batches, seq_lens)]
    return [s / sum(sizes) for s in sizes]
