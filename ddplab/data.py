"""Deterministic synthetic token data with a global sample id per example, sharded per rank.

Every example is a pure function of `(seed, sample_id, seq_len)`, so any process (a rank, the
single-process reference, a test) can rebuild exactly the examples a rank saw from their ids.
The sequences follow a learnable rule (mostly `next = (3 * token + 1) mod vocab`, with a little
noise), so a model trained on them actually gets better. Used by notebooks 00, 01 and 06.

Sharding: optimizer step `s` consumes the global sample ids `[s * G, (s + 1) * G)`, with
G = global batch; micro-step `m` of rank `r` takes the next `local_batch[r]` ids after those of
ranks `0..r-1`. The shards are disjoint and together cover the global batch.
"""

from __future__ import annotations

import torch

NOISE = 0.1  # fraction of tokens replaced by random ones


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


def example(seed: int, sample_id: int, seq_len: int, vocab_size: int) -> torch.Tensor:
    """Token ids of one example: `seq_len + 1` tokens (inputs are [:-1], targets [1:])."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + sample_id)
    first = int(torch.randint(vocab_size, (1,), generator=g))
    noise = (torch.rand(seq_len, generator=g) < NOISE).tolist()
    random_tokens = torch.randint(vocab_size, (seq_len,), generator=g).tolist()
    tokens = [first]
    for t in range(seq_len):
        tokens.append(random_tokens[t] if noise[t] else (3 * tokens[t] + 1) % vocab_size)
    return torch.tensor(tokens, dtype=torch.long)


def batch(seed: int, sample_ids: list[int], seq_len: int, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), each of shape (len(sample_ids), seq_len)."""
    rows = torch.stack([example(seed, i, seq_len, vocab_size) for i in sample_ids])
    return rows[:, :-1], rows[:, 1:]
