"""Notebook 05, buckets and overlap: the all-reduce fit and the bucket sweep, in one launch."""

from __future__ import annotations

from ..spec import BucketSweep, Experiment
from ..spec.bucket_sweep import Plan
from ..units import MIB
from .communication import allreduce_sweep


# 4.2 M parameters, 16 MiB of float32 gradients in 53 tensors: on 2 CPU ranks backward takes about as
# long as one flat all-reduce of the gradient takes 3-4 times over, so bucket size visibly matters
BUCKET_MODEL = dict(vocab_size=2048, d_model=256, n_layers=4, n_heads=4, local_batch=4, seq_len=64)
ONE_PER_PARAMETER_MB = 1e-4     # below every tensor's size: DDP closes a bucket after each tensor


def bucket_sweep(world_size: int = 2, caps_mb=(ONE_PER_PARAMETER_MB, 0.25, 1, 2, 4, 8, 64), split_cap_mb: float = 8,
                 rounds: int = 5, steps: int = 4, allreduce_repeats: int = 50, pin_cpus: bool = True,
                 **overrides) -> list[Experiment]:
    """Notebook 05: [the all-reduce sweep that fits alpha-beta, the bucket sweep], for one launch
    (`ddplab.run_many`). The bucket sweep times DDP at every cap in `caps_mb` (from one tensor per
    bucket to a single bucket), DDP's default, and `BucketedSync` with DDP's plan at `split_cap_mb`,
    as is and with its last bucket split in two; `rounds` interleaved rounds of `steps` steps each.
    Ranks are pinned one per core by default: the timings are steadier
    (docs/performance-anchors.md, "Pinning ranks to cores").
    The split is at 8 MiB by default: that plan's last bucket (the first layers, about half the model)
    has gradients ready over the last half of backward, so its first half can leave well before the
    end; at 4 MiB the cut would only separate the embeddings, a head start of under a millisecond."""
    plans = tuple(Plan("ddp", c) for c in caps_mb) + (Plan("ddp"), Plan("plan", split_cap_mb),
                                                      Plan("split", split_cap_mb), Plan("ddp-split", split_cap_mb))
    task = BucketSweep(plans=plans, rounds=rounds, steps_per_round=steps)
    sweep = Experiment(**{**dict(name=f"bucket-sweep-w{world_size}", task=task, world_size=world_size,
                                 pin_cpus=pin_cpus, **BUCKET_MODEL), **overrides})
    return [allreduce_sweep(world_size, max_bytes=32 * MIB, repeats=allreduce_repeats, pin_cpus=pin_cpus), sweep]


def split_on_link(link: str = "1GbE", cap_mb: float = 64, rounds: int = 6, steps: int = 5, world_size: int = 2,
                  pin_cpus: bool = True, against_bandwidth: bool = False) -> Experiment:
    """Notebook 05, section 5 on a link you can dial: one bucket (`ddp:{cap_mb}`) against the same bucket
    cut in two by DDP itself (`ddp-split:{cap_mb}`), with every all-reduce held to the emulated `link`
    (spec/link.py). One bucket's halves are the later and the earlier layers, so the first half is ready
    about halfway through backward: a head start of half a backward, where the 8 MiB plan's cut gives a
    few ms. On the link the wire time is a wait, not work for the cores, so most of the head start shows
    in the exposed tail; the real gloo all-reduce beneath the wait still slows the backward beside it
    (about +9 ms on 2 cores). `rounds` x `steps` paired steps: 30, because with 20 that +9 ms stayed
    unresolved in 3 of 5 quiet runs of the chapter (at 30 the sign test's interval tolerates 6 steps on
    the wrong side, at 20 only 2). `against_bandwidth` adds, in the same rounds, the one bucket on a link
    twice as fast (`ddp-2x:{cap_mb}`) and 1 MiB buckets (`ddp:1`, a small late bucket): smaller late
    buckets against more bandwidth."""
    plans = (Plan("ddp", cap_mb), Plan("ddp-split", cap_mb)) + ((Plan("ddp-2x", cap_mb), Plan("ddp", 1))
                                                                if against_bandwidth else ())
    task = BucketSweep(plans=plans, rounds=rounds, steps_per_round=steps)
    return Experiment(name=f"split-on-link-w{world_size}", task=task, world_size=world_size, pin_cpus=pin_cpus,
                      link=link, **BUCKET_MODEL)
