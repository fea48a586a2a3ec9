"""Measured memory per rank against the analytic model, from real 2- and 4-rank runs."""

from __future__ import annotations

import pytest

from ddplab import Experiment, recipes, tables
from ddplab import predict
from ddplab.predict.memory import CATEGORIES, PHASES
from tests.support import share

pytestmark = pytest.mark.slow

MODEL_STATE = ("parameters", "gradients", "ddp_buckets", "optimizer_state")


def _memory_exps():
    sweeps = recipes.memory_sweeps()
    return [recipes.memory_ledger(2), recipes.memory_ledger(4, 4), *sweeps["optimizer"][:2],
            *sweeps["bucket_view"], *recipes.sharding_preview()]


share("memory", _memory_exps)
share("frozen-mem", lambda: [Experiment(name="frozen-mem", world_size=2, steps=2, local_batch=4, seq_len=8,
                                        optimizer="adam", model="tests.support.user_models:with_frozen",
                                        probes=("memory",)),
                             Experiment(name="branchy-mem", world_size=2, steps=2, local_batch=4, seq_len=8,
                                        model="branchy", probes=("memory",))])


@pytest.fixture(scope="module")
def memory_runs(shared_runs):
    return {r.spec.name: r for r in shared_runs["memory"]}


def model_state_mismatches(run, predict=predict.memory.predict) -> list[tuple]:
    """(rank, step, phase, category, measured, predicted) wherever the run's ledger and `predict` differ."""
    out = []
    for r in run.ranks:
        for step, measured in enumerate(r.memory.steps):
            predicted = predict(run.spec, r.rank, step)
            for phase in PHASES:
                for c in MODEL_STATE:
                    if measured.phases[phase][c] != predicted[phase][c]:
                        out.append((r.rank, step, phase, c, measured.phases[phase][c], predicted[phase][c]))
    return out


def test_measured_model_state_equals_the_prediction_exactly_on_every_rank(memory_runs):
    for name, run in memory_runs.items():
        if run.spec.sharding != "fsdp2":   # plain DDP and ZeRO-1
            assert model_state_mismatches(run) == [], name


def test_zero1_optimizer_state_of_every_rank_is_predicted_to_the_byte(memory_runs):
    """Each rank keeps the state of the whole tensors torch's partition gives it: the shares differ
    by rank (not an even split) and add up to the unsharded state."""
    run = memory_runs["sharding-zero1"]
    measured = [r.memory.steps[1].phases["step"]["optimizer_state"] for r in run.ranks]
    predicted = [predict.memory.state_bytes(run.spec, rank=r.rank)["optimizer_state"] for r in run.ranks]
    whole = predict.memory.state_bytes(run.spec.replace(sharding="none"))["optimizer_state"]
    print(f"ZeRO-1 optimizer state per rank, bytes: measured {measured}, predicted {predicted}, "
          f"unsharded {whole}")
    assert measured == predicted
    assert sum(measured) == whole and len(set(measured)) > 1
    table = tables.memory.memory_moments(run)   # the notebook's table shows the same prediction
    for c in MODEL_STATE:
        assert (table[(c, "measured")] == table[(c, "predicted")]).all(), (c, table[c])


