"""The analytic memory model against tensors built in this process (no ranks launched)."""

import pytest
import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

from ddplab import Experiment
from ddplab.predict import memory
from ddplab.rank import data, models
from ddplab.rank.probes.activations import SavedTensorMeter
from ddplab.rank.probes.memory import PeakTracker, ledger
from ddplab.rank.training import make_optimizer, micro_loss, token_losses

SHAPES = [dict(model="transformer", local_batch=8, seq_len=16, d_model=64, n_layers=2, vocab_size=64),
          dict(model="transformer", local_batch=3, seq_len=32, d_model=96, n_layers=3, n_heads=6, vocab_size=100),
          dict(model="transformer", local_batch=4, seq_len=8, tie_weights=True),
          dict(model="mlp", local_batch=5, seq_len=12, d_model=48, n_layers=3, vocab_size=80),
          dict(model="transformer", local_batch=2, seq_len=8, dtype="float64")]


@pytest.mark.parametrize("kw", SHAPES, ids=lambda kw: "-".join(f"{v}" for v in kw.values()))
def test_parameter_numels_match_the_built_model(kw):
    exp = Experiment(**kw)
    assert memory.parameter_numels(exp) == [p.numel() for p in models.build(exp).parameters()]


@pytest.mark.parametrize("kw", SHAPES, ids=lambda kw: "-".join(f"{v}" for v in kw.values()))
def test_activation_model_matches_what_autograd_saves(kw):
    exp = Experiment(**kw)
    model = models.build(exp).to(torch.float64 if exp.dtype == "float64" else torch.float32)
    x, y = data.batch(0, list(range(exp.local_batch_of(0))), exp.seq_len_of(0), exp.vocab_size)
    with SavedTensorMeter(model.parameters()) as meter:
        micro_loss("rank-mean", token_losses(model(x), y), 1, 1.0, 1.0)
    assert memory.activation_bytes(exp) == meter.bytes


