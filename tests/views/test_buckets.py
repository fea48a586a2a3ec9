"""The pure parts of tables/buckets.py and tables/bucket_sweep.py: error summaries,
calibration and the worked-example tables, on hand-made inputs (the timing claims judged on paired
steps, the ordering among them, are in tests/tasks/test_bucket_claims.py; the real-run parts in
tests/rank/test_bucketed.py)."""

import pandas as pd
import pytest

from ddplab import predict
from ddplab.predict.buckets import Cost, Grad
from ddplab.predict.comm import AlphaBeta
from ddplab.tables import bucket_sweep, buckets

LINK = AlphaBeta(1e-3, 1e-9)   # 1 ms + 1 ms per MB
INS = bucket_sweep.Inputs([Grad(f"p{i}", 2 ** 20, 5.0 * (i + 1)) for i in range(8)], backward_ms=42.0,
                          forward_ms=20.0, optimizer_ms=3.0)


def table(measured, spread, predicted, calibration=None):
    return pd.DataFrame({"measured_ms": measured, "spread_ms": spread, "calibrated_ms": predicted,
                         "calibrated_error": [(p - m) / m for p, m in zip(predicted, measured)],
                         "calibration_point": [i == calibration for i in range(len(measured))]},
                        index=[f"plan{i}" for i in range(len(measured))])


def test_error_summary_leaves_out_the_calibration_point_unless_asked():
    t = table([100, 100, 100], [1, 1, 1], [100, 104, 90], calibration=0)
    s = buckets.error_summary(t)
    assert s["mean_abs_error"] == pytest.approx(0.07) and s["max_abs_error"] == pytest.approx(0.10)
    assert s["worst"] == "plan2"
    assert buckets.error_summary(t, include_calibration=True)["mean_abs_error"] == pytest.approx(0.14 / 3)


def test_calibrating_alpha_reproduces_the_calibration_point_exactly():
    plan = buckets.ddp_rule(INS, 1)                    # one tensor per bucket
    shared = Cost(LINK, interference=1.0, copy_bytes_per_s=1e10)
    cost = buckets.calibrate(INS, plan, shared, measured_step_ms=100.0)
    assert buckets.predict(INS, plan, cost).step_ms == pytest.approx(100.0)
    # interference 1: step = forward + backward + sum of bucket costs + optimizer
    per_bucket = (100.0 - 20 - 42 - 3) / len(plan)
    assert cost.allreduce_ms(2 ** 20) == pytest.approx(per_bucket)


def test_ddp_rule_default_cap_has_a_1_mib_first_bucket():
    assert [len(b) for b in buckets.ddp_rule(INS, None)] == [1, 7]
    assert [len(b) for b in buckets.ddp_rule(INS, 4)] == [4, 4]


def test_candidates_and_summary_describe_the_last_bucket():
    cand = buckets.candidates(INS, Cost(LINK), [1, 4, 64], split_cap_mb=4)
    assert cand["buckets"].tolist() == [8, 2, 1, 3]
    assert (cand["last_ready_ms"] == 40.0).all()
    assert cand.loc["ddp:64", "first_launch_ms"] == 40.0
    assert cand.loc["ddp:64", "exposed_tail_ms"] > cand.loc["split:4", "exposed_tail_ms"] > 0
    s = buckets.predict(INS, buckets.ddp_rule(INS, 4), Cost(LINK))
    row = buckets.summary(s)
    assert row["buckets"] == 2 and row["last_bucket_mib"] == pytest.approx(4.0)
    bt = buckets.bucket_table(s)
    assert bt.loc[0, "backward_left_ms"] == pytest.approx(42.0 - 20.0)
    assert predict.buckets.simulate(INS.grads, buckets.ddp_rule(INS, 4), Cost(LINK), 42.0).buckets == s.buckets


def test_is_last_split_accepts_only_the_last_bucket_cut_in_two_in_order():
    plan = [["a", "b"], ["c", "d", "e"]]
    assert buckets.is_last_split([["a", "b"], ["c"], ["d", "e"]], plan)
    assert buckets.is_last_split([["a", "b"], ["c", "d"], ["e"]], plan)
    assert not buckets.is_last_split([["a"], ["b"], ["c", "d", "e"]], plan)        # the first bucket cut
    assert not buckets.is_last_split([["a", "b"], ["d"], ["c", "e"]], plan)        # reordered
    assert not buckets.is_last_split([["a", "b"], ["c"], ["d"], ["e"]], plan)      # cut in three
    assert not buckets.is_last_split(plan, plan) and not buckets.is_last_split([["a", "b"], [], ["c", "d", "e"]], plan)
    split = predict.buckets.split_bucket([[g.name for g in INS.grads[:3]], [g.name for g in INS.grads[3:]]], INS.grads)
    assert buckets.is_last_split(split, [[g.name for g in INS.grads[:3]], [g.name for g in INS.grads[3:]]])


