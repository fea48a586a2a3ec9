"""The emulated link: a link you can dial for DDP's all-reduce. Its cost formula and
spec are pure; the rank-side wire is tested on futures completed by hand (no launch); one real 2-rank
run shows every bucket held at least as long as the link needs, one transfer behind the other, with
the gradients exactly those of loopback."""

from __future__ import annotations

import time

import pytest
import torch

from ddplab.rank import link as wire
from ddplab.spec import LINKS, Experiment, Link
from ddplab.spec.link import describe
from tests.support import share


# ---- the cost -----------------------------------------------------------------------------------
def test_a_ring_all_reduce_pays_2_p_minus_1_hops_and_sends_2_p_minus_1_over_p_of_the_bytes():
    link = Link("t", latency_us=100, gbit_s=8)             # 1 GB/s
    assert link.wire_s(10 ** 6, 2) == pytest.approx(2 * 100e-6 + 1 * 1e-3)
    assert link.wire_s(10 ** 6, 4) == pytest.approx(6 * 100e-6 + 1.5 * 1e-3)
    assert link.wire_s(10 ** 6, 1) == 0.0
    alpha, beta = link.alpha_beta(4)
    assert alpha + 10 ** 6 * beta == pytest.approx(link.wire_s(10 ** 6, 4))


def test_a_link_round_trips_through_json_and_a_preset_is_named():
    exp = Experiment(probes=("buckets",), link="1GbE")
    assert exp.link == LINKS["1GbE"] and Experiment.from_json(exp.to_json()) == exp
    assert exp.hash != exp.replace(link=None).hash
    assert "1GbE" in describe(exp) and "loopback" in describe(exp.replace(link=None))


