"""Bytes on the wire, the all-reduce sweep and gradient readiness, from real runs."""

from __future__ import annotations

import pytest

from ddplab import recipes, tables
from tests.support import share

pytestmark = pytest.mark.slow


# 3 ranks: bus bandwidth differs from algorithm bandwidth only where 2(D-1)/D != 1
share("comm", lambda: [recipes.allreduce_sweep(world_size=3, min_bytes=2**16, max_bytes=2**22, repeats=5),
                       *recipes.bytes_on_wire(world_sizes=(2, 3, 4))])
share("ready", lambda: recipes.readiness_cases())


@pytest.fixture(scope="module")
def comm_runs(shared_runs):
    return shared_runs["comm"]


def test_bytes_each_rank_writes_match_the_ring_formula_for_2_3_and_4_ranks(comm_runs):
    table = tables.comm.bytes_on_wire(comm_runs[1:])
    assert list(table.index) == [2, 3, 4]
    assert ((table["ratio"] - 1).abs() < 0.02).all(), table


def test_sweep_records_every_size_and_the_fit_is_graded(comm_runs):
    table = tables.comm.allreduce_sweep(comm_runs[0])
    assert list(table.index) == [2**k for k in range(16, 23)]
    for r in comm_runs[0].ranks:  # every rank timed every size, once per repeat
        assert [c.bytes for c in r.result.sizes] == list(table.index)
        assert all(len(c.ms) == len(c.write_bytes) == 5 for c in r.result.sizes)
    assert ((table["written_over_ring_formula"] - 1).abs() < 0.05).all()
    model, q = tables.comm.fit_sweep(table)
    assert model.bandwidth_bytes_per_s > 0 and len(q.residuals) == len(table)
    # bus bandwidth is the rate each rank's link carries, 2(D-1)/D x the algorithm bandwidth (4/3 at
    # 3 ranks): since each rank wrote the ring formula's bytes (above), it is what a rank wrote per second
    assert table["busbw_gb_s"].to_list() == pytest.approx((table["algbw_gb_s"] * 4 / 3).to_list(), rel=1e-9)


@pytest.fixture(scope="module")
def ready_runs(shared_runs):
    return {r.spec.name: r for r in shared_runs["ready"]}


def test_first_iteration_uses_one_bucket_in_source_order_then_ddp_rebuilds(ready_runs):
    r = ready_runs["ready-plain"].ranks[0]
    assert len(r.steps[0].buckets) == 1 and r.steps[0].buckets[0].params == r.parameter_names
    assert len(r.steps[-1].buckets) > 1


def test_rebuilt_buckets_follow_the_observed_ready_order(ready_runs):
    st = ready_runs["ready-branchy"].ranks[0].steps[-1]
    ready = [e.param for e in st.backward.ready]
    in_buckets = [p for b in sorted(st.buckets, key=lambda b: b.index) for p in b.params]
    assert in_buckets == ready


def test_tied_weight_is_ready_last_though_defined_first(ready_runs):
    order = tables.readiness.ready_order(ready_runs["ready-tied"])
    assert order.loc["tok_emb.weight", "source_position"] == 0
    assert order.loc["tok_emb.weight", "ready_position"] == len(order) - 1


def test_branchy_ready_order_differs_from_reverse_source_order(ready_runs):
    order = tables.readiness.ready_order(ready_runs["ready-branchy"])
    assert order.loc["head.weight", "ready_position"] <= 1 and not order["as_assumed"].all()
    assert order.loc["b2.weight", "ready_position"] < order.loc["b1.weight", "ready_position"]


def test_every_bucket_completes_before_backward_returns(ready_runs):
    # causal, so no slack (notebook 04 checks the same, also without): a rank stamps all three on its own
    # monotonic clock (rank/clock.py), the launch before the all-reduce starts, the completion in its
    # future's callback, and backward's end only after DDP has waited on that future
    for run in ready_runs.values():
        for r in run.ranks:
            st = r.steps[-1]
            assert all(b.launch_ns <= b.done_ns <= st.backward.end_ns for b in st.buckets)


def test_loopback_ceiling_is_measured():
    from ddplab.doctor import loopback_bandwidth_bytes_per_s

    # 1 MB/s is a floor a thousand times below what loopback TCP pushes (GB/s): only a broken measurement,
    # never a busy machine, lands under it
    assert loopback_bandwidth_bytes_per_s(total_bytes=8 * 2**20, tries=1) > 1e6
