"""Notebook 05's timing claims, judged on paired steps (tables/bucket_sweep.py, tables/buckets.py,
tools/bucket_tuning.py), on synthetic sweeps: each claim is "contradicted" on data where it is false,
"holds" where it is true beyond the noise, and "cannot resolve" on pure noise. No launch."""

import random
from types import SimpleNamespace

import pandas as pd
import pytest

from ddplab import claims, record
from ddplab.predict.comm import AlphaBeta
from ddplab.record import Backward, BucketEvent, BucketSweepRecord, ModelInfo, ReadyEvent, SweepArm, SweepStep
from ddplab.tables import bucket_sweep, buckets
from ddplab.tools import bucket_tuning

ROUNDS, STEPS = 4, 4          # 16 pairs, as notebook 05's sweep
NS = 1e6


def _step(r, step_ms, last_ready_ms, comm=(), backward_ms=None):
    """One rank's record of one step: backward from 0 to `backward_ms` (default: just after
    `last_ready_ms`), buckets (launch, done, bytes)."""
    backward_ms = last_ready_ms + 0.1 if backward_ms is None else backward_ms
    return SweepStep(round=r, forward_ms=1.0, backward_ms=backward_ms, optimizer_ms=1.0, step_ms=step_ms,
                     backward=Backward(0, int(backward_ms * NS), [ReadyEvent("w", int(last_ready_ms * NS))]),
                     buckets=[BucketEvent(i, n, [], int(a * NS), int(b * NS)) for i, (a, b, n) in enumerate(comm)] or None)


def fake_sweep(arms, ranks=2, rounds=ROUNDS, steps=STEPS):
    """A bucket sweep's records: `arms[name](round, position, rank)` gives (step_ms, last_ready_ms, comm);
    the compute-only arm (always present) runs 2 x `steps` a round, at both ends, as the real sweep."""
    names = list(arms)
    records = []
    for k in range(ranks):
        out = []
        for name in names:
            n = 2 * steps if name == "compute-only" else steps
            out.append(SweepArm(name, [], None, [_step(r, *arms[name](r, i, k)) for r in range(rounds) for i in range(n)]))
        records.append(BucketSweepRecord(["w"], {"w": 4}, ModelInfo(1, 4), 2, ["w"], 1e9, out))
    return SimpleNamespace(spec=SimpleNamespace(task=SimpleNamespace(kind="bucket-sweep")),
                           ranks=[SimpleNamespace(result=rec) for rec in records])


def noisy(seed=0, sd=5.0):
    """Gaussian noise, one draw per (what, round, position): every rank sees the same moment's load
    (independent draws per rank would bias a step's slowest rank upward)."""
    rng, drawn = random.Random(seed), {}
    return lambda *key: drawn.setdefault(key, rng.gauss(0.0, sd))


def synced(step, tail=10.0, launch=None, noise=None, last=50.0):
    """A plan: step ms, and one bucket launched at `launch` (default: at the last ready) ending `tail` after it."""
    noise = noise or (lambda *key: 0.0)
    def arm(r, i, k):
        at = last if launch is None else launch
        return step + noise("step", r, i), last, [(at, last + tail + noise("tail", r, i), 4096)]
    return arm


def compute(step=100.0, noise=None, last=50.0):
    noise = noise or (lambda *key: 0.0)
    return lambda r, i, k: (step + noise("step", r, i), last, ())