def _even_split(exp, numels=None, trainable=None, rank=0, _state_bytes=predict.memory.state_bytes):
    whole = _state_bytes(exp.replace(sharding="none"), numels, trainable)
    return {**whole, "optimizer_state": whole["optimizer_state"] // exp.world_size}


def _in_turn(numels, world_size):
    return [i % world_size for i in range(len(numels))]


def _unsorted_greedy(numels, world_size):
    loads, owners = [0] * world_size, []
    for n in numels:   # the least-loaded rank, but in definition order instead of largest first
        owners.append(loads.index(min(loads)))
        loads[owners[-1]] += n
    return owners


@pytest.mark.parametrize("wrong", ["even split", "in turn", "unsorted greedy"])
def test_a_wrong_partition_rule_fails_the_zero1_comparison(memory_runs, monkeypatch, wrong):
    if wrong == "even split":
        monkeypatch.setattr(predict.memory, "state_bytes", _even_split)
    else:
        monkeypatch.setattr(predict.memory, "zero1_owners", {"in turn": _in_turn, "unsorted greedy": _unsorted_greedy}[wrong])
    bad = model_state_mismatches(memory_runs["sharding-zero1"])
    assert bad and {m[3] for m in bad} == {"optimizer_state"}, bad


def test_measured_activations_are_within_10_percent_of_the_prediction(memory_runs):
    for run in memory_runs.values():
        if run.spec.sharding == "fsdp2":
            continue
        for r in run.ranks:
            got = r.memory.steps[1].phases["forward"]["activations"]
            assert got == pytest.approx(predict.memory.activation_bytes(run.spec, r.rank), rel=0.10)


def test_adding_ranks_does_not_divide_model_state(memory_runs):
    table = tables.memory.memory_sweep([memory_runs["memory-w2-adam"], memory_runs["memory-w4-adam"]])
    assert table["model_state"].nunique() == 1
    assert table["activations"].iloc[1] == pytest.approx(table["activations"].iloc[0] / 2, rel=0.05)


def test_peak_is_at_least_the_largest_phase(memory_runs):
    """The tracked peak covers every sampled moment (FSDP2's peak is that by construction: the
    tracker misses some of its all-gather buffers, rank/probes/memory.py)."""
    for run in memory_runs.values():
        if run.spec.sharding == "fsdp2":
            continue
        st = run.ranks[0].memory.steps[1]
        assert st.peak >= max(sum(p[c] for c in CATEGORIES) for p in st.phases.values())


def test_sharding_divides_what_it_shards_and_checkpoint_over_world_size_underestimates_the_peak(memory_runs):
    table = tables.memory.sharding([memory_runs[f"sharding-{s}"] for s in ("none", "zero1", "fsdp2")])
    ddp, zero, fsdp = table.loc["none"], table.loc["zero1"], table.loc["fsdp2"]
    assert zero["parameters"] == ddp["parameters"] and zero["optimizer_state"] < ddp["optimizer_state"] / 2
    assert fsdp["parameters"] == pytest.approx(ddp["parameters"] / 4, rel=0.02)
    assert fsdp["ddp_buckets"] == 0 and fsdp["optimizer_state"] == pytest.approx(ddp["optimizer_state"] / 4, rel=0.02)
    assert (table["peak_over_estimate"] > 1).all()


def test_a_memory_only_run_records_no_fields_of_the_probes_it_needs(memory_runs):
    run = memory_runs["memory-w2-adam"]
    assert run.spec.probes == ("memory",)
    for r in run.ranks:
        assert all(st.buckets is None and st.activation_bytes is None and st.backward is None for st in r.steps)
        assert r.memory is not None


def test_each_moment_row_is_memory_held_together_and_predicted_exactly(memory_runs):
    from ddplab.tables.memory import memory_moments

    for name in ("memory-w2-adam", "memory-w2-bucket-view"):
        table = memory_moments(memory_runs[name])
        assert len(table) == 2 * 3   # every rank at each of the three moments
        measured = table.xs("measured", axis=1, level=1)
        assert (measured[list(CATEGORIES)].sum(axis=1) - measured["total"]).abs().max() < 2e-3   # MiB, rounded
        for c in MODEL_STATE:
            assert (table[(c, "measured")] == table[(c, "predicted")]).all(), (name, c)
    views = memory_moments(memory_runs["memory-w2-bucket-view"]).xs(0)
    assert views.loc["after forward", ("ddp_buckets", "measured")] > 0
    assert views.loc["after backward", ("ddp_buckets", "measured")] == 0   # the gradients live in the buckets


def test_the_memory_figures_draw_each_moment_as_measured(memory_runs):
    import matplotlib

    matplotlib.use("Agg")
    from ddplab import plots
    from ddplab.tables.memory import moments_sweep

    run = memory_runs["memory-w2-adam"]
    ax = plots.memory.memory_figure(run).axes[0]
    assert ax.get_ylim()[1] > run.ranks[0].memory.steps[1].peak / 2 ** 20   # the peak line is in view
    runs = [memory_runs["memory-w2-adam"], memory_runs["memory-w2-bucket-view"]]
    ax = plots.memory.memory_sweep(runs, "bucket views").axes[0]
    n = len(CATEGORIES)
    tops = [sum(p.get_height() for p in ax.patches[i:i + n]) for i in range(0, len(ax.patches), n)]
    assert tops == pytest.approx(moments_sweep(runs)["total"].tolist(), abs=3e-3)   # MiB, rounded


def test_the_memory_tables_work_for_a_users_model_with_frozen_parameters(shared_runs):
    """A user's model (not built in) gets its model-state prediction from the parameters the run
    recorded; a frozen parameter gets no gradient, bucket slot or optimizer state."""
    import math

    from ddplab.units import MIB

    run = shared_runs["frozen-mem"][0]
    exp = run.spec
    table = tables.memory.memory_moments(run)
    for c in ("parameters", "gradients", "ddp_buckets", "optimizer_state"):
        assert (table[(c, "measured")] == table[(c, "predicted")]).all(), (c, table[c])
    acts = table[("activations", "predicted")]
    assert acts.xs("after forward", level="moment").isna().all()   # only a built-in model's shapes tell
    assert (acts.xs("after backward", level="moment") == 0).all()   # backward freed what the forward saved
    assert table[("gradients", "measured")].max() < table[("parameters", "measured")].max()   # the frozen embedding
    # the prediction from the spec's shapes alone would count the frozen embedding: it must not match
    m = run.ranks[0].memory
    everything = predict.memory.state_bytes(exp, m.parameter_numels, [True] * len(m.trainable))
    after_step = table.loc[(0, "after optimizer step")]
    assert not math.isclose(everything["gradients"] / MIB, after_step[("gradients", "measured")], rel_tol=1e-3)
    assert not tables.memory.memory_table(run).empty


def test_a_built_in_models_prediction_comes_from_its_spec_not_from_the_ranks_own_counts(memory_runs):
    """The table's prediction for a built-in model ignores what the ranks recorded, so a rank that held
    the wrong parameters would show a gap rather than agree with itself."""
    import dataclasses

    from ddplab import tables

    run = next(r for r in memory_runs.values() if r.spec.sharding == "none")
    doubled = dataclasses.replace(run, ranks=[dataclasses.replace(r, result=dataclasses.replace(r.result, memory=dataclasses.replace(
        r.memory, parameter_numels=[2 * n for n in r.memory.parameter_numels]))) for r in run.ranks])
    assert tables.memory.memory_table(doubled).equals(tables.memory.memory_table(run))


def test_a_built_in_model_without_an_activation_model_gets_its_state_predicted_and_activations_measured(shared_runs):
    """branchy: its parameters come from its spec, and its activations, which no formula here covers, stay
    unpredicted (NaN) rather than failing the table."""
    run = shared_runs["frozen-mem"][1]
    table = tables.memory.memory_table(run)
    assert (table[("parameters", "measured")] == table[("parameters", "predicted")]).all()
    assert table[("activations", "predicted")].isna().all() and (table[("activations", "measured")] > 0).all()
