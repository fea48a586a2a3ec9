"""The four common errors (notebook 08, seed claim C18): each right claim holds on real runs of
`recipes.common_error_runs()`, all in one launch, and its check or verdict fails for a wrong input: weak
runs fed as strong scaling, a prediction divided by the world size, one bucket launched after backward,
a chain-shaped model whose gradients are ready in reverse source order, or a recorded order rewritten to
the source order. No timing is judged: the step times of separate runs are shown, not judged, and the
summed durations beside the exposed tail are printed as arithmetic (the tests check what is printed).
The fast tests check the recipe and the tables' logic on hand-built runs.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pandas as pd
import pytest

import ddplab
from ddplab import verify
from tests.support import share
from ddplab.recipes.common_errors import PREFIX, common_error_groups, common_error_runs
# the four side by side; each error's own table and check live with its concept
from ddplab.tables.common_errors import error_runs, error_table
from ddplab.tables.global_batch import fixed_global_batch_setup, weak_as_strong
from ddplab.tables.memory import divided_state, replicated_state_bytes, verify_replicated_state
from ddplab.tables.readiness import (overlap_sentence, source_as_ready_order, summed_as_exposed,
                                     verify_ready_not_source_order)

GROUPS = common_error_groups()
# wrong inputs the lab can configure: the overlap model with every gradient in one bucket (launched
# only after the last gradient is ready), and the MLP (a chain: ready in exactly reverse source order)
ONE_BUCKET = GROUPS["overlap"][0].replace(name="wrong-overlap-one-bucket", bucket_cap_mb=64)
CHAIN = GROUPS["ready"][0].replace(name="wrong-ready-mlp", model="mlp")


share("common-errors", lambda: [*common_error_runs(), ONE_BUCKET, CHAIN])   # the one shared launch (tests/support)


@pytest.fixture(scope="module")
def launch(shared_runs):
    by_name = {r.spec.name: r for r in shared_runs["common-errors"]}
    wrong = {n: by_name.pop(n) for n in (ONE_BUCKET.name, CHAIN.name)}
    return SimpleNamespace(runs=list(by_name.values()), groups=error_runs(by_name), wrong=wrong)


# ---- 1. strong scaling claimed after growing the global batch -------------------------------------
@pytest.mark.slow
def test_strong_runs_keep_the_global_batch_and_weak_runs_grow_it(launch, capsys):
    g = launch.groups
    fixed_global_batch_setup(g["strong"], g["weak"])
    out = capsys.readouterr().out
    assert "the setup: strong scaling keeps the global batch at 32 on 1, 2, 4 ranks" in out
    assert "verified" not in out   # set by the specs: printed as a fact, not checked
    assert "(the fewest over a run's steps): 32 on 1 rank, 32 on 2 ranks, 32 on 4 ranks" in out
    table = weak_as_strong(g["weak"], g["strong"])
    assert table.index.tolist() == [1, 2, 4]
    assert table["weak_global_batch"].tolist() == [8, 16, 32] and table["strong_global_batch"].tolist() == [32] * 3
    assert (table["strong_step_ms_min"] <= table["strong_step_ms"]).all()
    assert (table["strong_step_ms"] <= table["strong_step_ms_max"]).all()
    assert (table["speedup_low"] <= table["speedup"]).all() and (table["speedup"] <= table["speedup_high"]).all()
    assert "verdict" not in table.columns   # separate runs: shown, not judged


@pytest.mark.slow
def test_weak_runs_fed_as_strong_scaling_fail_the_fixed_global_batch_check(launch):
    g = launch.groups
    with pytest.raises(ValueError, match="^strong_runs: strong scaling needs one global batch"):
        fixed_global_batch_setup(g["weak"], g["weak"])


@pytest.mark.slow
def test_strong_runs_fed_as_weak_scaling_fail_the_check(launch):
    g = launch.groups
    with pytest.raises(ValueError, match="^weak_runs: weak scaling grows the global batch"):
        fixed_global_batch_setup(g["strong"], g["strong"])


# ---- 2. model-state memory divided by the data-parallel degree -------------------------------------
@pytest.mark.slow
def test_model_state_per_rank_is_the_same_at_2_and_4_ranks_and_predicted_to_the_byte(launch):
    table = divided_state(launch.groups["memory"])
    verify_replicated_state(table)
    assert table.index.tolist() == [(2, 0), (2, 1), (4, 0), (4, 1), (4, 2), (4, 3)]
    assert table["model_state_bytes"].nunique() == 1
    assert table["measured_over_divided"].tolist() == [2.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    acts = table.groupby(level="world_size")["activation_bytes"].max()
    assert acts[4] < acts[2]   # at a fixed global batch the activations do shrink


@pytest.mark.slow
def test_a_prediction_divided_by_the_world_size_fails_the_memory_check(launch):
    def divided(run, rank):
        return replicated_state_bytes(run, rank) / run.world_size

    table = divided_state(launch.groups["memory"], predicted=divided)
    with pytest.raises(verify.CheckFailed, match="the prediction gives every rank's model state exactly"):
        verify_replicated_state(table)


# ---- 3. summed all-reduce durations read as exposed overhead ---------------------------------------
@pytest.mark.slow
def test_summed_all_reduce_durations_and_the_exposed_tail_are_printed_per_step(launch):
    table = summed_as_exposed(*launch.groups["overlap"])
    n = len(table.attrs["summed_ms"])
    assert n == len(table.attrs["tail_ms"]) == launch.groups["overlap"][0].spec.steps - 4   # after the warm-up
    said = overlap_sentence(table)
    assert f"per step, median of {n}: the tail rank's bucket durations sum to " in said
    assert "shown, not judged" in said
    assert table.attrs["buckets"] > 1 and table.attrs["launched_during_backward"] >= 1
    # per step the tail (last done - last ready) lies inside the span (last done - first launch)
    assert table.loc["exposed tail", "ms"] <= table.loc["communication span", "ms"]


@pytest.mark.slow
def test_one_bucket_launched_after_backward_is_not_shown_as_the_error(launch):
    ddp, alone = launch.groups["overlap"]
    table = summed_as_exposed(launch.wrong[ONE_BUCKET.name], alone)
    assert table.attrs["buckets"] == 1 and table.attrs["launched_during_backward"] == 0
    # nothing overlapped: per step the sum (launch to done) is at most the tail (last ready to done)
    n = len(table.attrs["summed_ms"])
    assert f"the sum is the larger in 0 of {n} steps" in overlap_sentence(table)
    # the same run in the overlap group's place: the summary's verdict follows it
    one = launch.wrong[ONE_BUCKET.name]
    as_ddp = dataclasses.replace(one, spec=one.spec.replace(name=ddp.spec.name))
    runs = [as_ddp if r.spec.name == ddp.spec.name else r for r in launch.runs]
    verdict = error_table(runs).loc["summed all-reduce", "verdict"]
    assert verdict.startswith("not shown: no bucket launched during backward"), verdict


# ---- 4. source order assumed to be ready order -----------------------------------------------------
@pytest.mark.slow
def test_branchy_ready_order_is_neither_source_nor_reverse_source_order(launch):
    run = launch.groups["ready"][0]
    table = source_as_ready_order(run)
    verify_ready_not_source_order(table)
    assert table.loc["head.weight", "source_position"] == 0 and table.loc["head.weight", "ready_position"] <= 1
    # deterministic: every rank and every step records the same order
    orders = {tuple(e.param for e in st.backward.ready) for r in run.ranks for st in r.steps}
    assert len(orders) == 1


@pytest.mark.slow
def test_a_chain_model_ready_in_reverse_source_order_fails_the_order_check(launch):
    table = source_as_ready_order(launch.wrong[CHAIN.name])
    assert table["at_reverse_source_position"].all()
    with pytest.raises(verify.CheckFailed, match="nor the reverse source order"):
        verify_ready_not_source_order(table)


@pytest.mark.slow
def test_a_recorded_order_rewritten_to_source_order_fails_the_order_check(launch):
    run = launch.groups["ready"][0]
    r0 = run.ranks[0]
    st = r0.steps[-1]
    at = {e.param: e.t_ns for e in st.backward.ready}
    times = sorted(at.values())
    rewritten = [dataclasses.replace(e, param=name, t_ns=t) for e, name, t in
                 zip(st.backward.ready, r0.parameter_names, times)]
    step = dataclasses.replace(st, backward=dataclasses.replace(st.backward, ready=rewritten))
    result = dataclasses.replace(r0.result, steps=[*r0.result.steps[:-1], step])
    fake = dataclasses.replace(run, ranks=[dataclasses.replace(r0, result=result), *run.ranks[1:]])
    with pytest.raises(verify.CheckFailed, match="the ready order is not the source order"):
        verify_ready_not_source_order(source_as_ready_order(fake))


# ---- the four, side by side ------------------------------------------------------------------------
@pytest.mark.slow
def test_summary_has_one_row_per_error_and_verdicts_computed_from_the_runs(launch):
    table = error_table(launch.runs)
    for error, row in table.iterrows():
        print(f"{error}: {row['says']} => {row['verdict']}")
    assert table.index.tolist() == ["global batch", "replicated memory", "summed all-reduce", "ready order"]
    # none of them rests on timing: each is wrong on any machine
    assert table["verdict"].str.startswith("wrong: ").all(), table["verdict"].tolist()
    assert not table["verdict"].str.contains("faster|slower|cannot resolve").any()
    assert "shown, not judged" in table.loc["global batch", "says"]
    assert table.loc["summed all-reduce", "verdict"].startswith("wrong: the sum is not the step's cost")
    assert "notebook 05 (section 6)" in table.loc["summed all-reduce", "verdict"]


@pytest.mark.slow
def test_summary_verdict_follows_the_runs_not_fixed_text(launch):
    # strong runs renamed into the weak group: the global batch no longer grows, so the error is not shown
    g = launch.groups
    as_weak = [dataclasses.replace(r, spec=r.spec.replace(name=r.spec.name.replace("strong", "weak")))
               for r in g["strong"]]
    weak = {r.spec.name for r in g["weak"]}
    others = [r for r in launch.runs if r.spec.name not in weak]
    verdict = error_table([*as_weak, *others]).loc["global batch", "verdict"]
    assert verdict.startswith("not shown: "), verdict


# ---- fast: the recipe and the tables' logic --------------------------------------------------------
def test_recipe_is_one_list_whose_groups_say_what_each_error_needs():
    exps = common_error_runs()
    assert len({e.name for e in exps}) == len(exps) and all(e.name.startswith(PREFIX) for e in exps)
    assert {e.hash for e in exps} and len({e.hash for e in exps}) == len(exps)
    g = common_error_groups()
    assert [e.global_batch for e in g["strong"]] == [32, 32, 32]
    assert [e.global_batch for e in g["weak"]] == [8, 16, 32]
    assert [e.world_size for e in g["memory"]] == [2, 4] and len({e.global_batch for e in g["memory"]}) == 1
    ddp, alone = g["overlap"]
    assert (ddp.sync, alone.sync) == ("ddp", "none") and "readiness" in ddp.probes
    assert ddp.replace(name=alone.name, sync="none", bucket_cap_mb=None, probes=()) == alone
    assert g["ready"][0].model == "branchy"
    assert len(exps) == sum(len(v) for v in g.values())


def test_recipe_refuses_a_global_batch_that_does_not_split():
    with pytest.raises(ValueError, match="does not split evenly over 4 ranks"):
        common_error_runs(global_batch=30)


def test_error_runs_refuses_an_unknown_group_and_leaves_other_recipes_runs_out():
    foreign = SimpleNamespace(spec=ddplab.Experiment(name="errors-nonsense"))
    with pytest.raises(ValueError, match="not one of recipes.common_error_runs"):
        error_runs([foreign])
    with pytest.raises(ValueError, match="no runs of group"):   # a run of another recipe is not counted
        error_runs([SimpleNamespace(spec=ddplab.Experiment(name="ready-plain"))])


def _scaling_run(exp, step_ms):
    """A stand-in for a finished run: step times and, per step, the sample ids every rank consumed."""
    ids = range(exp.global_batch)
    steps = [SimpleNamespace(sample_ids=list(ids[r::exp.world_size])) for r in range(exp.world_size)]
    ranks = [SimpleNamespace(steps=[steps[r]] * exp.steps) for r in range(exp.world_size)]
    return SimpleNamespace(spec=exp, world_size=exp.world_size, ranks=ranks,
                           step_ms=lambda warmup=0: list(step_ms)[warmup:])


def test_fixed_batch_speedups_and_ranges_are_shown_without_a_verdict(capsys):
    g = common_error_groups(steps=5)
    weak = [_scaling_run(e, [9, 9, 4, 5, 6]) for e in g["weak"]]
    # 1 rank 10-12 ms; 2 ranks 6-8 ms; 4 ranks 9-13 ms
    strong = [_scaling_run(e, t) for e, t in zip(g["strong"], ([99, 99, 10, 11, 12], [99, 99, 6, 7, 8],
                                                                [99, 99, 9, 11, 13]))]
    table = weak_as_strong(weak, strong)
    assert "verdict" not in table.columns
    assert table.loc[2, "speedup"] == pytest.approx(11 / 7, abs=1e-3)
    assert table.loc[2, "claimed_speedup"] == pytest.approx(2.0, abs=1e-3)   # twice the examples, same time
    assert (table.loc[2, "speedup_low"], table.loc[2, "speedup_high"]) == pytest.approx((10 / 8, 12 / 6), abs=1e-3)
    fixed_global_batch_setup(strong, weak)
    assert "32 on 1 rank, 32 on 2 ranks, 32 on 4 ranks" in capsys.readouterr().out
    with pytest.raises(ValueError):
        fixed_global_batch_setup(weak, weak)
    # the counts are printed from what the ranks read, not from the spec: 4 ranks that all read the first
    # rank's ids consumed 8 distinct examples a step
    repeats = _scaling_run(g["strong"][-1], [9] * 5)
    for r in repeats.ranks:
        r.steps = repeats.ranks[0].steps
    fixed_global_batch_setup([*strong[:-1], repeats], weak)
    assert "32 on 1 rank, 32 on 2 ranks, 8 on 4 ranks" in capsys.readouterr().out


def _state_table(measured, predicted, divided_by):
    index = pd.MultiIndex.from_tuples([(2, 0), (2, 1), (4, 0)], names=["world_size", "rank"])
    return pd.DataFrame({"model_state_bytes": measured, "predicted_bytes": predicted,
                         "measured_over_divided": [m / (p / d) for m, p, d in zip(measured, predicted, divided_by)]},
                        index=index)


def test_replicated_state_check_fails_for_unequal_ranks_or_a_divided_prediction():
    verify_replicated_state(_state_table([100] * 3, [100] * 3, [2, 2, 4]))
    with pytest.raises(verify.CheckFailed, match="the same on every rank"):   # e.g. ZeRO-1's sharded state
        verify_replicated_state(_state_table([100, 60, 100], [100] * 3, [2, 2, 4]))
    with pytest.raises(verify.CheckFailed, match="exactly"):
        verify_replicated_state(_state_table([100] * 3, [50, 50, 25], [2, 2, 4]))


def _overlap_table(summed_ms, tail_ms):
    rows = {"summed all-reduce durations": 14.0, "communication span": 9.0, "exposed tail": 1.0,
            "summed minus exposed tail": 13.0, "step over compute-only run's step": 5.0}
    table = pd.DataFrame([{"quantity": q, "ms": m, "spread_ms": 1.0} for q, m in rows.items()]).set_index("quantity")
    table.attrs.update(summed_ms=list(summed_ms), tail_ms=list(tail_ms))
    return table


def test_order_check_fails_for_source_order_and_for_its_reverse():
    names = ["a", "b", "c"]

    def table(ready):
        n = len(names)
        return pd.DataFrame({"source_position": range(n), "ready_position": ready,
                             "at_source_position": [r == i for i, r in enumerate(ready)],
                             "at_reverse_source_position": [r == n - 1 - i for i, r in enumerate(ready)]},
                            index=pd.Index(names, name="parameter"))

    verify_ready_not_source_order(table([1, 0, 2]))
    with pytest.raises(verify.CheckFailed, match="not the source order"):
        verify_ready_not_source_order(table([0, 1, 2]))
    with pytest.raises(verify.CheckFailed, match="reverse source order"):
        verify_ready_not_source_order(table([2, 1, 0]))


def test_the_overlap_sentence_prints_the_arithmetic_and_leaves_the_unpaired_step_unjudged():
    said = overlap_sentence(_overlap_table([14.0, 12.0, 3.0, 16.0], [1.0, 2.0, 4.0, 1.5]))
    assert "per step, median of 4: the tail rank's bucket durations sum to 13.0 ms, the exposed tail is 1.8 ms" in said
    assert "the sum is the larger in 3 of 4 steps" in said
    assert "+5.0 ms over the compute-only run's step" in said and "shown, not judged" in said
    for verdict in ("exceeds", "falls short", "cannot", "holds", "faster", "slower"):
        assert verdict not in said
