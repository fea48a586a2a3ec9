"""The analytic memory model against tensors built in this process (no ranks launched)."""

import pytest
import torch

from ddplab import Experiment
from ddplab.predict import memory as memory_model
from ddplab.rank import data, models
from ddplab.rank.probes.activations import SavedTensorMeter
from ddplab.rank.probes.memory import PeakTracker
from ddplab.rank.training import micro_loss, token_losses

SHAPES = [dict(model="transformer", local_batch=8, seq_len=16, d_model=64, n_layers=2, vocab_size=64),
          dict(model="transformer", local_batch=3, seq_len=32, d_model=96, n_layers=3, n_heads=6, vocab_size=100),
          dict(model="transformer", local_batch=4, seq_len=8, tie_weights=True),
          dict(model="mlp", local_batch=5, seq_len=12, d_model=48, n_layers=3, vocab_size=80),
          dict(model="transformer", local_batch=2, seq_len=8, dtype="float64")]


@pytest.mark.parametrize("kw", SHAPES, ids=lambda kw: "-".join(f"{v}" for v in kw.values()))
def test_parameter_numels_match_the_built_model(kw):
    exp = Experiment(**kw)
    assert memory_model.parameter_numels(exp) == [p.numel() for p in models.build(exp).parameters()]


@pytest.mark.parametrize("kw", SHAPES, ids=lambda kw: "-".join(f"{v}" for v in kw.values()))
def test_activation_model_matches_what_autograd_saves(kw):
    exp = Experiment(**kw)
    model = models.build(exp).to(torch.float64 if exp.dtype == "float64" else torch.float32)
    x, y = data.batch(0, list(range(exp.local_batch_of(0))), exp.seq_len_of(0), exp.vocab_size)
    with SavedTensorMeter(model.parameters()) as meter:
        micro_loss("rank-mean", token_losses(model(x), y), 1, 1.0, 1.0)
    assert memory_model.activation_bytes(exp) == meter.bytes


def test_model_state_does_not_depend_on_world_size():
    one, eight = (memory_model.state_bytes(Experiment(world_size=w, optimizer="adam")) for w in (1, 8))
    assert one == eight
    p = one["parameters"]
    assert one["gradients"] == one["ddp_buckets"] == p and one["optimizer_state"] == 2 * p + 4 * 29


def test_bucket_views_remove_the_gradient_copy_after_backward():
    pred = memory_model.predict(Experiment(gradient_as_bucket_view=True))
    assert pred["forward"]["ddp_buckets"] > 0 and pred["backward"]["ddp_buckets"] == 0
    assert pred["backward"]["gradients"] == pred["forward"]["ddp_buckets"]


def test_optimizer_state_appears_after_the_first_step():
    pred = memory_model.predict(Experiment(optimizer="sgd", momentum=0.9), step=0)
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