def test_caps_for_gives_each_bucket_its_own_size_in_mib_exactly():
    from ddplab.predict.buckets import caps_for

    sizes = {"a": 3 * 2 ** 20, "b": 1000, "c": 2 ** 19 + 7}
    caps = caps_for([["a"], ["b", "c"]], sizes)
    assert caps == [3.0, (1000 + 2 ** 19 + 7) / 2 ** 20]
    # DDP turns a cap into bytes as int(cap * 2**20): the bytes come back exact, so each bucket closes
    # on its own last tensor (at >= its cap) and not one tensor later
    assert [int(c * 2 ** 20) for c in caps] == [3 * 2 ** 20, 1000 + 2 ** 19 + 7]
    assert not buckets.is_last_split([["x"]], [])


def test_an_emulated_link_holds_each_all_reduce_after_it_one_transfer_at_a_time():
    # two 1 MB buckets ready at 0 and 1 ms; loopback all-reduce 1 ms each; the link 4 ms each
    grads = [Grad("a", 10**6, 0.0), Grad("b", 10**6, 1.0)]
    plan = [["a"], ["b"]]
    loop = AlphaBeta(1e-3, 0.0)
    plain = predict.buckets.simulate(grads, plan, Cost(loop))
    assert [b.finish_ms for b in plain.buckets] == pytest.approx([1.0, 2.0])
    held = predict.buckets.simulate(grads, plan, Cost(loop, link_hold=AlphaBeta(4e-3, 0.0)))
    # a: done at 1, on the wire 1..5; b: done at 2, waits for the wire, 5..9 (not 2 + 4 = 6)
    assert [b.finish_ms for b in held.buckets] == pytest.approx([5.0, 9.0])
    assert held.exposed_tail_ms == pytest.approx(8.0) and held.summed_comm_ms == pytest.approx(10.0)
    # the hold takes no core: backward is not slowed by it, whatever the interference
    shared = predict.buckets.simulate(grads, plan, Cost(loop, interference=1.0, link_hold=AlphaBeta(4e-3, 0.0)))
    assert shared.backward_ms == predict.buckets.simulate(grads, plan, Cost(loop, interference=1.0)).backward_ms


@pytest.mark.slow
def test_a_plan_on_twice_the_bandwidth_is_held_half_as_long_and_modelled_so(tmp_path):
    """A real 2-rank run on an emulated 1 GbE link with every plan of the bandwidth question: the model gives
    the one bucket on twice the bandwidth half the wire's time less, the measured tails are the steps'
    medians, and the sentence names the wire's time."""
    import ddplab
    from ddplab import recipes, record
    from ddplab.tables import bucket_sweep

    exp = recipes.split_on_link("1GbE", rounds=2, steps=2, pin_cpus=False, against_bandwidth=True)
    run = ddplab.run(exp, tmp_path)
    plans = ["ddp:64", "ddp-2x:64", "ddp-split:64", "ddp:1"]
    table = buckets.tails_beside_model(run, AlphaBeta(1e-4, 1e-10), plans)
    half_wire_ms = run.spec.link.wire_s(bucket_sweep.inputs(run).gradient_bytes, 2) * 1e3 / 2
    assert table.loc["ddp-2x:64", "modelled_saving_ms"] == pytest.approx(half_wire_ms, rel=0.05)
    # what it saved in this run is timing, judged by chapter 05 on 20 paired steps, not here on 4
    seen = bucket_sweep.steps(run, record.exposed_tail_ms, plans).median()
    assert table["measured_tail_ms"].to_dict() == pytest.approx(seen.to_dict())
    assert f"{2 * half_wire_ms:.0f} ms on this wire" in buckets.wire_against_backward(run)
    # the step model prices the same plan at the rate it ran at, not the link's own
    steps, _ = buckets.compare(run, AlphaBeta(1e-4, 1e-10), plans=["ddp:64", "ddp-2x:64"])
    assert steps.loc["ddp:64", "textbook_ms"] - steps.loc["ddp-2x:64", "textbook_ms"] == pytest.approx(half_wire_ms, rel=0.05)


def test_a_hold_at_twice_the_bandwidth_puts_half_the_bytes_on_the_wire(monkeypatch):
    """rank/link.py: `bandwidth` scales the bytes the wire carries (its latency stays), and the bucket probe
    passes its own (`ddp-2x` plans: 2)."""
    from ddplab.rank import link
    from ddplab.rank.probes import buckets as probe

    held = []

    class Wire:
        def hold(self, fut, n_bytes, calls):
            held.append((n_bytes, calls))
            return fut

    monkeypatch.setattr(link, "_active", Wire())
    link.hold("fut", 1000, 3, bandwidth=2.0)
    link.hold("fut", 1000)
    assert held == [(500.0, 3), (1000.0, 1)]
    seen = []
    monkeypatch.setattr(probe.link, "hold", lambda fut, n, calls=1, bandwidth=1.0: seen.append(bandwidth) or fut)
    monkeypatch.setattr(probe.dist, "get_world_size", lambda group=None: 2)

    class Work:
        def get_future(self):
            import torch
            fut = torch.futures.Future()
            fut.set_result([torch.ones(4)])
            return fut

    monkeypatch.setattr(probe.dist, "all_reduce", lambda buf, group=None, async_op=False: Work())
    import torch
    probe.BucketLog(bandwidth=2.0).launch(0, torch.ones(4), ["w"]).wait()
    assert seen == [2.0]
