"""After every synchronized step the replicas must agree; a run that silently did not synchronize is a
failure naming the cause, and probes cope with frozen parameters."""

from __future__ import annotations

import pytest

import ddplab
from ddplab import Experiment, tables

from tests.support import share

pytestmark = pytest.mark.slow

UNUSED_FOUND = Experiment(name="unused-found", model="tests.support.user_models:with_unused", world_size=2, steps=2,
                          find_unused_parameters=True, probes=("reference",))
FROZEN = Experiment(name="frozen", model="tests.support.user_models:with_frozen", world_size=2, steps=2,
                    probes=("gradients", "readiness", "memory", "bytes", "reference"))
share("replicas", lambda: [UNUSED_FOUND, FROZEN])   # healthy runs: the one shared launch (tests/support)


@pytest.fixture(scope="module")
def replicas(shared_runs):
    return dict(zip(("unused-found", "frozen"), shared_runs["replicas"]))


def test_an_unused_parameter_makes_an_unsynchronized_run_fail_naming_it(runs_dir):
    exp = Experiment(name="unused", model="tests.support.user_models:with_unused", world_size=2, steps=1,
                     probes=("reference",))
    with pytest.raises(ddplab.RunFailed) as err:
        ddplab.run(exp, runs_dir / "unused", progress=False)
    d = err.value.diagnosis
    assert d.kind == "diverged" and d.ranks == [0, 1], str(d)
    assert "unused.weight, unused.bias" in d.summary and "find_unused_parameters=True" in d.summary
    assert "after step 0" in d.summary


def test_find_unused_parameters_synchronizes_the_same_model(replicas):
    run = replicas["unused-found"]
    assert len({r.param_checksum.final for r in run.ranks}) == 1
    assert run.ranks[0].result.unused_parameters == ["unused.weight", "unused.bias"]
    assert all(r.reference.ddp.update_rel_error < 1e-5 for r in run.ranks)


def test_frozen_parameters_are_skipped_by_ddp_and_every_probe(replicas):
    run = replicas["frozen"]
    assert len({r.param_checksum.final for r in run.ranks}) == 1
    assert "emb.weight" not in [e.param for e in run.ranks[0].steps[-1].backward.ready]
    assert run.ranks[0].result.unused_parameters == []
    rows = tables.gradients.gradient_check(run)
    assert (rows["reduced_rel_error"] < 1e-5).all(), rows


def test_a_model_that_fails_to_build_is_reported_in_the_build_phase(runs_dir):
    exp = Experiment(name="build-fails", model="tests.support.user_models:raises_on_rank_1", world_size=2)
    with pytest.raises(ddplab.RunFailed) as err:
        ddplab.run(exp, runs_dir / "build-fails", progress=False)
    d = err.value.diagnosis
    assert d.kind == "crash" and d.ranks == [1], str(d)
    assert d.summary.startswith("Rank 1 failed in 'build': RuntimeError: this factory refuses to build on rank 1")
