"""Deterministic synthetic token data with a global sample id per example, sharded per rank.

Every example is a pure function of `(seed, sample_id, seq_len)`, so any process (a rank, the
single-process reference, a test) can rebuild exactly the examples a rank saw from their ids.
The sequences follow a learnable rule (mostly `next = (3 * token + 1) mod vocab`, with a little
noise), so a model trained on them actually gets better. Which ids a rank gets is the sharding
rule, `spec/sharding.py`. Used by notebooks 00, 01 and 06.
"""

from __future__ import annotations

import torch

NOISE = 0.1  # fraction of tokens replaced by random ones


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
