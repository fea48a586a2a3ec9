"""Notebook 08, data coverage: the DataCoverage spec refuses bad settings before launch; the tables and
checks count what hand-made records say; and real 4-rank runs of DistributedSampler pad, drop and
reshuffle exactly as torch's own arithmetic says (recomputed here, not taken from ddplab)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from ddplab import verify
from ddplab.recipes.coverage import data_coverage
from ddplab.spec import Experiment
from ddplab.record.coverage import CoverageRecord, EpochBatches
from ddplab.spec.coverage import DataCoverage
from ddplab.tables import coverage as views
from tests.support import launch_leftovers, leftovers, share


# ---- the spec ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("settings, field", [
    (dict(dataset_size=0), "task.dataset_size"),
    (dict(dataset_size=3), "task.dataset_size"),          # fewer examples than the 4 ranks
    (dict(dataset_size=2.5), "task.dataset_size"),
    (dict(epochs=0), "task.epochs"),
    (dict(dataset_size=10 ** 5, epochs=11), "task.epochs"),
    (dict(drop_last="yes"), "task.drop_last"),
    (dict(loader_drop_last=1), "task.loader_drop_last"),
    (dict(shuffle=None), "task.shuffle"),
    (dict(set_epoch=False, shuffle=False), "task.set_epoch"),
    (dict(set_epoch=False, epochs=1), "task.set_epoch"),
])
def test_bad_coverage_settings_are_refused_naming_the_field(settings, field):
    with pytest.raises(ValueError, match=f"Experiment.{field}:"):
        Experiment(world_size=4, local_batch=2, task=DataCoverage(**settings))


def test_a_field_the_coverage_task_does_not_read_is_refused():
    with pytest.raises(ValueError, match="Experiment.steps: the data-coverage task does not read it"):
        Experiment(world_size=4, steps=3, task=DataCoverage())


def test_coverage_spec_round_trips_through_json():
    exp = Experiment(world_size=4, local_batch=(2, 2, 3, 3), seed=7, task=DataCoverage(dataset_size=30, epochs=3,
                                                                                      drop_last=True))
    again = Experiment.from_json(exp.to_json())
    assert again == exp and again.hash == exp.hash and again.task.total_steps(again) == 3


def test_the_recipe_is_four_distinct_experiments_for_one_launch():
    exps = data_coverage()
    assert [e.name for e in exps] == ["coverage-padded", "coverage-drop-last", "coverage-divisible",
                                      "coverage-no-set-epoch"]
    assert len({e.hash for e in exps}) == 4 and {e.world_size for e in exps} == {4}
    padded, dropped, divisible, forgotten = (e.task for e in exps)
    assert padded.dataset_size % 4 and not padded.drop_last and dropped.drop_last
    assert divisible.dataset_size % 4 == 0 and forgotten.dataset_size == divisible.dataset_size
    assert divisible.set_epoch and not forgotten.set_epoch


# ---- the tables and checks on hand-made records ---------------------------------------------------------
def fake_run(per_rank: list[list[list[list[int]]]], dataset_size: int, name: str = "fake"):
    """A run-shaped object: per_rank[r][epoch] is rank r's batches in that epoch."""
    exp = Experiment(name=name, world_size=len(per_rank), local_batch=2,
                     task=DataCoverage(dataset_size=dataset_size, epochs=len(per_rank[0])))
    epochs = [[EpochBatches(e, b, len(b)) for e, b in enumerate(rank)] for rank in per_rank]
    ranks = [SimpleNamespace(rank=r, result=CoverageRecord(dataset_size, len(epochs[r][0].ids), 0, 0, epochs[r], epochs))
             for r in range(len(per_rank))]
    return SimpleNamespace(spec=exp, ranks=ranks, world_size=len(per_rank))


# 5 examples on 2 ranks, padded to 6: example 0 twice; epoch 1 in epoch 0's order again
PADDED = fake_run([[[[0, 2], [4]], [[0, 2], [4]]], [[[1, 3], [0]], [[1, 3], [0]]]], dataset_size=5, name="padded")
# 4 examples on 2 ranks, every one once, a new order in epoch 1
CLEAN = fake_run([[[[3, 0]], [[1, 2]]], [[[1, 2]], [[0, 3]]]], dataset_size=4, name="clean")


def test_coverage_table_counts_the_duplicated_padding_and_the_repeated_order():
    t = views.coverage_table(PADDED)
    assert t.loc[0, "seen_once"] == 4 and t.loc[0, "duplicated"] == [0] and t.loc[0, "dropped"] == []
    assert t.loc[0, "consumed"] == 6 and t.loc[0, "examples_per_rank"] == [3, 3]
    assert t.loc[0, "batches_per_rank"] == [2, 2] and t.loc[0, "equal_batches"]
    assert t.loc[0, "order_changed"] is None and t.loc[1, "order_changed"] == [False, False]
    assert t["all_gather_agrees"].all()


