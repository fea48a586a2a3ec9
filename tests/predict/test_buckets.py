"""The bucket simulator: DDP's bucketing rule, plan surgery, and schedules worked out by hand."""

import time

import pytest

from ddplab.predict import buckets
from ddplab.predict.comm import AlphaBeta
from ddplab.predict.buckets import Cost, Grad

MS = 1e-3
# alpha 1 ms, 1 ms per 1000 bytes
LINK = AlphaBeta(1 * MS, 1e-6)


def grads(*spec):
    return [Grad(f"p{i}", b, t) for i, (b, t) in enumerate(spec)]


def test_ddp_plan_closes_a_bucket_once_it_reaches_the_cap_and_never_splits_a_tensor():
    g = grads((400, 1), (700, 2), (100, 3), (300, 4), (2000, 5))
    assert buckets.ddp_plan(g, 1000) == [["p0", "p1"], ["p2", "p3", "p4"]]     # 1100 >= 1000: overshoot by one tensor
    assert buckets.ddp_plan(g, 1) == [[x.name] for x in g]                     # tiny cap: one tensor per bucket
    assert buckets.ddp_plan(g, 10 ** 9) == [[x.name for x in g]]               # huge cap: one bucket
    assert buckets.ddp_plan(g, 1000, first_cap_bytes=300) == [["p0"], ["p1", "p2", "p3"], ["p4"]]


def test_ddp_plan_follows_ready_order_not_list_order():
    g = [Grad("late", 10, 9.0), Grad("early", 10, 1.0)]
    assert buckets.ddp_plan(g, 10) == [["early"], ["late"]]
    with pytest.raises(ValueError, match="cap_bytes"):
        buckets.ddp_plan(g, 0)


def test_split_bucket_cuts_the_last_bucket_as_evenly_as_whole_tensors_allow():
    g = grads((100, 1), (100, 2), (300, 3), (300, 4), (100, 5), (100, 6))
    plan = [["p0", "p1"], ["p2", "p3", "p4", "p5"]]
    assert buckets.split_bucket(plan, g) == [["p0", "p1"], ["p2"], ["p3", "p4", "p5"]]   # 300 | 500 beats 600 | 200
    assert buckets.split_bucket(plan, g, index=0) == [["p0"], ["p1"], ["p2", "p3", "p4", "p5"]]
    assert buckets.split_bucket(plan, g, parts=4) == [["p0", "p1"], ["p2"], ["p3"], ["p4"], ["p5"]]
    with pytest.raises(ValueError, match="index"):
        buckets.split_bucket([["p0"], ["p1", "p2", "p3", "p4", "p5"]], g, index=0)
    # 40/30/30: the cut closest to half is after the first tensor (40 | 60), not after two (70 | 30)
    h = grads((40, 1), (30, 2), (30, 3))
    assert buckets.split_bucket([["p0", "p1", "p2"]], h) == [["p0"], ["p1", "p2"]]


def test_check_plan_names_what_is_wrong():
    g = grads((4, 1), (4, 2))
    with pytest.raises(ValueError, match=r"missing: \['p1'\]"):
        buckets.check_plan([["p0"]], g)
    with pytest.raises(ValueError, match=r"twice: \['p0'\]"):
        buckets.check_plan([["p0"], ["p0", "p1"]], g)
    with pytest.raises(ValueError, match="empty"):
        buckets.check_plan([["p0", "p1"], []], g)
    with pytest.raises(ValueError, match="Cost.interference"):
        Cost(LINK, interference=-1)


def test_textbook_overlap_by_hand():
    # two buckets of 4000 bytes (5 ms each), ready at 10 and 20 ms; backward ends at 20 ms
    g = grads((4000, 10.0), (4000, 20.0))
    s = buckets.simulate(g, [["p0"], ["p1"]], Cost(LINK), backward_ms=20.0, forward_ms=3.0, optimizer_ms=2.0)
    (a, b) = s.buckets
    assert (a.ready_ms, a.start_ms, a.finish_ms) == pytest.approx((10, 10, 15))
    assert (b.ready_ms, b.start_ms, b.finish_ms) == pytest.approx((20, 20, 25))
    assert s.backward_ms == pytest.approx(20) and s.exposed_tail_ms == pytest.approx(5)
    assert s.step_ms == pytest.approx(3 + 25 + 2) and s.first_launch_ms == pytest.approx(10)
    # one bucket: launched at 20, 9 ms alone: the whole all-reduce is exposed
    one = buckets.simulate(g, [["p0", "p1"]], Cost(LINK), backward_ms=20.0)
    assert one.comm_end_ms == pytest.approx(29) and one.exposed_tail_ms == pytest.approx(9)


def test_a_bucket_ready_while_the_channel_is_busy_waits_its_turn():
    g = grads((9000, 1.0), (1000, 2.0))          # 10 ms, then 2 ms
    s = buckets.simulate(g, [["p0"], ["p1"]], Cost(LINK), backward_ms=30.0)
    assert s.buckets[1].ready_ms == pytest.approx(2) and s.buckets[1].start_ms == pytest.approx(11)
    assert s.buckets[1].finish_ms == pytest.approx(13) and s.exposed_tail_ms == 0


