"""The step-time estimate on a named cluster: compute from FLOPs, communication on the alpha-beta line,
overlap as chapter 05 models it; a range, with its assumptions."""

from __future__ import annotations

import pytest

from ddplab.predict.comm import ring_bytes_per_rank
from ddplab.predict.plan import CLUSTERS, GLOO_WIRE, RING_WIRE, comm_seconds, gloo_wire_bytes, step_estimate
from ddplab.record.plan import Collective

CLUSTER = CLUSTERS["h100-ib"]
GB = 1e9


def reduce_of(buckets, world_size):
    total = sum(buckets)
    return [Collective("all_reduce", len(buckets), total, round(2 * (world_size - 1) / world_size * total))]


def test_compute_is_flops_over_peak_times_utilisation():
    e = step_estimate(int(100e12), [], [], 8, "fsdp2", CLUSTER)
    assert e.compute_s == pytest.approx((100 / (989 * 0.43), 100 / (989 * 0.38)))
    assert e.step_s == e.compute_s   # nothing to send: the step is its compute
    assert any("989" in a and "43%" in a for a in e.assumptions)


def test_communication_is_latency_per_call_plus_wire_bytes_over_bus_bandwidth():
    c = [Collective("all_gather", 10, 0, int(47 * GB)), Collective("reduce_scatter", 5, 0, int(47 * GB))]
    assert comm_seconds(c, 470 * GB, 20e-6) == pytest.approx(15 * 20e-6 + 94 / 470)


def test_ddp_hides_its_buckets_behind_backward_but_not_the_last_one():
    buckets = [int(0.5 * GB)] * 20
    e = step_estimate(int(200e12), reduce_of(buckets, 64), buckets, 64, "ddp", CLUSTER)
    for compute, comm, step in zip(e.compute_s, e.comm_s, e.step_s):
        assert compute < step < compute + comm
        assert step - compute >= comm / len(buckets) * 0.99   # the last bucket runs after backward
    one = step_estimate(int(200e12), reduce_of([sum(buckets)], 64), [sum(buckets)], 64, "ddp", CLUSTER)
    assert one.step_s[0] == pytest.approx(one.compute_s[0] + one.comm_s[0])   # one bucket: nothing overlaps


def test_zero1_adds_its_broadcasts_after_the_step():
    buckets = [int(0.5 * GB)] * 20
    ddp = step_estimate(int(200e12), reduce_of(buckets, 64), buckets, 64, "ddp", CLUSTER)
    cast = reduce_of(buckets, 64) + [Collective("broadcast", 100, int(10 * GB), int(9.8 * GB))]
    zero1 = step_estimate(int(200e12), cast, buckets, 64, "zero1", CLUSTER)
    for d, z in zip(ddp.step_s, zero1.step_s):
        assert z > d


def test_fsdp2_ranges_from_hidden_to_added():
    c = [Collective("all_gather", 64, 0, int(100 * GB))]
    e = step_estimate(int(100e12), c, [], 64, "fsdp2", CLUSTER)
    assert e.step_s[0] == pytest.approx(max(e.compute_s[0], e.comm_s[0]))
    assert e.step_s[1] == pytest.approx(e.compute_s[1] + e.comm_s[1])
    assert e.step_s[0] < e.step_s[1]


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        step_estimate(-1, [], [], 8, "ddp", CLUSTER)


def test_gloo_prices_reduce_scatter_as_an_all_reduce_and_the_rest_as_the_ring():
    """What tests/launch/test_plan.py holds real gloo ranks' writes to: on 4 ranks a payload P costs 1.5 P
    reduced or reduce-scattered, 0.75 P gathered or broadcast (on average over the ranks)."""
    mib = 1 << 20
    calls = [Collective(op, 1, mib, 0) for op in ("all_reduce", "reduce_scatter", "all_gather", "broadcast")]
    assert [gloo_wire_bytes([c], 4) for c in calls] == [1.5 * mib, 1.5 * mib, 0.75 * mib, 0.75 * mib]
    assert gloo_wire_bytes(calls, 4) == 4.5 * mib and gloo_wire_bytes(calls, 1) == 0
    with pytest.raises(ValueError, match="no gloo price for all_to_all"):
        gloo_wire_bytes([Collective("all_to_all", 1, mib, 0)], 4)


def test_the_ring_price_is_chapter_03s_and_differs_from_gloo_only_in_reduce_scatter():
    """The plan's wire bytes (NCCL's ring, `RING_WIRE`) and the gloo price (`GLOO_WIRE`) cover the same
    collectives; a ring all-reduce is chapter 03's 2(D-1)/D P, and only reduce-scatter is priced apart."""
    assert set(RING_WIRE) == set(GLOO_WIRE)
    assert {op for op in RING_WIRE if RING_WIRE[op] != GLOO_WIRE[op]} == {"reduce_scatter"}
    mib = 1 << 20
    for d in (2, 4, 8):
        assert RING_WIRE["all_reduce"] * (d - 1) / d * mib == ring_bytes_per_rank(mib, d)


def test_a_float32_estimate_says_it_assumes_tf32_which_torch_does_not_do_by_default():
    """The float32 peak is TF32's; torch runs float32 matmuls at full precision unless asked ('highest' is its
    default), so the assumption is printed with the estimate. Read from the running torch: if torch's default
    changes, the note is wrong and this fails."""
    torch = pytest.importorskip("torch")
    assert torch.get_float32_matmul_precision() == "highest"
    e = step_estimate(10**15, [], [], 8, "fsdp2", CLUSTER, dtype="float32")
    assert "set_float32_matmul_precision('high')" in e.assumptions[1] and "67 TFLOPS" in e.assumptions[1]
    assert "TF32" not in step_estimate(10**15, [], [], 8, "fsdp2", CLUSTER, dtype="bfloat16").assumptions[1]