def test_a_parameter_swapped_in_after_the_meter_was_built_is_no_activation():
    """FSDP2 swaps each unit's gathered parameters in for its shards during the forward: parameters the meter
    was not built with. A Linear saves its weight (or a view of it) for backward; that is parameter memory."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)
    with SavedTensorMeter(model.parameters()) as meter:
        model(x).sum()
    before = meter.bytes
    for m in (model[0], model[2]):
        m.weight = torch.nn.Parameter(m.weight.detach().clone())   # as FSDP2's gathered parameter
    with SavedTensorMeter([]) as meter:   # built with none of them
        model(x).sum()
    assert meter.bytes == before == (5 * 8 + 5 * 16) * 4   # x, and tanh's output (the second layer's input)


@pytest.mark.parametrize("optimizer, momentum", [("adam", 0.0), ("sgd", 0.9), ("sgd", 0.0)])
def test_model_state_equals_the_tensors_one_optimizer_step_leaves(optimizer, momentum):
    """Parameters, gradients and optimizer state as the memory probe's ledger counts them after a
    real step of the spec's model and optimizer (DDP's buckets need ranks: tests/tasks/test_memory.py)."""
    exp = Experiment(world_size=8, optimizer=optimizer, momentum=momentum)
    model = models.build(exp)
    optimizer = make_optimizer(exp, model.parameters())
    x, y = data.batch(0, list(range(exp.local_batch_of(0))), exp.seq_len_of(0), exp.vocab_size)
    token_losses(model(x), y).mean().backward()
    optimizer.step()
    held, predicted = ledger(model, optimizer), memory.state_bytes(exp)
    for c in ("parameters", "gradients", "optimizer_state"):
        assert held[c] == predicted[c], (c, held[c], predicted[c])


def _torch_partition(params, world_size: int) -> list[int]:
    """The rank torch's ZeroRedundancyOptimizer gives each parameter, from its own partition method
    run on a bare instance (no process group: any world size in one process)."""
    zero = ZeroRedundancyOptimizer.__new__(ZeroRedundancyOptimizer)
    zero.world_size, zero.param_groups, zero._partition_parameters_cache = world_size, [{"params": params}], []
    rank_of = {id(p): r for r, groups in enumerate(zero._partition_parameters()) for g in groups for p in g["params"]}
    return [rank_of[id(p)] for p in params]


@pytest.mark.parametrize("kw", SHAPES, ids=lambda kw: "-".join(f"{v}" for v in kw.values()))
@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_zero1_owners_are_torchs_partition(kw, world_size):
    exp = Experiment(**kw)
    params = list(models.build(exp).parameters())
    assert memory.zero1_owners([p.numel() for p in params], world_size) == _torch_partition(params, world_size)


def test_zero1_shards_only_the_optimizer_state_and_every_tensor_has_one_owner():
    exp = Experiment(optimizer="adam", sharding="zero1")
    whole = memory.state_bytes(exp.replace(sharding="none", world_size=4))
    biggest = memory.optimizer_state_bytes(exp, [max(memory.parameter_numels(exp))], [True])
    for w in (1, 2, 3, 4, 8):
        shares = [memory.state_bytes(exp.replace(world_size=w), rank=r) for r in range(w)]
        assert sum(s["optimizer_state"] for s in shares) == whole["optimizer_state"], w
        for c in ("parameters", "gradients", "ddp_buckets"):
            assert {s[c] for s in shares} == {whole[c]}, (w, c)
        # greedy, largest first: no rank holds more than an even share plus the largest tensor's state
        largest = max(s["optimizer_state"] for s in shares)
        assert whole["optimizer_state"] / w <= largest <= whole["optimizer_state"] / w + biggest, w
    with pytest.raises(ValueError, match="covers 'none' and 'zero1', not 'fsdp2'"):
        memory.state_bytes(exp.replace(sharding="fsdp2"))
    with pytest.raises(ValueError, match="rank: 4 is not one of the experiment's ranks 0..3"):
        memory.state_bytes(exp.replace(world_size=4), rank=4)   # not a silent empty share


def test_bucket_views_remove_the_gradient_copy_after_backward():
    pred = memory.predict(Experiment(gradient_as_bucket_view=True))
    assert pred["forward"]["ddp_buckets"] > 0 and pred["backward"]["ddp_buckets"] == 0
    assert pred["backward"]["gradients"] == pred["forward"]["ddp_buckets"]


def test_optimizer_state_appears_after_the_first_step():
    pred = memory.predict(Experiment(optimizer="sgd", momentum=0.9), step=0)
    assert pred["forward"]["optimizer_state"] == 0 and pred["step"]["optimizer_state"] == pred["step"]["parameters"]


def test_peak_tracker_sees_activations_and_gradients_alive_together():
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    x = torch.randn(64, 256)
    with PeakTracker() as tracker:
        model(x).square().mean().backward()
    grads = sum(p.grad.numel() * 4 for p in model.parameters())
    assert tracker.peak >= grads + 64 * 256 * 4  # the gradients plus at least one activation
    assert tracker.current == grads  # what is still alive: the parameter gradients


def test_bucket_views_shrink_what_a_rank_holds_after_backward_by_one_gradient_copy():
    from ddplab.tables.memory import predicted_moments

    exp = Experiment(optimizer="adam")
    off, on = predicted_moments(exp), predicted_moments(exp.replace(gradient_as_bucket_view=True))
    grads = off.loc["after backward", "gradients"]
    assert (on.loc["after forward"] == off.loc["after forward"]).all()   # no gradients yet, the buckets held either way
    for moment in ("after backward", "after optimizer step"):
        assert off.loc[moment, "ddp_buckets"] == grads and on.loc[moment, "ddp_buckets"] == 0
        assert on.loc[moment, "total"] == pytest.approx(off.loc[moment, "total"] - grads, abs=1e-3)


def test_the_prediction_figure_stacks_one_moment_per_bar_and_loses_the_bucket_copy_with_views():
    import matplotlib

    matplotlib.use("Agg")
    from ddplab.plots.memory import MEMORY_COLORS, memory_prediction
    from ddplab.tables.memory import predicted_moments

    exp = Experiment(optimizer="adam")
    for views in (False, True):
        e = exp.replace(gradient_as_bucket_view=views)
        ax = memory_prediction(e, detached=True).axes[0]
        n = len(MEMORY_COLORS)
        bars = [ax.patches[i:i + n] for i in range(0, len(ax.patches), n)]
        table = predicted_moments(e)
        assert [sum(p.get_height() for p in bar) for bar in bars] == pytest.approx(table["total"].tolist())
        buckets = [bar[list(MEMORY_COLORS).index("ddp_buckets")].get_height() for bar in bars]
        assert (buckets[1:] == [0, 0]) == views
