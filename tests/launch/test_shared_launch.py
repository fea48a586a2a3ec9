"""The tests' one shared launch (`tests/support`): a broken experiment fails only the key it belongs to."""

from __future__ import annotations

import pytest

from ddplab import Experiment
from ddplab.spec import Fault
from tests.support import launch_shared


@pytest.mark.slow
def test_a_failing_experiment_fails_its_own_key_and_the_others_still_run(tmp_path):
    good = Experiment(name="good", world_size=2, local_batch=2, seq_len=4)
    broken = Experiment(name="broken", world_size=2, local_batch=2, seq_len=4, fault=Fault("crash", rank=1))
    shared = launch_shared({"fine": [good], "bad": [broken]}, tmp_path)
    assert [r.spec.name for r in shared["fine"]] == ["good"]
    assert set(shared.failed) == {"bad"} and shared.failed["bad"].diagnosis.ranks == [1]
    with pytest.raises(pytest.fail.Exception, match=r"'bad' failed in their own launch:\n.*[Rr]ank 1"):
        shared["bad"]
