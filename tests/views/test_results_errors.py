"""Asking a run for what it did not record says what it lacks and how to get it."""

from __future__ import annotations

import json
import shutil

import pytest

import ddplab
from ddplab import recipes, tables
from tests.support import share

pytestmark = pytest.mark.slow

share("memory-one-step", lambda: [recipes.memory_ledger(2, steps=1, name="memory-one-step")])


@pytest.mark.parametrize("ask, says", [
    (lambda run: tables.gradients.gradient_check(run), r"has no gradients: run it with probes=\('gradients',\)"),
    (lambda run: tables.gradients.gradient_values(run), r"has no gradients"),
    (lambda run: tables.gradients.normalization([run]), r"has no gradients"),
    (lambda run: tables.memory.memory_table(run), r"has no memory ledger: run it with probes=\('memory',\)"),
    (lambda run: tables.global_batch.accumulation([run]), r"tables\.global_batch\.accumulation: run 't2' was run without the probe\(s\) buckets, "
                                             r"activations, gradients it shows: run it with probes="),
    (lambda run: tables.global_batch.scaling([run], "strong"), r"has 2 step\(s\), all of them warm-up"),
    (lambda run: tables.readiness.ready_order(run), r"run 't2' recorded no gradient readiness: run it with probes=\('readiness',\)"),
    (lambda run: tables.comm.allreduce_sweep(run), r"tables\.comm\.allreduce_sweep: `run` got 't2', a train run, and it reads "
                                              r"allreduce-sweep runs \(made by recipes\.allreduce_sweep\(\)\)"),
    (lambda run: tables.coverage.coverage_table(run),
     r"tables\.coverage\.coverage_table: `run` got 't2', a train run, and it reads data-coverage runs"),
    (lambda run: tables.pipeline.bubble({"a": run}), r"tables\.pipeline\.bubble: `runs` is a dict; pass a list of runs"),
    (lambda run: tables.memory.memory_sweep([]), r"tables\.memory\.memory_sweep: `runs` is empty"),
])
def test_a_table_of_something_the_run_did_not_record_says_how_to_record_it(run2, ask, says):
    with pytest.raises(ValueError, match=says):
        ask(run2)


def test_a_memory_table_of_a_one_step_run_says_which_step_to_ask_for(shared_runs):
    run = shared_runs["memory-one-step"][0]
    with pytest.raises(ValueError, match=r"has 1 step\(s\), so no step 1.*pass step=0"):
        tables.memory.memory_table(run)
    assert len(tables.memory.memory_table(run, step=0)) == 2


def test_a_truncated_spec_is_a_damaged_run_not_a_json_traceback(run2, tmp_path):
    copy = tmp_path / "damaged"
    shutil.copytree(run2.path, copy)
    spec = copy / "spec.json"
    spec.write_text(spec.read_text()[:40])
    with pytest.raises(ValueError, match=r"spec.json is not a valid spec .*damaged: run it again"):
        ddplab.load_run(copy)


@pytest.mark.parametrize("damage, says", [
    (lambda d: (d / "spec.json").write_text("[]"), r"a spec is a JSON object of Experiment fields \(got list\)"),
    (lambda d: (d / "spec.json").write_text("null"), r"a spec is a JSON object of Experiment fields \(got NoneType\)"),
    (lambda d: (d / "spec.json").write_text("[" * 100000 + "]" * 100000), r"nested too deeply"),
    (lambda d: ((d / "spec.json").unlink(), (d / "spec.json").mkdir()), r"spec\.json is not a file"),
    (lambda d: ((d / "rank1.json").unlink(), (d / "rank1.json").mkdir()), r"Rank 1's result file is not a file"),
    (lambda d: (d / "rank1.json").write_text("[" * 100000 + "]" * 100000), r"Rank 1's result file is nested too deeply"),
    (lambda d: (d / "launch.json").write_text("[1]"), r"launch\.json is not the launcher's record"),
    (lambda d: _edit_rank(d, 1, parameter_names=[]), r"Rank 1's result file names no parameter"),
])
def test_a_damaged_run_directory_is_a_clear_error_not_a_raw_one(run2, tmp_path, damage, says):
    copy = shutil.copytree(run2.path, tmp_path / "damaged")
    damage(copy)
    with pytest.raises((ValueError, ddplab.RunFailed), match=says):
        ddplab.load_run(copy)


def _edit_rank(d, rank, **fields):
    f = d / f"rank{rank}.json"
    record = json.loads(f.read_text())
    record["result"].update(fields)
    f.write_text(json.dumps(record))


def test_a_rank_file_from_another_launch_is_refused_without_launch_json(run2, tmp_path):
    copy = shutil.copytree(run2.path, tmp_path / "mixed")
    (copy / "launch.json").unlink()
    d = json.loads((copy / "rank1.json").read_text())
    d["envelope"]["launch_id"] = "another"
    (copy / "rank1.json").write_text(json.dumps(d))
    with pytest.raises(ddplab.RunFailed, match=r"Rank 1's result file comes from another launch than rank 0's"):
        ddplab.load_run(copy)
