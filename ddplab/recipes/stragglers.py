"""Notebook 07, the slowest rank: stragglers on purpose, what every early rank waits, the same steps
under the profiler, and ranks balanced by cost rather than by tokens."""

from __future__ import annotations

from ..spec import BalanceStudy, Experiment, Straggler

# a small transformer whose step takes ~15 ms on 2 CPU ranks: a 10-40 ms straggler stands out of the noise;
# buckets of 0.05 MiB give several all-reduces per step, so every step has several arrivals to compare
STRAGGLER_MODEL = dict(d_model=64, n_layers=2, n_heads=4, vocab_size=64, local_batch=8, seq_len=32, bucket_cap_mb=0.05)


def straggler_runs(world_size: int = 2, ms: float = 20, rank: int = 1, steps: int = 12, pin_cpus: bool = True,
               longer_steps: int | None = None, **overrides) -> list[Experiment]:
    """Notebook 07: the same DDP run without a straggler ("straggler-none"), then with rank `rank` slower by
    `ms` every step in each of three places (a late batch, a pause before backward, extra compute
    before backward), and with three times the sequence length on that rank (no injected delay: more work).
    The bucket probe records every rank's arrival at every all-reduce. The longer-sequences run takes
    `longer_steps` steps (default twice `steps`): its effect (a few ms a step) is the smallest of the
    five, and its steps are cheap, so it gets the more paired values."""
    base = dict(world_size=world_size, steps=steps, probes=("buckets",), pin_cpus=pin_cpus, **STRAGGLER_MODEL)
    base.update(overrides)
    none = Experiment(name="straggler-none", **base)
    slowed = [none.replace(name=f"straggler-{where}", straggler=Straggler(rank, where, ms))
              for where in ("data", "before-backward", "compute")]
    longer = tuple(3 * none.seq_len if r == rank else none.seq_len for r in range(world_size))
    return [none, *slowed, none.replace(name="straggler-longer-sequences", seq_len=longer,
                                        steps=longer_steps or 2 * none.steps)]


def delay_sweep(delays_ms=(0, 20, 40, 80), cycles: int = 16, world_size: int = 2, rank: int = 1,
                pin_cpus: bool = True, **overrides) -> Experiment:
    """Notebook 07: one run whose rank `rank` pauses before backward for each of `delays_ms` in turn,
    one per step, `cycles` times over (after one cycle of warm-up): every delay is measured beside a
    step without one, a few steps apart, so a change of the machine's load between runs cannot pose as
    the straggler's cost (`tables.stragglers.cycle_slopes`: one slope per cycle). Cycles alternate
    direction (`Straggler.ms_at`): a drift within a cycle's few steps lines up with rising delays in
    half the cycles and with falling ones in the other half, not always the same way."""
    for field in ("steps", "name", "straggler"):
        if field in overrides:
            raise ValueError(f"delay_sweep: {field} is set by the cycle (steps = len(delays_ms) x (cycles + 1)); "
                             "give delays_ms and cycles instead")
    base = dict(world_size=world_size, probes=("buckets",), pin_cpus=pin_cpus, **STRAGGLER_MODEL)
    base.update(overrides)
    return Experiment(name="delay-cycle", straggler=Straggler(rank, "before-backward", tuple(delays_ms)),
                      steps=len(delays_ms) * (cycles + 1), **base)


def profiled(ms: float = 20, world_size: int = 2, rank: int = 1, steps: int = 6, pin_cpus: bool = True,
             **overrides) -> Experiment:
    """Notebook 07: the pause-before-backward straggler under PyTorch Profiler on every rank (the
    profile probe: one chrome trace per rank, aligned on a barrier, and the profiler's memory
    timeline), with Adam, so the memory timeline has optimizer state to show."""
    fields = dict(world_size=world_size, steps=steps, probes=("profile",), pin_cpus=pin_cpus, optimizer="adam",
                  lr=1e-3, straggler=Straggler(rank, "before-backward", ms), **STRAGGLER_MODEL)
    fields.update(overrides)
    return Experiment(name="profiled-straggler", **fields)


def balance_study(rounds: int = 10, steps: int = 8, pin_cpus: bool = True, **overrides) -> Experiment:
    """Notebook 07: equal tokens, unequal cost. A pool of four 512-token and thirty-two 64-token
    sequences (4096 tokens) on 2 ranks, split two ways: by length groups with equal tokens per rank
    (one rank gets the long sequences: 8x the squared-length sum), and by estimated cost (greedy,
    the cost model fitted on this machine by the task's calibration phase). A narrow model with long
    sequences, so attention's quadratic term is a large share of the compute."""
    # 11 timed repeats a calibration shape (the median of each is the point): one disturbed call on a busy
    # machine moves no point, so the quadratic term's standard error stays near a quiet machine's
    task = BalanceStudy(pool=(512,) * 4 + (64,) * 32, calibration_tokens=2048, calibration_repeats=11, rounds=rounds,
                        steps_per_round=steps)
    fields = dict(world_size=2, seq_len=512, d_model=32, n_layers=2, n_heads=4, vocab_size=64, pin_cpus=pin_cpus)
    fields.update(overrides)
    return Experiment(name="balance-study", task=task, **fields)
