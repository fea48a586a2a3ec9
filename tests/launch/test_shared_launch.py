"""The tests' one shared launch (`tests/support`): a broken experiment fails only the key it belongs to."""

from __future__ import annotations

import pytest

from ddplab import Experiment
from ddplab.spec import Fault
from tests.support import launch_leftovers, launch_shared


@pytest.mark.slow
def test_the_shared_launch_leaves_no_process_behind(shared_runs, run2):   # run2: at least one key is shared
    runs = [r for rs in dict.values(shared_runs) for r in rs]
    assert runs and not [p for r in runs for p in launch_leftovers(r)]


@pytest.mark.slow
def test_a_failing_experiment_fails_its_own_key_and_the_others_still_run(tmp_path):
    # small, so the 3 launches stay cheap: the healthy run on one rank for one step; the crash needs 2 ranks
    # for rank 1 to be the one blamed
    good = Experiment(name="good", world_size=1, steps=1, local_batch=2, seq_len=4)
    broken = Experiment(name="broken", world_size=2, steps=1, local_batch=2, seq_len=4, fault=Fault("crash", rank=1))
    shared = launch_shared({"fine": [good], "bad": [broken]}, tmp_path)
    assert [r.spec.name for r in shared["fine"]] == ["good"]
    assert set(shared.failed) == {"bad"} and shared.failed["bad"].diagnosis.ranks == [1]
    with pytest.raises(pytest.fail.Exception, match=r"'bad' failed in their own launch:\n.*[Rr]ank 1"):
        shared["bad"]


def test_xdist_workers_meet_at_one_launch_and_launch_only_what_the_index_lacks(tmp_path, monkeypatch):
    """`launch_shared_once`: the first worker launches and writes the index; a later one loads the run
    directories it names, keeps a key's recorded failure, and launches only a key the index lacks."""
    import json
    from types import SimpleNamespace

    import ddplab
    from tests import support

    launched = []

    def fake_launch(groups, out):
        launched.append(sorted(groups))
        return support.SharedRuns({k: [SimpleNamespace(path=out / k)] for k in groups if k != "bad"},
                                  {"bad": "rank 1 crashed"} if "bad" in groups else {})

    monkeypatch.setattr(support, "launch_shared", fake_launch)
    monkeypatch.setattr(ddplab, "load_run", lambda p: SimpleNamespace(path=p, loaded=True))
    e = Experiment(name="e", world_size=2)
    first = support.launch_shared_once({"a": [e], "bad": [e]}, tmp_path / "w0", tmp_path)
    assert launched == [["a", "bad"]] and not hasattr(first["a"][0], "loaded")
    assert json.loads((tmp_path / "shared-runs.json").read_text()) == {
        "runs": {"a": [str(tmp_path / "w0" / "a")]}, "failed": {"bad": "rank 1 crashed"}}
    second = support.launch_shared_once({"a": [e], "bad": [e], "new": [e]}, tmp_path / "w1", tmp_path)
    assert launched == [["a", "bad"], ["new"]]   # only the key the index lacks
    assert second["a"][0].loaded and second["a"][0].path == str(tmp_path / "w0" / "a")
    assert second["new"][0].path == tmp_path / "w1" / "new"
    with pytest.raises(pytest.fail.Exception, match="rank 1 crashed"):
        second["bad"]