# ---- per_step: the pairing itself --------------------------------------------------------------------
def test_the_compute_only_step_pairs_by_the_mean_of_its_two_steps_around_the_plans():
    # the baseline's steps in a round, as recorded: step i before the plans' step i, then step i after it
    run = fake_sweep({"compute-only": lambda r, i, k: (100.0 + 10 * (i % 2) + i // 2, 50.0, ()),
                      "ddp:1": synced(130.0)})
    base = bucket_sweep.per_step(run, "compute-only")
    assert len(base) == ROUNDS * STEPS and base[(0, 1)] == pytest.approx((101 + 111) / 2)
    t = bucket_sweep.steps(run)
    assert list(t.columns) == ["compute-only", "ddp:1"] and t.index.names == ["round", "step"]


def test_the_tail_per_step_is_the_labs_one_exposed_tail():
    arms = {"compute-only": compute(), "ddp:8": lambda r, i, k: (120.0, 50.0 - 4 * k, [(10.0, 60.0 + r, 4096)])}
    tails = bucket_sweep.steps(fake_sweep(arms), record.exposed_tail_ms, ["ddp:8"])
    # rank 1's last gradient was ready 4 ms earlier: its share of the tail is the longer one
    assert tails.loc[(2, 0), "ddp:8"] == pytest.approx(62.0 - 46.0)


# ---- each claim: contradicted where false, cannot resolve on noise ------------------------------------
def test_synchronizing_costs_time_is_contradicted_by_a_plan_faster_than_no_communication():
    v = bucket_sweep.judge_costs(bucket_sweep.steps(fake_sweep(
        {"compute-only": compute(noise=noisy(1)), "ddp:1": synced(130.0, noise=noisy(2)),
         "ddp:8": synced(80.0, noise=noisy(3)), "ddp:64": synced(100.0, noise=noisy(4))})))
    assert v["ddp:1"].holds and v["ddp:8"].contradicted and v["ddp:64"].outcome == claims.UNRESOLVED
    with pytest.raises(claims.CheckFailed):
        claims.check(v["ddp:8"])


def test_the_split_tail_claim_is_contradicted_by_a_longer_tail_and_unresolved_on_noise():
    def tails(split_tail):
        run = fake_sweep({"compute-only": compute(), "ddp:8": synced(120.0, 10.0, noise=noisy(5, 1.5)),
                          "ddp-split:8": synced(120.0, split_tail, noise=noisy(6, 1.5))})
        return bucket_sweep.steps(run, record.exposed_tail_ms, ["ddp:8", "ddp-split:8"])
    assert bucket_sweep.judge_split_tail(tails(2.0), "ddp:8", "ddp-split:8").holds
    assert bucket_sweep.judge_split_tail(tails(30.0), "ddp:8", "ddp-split:8").contradicted
    assert bucket_sweep.judge_split_tail(tails(10.0), "ddp:8", "ddp-split:8").outcome == claims.UNRESOLVED
    said = bucket_sweep.split_finding(tails(30.0), tails(30.0), "ddp:8", "ddp-split:8")
    assert said.startswith("ddp:8 -> ddp-split:8: exposed tail longer (seen +")


def test_the_split_compute_claim_holds_on_a_longer_backward_and_is_contradicted_by_a_shorter_one():
    """C26's second half: the shorter tail did not come with less compute (last gradient ready later)."""
    def arm(last, noise):
        return lambda r, i, k: (120.0, last + noise("last", r, i), [(last, last + 10.0, 4096)])

    def last_ready(split_last):
        run = fake_sweep({"compute-only": compute(), "ddp:8": arm(50.0, noisy(7, 1.5)),
                          "ddp-split:8": arm(split_last, noisy(8, 1.5))})
        return bucket_sweep.steps(run, bucket_sweep.last_ready_ms, ["ddp:8", "ddp-split:8"])
    assert bucket_sweep.judge_split_compute(last_ready(60.0), "ddp:8", "ddp-split:8").holds
    assert bucket_sweep.judge_split_compute(last_ready(40.0), "ddp:8", "ddp-split:8").contradicted
    assert bucket_sweep.judge_split_compute(last_ready(50.0), "ddp:8", "ddp-split:8").outcome == claims.UNRESOLVED


def test_a_bucket_launched_before_the_last_gradient_contradicts_waiting_for_it():
    def run(launch):
        return fake_sweep({"compute-only": compute(), "ddp:64": synced(120.0, launch=launch)})
    assert bucket_sweep.judge_launch_order(run(50.5), "ddp:64").holds
    assert bucket_sweep.judge_launch_order(run(40.0), "ddp:64").contradicted
    assert bucket_sweep.judge_launch_order(run(40.0), "ddp:64", 0, before=True).holds
    assert bucket_sweep.judge_launch_order(run(50.5), "ddp:64", 0, before=True).contradicted
    rng = random.Random(7)
    jitter = fake_sweep({"compute-only": compute(),
                         "ddp:64": lambda r, i, k: (120.0, 50.0, [(50.0 + rng.gauss(0, 1), 60.0, 4096)])})
    assert bucket_sweep.judge_launch_order(jitter, "ddp:64").outcome == claims.UNRESOLVED


def test_in_flight_and_stretch_are_contradicted_by_communication_that_costs_nothing():
    link = AlphaBeta(1e-3, 0.0)   # 1 ms per bucket alone
    def run(in_flight, last):
        return fake_sweep({"compute-only": compute(noise=noisy(9, 1.0)),
                           "ddp:1": lambda r, i, k: (130.0, last, [(5.0, 5.0 + in_flight, 4096), (20.0, 20.0 + in_flight, 4096)])})
    assert bucket_sweep.judge_in_flight(run(3.0, 70.0), "ddp:1", link).holds
    assert bucket_sweep.judge_in_flight(run(0.5, 70.0), "ddp:1", link).contradicted
    assert bucket_sweep.judge_stretch(run(3.0, 70.0), "ddp:1").holds
    assert bucket_sweep.judge_stretch(run(3.0, 40.0), "ddp:1").contradicted
    rng = random.Random(10)
    wobble = fake_sweep({"compute-only": compute(), "ddp:1": lambda r, i, k: (
        130.0, 50.0 + rng.gauss(0, 3), [(5.0, 6.0 + rng.gauss(0, 0.3), 4096)])})
    assert bucket_sweep.judge_in_flight(wobble, "ddp:1", link).outcome == claims.UNRESOLVED
    assert bucket_sweep.judge_stretch(wobble, "ddp:1").outcome == claims.UNRESOLVED


def test_summed_intervals_overstating_what_is_added_is_contradicted_when_they_understate_it():
    def run(step):   # two 10 ms buckets: 20 ms summed in flight, compute-only 100 ms
        return fake_sweep({"compute-only": compute(noise=noisy(11, 2.0)),
                           "ddp:1": lambda r, i, k: (step, 50.0, [(5.0, 15.0, 4096), (30.0, 40.0, 4096)])})
    assert bucket_sweep.judge_summed_vs_added(run(110.0), "ddp:1").holds
    assert bucket_sweep.judge_summed_vs_added(run(140.0), "ddp:1").contradicted
    assert bucket_sweep.judge_summed_vs_added(run(120.0), "ddp:1").outcome == claims.UNRESOLVED
    assert bucket_sweep.judge_isolated_price(run(120.0), "ddp:1", 20.0).holds                 # added 20 of 20
    assert bucket_sweep.judge_isolated_price(run(150.0), "ddp:1", 20.0).contradicted          # added 50 of 20


# ---- the models against paired steps --------------------------------------------------------------
def model_table(measured, textbook, calibrated, calibration=0):
    return pd.DataFrame({"textbook_ms": textbook, "calibrated_ms": calibrated,
                         "calibration_point": [i == calibration for i in range(len(measured))]},
                        index=[f"ddp:{i + 1}" for i in range(len(measured))])


def step_table(means, noise=5.0, seed=12, n=ROUNDS * STEPS):
    rng = random.Random(seed)
    return pd.DataFrame({f"ddp:{i + 1}": [m + rng.gauss(0, noise) for _ in range(n)] for i, m in enumerate(means)})


def test_the_model_claims_are_contradicted_where_the_models_are_the_other_way_round():
    steps = step_table([100, 110, 120, 130])
    good = model_table([100, 110, 120, 130], [80, 85, 90, 95], [100, 111, 119, 131])
    assert buckets.judge_optimistic(good, steps).holds and buckets.judge_closer(good, steps).holds
    pessimistic = model_table([100, 110, 120, 130], [120, 130, 140, 150], [100, 111, 119, 131])
    assert buckets.judge_optimistic(pessimistic, steps).contradicted
    worse = model_table([100, 110, 120, 130], [101, 109, 121, 129], [80, 130, 100, 150])
    assert buckets.judge_closer(worse, steps).contradicted
    with pytest.raises(claims.CheckFailed):
        claims.check(buckets.judge_closer(worse, steps))
    noise_only = step_table([100, 100, 100, 100], noise=8.0)
    on_the_mean = model_table([100] * 4, [100] * 4, [100] * 4)
    assert buckets.judge_optimistic(on_the_mean, noise_only).outcome == claims.UNRESOLVED


def test_the_model_claims_are_judged_at_each_steps_compute_only_pace():
    # the machine's pace drifts 0.7x-1.5x over the rounds and moves every arm alike; the calibrated
    # model is 3% off and the textbook 15% optimistic at the median pace
    rng = random.Random(5)
    pace = [rng.choice([0.7, 1.0, 1.5]) * (1 + rng.gauss(0, 0.01)) for _ in range(ROUNDS * STEPS)]
    means = [100, 110, 120, 130]
    steps = pd.DataFrame({"compute-only": [80 * k for k in pace],
                          **{f"ddp:{i + 1}": [m * k * (1 + rng.gauss(0, 0.01)) for k in pace] for i, m in enumerate(means)}})
    steps["compute-only"] /= steps["compute-only"].median() / 80    # the median pace is 1
    t = model_table(means, [m * 0.85 for m in means], [m * 1.03 for m in means])
    assert buckets.judge_closer(t, steps).holds and buckets.judge_optimistic(t, steps).holds
    unpaced = steps.drop(columns="compute-only")
    assert buckets.judge_closer(t, unpaced).outcome == claims.UNRESOLVED     # the drift drowns it unpaced
    wrong = model_table(means, [m * 1.0 for m in means], [m * 0.85 for m in means])
    assert buckets.judge_closer(wrong, steps).contradicted
    # no drift, and the compute-only step noisy on its own (3%): the pacing adds noise, not a verdict
    steady = pd.DataFrame({"compute-only": [80 * (1 + rng.gauss(0, 0.03)) for _ in pace],
                           **{f"ddp:{i + 1}": [m * (1 + rng.gauss(0, 0.01)) for _ in pace] for i, m in enumerate(means)}})
    assert buckets.judge_closer(t, steady).holds and buckets.judge_closer(wrong, steady).contradicted
    assert "compute-only pace" in buckets.judge_closer(t, steady).claim
    assert "compute-only pace" not in buckets.judge_closer(t, unpaced).claim


def test_ordering_grades_only_the_pairs_the_paired_steps_resolve():
    steps = step_table([100, 101, 130], noise=3.0)
    t = model_table([100, 101, 130], [0, 0, 0], [99, 102, 120])
    o = buckets.ordering(t, steps).set_index(["a", "b"])
    assert o.loc[("ddp:1", "ddp:2"), "verdict"] == claims.UNRESOLVED and pd.isna(o.loc[("ddp:1", "ddp:2"), "agrees"])
    assert o.loc[("ddp:1", "ddp:3"), "verdict"] == "ordered" and o.loc[("ddp:1", "ddp:3"), "agrees"]
    wrong = buckets.ordering(model_table([100, 130], [0, 0], [125, 110]), step_table([100, 130], noise=3.0))
    assert wrong["agrees"].tolist() == [False]
    same = buckets.ordering(model_table([100, 130], [0, 0], [120, 120]), step_table([100, 130], noise=3.0))
    assert same["agrees"].tolist() == [False]   # predicted equal: not ordered


def test_faster_than_one_tensor_per_bucket_fails_only_a_plan_judged_slower():
    steps = step_table([130, 110, 150, 131], noise=3.0)
    v = bucket_sweep.faster_than(steps, "ddp:1", ["ddp:2", "ddp:3", "ddp:4"])
    assert v["ddp:2"].holds and v["ddp:3"].contradicted and v["ddp:4"].outcome == claims.UNRESOLVED
    table = bucket_sweep.verdict_table(v)
    assert table.loc["ddp:3", "answer"] == "no, the opposite" and table.loc["ddp:2", "answer"] == "yes"
    assert table.loc["ddp:4", "answer"] == "not resolved" and table.loc["ddp:2", "median"] < 0


# ---- the all-reduce line --------------------------------------------------------------------------
def allreduce_run(alpha_ms, ms_per_mib, noise=0.05, repeats=30, seed=13):
    rng = random.Random(seed)
    sizes = [4096 * 4 ** i for i in range(9)] + [16 * 2 ** 20]
    sizes = sorted(set(sizes))
    def calls():
        return [record.SizeCalls(n, [(alpha_ms + n / 2 ** 20 * ms_per_mib) * (1 + rng.gauss(0, noise))
                                     for _ in range(repeats)], [0] * repeats) for n in sizes]
    return SimpleNamespace(ranks=[SimpleNamespace(result=record.AllReduceSweepRecord(calls())) for _ in range(2)])


def test_the_all_reduce_terms_are_contradicted_by_a_line_where_alpha_dominates():
    bandwidth = allreduce_run(0.3, 1.3)        # 16 MiB: 21 ms against 0.3 ms
    assert buckets.judge_bandwidth_term(bandwidth, 16 * 2 ** 20 + 1000).holds
    assert buckets.judge_startup_term(bandwidth).holds
    latency = allreduce_run(20.0, 0.5)          # 16 MiB: 8 ms of bandwidth against 20 ms of start-up
    assert buckets.judge_bandwidth_term(latency, 16 * 2 ** 20, times=2).contradicted
    slow_link = allreduce_run(0.01, 50.0)       # 4 KiB: 0.2 ms of bandwidth against 0.01 ms
    assert buckets.judge_startup_term(slow_link).contradicted
    edge = allreduce_run(1.0, 1.0 / 16, noise=0.3)   # 16 MiB: exactly 1 ms + 1 ms: ratio 2 against a claim of 2
    assert buckets.judge_bandwidth_term(edge, 16 * 2 ** 20, times=1).outcome == claims.UNRESOLVED


# ---- tune-buckets' recommendation ----------------------------------------------------------------
def test_the_recommendation_leaves_the_default_only_for_a_plan_judged_faster():
    keep = bucket_tuning.KEEP
    def steps(default, best, noise=1.0):
        rng = random.Random(14)
        return pd.DataFrame({"ddp:default": [default + rng.gauss(0, noise) for _ in range(12)],
                             "ddp:4": [best + rng.gauss(0, noise) for _ in range(12)]})
    setting, verdict, outcome = bucket_tuning.recommend(steps(80, 70), "ddp:4", "bucket_cap_mb=4")
    assert setting == "bucket_cap_mb=4" and outcome == claims.HOLDS and verdict.startswith("ddp:4 measured faster than DDP's default (seen -")
    setting, verdict, outcome = bucket_tuning.recommend(steps(80, 80, noise=5.0), "ddp:4", "bucket_cap_mb=4")
    assert setting == keep and outcome == claims.UNRESOLVED and "cannot tell ddp:4 from DDP's default" in verdict
    setting, verdict, outcome = bucket_tuning.recommend(steps(70, 80), "ddp:4", "bucket_cap_mb=4")
    assert setting == keep and outcome == claims.CONTRADICTED
    few = steps(80, 70).head(6)   # 6 pairs: too few to judge, whatever the difference
    assert bucket_tuning.recommend(few, "ddp:4", "bucket_cap_mb=4")[0] == keep
    assert bucket_tuning.recommend(steps(70, 80), "ddp:default", keep)[0] == keep