def test_coverage_table_names_dropped_examples_and_unequal_batches():
    run = fake_run([[[[0, 1], [2]]], [[[3, 4]]]], dataset_size=7)
    t = views.coverage_table(run)
    assert t.loc[0, "dropped"] == [5, 6] and t.loc[0, "duplicated"] == [] and t.loc[0, "seen_once"] == 5
    assert t.loc[0, "batches_per_rank"] == [2, 1] and not t.loc[0, "equal_batches"]


def test_sample_grid_shows_which_ranks_saw_each_example():
    ranks, counts = views.sample_grid(PADDED), views.sample_grid(PADDED, value="count")
    assert ranks.shape == (5, 2) and ranks.at[0, 0] == (0, 1) and ranks.at[4, 1] == (0,) and ranks.at[3, 0] == (1,)
    assert counts[0].tolist() == [2, 1, 1, 1, 1]
    assert views.sample_grid(fake_run([[[[0]]], [[[1]]]], dataset_size=3)).at[2, 0] == ()
    with pytest.raises(ValueError, match="value"):
        views.sample_grid(PADDED, value="rank")


def test_verify_each_example_once_names_what_was_duplicated_or_dropped(capsys):
    with pytest.raises(verify.CheckFailed, match=r"in epoch 0: 4 once, none dropped, duplicated \[0\]"):
        views.verify_each_example_once(PADDED)
    with pytest.raises(verify.CheckFailed, match=r"dropped \[5, 6\], none duplicated"):
        views.verify_each_example_once(fake_run([[[[0, 1], [2]]], [[[3, 4]]]], dataset_size=7))
    views.verify_each_example_once(CLEAN)
    views.verify_each_example_once(CLEAN, epoch=1)
    assert capsys.readouterr().out.count("verified: clean: every one of the 4 examples seen exactly once") == 2
    with pytest.raises(ValueError, match="epoch"):
        views.verify_each_example_once(CLEAN, epoch=2)


def test_verify_order_changes_fails_when_an_epoch_repeats_the_order(capsys):
    with pytest.raises(verify.CheckFailed, match=r"0 of 2 .*again on \[rank 0 in epoch 1, rank 1 in epoch 1\]"):
        views.verify_order_changes(PADDED)
    views.verify_order_changes(CLEAN)
    assert "verified: clean: every rank's order of examples changes" in capsys.readouterr().out
    with pytest.raises(ValueError, match="at least 2"):
        views.verify_order_changes(fake_run([[[[0]]], [[[1]]]], dataset_size=2))


def test_sample_grid_figure_has_one_panel_per_run():
    import matplotlib

    matplotlib.use("Agg")
    from ddplab.plots.coverage import sample_grid

    fig = sample_grid([PADDED, CLEAN], detached=True)
    titles = [ax.get_title("left") for ax in fig.axes]
    assert titles[0].startswith("padded") and "1 duplicated per epoch" in titles[0] and "same order" in titles[0]
    assert "every example exactly once" in titles[1]
    assert len(sample_grid(CLEAN, detached=True).axes) == 1


# ---- real runs: 4 ranks, one launch ----------------------------------------------------------------------
W, SEED = 4, 0


def _coverage_exps():
    loader_drops = Experiment(name="coverage-loader-drop-last", world_size=W, local_batch=4, seed=SEED,
                              task=DataCoverage(dataset_size=22, epochs=2, loader_drop_last=True))
    return [*data_coverage(world_size=W, seed=SEED), loader_drops]


share("coverage", _coverage_exps)


@pytest.fixture(scope="module")
def coverage_runs(shared_runs):
    """The recipe's four experiments and one with the DataLoader's own drop_last (in the shared launch):
    name -> Run."""
    return {r.spec.name: r for r in shared_runs["coverage"]}


def torch_permutation(n: int, epoch: int) -> list[int]:
    """DistributedSampler's shuffle: randperm(n) from a generator seeded with seed + epoch."""
    import torch

    return torch.randperm(n, generator=torch.Generator().manual_seed(SEED + epoch)).tolist()


def expected_shards(n: int, epoch: int, drop_last: bool) -> list[list[int]]:
    """Each rank's ids by DistributedSampler's documented arithmetic, written out independently."""
    num_samples = n // W if drop_last else math.ceil(n / W)
    total = num_samples * W
    order = torch_permutation(n, epoch)
    order = order[:total] if drop_last else order + order[:total - n]
    return [order[r:total:W] for r in range(W)]


@pytest.mark.slow
@pytest.mark.parametrize("name, drop_last", [("coverage-padded", False), ("coverage-drop-last", True),
                                             ("coverage-divisible", False)])
