"""Adding a task is one module and one registration (tests/support/toy_task.py): it is launched, loaded as its
own record, diagnosed by its own phases when it hangs, and its settings are validated."""

from __future__ import annotations

import pytest

import ddplab
from ddplab import Experiment
from ddplab.launch.progress import describe
from tests.support import leftovers, share
from tests.support.toy_task import Toy, ToyRecord

share("toy", lambda: [Experiment(name="toy", task=Toy(), world_size=2)])   # the one shared launch


def test_a_task_from_another_module_round_trips_through_spec_json():
    exp = Experiment(name="toy", task=Toy(hang_rank=1), world_size=2)
    d = exp.to_dict()["task"]
    assert d == {"kind": "toy", "module": "tests.support.toy_task", "hang_rank": 1}
    assert Experiment.from_json(exp.to_json()) == exp


def test_a_task_validates_its_own_settings_and_refuses_fields_it_does_not_read():
    with pytest.raises(ValueError, match=r"Experiment\.task\.hang_rank"):
        Experiment(task=Toy(hang_rank=5), world_size=2)
    with pytest.raises(ValueError, match=r"Experiment\.optimizer: the toy task does not read it"):
        Experiment(task=Toy(), optimizer="adam")


@pytest.mark.slow
def test_the_toy_task_is_launched_and_loaded(shared_runs):
    run = shared_runs["toy"][0]   # launched beside the train task's experiments, in the same torchrun
    assert [type(r.result) for r in run.ranks] == [ToyRecord, ToyRecord]
    assert [r.result.rank_sum for r in run.ranks] == [3.0, 3.0]   # 1 + 2 on every rank
    assert run.ranks[1].envelope.task == "toy"


@pytest.mark.slow
def test_a_hung_toy_task_is_diagnosed_by_its_own_phases(runs_dir):
    exp = Experiment(name="toy-hang", task=Toy(hang_rank=1), world_size=2, timeout_s=3)
    with pytest.raises(ddplab.RunFailed) as err:
        ddplab.run(exp, runs_dir / "toy-hang", progress=False)
    d = err.value.diagnosis
    assert d.kind == "hang" and d.ranks == [1], str(d)
    assert "the toy's all_reduce ('toy all-reduce' of step 0)" in d.summary, d.summary
    assert "Rank 1 never arrived: its last phase was 'toy prepare' of step 0; it was outside any collective" in d.summary
    assert leftovers(runs_dir / "toy-hang") == []


def test_the_progress_line_counts_the_task_s_own_unit():
    assert describe("sweep", 2, [3, 2], 5, "round ddp:4", 1.0, "rounds") == \
        "ddplab sweep: 2 ranks, 2/5 rounds done, slowest rank in 'round ddp:4' (1.0 s)"
