import torch

from ddplab import Experiment
from ddplab.rank import data, models
from ddplab.rank.reference import global_batch
from ddplab.spec import sharding


def all_ids(exp, step):
    return [i for m in range(exp.accum_steps) for r in range(exp.world_size)
            for i in sharding.shard_ids(exp.local_batches, exp.accum_steps, step, m, r)]


def test_shards_are_disjoint_and_cover_the_global_batch_every_step():
    exp = Experiment(world_size=3, local_batch=(4, 2, 5), accum_steps=2, steps=3)
    for step in range(exp.steps):
        ids = all_ids(exp, step)
        assert len(ids) == len(set(ids)) == exp.global_batch
        assert sorted(ids) == list(range(step * exp.global_batch, (step + 1) * exp.global_batch))


def test_examples_depend_only_on_seed_id_and_length():
    a = data.example(seed=0, sample_id=7, seq_len=12, vocab_size=50)
    assert torch.equal(a, data.example(0, 7, 12, 50))
    assert not torch.equal(a, data.example(0, 8, 12, 50))
    assert not torch.equal(a, data.example(1, 7, 12, 50))
    assert a.shape == (13,) and int(a.max()) < 50


def test_examples_mostly_follow_the_learnable_rule():
    x = data.example(0, 3, 400, 64)
    follows = ((3 * x[:-1] + 1) % 64 == x[1:]).float().mean()
    assert 0.85 < follows < 0.95  # NOISE = 0.1 of the tokens are random


def test_batch_shapes_with_per_rank_sequence_lengths():
    exp = Experiment(world_size=2, local_batch=(3, 2), seq_len=(8, 5))
    parts = global_batch(exp, models.build_with_data(exp).batch, step=0)
    assert [tuple(x.shape) for x, _ in parts] == [(3, 8), (2, 5)]
    x, y = parts[0]
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one


def test_contiguous_spans_of_sample_ids():
    assert sharding.contiguous_spans([9, 0, 1, 2, 3, 8]) == [(0, 3), (8, 9)]
    assert sharding.contiguous_spans([5]) == [(5, 5)] and sharding.contiguous_spans([]) == []
