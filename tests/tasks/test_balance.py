"""Equal tokens, unequal cost (notebook 07): the cost model and both assignment policies
(pure), the balance study's spec and tables on stand-in records, and one real 2-rank study."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pandas as pd
import pytest

import ddplab
from ddplab import record
from ddplab.predict import balance as cost
from ddplab.spec import Experiment
from ddplab.spec.balance import BalanceStudy
from ddplab.tables import balance as views

POOL = (512,) * 2 + (64,) * 16   # the brief's example: 1024 tokens each way on 2 ranks
TRUE = cost.CostModel(c_ms=1.5, a_ms_per_token=0.004, b_ms_per_sq=2e-5)


def exact_samples(model=TRUE, shapes=cost.calibration_shapes((32, 64, 128, 256, 512), 1024)):
    return [(n * length, n * length ** 2, model.predict(n * length, n * length ** 2)) for n, length in shapes]


# ---- the cost model ------------------------------------------------------------------------------
def test_fit_recovers_the_coefficients_of_exact_points():
    m = cost.fit(exact_samples())
    assert m.c_ms == pytest.approx(1.5, rel=1e-9) and m.a_ms_per_token == pytest.approx(0.004, rel=1e-9)
    assert m.b_ms_per_sq == pytest.approx(2e-5, rel=1e-9)
    q = cost.quality(m, exact_samples())
    assert q.r2 == pytest.approx(1.0) and q.max_abs_error_ms < 1e-9


def test_the_tokens_only_model_cannot_see_the_squared_term():
    samples = exact_samples()
    tokens_only = cost.fit_tokens(samples)
    assert tokens_only.b_ms_per_sq == 0.0
    full, flat = cost.quality(cost.fit(samples), samples), cost.quality(tokens_only, samples)
    assert flat.r2 < 0.6 < full.r2 and flat.mean_abs_error_ms > 1.0
    # at equal tokens the tokens-only model predicts one time for every length
    assert tokens_only.predict(1024, 2 * 512 ** 2) == tokens_only.predict(1024, 32 * 32 ** 2)


def test_fit_refuses_too_few_points_a_singular_design_and_malformed_points():
    with pytest.raises(ValueError, match=r"samples: .*at least 3 points \(got 2\)"):
        cost.fit(exact_samples()[:2])
    equal_tokens = [(1024, 1024 * n, 5.0 + n / 100) for n in (32, 64, 128, 256)]
    with pytest.raises(ValueError, match=r"samples: singular design: .*tokens"):
        cost.fit(equal_tokens)
    with pytest.raises(ValueError, match=r"samples\[1\]: expected numbers"):
        cost.fit([(1, 1, 1.0), ("many", 1, 1.0), (2, 4, 2.0)])
    with pytest.raises(ValueError, match=r"samples\[0\]: expected finite, non-negative"):
        cost.fit([(1, 1, float("nan")), (2, 2, 1.0), (3, 9, 2.0)])
    with pytest.raises(ValueError, match="samples: expected a list"):
        cost.fit(None)


def test_a_rank_pays_the_constant_once_per_micro_batch_one_per_length():
    m = cost.CostModel(1.0, 0.01, 0.001)
    assert m.lengths_ms([]) == 0.0
    assert m.lengths_ms([10, 10, 20]) == pytest.approx(2 * 1.0 + 0.01 * 40 + 0.001 * 600)
    assert m.sequence_ms(20) == pytest.approx(0.01 * 20 + 0.001 * 400)


def test_calibration_shapes_hold_equal_tokens_and_every_rank_of_two_sees_every_length():
    shapes = cost.calibration_shapes((32, 64, 128, 256, 512), 1024)
    assert {n * length for n, length in shapes} == {1024, 512}
    for mine in (shapes[0::2], shapes[1::2]):
        assert sorted(length for _, length in mine) == [32, 64, 128, 256, 512]
        assert {n * length for n, length in mine} == {1024, 512}


# ---- the two policies ----------------------------------------------------------------------------
def test_length_grouping_gives_equal_tokens_but_eight_times_the_squared_lengths():
    ranks = cost.by_length_groups(POOL, 2)
    lengths = [[POOL[i] for i in r] for r in ranks]
    assert lengths == [[512, 512], [64] * 16]
    assert [cost.tokens(x) for x in lengths] == [1024, 1024]
    assert cost.sum_sq(lengths[0]) == 8 * cost.sum_sq(lengths[1])


def test_cost_balancing_keeps_the_pool_and_evens_the_estimated_cost():
    ranks = cost.by_cost(POOL, 2, TRUE)
    assert sorted(i for r in ranks for i in r) == list(range(len(POOL)))      # the same sequences, once each
    assert [cost.describe(POOL[i] for i in r) for r in ranks] == ["1x512 + 8x64"] * 2
    loads = [TRUE.lengths_ms(POOL[i] for i in r) for r in ranks]
    grouped = [TRUE.lengths_ms(POOL[i] for i in r) for r in cost.by_length_groups(POOL, 2)]
    assert max(loads) < max(grouped)


@pytest.mark.parametrize("seed", range(20))
def test_on_random_pools_both_policies_keep_the_pool_and_lpt_stays_within_its_bound(seed):
    rng = random.Random(seed)
    world_size = rng.choice([2, 3, 4])
    pool = [rng.choice([32, 64, 128, 256, 512]) for _ in range(rng.randint(world_size, 40))]
    for policy in cost.POLICIES:
        ranks = cost.assign(policy, pool, world_size, TRUE)
        assert sorted(i for r in ranks for i in r) == list(range(len(pool))) and all(ranks), policy
    slowest = {p: max(TRUE.lengths_ms(pool[i] for i in r) for r in cost.assign(p, pool, world_size, TRUE))
               for p in cost.POLICIES}
    # LPT is within 4/3 of the best split; the length groups can be far worse, but never better by
    # more than LPT's own bound
    assert slowest["cost"] <= slowest["tokens"] * 4 / 3 + TRUE.c_ms


def test_length_grouping_never_leaves_a_rank_without_a_sequence():
    ranks = cost.by_length_groups([1000, 1, 1], 3)
    assert [len(r) for r in ranks] == [1, 1, 1]


def test_assignment_refuses_wrong_input_by_name():
    with pytest.raises(ValueError, match="world_size: must be a positive integer"):
        cost.by_length_groups(POOL, 0)
    with pytest.raises(ValueError, match="lengths: 1 sequences cannot give each of 2 ranks one"):
        cost.by_cost([64], 2, TRUE)
    with pytest.raises(ValueError, match="lengths: every sequence length must be a positive integer"):
        cost.by_length_groups([64, 0, 32], 2)
    with pytest.raises(ValueError, match="model: expected a CostModel"):
        cost.by_cost(POOL, 2, None)
    with pytest.raises(ValueError, match="policy: must be one of tokens, cost"):
        cost.assign("random", POOL, 2, TRUE)


# ---- the spec --------------------------------------------------------------------------------------
def study(**task):
    return Experiment(task=BalanceStudy(**{"pool": POOL, **task}), seq_len=512, d_model=32)


def test_the_study_round_trips_through_json_and_validates_its_settings():
    exp = study(rounds=2)
    assert Experiment.from_json(exp.to_json()) == exp and exp.task.total_steps(exp) == 2
    cases = [(dict(pool=()), "task.pool"), (dict(pool=(64,)), r"task.pool: 1 sequences"),
             (dict(policies=("tokens", "tokens")), "task.policies"),
             (dict(calibration_lengths=(64,)), "task.calibration_lengths: at least 2"),
             (dict(calibration_lengths=(32, 64)), "task.calibration_lengths: must reach the longest"),
             (dict(calibration_tokens=1000), "task.calibration_tokens"), (dict(rounds=0), "task.rounds")]
    for settings, message in cases:
        with pytest.raises(ValueError, match=message):
            study(**settings)
    with pytest.raises(ValueError, match="seq_len: .*at least 512"):
        Experiment(task=BalanceStudy(pool=POOL))
    with pytest.raises(ValueError, match="local_batch: the balance-study task does not read it"):
        Experiment(task=BalanceStudy(pool=POOL), seq_len=512, local_batch=4)


# ---- the tables, on stand-in records --------------------------------------------------------------
def stand_in(compute: dict, rounds: int = 4, steps: int = 3, noise: float = 0.0, seed: int = 0):
    """A 2-rank study whose rank r computes `compute[policy][r]` ms (plus uniform noise) each step."""
    rng = random.Random(seed)
    points = [record.CalibrationPoint(n, length, i % 2, [t] * 3)
              for i, ((n, length), (_, _, t)) in enumerate(zip(cost.calibration_shapes((32, 64, 128, 256, 512), 1024),
                                                              exact_samples()))]
    arms: list[list] = [[], []]
    for policy, per_rank in compute.items():
        steps_of = [[], []]
        t = 0
        for r in range(rounds):
            for _ in range(steps):
                ms = [c + rng.uniform(0, noise) for c in per_rank]
                start, last = t, t + int(max(ms) * 1e6)
                for rank in range(2):
                    arrival = start + int(ms[rank] * 1e6)
                    steps_of[rank].append(record.BalanceStep(r, start, arrival, last + 10 ** 6, ms[rank],
                                                             (last - arrival) / 1e6))
                t = last + 2 * 10 ** 6
        for rank in range(2):
            arms[rank].append(record.BalanceArm(policy, [rank], [64], 64, 4096, per_rank[rank], 0.0, steps_of[rank]))
    fit = cost.fit([(p.tokens, p.sum_sq, p.median_ms) for p in points])
    recs = [record.BalanceRecord(record.ModelInfo(10, 40), list(POOL), sum(POOL), 2, points,
                                 record.CostFit(fit.c_ms, fit.a_ms_per_token, fit.b_ms_per_sq), arms[rank])
            for rank in range(2)]
    return SimpleNamespace(spec=SimpleNamespace(task=SimpleNamespace(kind="balance-study")),
                           ranks=[SimpleNamespace(result=r) for r in recs])


def test_timing_takes_medians_per_rank_and_times_the_step_by_its_slowest_rank():
    run = stand_in({"tokens": [20.0, 8.0], "cost": [14.0, 14.0]})
    t = views.balance_timing(run)
    assert t.loc[("tokens", 0), "compute_ms"] == pytest.approx(20.0) and t.loc[("tokens", 1), "wait_ms"] == pytest.approx(12.0)
    assert t.loc[("tokens", 0), "wait_ms"] == 0.0 and t.loc[("cost", 1), "max_wait_ms"] == pytest.approx(0.0)
    assert t.loc[("tokens", 0), "step_ms"] == pytest.approx(21.0) and t.loc[("cost", 0), "step_ms"] == pytest.approx(15.0)


def test_the_verdict_holds_for_a_clear_gain_is_contradicted_for_a_loss_and_unresolved_on_noise():
    clear = views.balance_verdict(stand_in({"tokens": [20.0, 8.0], "cost": [14.0, 14.0]}, noise=0.5))
    assert clear["step_ms"].holds and clear["max_wait_ms"].holds
    assert clear["step_ms"].center == pytest.approx(-6.0, abs=0.6) and clear["step_ms"].n == 12
    worse = views.balance_verdict(stand_in({"tokens": [14.0, 14.0], "cost": [20.0, 8.0]}, noise=0.5))
    assert worse["step_ms"].contradicted and worse["max_wait_ms"].contradicted
    noisy = views.balance_verdict(stand_in({"tokens": [15.0, 14.0], "cost": [14.5, 14.5]}, noise=8.0, seed=3))
    assert noisy["step_ms"].outcome == "cannot resolve"


def test_the_quadratic_term_is_judged_on_its_standard_error():
    np = pytest.importorskip("numpy")
    rng = random.Random(0)
    noisy = [(n, q, t + rng.gauss(0, 0.3)) for n, q, t in exact_samples()]
    errors, dof = cost.standard_errors(noisy)
    x = np.array([[1.0, n, q] for n, q, _ in noisy])
    y = np.array([t for *_, t in noisy])
    beta = np.linalg.lstsq(x, y, rcond=None)[0]
    want = np.sqrt(np.diag(((x @ beta - y) ** 2).sum() / dof * np.linalg.inv(x.T @ x)))
    assert dof == len(noisy) - 3
    assert [errors.c_ms, errors.a_ms_per_token, errors.b_ms_per_sq] == pytest.approx(list(want), rel=1e-6)
    assert max(vars(cost.standard_errors(exact_samples())[0]).values()) < 1e-9
    with pytest.raises(ValueError, match="more points than the 3 coefficients"):
        cost.standard_errors(exact_samples()[:3])
    # Student's t over the normal quantile, at alpha 0.001 (tables: 4.785 at 7 degrees of freedom, 3.421 at 27)
    assert 3.0902 * views._t_over_z(7, 0.001) == pytest.approx(4.785, rel=0.005)
    assert 3.0902 * views._t_over_z(27, 0.001) == pytest.approx(3.421, rel=0.005)

    def judged(model, noise, seed=0):
        rng = random.Random(seed)
        points = [(n, q, t + rng.gauss(0, noise)) for n, q, t in exact_samples(model)]
        run = stand_in({"tokens": [20.0, 8.0]}, rounds=1, steps=1)
        for rank in run.ranks:
            rank.result = dataclasses.replace(rank.result, calibration=[
                record.CalibrationPoint(p.count, p.length, p.rank, [t] * 3)
                for p, (_, _, t) in zip(rank.result.calibration, points)])
        return views.judge_quadratic_term(run)

    assert judged(TRUE, 0.3).holds
    assert judged(cost.CostModel(1.5, 0.01, -1e-5), 0.3).contradicted   # longer sequences cheaper per token
    assert judged(cost.CostModel(1.5, 0.004, 0.0), 0.3).outcome == "cannot resolve"   # no quadratic term: noise


def test_the_tables_refuse_a_run_of_another_task():
    run = SimpleNamespace(spec=SimpleNamespace(task=SimpleNamespace(kind="bucket-sweep")), ranks=[])
    with pytest.raises(ValueError, match="a bucket-sweep run, and it reads balance-study runs"):
        views.balance_timing(run)
    with pytest.raises(ValueError, match="`run` must be a run .*got str 'runs/mine'"):
        views.balance_timing("runs/mine")


def test_a_balance_record_round_trips_through_the_rank_file_schema():
    rec = stand_in({"tokens": [20.0, 8.0]}, rounds=1, steps=1).ranks[0].result
    env = record.Envelope("balance-study", 0, 0, 2, "gloo", "cpu", 1, "h", "2", "3", "x", "y", 0, 1)
    back = record.load(record.dump(record.RankRecord(env, rec)), record.BalanceRecord).result
    assert back == rec and back.arm("tokens").steps[0].allreduce_ms == pytest.approx(1.0)


# ---- one real study ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_real_study_reduces_one_gradient_and_the_cost_model_beats_tokens(runs_dir):
    exp = Experiment(name="balance-2", world_size=2, seq_len=512, d_model=32, n_layers=2, n_heads=4,
                     task=BalanceStudy(pool=POOL, calibration_repeats=3, rounds=4, steps_per_round=3))
    run = ddplab.run(exp, runs_dir / exp.name, progress=False)
    recs = [r.result for r in run.ranks]
    assert len(recs) == 2 and all(len(r.calibration) == 10 for r in recs) and recs[0].fit == recs[1].fit
    assert {p.rank for p in recs[0].calibration} == {0, 1}
    for policy in ("tokens", "cost"):
        arms = [r.arm(policy) for r in recs]
        assert sorted(i for a in arms for i in a.sequences) == list(range(len(POOL)))
        # 12 steps a policy: more than the 10 a claim needs to resolve at all
        assert all(len(a.steps) == 12 for a in arms) and [s.round for s in arms[0].steps] == [r for r in range(4)
                                                                                               for _ in range(3)]
        for steps in zip(*(a.steps for a in arms)):
            assert min(s.wait_ms for s in steps) == 0.0                   # the last rank to arrive waits for no one
            assert all(s.returned_ns >= s.arrival_ns >= s.start_ns for s in steps)
        # from the same parameters, the same global batch, shared differently: one reduced gradient
        assert all(a.grad_rel_diff < 1e-5 for a in arms), [a.grad_rel_diff for a in arms]
    assert [a.tokens for a in (r.arm("tokens") for r in recs)] == [1024, 1024]
    fit = views.balance_fit(run)
    assert views.fitted_models(run)["cost"] == cost.CostModel(**vars(recs[0].fit))   # the tables refit what the ranks used
    print(fit[["r2", "mean_abs_error_ms", "max_abs_error_ms"]].round(3).to_dict("index"))
    # in sample the nested cost model cannot fit worse than the tokens-only one; how much better is
    # this machine's noise (a CI run: R^2 0.81 against 0.23), so the test judges out of sample, below
    assert fit.loc["cost", "r2"] >= fit.loc["tokens", "r2"]
    assert not views.judge_quadratic_term(run).contradicted
    timing = views.balance_timing(run)
    assert set(timing.index) == {(p, r) for p in ("tokens", "cost") for r in (0, 1)}
    for v in views.balance_verdict(run).values():
        print(v)
        assert not v.contradicted
    # out of sample: the cost model predicts the gap between the equal-token ranks, the token count cannot
    gaps = views.imbalance(run)
    assert gaps.loc["tokens", "tokens_model_gap_ms"] == pytest.approx(0.0, abs=1e-9)
    views.verify_cost_explains_imbalance(gaps)


def test_the_imbalance_check_fails_when_the_ranks_took_the_same_time():
    """The key check can fail: equal-token ranks that measured no gap, while the cost model expected one."""
    from ddplab import verify

    steps = lambda ms: [[ms + 0.1 * (i % 5 - 2) for i in range(12)]]   # noqa: E731  12 steps, a little noise
    table = pd.DataFrame({"slow_rank": [0], "fast_rank": [1], "measured_gap_ms": [0.3], "step_gaps_ms": steps(0.3),
                          "cost_model_gap_ms": [19.5], "tokens_model_gap_ms": [0.0]},
                         index=pd.Index(["tokens"], name="policy"))
    with pytest.raises(verify.CheckFailed, match="(?s)contradicted: tokens split: the rank gap is at least.*measured over predicted"):
        views.verify_cost_explains_imbalance(table)
    views.verify_cost_explains_imbalance(table.assign(measured_gap_ms=17.4, step_gaps_ms=steps(17.4)))
    with pytest.raises(verify.CheckFailed, match="predicts no gap"):
        views.verify_cost_explains_imbalance(table.assign(cost_model_gap_ms=0.0))
