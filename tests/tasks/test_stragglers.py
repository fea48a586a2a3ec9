"""Stragglers on purpose (notebook 07): the spec injects a known delay into one rank, the bucket
probe sees every rank's arrival at every all-reduce, and the tables say who waited for whom. One real
2-rank launch: a run without a straggler, a pause before backward and a late batch on rank 1, and a
rank with twice the sequence length."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

import ddplab
from ddplab import claims, verify
from ddplab.recipes.stragglers import delay_sweep
from ddplab.recipes.stragglers import straggler_runs
from ddplab.tables import stragglers
from tests.support import leftovers

DELAY_MS = 25


@pytest.fixture(scope="module")
def runs(runs_dir):
    # the notebook's model: with a smaller one a rank with 3x the sequence length is not reliably slower
    exps = straggler_runs(ms=DELAY_MS, steps=12)   # 11 judged steps: 10 are the fewest claims.judge can resolve
    exps.append(delay_sweep((0, 20, 40, 80), cycles=10))   # 10 slopes, one per cycle
    out = {r.spec.name: r for r in ddplab.run_many(exps, runs_dir / "stragglers", progress=False)}
    assert not leftovers(runs_dir / "stragglers")
    return out


@pytest.mark.slow
def test_the_slow_rank_arrives_last_and_every_early_rank_waits_for_it(runs):
    run = runs["straggler-before-backward"]
    a = stragglers.arrivals(run)
    assert set(a.index.get_level_values("rank")) == {0, 1}
    # the last rank's wait is 0, and an early rank's wait is the time from its arrival to the last one
    assert (a.loc[a["last"], "wait_ms"] == 0).all() and (a["wait_ms"] >= 0).all()
    spread = a.groupby(level=["step", "bucket"])["arrival_ms"].max()
    assert (a.groupby(level=["step", "bucket"])["wait_ms"].max() - spread).abs().max() < 1e-9
    last = stragglers.last_arrivals(run)
    assert last["arrived_last"].sum() == last["of"].iloc[0]
    assert not stragglers.judge_last(run, late=1).contradicted
    # rank 0, the early one, named as the last to arrive: never "holds" (the stand-ins below show it contradicted)
    assert not stragglers.judge_last(run, late=0).holds
    cw = stragglers.compute_and_wait(run)
    assert (cw["other_ms"] + cw["wait_ms"] - cw["step_ms"]).abs().max() < 1e-9


@pytest.mark.slow
def test_the_early_ranks_wait_is_the_injected_delay_and_the_step_loses_it(runs):
    table = stragglers.delay_response([runs["straggler-before-backward"], runs["straggler-data"]],
                                      runs["straggler-none"])
    assert list(table["delay_ms"]) == [DELAY_MS, DELAY_MS] and list(table["slow_rank"]) == [1, 1]
    # the slow rank's own clock saw the delay it was given (a sleep can only overshoot; by how much is load)
    assert (table["measured_delay_ms"] >= DELAY_MS).all()
    for name in ("straggler-before-backward", "straggler-data"):
        run = runs[name]
        assert not claims.judge(f"{name}: the slow rank lost less than twice its delay", stragglers.lost_ms(run),
                                below=2 * DELAY_MS).contradicted
        assert not stragglers.judge_step_added(run, runs["straggler-none"]).contradicted   # judged on its steps
    verdicts = stragglers.check_wait_for_delay([runs["straggler-before-backward"], runs["straggler-data"]])
    assert not any(v.contradicted for v in verdicts)


@pytest.mark.slow
def test_more_work_on_one_rank_makes_it_the_straggler_without_any_delay(runs):
    run = runs["straggler-longer-sequences"]
    assert run.spec.straggler is None and run.spec.seq_len_of(1) == 3 * run.spec.seq_len_of(0)
    per = stragglers.per_rank(run)
    assert set(per.index) == {0, 1}
    assert not stragglers.judge_last(run, late=1, final_only=True).contradicted
    assert not stragglers.judge_last(runs["straggler-before-backward"], late=1, final_only=True).contradicted


@pytest.mark.slow
def test_arrivals_need_the_bucket_probe_and_delay_response_needs_stragglers(runs):
    base = runs["straggler-none"]
    with pytest.raises(ValueError, match="no straggler"):
        stragglers.delay_response([base], base)
    with pytest.raises(ValueError, match="all within the first"):
        stragglers.arrivals(base, skip=base.spec.steps)


@pytest.mark.slow
def test_arrivals_refuse_a_run_without_bucket_events(run2):
    with pytest.raises(ValueError, match="probes=\\('buckets',\\)"):
        stragglers.arrivals(run2)


def cycle_stand_in(rank0_added, cycle=(0.0, 20.0, 40.0, 80.0), cycles: int = 12, noise=None):
    """A 2-rank run whose rank 1 pauses `Straggler.ms_at(k)` ms before backward in step k: rank 1's clock saw
    exactly that, and rank 0's step is 30 ms plus `rank0_added(delay)` plus `noise(k)`."""
    from ddplab.spec.straggler import Straggler

    slow = Straggler(1, "before-backward", tuple(cycle))
    n = len(cycle) * (cycles + 1)
    def step(k, rank):
        d = slow.ms_at(k)
        ms = 30.0 + (rank0_added(d) + (noise(k) if noise else 0.0) if rank == 0 else d)
        last = (d if rank == 1 else 0.0) + 1.0     # rank 1 launches the final bucket its pause late
        return SimpleNamespace(step_ms=ms, phase_ms={"straggler": d} if rank == 1 else {},
                               buckets=[SimpleNamespace(index=0, launch_ns=int(last * 1e6))])
    ranks = [SimpleNamespace(rank=r, steps=[step(k, r) for k in range(n)]) for r in (0, 1)]
    spec = SimpleNamespace(name="cycle", steps=n, straggler=slow)
    return SimpleNamespace(spec=spec, ranks=ranks, world_size=2)