@pytest.mark.parametrize("changes, field", [
    ({"link": "9GbE", "probes": ("buckets",)}, "Experiment.link: must be one of"),
    ({"link": "1GbE"}, "Experiment.link: is held in the buckets probe"),
    ({"link": {"latency_us": -1}, "probes": ("buckets",)}, "Experiment.link.latency_us"),
    ({"link": {"gbit_s": 0}, "probes": ("buckets",)}, "Experiment.link.gbit_s"),
    ({"link": {"name": ""}, "probes": ("buckets",)}, "Experiment.link.name"),
    ({"link": {"speed": 1}}, "Experiment.link: must be Link"),
    ({"link": "1GbE", "probes": ("buckets",), "world_size": 1}, "Experiment.link: needs world_size >= 2"),
    ({"link": "1GbE", "sync": "none"}, "Experiment.link: holds DDP's bucket all-reduces"),
])
def test_a_bad_link_is_refused_naming_the_field(changes, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        Experiment(**changes)


def test_a_task_that_does_not_read_the_link_refuses_it():
    from ddplab.spec import AllReduceSweep
    with pytest.raises(ValueError, match="Experiment.link: the allreduce-sweep task does not read it"):
        Experiment(task=AllReduceSweep(), link="1GbE")


# ---- the wire, without a launch -------------------------------------------------------------------
def _done(value):
    f = torch.futures.Future()
    f.set_result(value)
    return f


def test_transfers_are_held_for_the_link_one_behind_the_other():
    link = Link("t", latency_us=0, gbit_s=8e-3 * 8)          # 8 MB/s: 80 KB take 10 ms on 2 ranks
    wire.activate(link, 2)
    try:
        t0 = time.perf_counter()
        held = [wire.hold(_done([torch.ones(1) * i]), 80_000) for i in range(3)]
        done = []
        for h in held:
            h.wait()
            done.append(time.perf_counter() - t0)
    finally:
        wire.deactivate()
    cost = link.wire_s(80_000, 2)
    assert cost == pytest.approx(0.010)
    # sleep never returns early and the wire carries one at a time: the k-th transfer ends at least k costs
    # after they were all handed over (a bound on each, not on gaps, which a late waiter could shrink)
    assert all(t >= (k + 1) * cost * 0.999 for k, t in enumerate(done))
    assert [h.value()[0].item() for h in held] == [0.0, 1.0, 2.0]


def test_without_a_link_the_future_is_handed_back_as_it_is_and_an_error_reaches_the_waiter():
    f = _done([torch.zeros(1)])
    assert wire.hold(f, 10) is f
    wire.activate(Link("t", latency_us=0, gbit_s=1), 2)
    try:
        failed = torch.futures.Future()
        failed.set_exception(RuntimeError("peer gone"))
        with pytest.raises(RuntimeError, match="peer gone"):
            wire.hold(failed, 10).wait()
    finally:
        wire.deactivate()


# ---- a real run ----------------------------------------------------------------------------------
LINK = Link("test", latency_us=500, gbit_s=0.5)
LOOPBACK = Experiment(name="link-loopback", world_size=2, steps=3, probes=("buckets", "gradients"), bucket_cap_mb=0.1)
share("link", lambda: [LOOPBACK, LOOPBACK.replace(name="link-held", link=LINK)])   # the one shared launch


@pytest.mark.slow
def test_a_run_on_a_link_holds_every_bucket_for_the_link_and_reduces_the_same_gradients(shared_runs):
    link = LINK
    loop, held = shared_runs["link"]
    for rank in held.ranks:
        for step in rank.steps[1:]:
            buckets = sorted(step.buckets, key=lambda b: b.done_ns)
            assert len(buckets) > 1
            first = min(b.launch_ns for b in buckets)
            on_wire = 0.0
            for b in buckets:   # held at least its cost after its launch, and behind every bucket done before it
                on_wire += link.wire_s(b.bytes, 2) * 1e9
                assert b.done_ns - b.launch_ns >= link.wire_s(b.bytes, 2) * 1e9 * 0.999
                assert b.done_ns - first >= on_wire * 0.999
    assert [s.param_checksum for s in held.ranks[0].steps] == [s.param_checksum for s in loop.ranks[0].steps]
    assert held.spec.link == link


def test_a_failure_inside_the_wire_reaches_its_waiter_and_later_transfers_still_go():
    wire.activate(Link("t", latency_us=0, gbit_s=1), 2)
    try:
        pending = torch.futures.Future()       # the real collective, not finished yet: the wire waits on it
        held = wire.hold(pending, 10)
        held.set_result([torch.ones(1)])       # someone completed it first: set_result raises on the wire
        pending.set_result([torch.zeros(1)])
        later = wire.hold(_done([torch.ones(1) * 2]), 10)
        assert later.wait()[0].item() == 2.0   # the wire lived on
    finally:
        wire.deactivate()


def test_a_link_is_refused_for_cuda_before_anything_starts():
    with pytest.raises(ValueError, match="Experiment.link: is emulated for gloo"):
        Experiment(probes=("buckets",), link="1GbE", backend="nccl")
    with pytest.raises(ValueError, match="Experiment.link: the emulated link holds gloo"):
        wire.activate(LINKS["1GbE"], 2, torch.device("meta"))
    wire.deactivate()


def test_a_figure_of_timings_names_the_link_its_runs_used():
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd
    from types import SimpleNamespace

    from ddplab.plots import canvas
    from ddplab.plots.stragglers import delay_response

    on_link = SimpleNamespace(spec=Experiment(name="x", world_size=2, probes=("buckets",), link="1GbE"))
    plain = SimpleNamespace(spec=Experiment(name="y", world_size=2))
    table = pd.DataFrame({"measured_delay_ms": [10.0, 20.0], "step_added_ms": [9.0, 21.0], "extra_wait_ms": [8.0, 19.0]})
    texts = lambda fig: [t.get_text() for t in fig.texts]  # noqa: E731
    assert texts(delay_response(table, link=[on_link, on_link])) == [f"link: {LINKS['1GbE'].describe()}"]
    assert texts(delay_response(table, link=plain)) == ["link: loopback (gloo), no emulated link"]
    assert canvas.link_of({"a": on_link, "b": plain}) == f"{LINKS['1GbE'].describe()}; loopback (gloo), no emulated link"
    assert texts(delay_response(table)) == []