def test_every_rank_gets_torchs_shard_in_batches_of_local_batch(coverage_runs, name, drop_last):
    run = coverage_runs[name]
    n, b = run.spec.task.dataset_size, run.spec.local_batch
    num_samples = n // W if drop_last else math.ceil(n / W)
    for r in run.ranks:
        assert (r.result.num_samples, r.result.total_size) == (num_samples, num_samples * W)
        assert r.result.loader_len == math.ceil(num_samples / b)
        for e in r.result.epochs:
            assert e.ids == expected_shards(n, e.epoch, drop_last)[r.rank]
            assert [len(x) for x in e.batches] == [min(b, num_samples - i) for i in range(0, num_samples, b)]
            assert e.num_batches == r.result.loader_len
        assert r.result.gathered == [o.result.epochs for o in run.ranks]   # the all_gather delivered every rank's
    assert views.coverage_table(run)["equal_batches"].all()


@pytest.mark.slow
def test_the_loaders_drop_last_drops_each_ranks_last_short_batch_on_top_of_the_sampler(coverage_runs):
    run = coverage_runs["coverage-loader-drop-last"]
    n, b = run.spec.task.dataset_size, run.spec.local_batch
    full = math.ceil(n / W) // b * b              # the sampler pads to ceil(N/W) a rank; the loader keeps whole batches
    table = views.coverage_table(run)
    for e in range(run.spec.task.epochs):
        kept = [shard[:full] for shard in expected_shards(n, e, drop_last=False)]
        assert [r.result.epochs[e].ids for r in run.ranks] == kept
        assert table.loc[e, "dropped"] == sorted(set(range(n)) - {i for k in kept for i in k})
        assert table.loc[e, "batches_per_rank"] == [math.ceil(n / W) // b] * W
    assert run.ranks[0].result.loader_len == math.ceil(n / W) // b


@pytest.mark.slow
def test_padding_covers_every_example_and_duplicates_the_first_ids_of_the_permutation(coverage_runs):
    run = coverage_runs["coverage-padded"]
    n = run.spec.task.dataset_size
    padding = math.ceil(n / W) * W - n
    assert n % W and padding > 0
    table = views.coverage_table(run)
    for e in range(run.spec.task.epochs):
        assert table.loc[e, "dropped"] == []
        assert table.loc[e, "duplicated"] == sorted(torch_permutation(n, e)[:padding])
        assert table.loc[e, "seen_once"] == n - padding and table.loc[e, "consumed"] == n + padding
        counts = views.sample_grid(run, value="count")[e]
        assert counts.min() == 1 and counts.max() == 2
    with pytest.raises(verify.CheckFailed, match="duplicated"):
        views.verify_each_example_once(run)


@pytest.mark.slow
def test_drop_last_drops_exactly_n_mod_w_examples_and_duplicates_none(coverage_runs):
    run = coverage_runs["coverage-drop-last"]
    n = run.spec.task.dataset_size
    table = views.coverage_table(run)
    for e in range(run.spec.task.epochs):
        assert table.loc[e, "dropped"] == sorted(torch_permutation(n, e)[n - n % W:])
        assert len(table.loc[e, "dropped"]) == n % W and table.loc[e, "duplicated"] == []
        assert table.loc[e, "seen_once"] == n - n % W
    with pytest.raises(verify.CheckFailed, match="dropped"):
        views.verify_each_example_once(run, epoch=0)


@pytest.mark.slow
def test_a_divisible_data_set_gives_every_example_exactly_once(coverage_runs, capsys):
    run = coverage_runs["coverage-divisible"]
    n = run.spec.task.dataset_size
    assert n % W == 0
    views.verify_each_example_once(run)
    assert f"verified: coverage-divisible: every one of the {n} examples seen exactly once" in capsys.readouterr().out
    assert (views.sample_grid(run, value="count") == 1).all().all()
    assert views.coverage_table(run)["examples_per_rank"].tolist() == [[n // W] * W] * run.spec.task.epochs


@pytest.mark.slow
def test_a_forgotten_set_epoch_repeats_epoch_0s_order_while_set_epoch_changes_it(coverage_runs):
    forgotten, reseeded = coverage_runs["coverage-no-set-epoch"], coverage_runs["coverage-divisible"]
    n = forgotten.spec.task.dataset_size
    for r in forgotten.ranks:
        assert all(e.ids == expected_shards(n, 0, False)[r.rank] for e in r.result.epochs)
    assert views.coverage_table(forgotten)["order_changed"].iloc[1:].tolist() == [[False] * W] * 2
    assert views.coverage_table(reseeded)["order_changed"].iloc[1:].tolist() == [[True] * W] * 2
    with pytest.raises(verify.CheckFailed, match="0 of 8 epoch-to-epoch orders changed"):
        views.verify_order_changes(forgotten)
    views.verify_order_changes(reseeded)
    views.verify_each_example_once(forgotten)   # every example once: a forgotten set_epoch hides from coverage


@pytest.mark.slow
def test_the_coverage_launch_leaves_no_process_behind(coverage_runs):
    for run in coverage_runs.values():
        assert not leftovers(run.path)
    assert not launch_leftovers(next(iter(coverage_runs.values())))
