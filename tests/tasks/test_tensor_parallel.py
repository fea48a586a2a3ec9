"""Notebook 09, tensor parallelism: the TensorParallel spec refuses bad settings before launch, naming
the field; Megatron's formulas hold for the lab's layers; the checks fail on wrong records; and real
2- and 4-rank gloo runs (one launch) show the split layer equal to the dense one, the collectives
equal to the formula, a mis-sharded attention caught, and a 2 x 2 dp x tp mesh training exactly as
the dense layer on the global batch."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import pytest

import ddplab
from ddplab import claims, recipes, verify
from ddplab.predict import tensor_parallel as formula
from ddplab.recipes.tensor_parallel import dp_tp_mesh, split_layers, tensor_parallel_runs
from ddplab.spec import Experiment, TensorParallel
from ddplab.record.tensor_parallel import Collective, LayerRecord, MeshLayerRecord, StepTimes, TensorParallelRecord
from ddplab.tables import tensor_parallel as views
from tests.support import launch_leftovers


# ---- the spec ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("task, exp, field", [
    (dict(layers=("conv",)), {}, "task.layers"),
    (dict(layers=()), {}, "task.layers"),
    (dict(layers=("mlp", "mlp")), {}, "task.layers"),
    (dict(dp=3), dict(world_size=4), "task.dp"),
    (dict(dp=4), dict(world_size=4, local_batch=4, steps=2), "task.dp"),       # tp = 1: nothing to split
    (dict(), dict(world_size=4, n_heads=2), "n_heads"),                         # 2 heads over 4 ranks
    (dict(), dict(d_model=48, n_heads=5), "n_heads"),                           # 5 does not divide 48
    (dict(layers=("mlp",)), dict(world_size=3, local_batch=6, d_model=4, n_heads=1), "d_model"),  # 16 over 3
    (dict(), dict(local_batch=(4, 4)), "local_batch"),
    (dict(), dict(local_batch=3), "local_batch"),                               # DDP beside splits it over 2
    (dict(), dict(steps=2), "steps"),                                           # dp = 1 checks single steps
    (dict(dp=2), dict(world_size=4, bucket_cap_mb=1.0), "bucket_cap_mb"),
    (dict(dp=2, rounds=3), dict(world_size=4), "task.rounds"),                  # the mesh is not timed
    (dict(rounds=0), {}, "task.rounds"),
    (dict(steps_per_round=1000), {}, "task.steps_per_round"),
])
def test_bad_tensor_parallel_settings_are_refused_naming_the_field(task, exp, field):
    with pytest.raises(ValueError, match=f"Experiment.{field}:"):
        Experiment(**{"world_size": 2, "local_batch": 8, **exp}, task=TensorParallel(**task))


def test_an_mlp_alone_needs_only_its_hidden_features_to_split():
    # d_model = 6 does not divide over 4 ranks, but the MLP splits 4 x 6 = 24 hidden features
    Experiment(world_size=4, local_batch=8, d_model=6, n_heads=1, task=TensorParallel(layers=("mlp",)))
    with pytest.raises(ValueError, match="Experiment.n_heads:"):
        Experiment(world_size=4, local_batch=8, d_model=6, n_heads=1, task=TensorParallel(layers=("mlp", "attention")))


def test_a_field_the_tensor_parallel_task_does_not_read_is_refused():
    with pytest.raises(ValueError, match="Experiment.momentum: the tensor-parallel task does not read it"):
        Experiment(world_size=2, momentum=0.5, task=TensorParallel())


def test_tensor_parallel_spec_round_trips_through_json():
    for exp in (split_layers(world_size=4), dp_tp_mesh()):
        again = Experiment.from_json(exp.to_json())
        assert again == exp and again.hash == exp.hash
    assert dp_tp_mesh().task.tp_degree(dp_tp_mesh()) == 2 and dp_tp_mesh().task.total_steps(dp_tp_mesh()) == 3


def test_the_chapter_is_one_four_rank_launch():
    exps = tensor_parallel_runs()
    assert [e.world_size for e in exps] == [4, 4, 2] and exps[0].task.dp == 2
    assert "attention-qkv-split" in exps[2].task.layers and len({e.hash for e in exps}) == 3


def test_the_chapter_times_enough_paired_steps_to_judge_the_split_against_dense():
    timed = [e for e in recipes.beyond_ddp_runs() if e.task.kind == "tensor-parallel" and e.task.dp == 1]
    assert len(timed) == 2
    for e in timed:
        assert e.task.rounds * e.task.steps_per_round >= claims.min_rounds(), e.name


# ---- the formulas ------------------------------------------------------------------------------------
@pytest.mark.parametrize("layer", ["mlp", "attention", "block"])
def test_parameter_counts_are_the_lab_layers_own(layer):
    from ddplab.rank.parallel.tensor_parallel import build_layer

    module = build_layer(layer, 64, 4, 0)
    assert formula.params(layer, 64) == sum(p.numel() for p in module.parameters())
    assert formula.ddp_gradient_bytes(layer, 64) == 4 * formula.params(layer, 64)


def test_megatron_counts_one_all_reduce_per_sublayer_each_way():
    assert formula.all_reduces("mlp") == {"forward": 1, "backward": 1}
    assert formula.all_reduces("attention") == {"forward": 1, "backward": 1}
    assert formula.all_reduces("block") == {"forward": 2, "backward": 2}
    # a first layer fed plain data needs no input gradient; a block's LayerNorms still do
    assert formula.all_reduces("mlp", input_needs_grad=False) == {"forward": 1, "backward": 0}
    assert formula.all_reduces("block", input_needs_grad=False) == {"forward": 2, "backward": 2}
    with pytest.raises(ValueError, match="layer"):
        formula.all_reduces("conv")


def test_step_bytes_are_activations_on_a_ring_against_ddps_gradients():
    c = formula.step_comm("mlp", local_batch=8, seq_len=32, d_model=64, tp=4)
    assert c["tp_all_reduce_bytes"] == 8 * 32 * 64 * 4 and c["tp_step_bytes"] == 2 * 8 * 32 * 64 * 4
    assert c["tp_step_ring_bytes_per_rank"] == 2 * (2 * 3 / 4 * 8 * 32 * 64 * 4)
    assert c["ddp_all_reduce_bytes"] == 4 * (8 * 64 * 64 + 5 * 64)
    assert formula.local_params("mlp", 64, 2) == (8 * 64 * 64 + 4 * 64) // 2 + 64
    assert math.isclose(formula.predicted_all_reduce_ms(1e9, 2, 100e9), 10.0)   # 2(1)/2 x 1 GB at 100 GB/s
    with pytest.raises(ValueError):
        formula.predicted_all_reduce_ms(1e6, 1, 1e9)


# ---- the checks on hand-made records -----------------------------------------------------------------------
def _times(ms: float, comm: float = 0.0, n: int = 5 * 3) -> StepTimes:   # the recipe's rounds x steps_per_round
    return StepTimes([ms] * n, [ms] * n, [comm] * n, [comm] * n, [comm] * n, [0.0] * n)


def fake_run(forward_all_reduces: int = 1, output_error: float = 1e-7, bytes_: int = 8 * 32 * 64 * 4,
             tp_ms: float = 2.0, name: str = "tensor-parallel-2", output_scale: float = 1.0, rounds: int = 5):
    """A 2-rank run-shaped object of one split MLP layer (the real one's numbers), one thing changeable."""
    exp = split_layers(world_size=2, layers=("mlp",), rounds=rounds).replace(name=name)
    n = rounds * exp.task.steps_per_round
    group = [0, 1]
    collectives = [Collective("forward", "all_reduce", bytes_, group)] * forward_all_reduces + \
        [Collective("backward", "all_reduce", bytes_, group)]
    layer = LayerRecord("mlp", 33088, 16576, output_scale, output_error, 0.1, 1e-9, 0.1, {"0.weight": 1e-9},
                        {"Global": {"forward": {"all_reduce": forward_all_reduces}, "backward": {"all_reduce": 1}}},
                        collectives, [33088 * 4], _times(1.0, n=n), _times(tp_ms, 0.2, n), _times(1.5, 0.3, n))
    ranks = [SimpleNamespace(rank=r, result=TensorParallelRecord(2, 1, [group], group, [r], 2, [layer], []))
             for r in range(2)]
    return SimpleNamespace(spec=exp, ranks=ranks, world_size=2)


def test_verify_tp_collectives_fails_on_a_wrong_count_or_wrong_bytes(capsys):
    views.verify_tp_collectives(fake_run())
    assert "verified: each split layer's collectives are Megatron's formula" in capsys.readouterr().out
    with pytest.raises(verify.CheckFailed, match="mlp \\(tp=2\\): forward all-reduces 2 where 1 was due"):
        views.verify_tp_collectives(fake_run(forward_all_reduces=2))
    with pytest.raises(verify.CheckFailed, match="bytes per all-reduce 1024 where 65536 was due"):
        views.verify_tp_collectives(fake_run(bytes_=1024))


def test_verify_tp_matches_dense_fails_on_a_wrong_output():
    views.verify_tp_matches_dense(fake_run())
    with pytest.raises(verify.CheckFailed, match="mlp on tp=2 off by 0.5 of the dense scale"):
        views.verify_tp_matches_dense(fake_run(output_error=0.5))


def test_the_equality_tolerance_is_relative_to_the_dense_scale():
    # a bigger batch: the output 1000 x larger, its float32 rounding too; a correct split still passes
    views.verify_tp_matches_dense(fake_run(output_scale=1000.0, output_error=1e-4))
    # the same absolute error on an output of magnitude 1 is 1e-4 of it: too much
    with pytest.raises(verify.CheckFailed, match="off by 0.0001 of the dense scale"):
        views.verify_tp_matches_dense(fake_run(output_error=1e-4))
    assert math.isclose(views.equality(fake_run(output_scale=1000.0, output_error=1e-4)).iloc[0]["rel_error"], 1e-7)
    with pytest.raises(ValueError, match="none of the layers"):
        views.verify_tp_matches_dense(fake_run(), layers=("block",))


def test_timing_says_slower_or_faster_only_where_the_paired_steps_resolve_it():
    assert views.timing(fake_run(tp_ms=2.0)).loc[("tensor-parallel-2", "mlp", "tensor parallel"), "verdict"] \
        == "slower than dense"
    assert views.timing(fake_run(tp_ms=0.25)).loc[("tensor-parallel-2", "mlp", "tensor parallel"), "verdict"] \
        == "faster than dense"
    same = fake_run(tp_ms=1.0)
    assert views.timing(same).loc[("tensor-parallel-2", "mlp", "tensor parallel"), "verdict"] \
        == "not told apart from dense"


def test_sentences_and_the_gpu_prediction_are_read_from_the_run():
    run = fake_run(tp_ms=2.0)
    (sentence,) = views.timing_sentences(run)
    assert sentence.startswith("tensor-parallel-2, mlp: the split step took 4.00 ms")
    assert "slower than dense" in sentence
    gpu = views.gpu_prediction(run, busbw_gb_s=100.0, latency_us=0.0).loc[("tensor-parallel-2", "mlp")]
    assert math.isclose(gpu["predicted_tp_critical_path_us"], 2 * 65536 / 100e9 * 1e6)   # 2 all-reduces, 2(p-1)/p = 1
    assert gpu["what"].startswith("model at 100 GB/s")


def test_buckets_in_flight_together_count_once():
    from ddplab.rank.tasks.tensor_parallel import _union_ns

    assert _union_ns([(0, 10), (5, 12), (20, 25)]) == 17 and _union_ns([(0, 10), (2, 3)]) == 10
    assert _union_ns([]) == 0


def test_ddps_all_reduce_splits_into_during_backward_and_the_exposed_tail():
    from ddplab.rank.tasks.tensor_parallel import ddp_comm_split

    ms = 1_000_000
    # bucket 1 launched at 0 ms, done at 4; bucket 2 (the last gradient ready) at 6, done at 9;
    # backward returned at 9: 7 ms in flight, 4 of them before the last launch, a 3 ms tail
    assert ddp_comm_split([(0, 4 * ms), (6 * ms, 9 * ms)], 9 * ms) == (7.0, 4.0, 3.0)
    # bucket 1 still running when the last launches: only the part before the launch counts
    assert ddp_comm_split([(0, 8 * ms), (6 * ms, 9 * ms)], 9 * ms) == (9.0, 6.0, 3.0)
    # one bucket: it launches when the last gradient is ready, nothing is in flight during backward
    assert ddp_comm_split([(2 * ms, 5 * ms)], 5 * ms) == (3.0, 0.0, 3.0)


def test_timing_takes_the_median_of_round_medians():
    run = fake_run()
    t = run.ranks[0].result.layers[0].tp
    # round 0 is disturbed (every step 10x slower): the pooled median would not notice one round
    # in five either, but the spread comes from the rounds' medians
    slow = [10.0] * 3 + [1.0] * 12
    layer = run.ranks[0].result.layers[0]
    import dataclasses
    layer = dataclasses.replace(layer, tp=dataclasses.replace(t, forward_ms=slow, backward_ms=[0.0] * 15))
    for r in run.ranks:
        r.result = dataclasses.replace(r.result, layers=[layer])
    row = views.timing(run).loc[("tensor-parallel-2", "mlp", "tensor parallel")]
    assert row["step_ms"] == 1.0 and row["step_ms_max"] == 10.0 and row["rounds"] == 5
    assert row["step_ms_spread"] == 0.0   # 4 of 5 rounds agree: one bad round does not inflate it


def _mesh_run(error: float = 1e-8, moved: float = 0.01, scale: float = 0.5):
    """A 4-rank 2 x 2 mesh run-shaped object of one MLP layer, its parameter error changeable."""
    exp = dp_tp_mesh(layers=("mlp",))
    layer = MeshLayerRecord("mlp", [], [1.0, 0.9, 0.8], [1.0, 0.9, 0.8], scale, {"0.weight": error}, moved)
    ranks = [SimpleNamespace(rank=r, result=TensorParallelRecord(2, 2, [[0, 1], [2, 3]], [r // 2 * 2, r // 2 * 2 + 1],
                                                                 [r % 2, r % 2 + 2], 2, [], [layer]))
             for r in range(4)]
    return SimpleNamespace(spec=exp, ranks=ranks, world_size=4)


def test_verify_mesh_matches_dense_fails_on_a_skipped_or_summed_average(capsys):
    views.verify_mesh_matches_dense(_mesh_run())
    assert "verified: 2 x 2 mesh" in capsys.readouterr().out
    # without the dp average each dp group steps on its own half: off by about the update itself;
    # summing instead of averaging doubles the gradient: off by the update again
    with pytest.raises(verify.CheckFailed, match="= the dense layer trained on the global batch"):
        views.verify_mesh_matches_dense(_mesh_run(error=0.01))
    # steps that hardly moved the parameters cannot tell a wrong average: refused, not verified
    with pytest.raises(verify.CheckFailed, match="training moved every layer's parameters"):
        views.verify_mesh_matches_dense(_mesh_run(moved=1e-6))


def test_step_time_figure_has_a_panel_per_run_titled_from_the_data():
    import matplotlib

    matplotlib.use("Agg")
    from ddplab.plots.tensor_parallel import step_times

    fig = step_times([fake_run(tp_ms=2.0), fake_run(tp_ms=1.0, name="tied")], detached=True)
    titles = [ax.get_title("left") for ax in fig.axes]
    assert titles == ["tensor-parallel-2 (2 ranks): the split step slower than dense in 1 of 1 layers",
                      "tied (2 ranks): the split step not told apart from dense in 1 of 1 layers"]


def test_a_split_step_timed_over_too_few_steps_is_not_judged_against_dense():
    # 3 rounds of 3 steps, the split always twice the dense: under claims.min_rounds the sign test judges nothing
    few, enough = fake_run(rounds=3), fake_run(rounds=4)
    assert 3 * 3 < claims.min_rounds() <= 4 * 3
    assert views.timing(few).loc[("tensor-parallel-2", "mlp", "tensor parallel"), "verdict"] == views.TOO_FEW
    assert "not judged against dense (9 paired steps, under the 10 a verdict needs)" in views.timing_sentences(few)[0]
    assert "slower than dense over 12 paired steps" in views.timing_sentences(enough)[0]


# ---- real runs: one 4-rank launch (the mesh, tp = 4, tp = 2) ---------------------------------------------
@pytest.fixture(scope="module")
def tp_runs(chapter09_runs):
    """The chapter's three experiments, with 2 timing rounds (launched with the rest of chapter 09,
    conftest's `chapter09_runs`): name -> Run."""
    return {e.name: chapter09_runs[e.name] for e in tensor_parallel_runs(rounds=2)}


CORRECT = ("mlp", "attention", "block")


@pytest.mark.slow
def test_split_layers_equal_the_dense_layer_on_2_and_4_ranks(tp_runs):
    runs = [tp_runs["tensor-parallel-4"], tp_runs["tensor-parallel-2"]]
    views.verify_tp_matches_dense(runs, layers=CORRECT)
    table = views.equality(runs)
    for run in runs:
        tp = run.world_size
        for layer in CORRECT:
            assert table.loc[(run.spec.name, layer), "local_params"] == [formula.local_params(layer, 64, tp)] * tp


@pytest.mark.slow
def test_a_contiguous_split_of_a_qkv_ordered_weight_is_caught_by_the_equality_check(tp_runs):
    run = tp_runs["tensor-parallel-2"]
    assert views.equality(run).loc[(run.spec.name, "attention-qkv-split"), "output_error"] > 0.1
    with pytest.raises(verify.CheckFailed, match="attention-qkv-split on tp=2 off by"):
        views.verify_tp_matches_dense(run)
    # its collectives are the same as a correct split's: counting cannot tell, only the dense layer can
    views.verify_tp_collectives(run)


@pytest.mark.slow
def test_collectives_per_forward_and_backward_are_megatrons_on_2_and_4_ranks(tp_runs):
    runs = [tp_runs["tensor-parallel-4"], tp_runs["tensor-parallel-2"]]
    views.verify_tp_collectives(runs)
    for run in runs:
        e = run.spec
        for r in run.ranks:
            for layer in r.result.layers:
                due = formula.all_reduces(layer.layer)
                phases = ["forward"] * due["forward"] + ["backward"] * due["backward"]
                assert [c.phase for c in layer.collectives] == phases
                assert {c.bytes for c in layer.collectives} == {formula.activation_bytes(e.local_batch, e.seq_len, 64)}
                assert all(c.group == list(range(run.world_size)) for c in layer.collectives)
                assert sum(layer.ddp_bucket_bytes) == formula.ddp_gradient_bytes(layer.layer, 64)


@pytest.mark.slow
def test_commdebugmode_puts_the_forward_all_reduce_in_the_row_parallel_linear_and_the_backward_in_the_column(tp_runs):
    table = views.module_counts(tp_runs["tensor-parallel-2"], "mlp")
    assert table["same_on_every_rank"].all()
    assert table.loc["Sequential.2", "forward"] == {"all_reduce": 1} and table.loc["Sequential.2", "backward"] == {}
    assert table.loc["Sequential.0", "forward"] == {} and table.loc["Sequential.0", "backward"] == {"all_reduce": 1}


@pytest.mark.slow
def test_the_timing_table_has_every_way_for_every_layer(tp_runs):
    table = views.timing([tp_runs["tensor-parallel-4"], tp_runs["tensor-parallel-2"]])
    assert len(table) == 3 * (3 + 4)
    assert (table["step_ms_min"] <= table["step_ms"]).all() and (table["step_ms"] <= table["step_ms_max"]).all()
    tp_rows = table.xs("tensor parallel", level="way")
    assert tp_rows["verdict"].notna().all()
    for run in (tp_runs["tensor-parallel-4"], tp_runs["tensor-parallel-2"]):
        steps = run.spec.task.rounds * run.spec.task.steps_per_round
        for r in run.ranks:
            for layer in r.result.layers:   # every traced step saw its forward all-reduce block the rank
                assert len(layer.tp.comm_forward_ms) == steps and min(layer.tp.comm_forward_ms) > 0


@pytest.mark.slow
def test_ddps_all_reduce_is_in_flight_during_backward_only_with_more_than_one_bucket(tp_runs):
    ddp = views.timing(tp_runs["tensor-parallel-2"]).xs("ddp", level="way")
    # the recipe's bucket cap puts the block's gradients in several buckets, attention's in one
    assert ddp.loc[("tensor-parallel-2", "block"), "buckets"] > 1
    assert ddp.loc[("tensor-parallel-2", "attention"), "buckets"] == 1
    assert (ddp["comm_during_backward_ms"] <= ddp["comm_ms_max"]).all()


@pytest.mark.slow
def test_the_2x2_mesh_trains_like_the_dense_layer_on_the_global_batch(tp_runs):
    run = tp_runs["dp2-tp2-mesh"]
    views.verify_mesh_matches_dense(run)
    groups = views.mesh_groups(run)
    assert [groups.loc[(r, "tp"), "ranks"] for r in range(4)] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [groups.loc[(r, "dp"), "ranks"] for r in range(4)] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    e = run.spec
    for r in run.ranks:
        for m in r.result.mesh_layers:
            tp_ops = [c for c in m.collectives if c.group == r.result.tp_group]
            due = formula.all_reduces(m.layer, input_needs_grad=False)   # the mesh's input is plain data
            assert [c.phase for c in tp_ops] == ["forward"] * due["forward"] + ["backward"] * due["backward"]
            sync = [c for c in m.collectives if c.phase == "gradient sync"]
            assert len(sync) == 1 and sync[0].group == r.result.dp_group
            assert sync[0].bytes == 4 * formula.local_params(m.layer, e.d_model, 2)
    # the real record, as if the dp average had been skipped (each dp group stepping on its half of
    # the batch leaves the parameters off by about half of what the steps moved them): caught
    import dataclasses
    off = [SimpleNamespace(rank=r.rank, result=dataclasses.replace(r.result, mesh_layers=[
        dataclasses.replace(m, param_max_abs_error={k: m.update_max_abs / 2 for k in m.param_max_abs_error})
        for m in r.result.mesh_layers])) for r in run.ranks]
    with pytest.raises(verify.CheckFailed, match="= the dense layer trained on the global batch"):
        views.verify_mesh_matches_dense(SimpleNamespace(spec=run.spec, ranks=off, world_size=run.world_size))


@pytest.mark.slow
def test_a_mesh_runs_inside_a_wider_launch_and_after_another_mesh(runs_dir):
    # the 2 x 2 mesh on ranks 0-3 of a 6-rank launch (ranks 4, 5 skip it), then a 3 x 2 mesh on all
    # six: its dp groups join ranks that made the first mesh's groups and ranks that did not
    t0 = time.perf_counter()
    small, wide = ddplab.run_many([dp_tp_mesh(layers=("mlp",)), dp_tp_mesh(dp=3, tp=2, layers=("mlp",))],
                                  runs_dir / "tensor-parallel-wider", progress=False)
    print(f"two meshes in one 6-rank launch: {time.perf_counter() - t0:.1f} s")
    views.verify_mesh_matches_dense(small)
    views.verify_mesh_matches_dense(wide)
    groups = views.mesh_groups(wide)
    assert [groups.loc[(r, "tp"), "ranks"] for r in range(6)] == [[0, 1], [0, 1], [2, 3], [2, 3], [4, 5], [4, 5]]
    assert [groups.loc[(r, "dp"), "ranks"] for r in range(6)] == [[0, 2, 4], [1, 3, 5]] * 3
    assert small.world_size == 4 and not launch_leftovers(small)


@pytest.mark.slow
def test_a_session_runs_the_mesh_in_every_job(tmp_path):
    # the session's ranks build the mesh in the first job and keep it: torch takes a second mesh of the
    # same layout for the first (DTensor's plans are cached by mesh), so destroying the first job's groups
    # and building new ones fails the second job (could not resolve the process group)
    exp = dp_tp_mesh(layers=("mlp",))
    with ddplab.Session(world_size=4, runs_dir=tmp_path / "runs") as s:
        first = ddplab.run(exp, tmp_path / "first", progress=False)
        second = ddplab.run(exp, tmp_path / "second", progress=False)
        assert s.jobs == 2 and s.alive()
    for run in (first, second):
        assert run.launch["session"] == s.dir.name
        views.verify_mesh_matches_dense(run)
    assert [r.result.mesh_layers[0].losses for r in first.ranks] == [r.result.mesh_layers[0].losses for r in second.ranks]


@pytest.mark.slow
def test_the_tensor_parallel_launch_leaves_no_process_behind(tp_runs):
    for run in tp_runs.values():
        assert not launch_leftovers(run)
