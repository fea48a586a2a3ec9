"""The synchronized gradient against the single-process reference, from real 2- and 4-rank runs."""

from __future__ import annotations

import pytest
import torch

from ddplab import Experiment, recipes, tables
from ddplab.predict.loss_weights import rank_weights
from ddplab.tables import gradients
from tests.support import share

pytestmark = pytest.mark.slow


def exps_for(world_size: int) -> list[Experiment]:
    batches = (2, 6) if world_size == 2 else (2, 4, 6, 12)
    seqs = (8, 16) if world_size == 2 else (8, 16, 16, 32)
    return [recipes.gradient_run(world_size, local_batch=4),
            *recipes.unequal_work(local_batch=batches, seq_len=seqs),
            recipes.gradient_run(world_size, name=f"f64-w{world_size}", local_batch=batches, seq_len=seqs,
                                          loss_norm="global-token", dtype="float64")]


share("grads-2", lambda: exps_for(2))
share("grads-4", lambda: exps_for(4))
share("accum", lambda: recipes.accumulation(world_size=2, local_batch=4, accum_steps=4))


@pytest.fixture(scope="module", params=[2, 4], ids=["2-ranks", "4-ranks"])
def grad_runs(request, shared_runs):
    runs = shared_runs[f"grads-{request.param}"]
    return {r.spec.name.rsplit("-w", 1)[0] if r.spec.name.startswith(("synchronized", "f64")) else r.spec.name: r
            for r in runs}


def test_reduced_gradient_equals_global_batch_gradient(grad_runs):
    rows = gradients.check(grad_runs["synchronized-gradient"])
    assert all(r["reduced_rel_error"] < 1e-5 for r in rows)
    assert all(r["reduced_identical_on_all_ranks"] for r in rows)
    assert all(r["local_rel_error"] > 1e-2 for r in rows), "a local gradient alone is not the global one"


@pytest.mark.parametrize("norm", ["global-sample", "global-token"])
def test_weighted_normalization_reproduces_the_reference_with_unequal_work(grad_runs, norm):
    assert all(r["reduced_rel_error"] < 1e-5 for r in gradients.check(grad_runs[f"unequal-{norm}"]))


def test_naive_rank_mean_misses_the_reference_when_counts_differ(grad_runs):
    assert all(r["reduced_rel_error"] > 1e-2 for r in gradients.check(grad_runs["unequal-rank-mean"]))


def test_float64_reduced_gradient_matches_to_1e_12(grad_runs):
    run = grad_runs["f64"]
    assert run.tensors(0)["reduced"]["head.weight"].dtype == torch.float64
    assert all(r["reduced_rel_error"] < 1e-12 for r in gradients.check(run))


def test_rank_weights_model_explains_both_naive_and_weighted_results(grad_runs):
    run = grad_runs["unequal-rank-mean"]
    spec, tensors = run.spec, gradients.load(run)
    naive = gradients.combine(run, rank_weights(spec.local_batches, spec.seq_lens, "rank-mean"))
    fair = gradients.combine(run, rank_weights(spec.local_batches, spec.seq_lens, "global-token"))
    for name, ref in tensors[0]["reference"].items():
        assert torch.allclose(naive[name], tensors[0]["reduced"][name].double(), rtol=1e-5, atol=1e-7)
        assert torch.allclose(fair[name], ref.double(), rtol=1e-4, atol=1e-6)


def test_rank_weights_are_pure_and_sum_to_one():
    assert rank_weights([2, 6], [8, 8], "rank-mean") == [0.5, 0.5]
    assert rank_weights([2, 6], [8, 8], "global-sample") == [0.25, 0.75]
    assert rank_weights([2, 6], [16, 8], "global-token") == [32 / 80, 48 / 80]


@pytest.fixture(scope="module")
def accum_runs(shared_runs):
    return shared_runs["accum"]


def test_accumulated_synchronized_gradient_equals_the_reference(accum_runs):
    for run in accum_runs:
        assert run.spec.global_batch == 32
        assert all(r["reduced_rel_error"] < 1e-5 for r in gradients.check(run))


def test_no_sync_all_reduces_once_per_optimizer_step(accum_runs):
    table = tables.global_batch.accumulation(accum_runs)
    no_sync, every, big = table.iloc[0], table.iloc[1], table.iloc[2]
    assert no_sync["buckets"] > 1
    assert no_sync["all_reduces_per_step"] == no_sync["buckets"] == big["all_reduces_per_step"]
    assert every["all_reduces_per_step"] == 4 * every["buckets"]


def test_micro_steps_hold_a_quarter_of_the_big_batch_activations(accum_runs):
    table = tables.global_batch.accumulation(accum_runs)
    ratio = table["activation_mib_per_micro_step"].iloc[2] / table["activation_mib_per_micro_step"].iloc[0]
    assert ratio == pytest.approx(4, rel=0.1)