def test_interference_one_hides_nothing_whatever_the_plan():
    g = grads(*[(1000 * (i + 1), 5.0 * (i + 1)) for i in range(8)])
    cost = Cost(LINK, interference=1.0)
    total = 40.0 + sum(cost.allreduce_ms(x.bytes) for x in g)
    for cap in (1, 5000, 10 ** 9):
        s = buckets.simulate(g, buckets.ddp_plan(g, cap), cost, backward_ms=40.0)
        assert s.sync_end_ms == pytest.approx(40.0 + s.summed_comm_ms)
    assert buckets.simulate(g, [[x.name] for x in g], cost, 40.0).sync_end_ms == pytest.approx(total)


def test_interference_stretches_backward_by_the_overlapped_communication():
    g = grads((4000, 0.0), (0, 20.0))            # a 5 ms all-reduce at the very start of a 20 ms backward
    s = buckets.simulate(g, [["p0"], ["p1"]], Cost(LINK, interference=1.0), backward_ms=20.0)
    # both at half speed for 10 ms: the all-reduce ends at 10, backward at 25; then the empty bucket costs alpha
    assert s.buckets[0].finish_ms == pytest.approx(10) and s.backward_ms == pytest.approx(25)
    assert s.comm_end_ms == pytest.approx(26)


def test_comm_scale_multiplies_every_cost_and_calibrate_recovers_it():
    g = grads(*[(50_000, 2.0 * i) for i in range(1, 11)])
    plan = buckets.ddp_plan(g, 120_000)
    truth = buckets.simulate(g, plan, Cost(LINK, interference=0.3, comm_scale=1.7), 25.0).step_ms
    for knob, value in (("comm_scale", 1.7), ("interference", 0.3)):
        fixed = Cost(LINK, interference=0.3 if knob == "comm_scale" else 0.0,
                     comm_scale=1.7 if knob == "interference" else 1.0)
        fitted = buckets.calibrate(
            lambda x: buckets.simulate(g, plan, buckets.with_knob(fixed, knob, x), 25.0).step_ms, truth)
        assert fitted == pytest.approx(value, rel=1e-3)


def test_fast_enough_for_a_slider():
    g = [Grad(f"p{i}", 4096 * (1 + i % 7), 0.3 * i) for i in range(400)]
    cost = Cost(LINK, interference=0.5)
    t0 = time.perf_counter()
    for cap in (4096, 65536, 2 ** 20):
        buckets.simulate(g, buckets.ddp_plan(g, cap), cost, backward_ms=130.0)
    assert (time.perf_counter() - t0) / 3 < 0.05


def test_copies_priced_per_bucket_and_alpha_recovered_by_calibration():
    g = grads((4000, 10.0), (4000, 20.0))
    cost = Cost(LINK, copy_bytes_per_s=8e6)            # 2 x 4000 B at 8 MB/s: 1 ms per bucket
    assert cost.allreduce_ms(4000) == pytest.approx(5 + 1)
    shared = Cost(AlphaBeta(2.5e-3, 1e-6), interference=1.0, copy_bytes_per_s=8e6)
    plan = [["p0"], ["p1"]]
    truth = buckets.simulate(g, plan, shared, 20.0).step_ms
    assert truth == pytest.approx(20 + 2 * (2.5 + 4 + 1))
    start = buckets.with_knob(shared, "alpha_ms", 0.0)
    fitted = buckets.calibrate(lambda a: buckets.simulate(g, plan, buckets.with_knob(start, "alpha_ms", a), 20.0).step_ms, truth)
    assert fitted == pytest.approx(2.5, rel=1e-6)
    with pytest.raises(ValueError, match="knob"):
        buckets.with_knob(shared, "beta", 1.0)


def test_buckets_launch_in_plan_order_like_ddp():
    # bucket 1 is complete at 2 ms, but bucket 0 only at 10 ms: bucket 1 waits for it
    g = grads((1000, 10.0), (1000, 2.0))
    s = buckets.simulate(g, [["p0"], ["p1"]], Cost(LINK), backward_ms=20.0)
    assert [b.ready_ms for b in s.buckets] == pytest.approx([10.0, 10.0])
    assert s.buckets[1].start_ms == pytest.approx(s.buckets[0].finish_ms)


def test_a_cost_on_a_faster_link_holds_its_bytes_for_less_and_keeps_the_latency():
    link = AlphaBeta(1e-4, 1e-9)
    held = Cost(link, link_hold=AlphaBeta(5e-5, 8e-9))
    fast = held.link_faster(2.0)
    assert fast.link_hold == AlphaBeta(5e-5, 4e-9) and fast.link == link
    assert held.link_faster(1.0) is held and Cost(link).link_faster(2.0) == Cost(link)   # no link: nothing to scale