def test_a_cycle_of_delays_gives_one_slope_per_cycle_against_its_own_undelayed_step():
    fit = stragglers.cycle_slopes(cycle_stand_in(lambda d: d))         # rank 0 waits every ms
    assert fit["cycles"] == 12 and fit["slope"] == pytest.approx(1.0) and fit["intercept"] == pytest.approx(0.0)
    assert claims.judge("slope", fit["slopes"], within=(0.5, 1.5), unit="").holds
    table = stragglers.cycle_response(cycle_stand_in(lambda d: d))
    assert table["delay_ms"].tolist() == [20.0, 40.0, 80.0] and table["step_added_ms"].tolist() == [20.0, 40.0, 80.0]
    assert (table["steps"] == 12).all()
    # without synchronization rank 0's step stays flat: the claim is contradicted
    flat = stragglers.cycle_slopes(cycle_stand_in(lambda d: 0.0))
    assert claims.judge("slope", flat["slopes"], within=(0.5, 1.5), unit="").contradicted
    # the machine's load jumping by 200 ms between cycles moves every step of a cycle alike: no slope moves
    jumpy = stragglers.cycle_slopes(cycle_stand_in(lambda d: d, noise=lambda k: 200.0 * ((k // 4) % 2)))
    assert jumpy["slopes"] == pytest.approx([1.0] * 12)
    with pytest.raises(ValueError, match="straggler.ms: needs a cycle"):
        stragglers.cycle_slopes(stand_in([20.0] * 11, [20.0] * 11))


@pytest.mark.slow
def test_a_real_cycle_of_delays_pauses_each_step_in_turn_and_the_step_follows(runs):
    run = runs["delay-cycle"]
    t = stragglers.delay_cycle(run)
    assert t["cycle"].nunique() == 10 and (t.groupby("cycle").size() == 4).all()
    # rank 1's clock saw each step's own delay (a sleep never returns early; a step out of turn would
    # measure 20 ms where 80 were due)
    assert (t["measured_delay_ms"] >= 0.999 * t["delay_ms"]).all()
    fit = stragglers.cycle_slopes(run)
    assert not claims.judge("slope", fit["slopes"], within=(0.5, 1.5), unit="").contradicted


# ---- the judged claims on stand-in runs: contradicted where false, unresolved on pure noise, no launch ----
def stand_in(late_ms, lost_ms, buckets: int = 3):
    """A 2-rank straggler run (rank 1, before backward): in step i (after the one left out) rank 1
    launches every bucket `late_ms[i]` after rank 0 (negative: before it), and its clock saw it lose
    `lost_ms[i]`."""
    def step(late, lost, rank):
        at = max(late, 0.0) if rank == 1 else max(-late, 0.0)
        launches = [SimpleNamespace(index=b, launch_ns=int((b + at) * 1e6)) for b in range(buckets)]
        return SimpleNamespace(step_ms=30.0, phase_ms={"straggler": lost} if rank == 1 else {}, buckets=launches)
    late, lost = [0.0, *late_ms], [0.0, *lost_ms]
    ranks = [SimpleNamespace(rank=r, steps=[step(x, d, r) for x, d in zip(late, lost)]) for r in (0, 1)]
    spec = SimpleNamespace(name="stand-in", steps=len(late), straggler=SimpleNamespace(rank=1, where="before-backward"))
    return SimpleNamespace(spec=spec, ranks=ranks, world_size=2)


def test_who_is_last_is_contradicted_for_the_early_rank_and_unresolved_on_noise():
    rng = random.Random(0)
    late = [20 + rng.gauss(0, 3) for _ in range(11)]
    run = stand_in(late, late)
    assert len(stragglers.wait_gaps(run, 0, 1)) == 11   # one value a step: its 3 buckets share one delay
    assert stragglers.judge_last(run, late=1).holds
    assert stragglers.judge_last(run, late=0).contradicted
    with pytest.raises(verify.CheckFailed, match="contradicted: rank 0 joins"):
        claims.check(stragglers.judge_last(run, late=0))
    noise = [rng.gauss(0, 3) for _ in range(11)]   # neither rank late: no one is last
    assert stragglers.judge_last(stand_in(noise, [20.0] * 11), late=1).outcome == claims.UNRESOLVED


def test_the_wait_check_is_contradicted_where_no_one_waits_and_unresolved_on_noise():
    rng = random.Random(1)
    lost = [20 + rng.uniform(0, 1) for _ in range(23)]
    same = [d * (1.05 + rng.gauss(0, 0.05)) for d in lost]
    assert stragglers.judge_wait_for_delay(stand_in(same, lost)).holds
    assert stragglers.judge_wait_for_delay(stand_in([3 * d for d in lost], lost)).holds   # load on the late rank
    # a delay off the early rank's critical path: it waits (almost) nothing
    with pytest.raises(verify.CheckFailed, match="contradicted: stand-in: ranks wait at least 0.5 of rank"):
        stragglers.check_wait_for_delay([stand_in([rng.uniform(0, 2) for _ in lost], lost)])
    edge = [d * (0.5 + rng.gauss(0, 0.3)) for d in lost]   # pure noise about the claim's edge: half the delay
    assert stragglers.judge_wait_for_delay(stand_in(edge, lost)).outcome == claims.UNRESOLVED
