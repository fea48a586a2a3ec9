"""Notebook 09, tensor parallelism and the dp x tp mesh: a layer split over 2 and over 4 ranks, checked
against the same layer whole, its collectives counted and timed beside DDP's; and a 2 x 2 mesh."""

from __future__ import annotations

from ..spec import Experiment
from ..spec.tensor_parallel import TensorParallel

LAYERS = ("mlp", "attention", "block")
# the split step is judged against the dense one on paired steps by the sign test (`claims`): under 10
# steps it judges nothing, from 10 to 13 its interval runs from the smallest to the largest difference,
# so one step hit by a load spike leaves it unresolved; 5 rounds of 3 steps (15) leave out one at each end
TP_ROUNDS = 5


def split_layers(world_size: int = 2, layers: tuple[str, ...] = LAYERS, d_model: int = 64, n_heads: int = 4,
                    local_batch: int = 8, seq_len: int = 32, rounds: int = TP_ROUNDS, steps_per_round: int = 3,
                    seed: int = 0, **overrides) -> Experiment:
    """Every layer of `layers` split over all `world_size` ranks (tp = world_size), against the dense
    layer, then timed: dense, split, and under DDP (each rank local_batch / world_size examples).
    Add "attention-qkv-split" to `layers` to see a mis-sharded layer fail the equality check."""
    return Experiment(name=f"tensor-parallel-{world_size}", world_size=world_size, d_model=d_model, n_heads=n_heads,
                      local_batch=local_batch, seq_len=seq_len, seed=seed,
                      task=TensorParallel(layers=layers, rounds=rounds, steps_per_round=steps_per_round), **overrides)


def dp_tp_mesh(dp: int = 2, tp: int = 2, layers: tuple[str, ...] = LAYERS, d_model: int = 64, n_heads: int = 4,
               local_batch: int = 4, seq_len: int = 16, steps: int = 3, lr: float = 0.05, seed: int = 0,
               **overrides) -> Experiment:
    """A dp x tp mesh on dp * tp ranks: each layer split over every tp group, its gradients averaged over
    every dp group, trained `steps` SGD steps on dp x local_batch examples, against the dense layer
    trained on them all."""
    return Experiment(name=f"dp{dp}-tp{tp}-mesh", world_size=dp * tp, d_model=d_model, n_heads=n_heads,
                      local_batch=local_batch, seq_len=seq_len, steps=steps, lr=lr, seed=seed,
                      task=TensorParallel(layers=layers, dp=dp), **overrides)


def tensor_parallel_runs(rounds: int = TP_ROUNDS, mis_sharded: bool = True, ddp_bucket_cap_mb: float | None = 0.05) -> list[Experiment]:
    """Notebook 09's experiments for ONE `ddplab.run_many` launch (4 ranks): the 2 x 2 mesh, tp = 4,
    then tp = 2 on ranks 0 and 1 (a mesh makes its groups from its own ranks: it may also run inside a
    wider launch or session), with the mis-sharded
    attention ("attention-qkv-split") beside the correct layers unless `mis_sharded=False`. DDP's
    buckets are capped at `ddp_bucket_cap_mb` MiB so the MLP's and the block's gradients go in more
    than one bucket and the first all-reduces can run while backward still computes (None: DDP's
    default, one bucket per layer here, nothing to overlap)."""
    two = LAYERS + (("attention-qkv-split",) if mis_sharded else ())
    return [dp_tp_mesh(), split_layers(world_size=4, rounds=rounds, bucket_cap_mb=ddp_bucket_cap_mb),
            split_layers(world_size=2, layers=two, rounds=rounds, bucket_cap_mb=ddp_bucket_cap_mb)]
