"""Asking a run for what it did not record says what it lacks and how to get it (issue 11, item 9)."""

from __future__ import annotations

import shutil

import pytest

import ddplab
from ddplab import recipes, tables

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("ask, says", [
    (lambda run: tables.gradient_check(run), r"has no gradients: run it with probes=\('gradients',\)"),
    (lambda run: tables.gradient_values(run), r"has no gradients"),
    (lambda run: tables.normalization([run]), r"has no gradients"),
    (lambda run: tables.memory(run), r"has no memory ledger: run it with probes=\('memory',\)"),
    (lambda run: tables.accumulation([run]), r"counting all-reduces needs probes=\('buckets', \.\.\.\)"),
    (lambda run: tables.scaling([run], "strong"), r"has 2 step\(s\), all of them warm-up"),
])
def test_a_table_of_something_the_run_did_not_record_says_how_to_record_it(run2, ask, says):
    with pytest.raises(ValueError, match=says):
        ask(run2)


def test_a_memory_table_of_a_one_step_run_says_which_step_to_ask_for(runs_dir):
    run = ddplab.run(recipes.replicated_memory(2, steps=1, name="memory-one-step"), runs_dir / "one-step",
                     progress=False)
    with pytest.raises(ValueError, match=r"has 1 step\(s\), so no step 1.*pass step=0"):
        tables.memory(run)
    assert len(tables.memory(run, step=0)) == 2


def test_a_truncated_spec_is_a_damaged_run_not_a_json_traceback(run2, tmp_path):
    copy = tmp_path / "damaged"
    shutil.copytree(run2.path, copy)
    spec = copy / "spec.json"
    spec.write_text(spec.read_text()[:40])
    with pytest.raises(ValueError, match=r"spec.json is not a valid spec .*damaged: run it again"):
        ddplab.load_run(copy)
