"""Which global sample ids each rank processes: the data-parallel sharding rule (pure: no torch).

Optimizer step `s` consumes the global sample ids `[s * G, (s + 1) * G)`, with G = global batch;
micro-step `m` of rank `r` takes the next `local_batch[r]` ids after those of ranks `0..r-1`. The
shards are disjoint and together cover the global batch. The ranks (`rank/data.py` builds each
example from its id), the single-process reference and the views all use this one rule.
Used by notebooks 00, 01 and 06.
"""

from __future__ import annotations


def shard_ids(local_batches: list[int], accum_steps: int, step: int, micro: int, rank: int) -> list[int]:
    """Global sample ids that `rank` processes in micro-step `micro` of optimizer step `step`."""
    per_micro = sum(local_batches)
    start = step * per_micro * accum_steps + micro * per_micro + sum(local_batches[:rank])
    return list(range(start, start + local_batches[rank]))


def contiguous_spans(ids: list[int]) -> list[tuple[int, int]]:
    """[0, 1, 2, 3, 8, 9] -> [(0, 3), (8, 9)]: runs of consecutive sample ids, first and last."""
    spans: list[tuple[int, int]] = []
    for i in sorted(ids):
        if spans and i == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], i)
        else:
            spans.append((i, i))
    return spans
