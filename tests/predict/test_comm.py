"""Cost formulas and the alpha-beta fit (pure)."""

import pytest

from ddplab.predict import comm


def test_ring_all_reduce_bytes_per_rank():
    assert comm.ring_bytes_per_rank(1000, 2) == 1000
    assert comm.ring_bytes_per_rank(900, 3) == pytest.approx(1200)
    assert comm.ring_bytes_per_rank(1000, 4) == 1500


def test_bus_bandwidth_is_algorithm_bandwidth_times_the_ring_factor():
    assert comm.algbw(8e9, 2.0) == 4e9
    assert comm.busbw(8e9, 2.0, 8) == pytest.approx(4e9 * 14 / 8)
    assert comm.payload_bytes(1_000_000, 2) == 2_000_000  # bf16 gradients: 2 bytes per parameter


def test_fit_recovers_alpha_and_beta_from_exact_points():
    truth = comm.AlphaBeta(1e-3, 1 / 2e9)
    sizes = [2 ** k for k in range(12, 27)]
    model = comm.fit(sizes, [truth.predict(n) for n in sizes])
    assert model.alpha_s == pytest.approx(1e-3, rel=1e-9)
    assert model.bandwidth_bytes_per_s == pytest.approx(2e9, rel=1e-9)
    q = comm.quality(model, sizes, [truth.predict(n) for n in sizes])
    assert q.max_rel_error < 1e-9 and q.r2_log == pytest.approx(1.0)


def test_relative_error_exposes_a_misfit_that_linear_r2_hides():
    sizes = [2 ** k for k in range(12, 27)]
    times = [comm.AlphaBeta(5e-4, 1 / 2e9).predict(n) for n in sizes]
    times[0] *= 1.5   # one small message 50% slower: barely visible on a linear scale
    q = comm.quality(comm.fit(sizes, times), sizes, times)
    assert q.max_rel_error > 0.2


def test_floor_model_fits_a_flat_latency_floor():
    sizes = [2 ** k for k in range(12, 27)]
    times = [max(7e-3, 1.2e-3 + n / 0.7e9) for n in sizes]
    plain = comm.quality(comm.fit(sizes, times), sizes, times)
    floored = comm.fit_with_floor(sizes, times)
    assert floored.floor_s == pytest.approx(7e-3)
    assert comm.quality(floored, sizes, times).max_rel_error < 1e-6 < plain.max_rel_error


def test_fit_needs_two_sizes():
    with pytest.raises(ValueError, match="two or more"):
        comm.fit([1024, 1024], [1e-3, 1.1e-3])


def test_fit_never_returns_a_negative_start_up_cost():
    sizes = [2 ** k for k in range(12, 27)]
    times = [n * 1e-9 * 1.02 ** i for i, n in enumerate(sizes)]  # time per byte creeping up: alpha < 0 unconstrained
    model = comm.fit(sizes, times)
    assert model.alpha_s == 0 and model.beta_s_per_byte > 0


def test_zero1_in_torch_sends_one_and_a_half_times_ddps_bytes_at_any_world_size():
    from ddplab.predict.zero import zero1_step_bytes

    for d in (2, 3, 4, 8):
        got = zero1_step_bytes(1000, d)
        assert got["all_reduce"] == pytest.approx(2 * (d - 1) * 1000) and got["broadcast"] == (d - 1) * 1000
        assert got["over_ddp"] == pytest.approx(1.5)
    with pytest.raises(ValueError, match="^world_size"):
        zero1_step_bytes(1000, 0)


def _traffic(zero_step_mib, ddp_step_mib=0.0004, backward_mib=19.72):
    import pandas as pd
    return pd.DataFrame({"backward_mib": [backward_mib, backward_mib], "optimizer_step_mib": [ddp_step_mib, zero_step_mib],
                         "all_reduce_predicted_mib": [19.705, 19.705], "broadcast_predicted_mib": [0.0, 9.8525]},
                        index=pd.Index(["none", "zero1"], name="sharding"))


def test_the_zero1_traffic_check_fails_on_a_step_without_the_broadcast_or_a_changed_all_reduce():
    """Notebook 02's check on the bytes probe: a ZeRO-1 whose step sent nothing (the paper's accounting
    read as torch's), one that sent D x P instead of (D - 1) x P, a backward that shrank, or a DDP step
    that sent something, all fail."""
    from ddplab.tables.comm import verify_zero1_traffic
    from ddplab.verify import CheckFailed

    verify_zero1_traffic(_traffic(9.87))
    for wrong in (_traffic(0.0004), _traffic(9.87 * 4 / 3), _traffic(9.87, backward_mib=14.8), _traffic(9.87, ddp_step_mib=1.0)):
        with pytest.raises(CheckFailed):
            verify_zero1_traffic(wrong)


def test_the_busbw_ceiling_claim_refuses_a_run_of_one_rank():
    """One rank sends nothing: its bus bandwidth is 0 by the formula, never a measurement of a link."""
    from types import SimpleNamespace as NS

    from ddplab.tables import comm as comm_tables

    one = NS(spec=NS(task=NS(kind="allreduce-sweep"), name="one", probes=()), world_size=1,
             ranks=[NS(result=NS(sizes=[NS(bytes=4096, ms=[1.0, 1.1])]))])
    with pytest.raises(ValueError, match="at least 2 ranks"):
        comm_tables.judge_busbw_ceiling(one, 1e9)
