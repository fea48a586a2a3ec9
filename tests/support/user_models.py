"""Users' model factories for the tests: `model="tests.support.user_models:<factory>"`."""

from __future__ import annotations

import torch.nn as nn


class _TokenLinear(nn.Module):
    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, idx):
        return self.head(self.emb(idx))


def with_unused(vocab_size: int, d_model: int):
    """A parameter no forward uses: DDP never reduces the bucket that holds it."""
    model = _TokenLinear(vocab_size, d_model)
    model.unused = nn.Linear(d_model, d_model)
    return model


def with_frozen(vocab_size: int, d_model: int):
    """A frozen embedding (requires_grad=False): DDP and every probe must skip it."""
    model = _TokenLinear(vocab_size, d_model)
    model.emb.weight.requires_grad_(False)
    return model


def raises_on_rank_1(vocab_size: int, d_model: int):
    """A factory that fails in one rank only (the launcher's own check, outside any rank, passes)."""
    import os

    if os.environ.get("RANK") == "1":
        raise RuntimeError("this factory refuses to build on rank 1")
    return _TokenLinear(vocab_size, d_model)


def fails_if_flagged(vocab_size: int, d_model: int):
    """Builds like `_TokenLinear`, but raises inside a rank while $DDPLAB_TEST_FAIL is set: the same spec
    (same hash) run twice, once complete and once failed."""
    import os

    if os.environ.get("DDPLAB_TEST_FAIL") and "RANK" in os.environ:
        raise RuntimeError("DDPLAB_TEST_FAIL is set")
    return _TokenLinear(vocab_size, d_model)


class _Held(_TokenLinear):
    def forward(self, idx):
        import os
        import time

        hold, deadline = os.environ.get("DDPLAB_TEST_HOLD"), time.monotonic() + 60
        while hold and "RANK" in os.environ and os.path.exists(hold) and time.monotonic() < deadline:
            time.sleep(0.02)   # the test holds every forward until it deletes the file (at most 60 s)
        return super().forward(idx)


def held(vocab_size: int, d_model: int):
    """`_TokenLinear` whose forward, inside a rank, waits while the file named by $DDPLAB_TEST_HOLD exists
    (the launcher's own check of the factory runs through): a run that lasts as long as the test needs."""
    return _Held(vocab_size, d_model)


BUILT = []   # one entry per call of `counted`, for tests/tools/test_own_model.py


def counted(vocab_size: int, d_model: int):
    """Counts its calls: the launcher's checks should build a user's model once per launch."""
    BUILT.append(1)
    return _TokenLinear(vocab_size, d_model)

