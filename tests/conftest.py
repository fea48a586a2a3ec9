"""Shared fixtures: the checkpoint key (set before any worker starts), and the healthy runs of the one shared launch (`tests/support`)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from ddplab import recipes
from tests.support import RUN2, launch_shared_once, reachable, share


_KEY = pytest.StashKey[tuple]()


def pytest_configure(config):
    """The tests, their ranks and the notebooks' kernels seal checkpoints with a key of this pytest run,
    never the account's (`ddplab/seal.py`; `seal` makes it on first use, atomically). Set here, in the one
    process or in xdist's controller before any worker starts, so every worker, rank and kernel inherits
    the same key: a worker may resume a checkpoint another worker's launch sealed."""
    if hasattr(config, "workerinput"):
        return
    folder = tempfile.mkdtemp(prefix="ddplab-test-key-")
    config.stash[_KEY] = (folder, os.environ.get("DDPLAB_KEY_FILE"))
    os.environ["DDPLAB_KEY_FILE"] = os.path.join(folder, "checkpoint.key")


def pytest_unconfigure(config):
    folder, old = config.stash.get(_KEY, (None, None))
    if folder is None:
        return
    if old is None:
        os.environ.pop("DDPLAB_KEY_FILE", None)
    else:
        os.environ["DDPLAB_KEY_FILE"] = old
    shutil.rmtree(folder, ignore_errors=True)


def meeting(request, tmp_path_factory):
    """A folder every pytest-xdist worker of this pytest run sees (the parent of the workers' own base
    folders, new for each run), or this session's base folder without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if hasattr(request.config, "workerinput") else base


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="session")
def shared_runs(runs_dir, request, tmp_path_factory):
    """key -> the Runs of its experiments, from ONE launch of every experiment a selected test can reach
    (`tests/support`: `share`, `launch_shared_once`; with pytest-xdist, one launch for all workers)."""
    return launch_shared_once(reachable(request.session.items, __name__), runs_dir, meeting(request, tmp_path_factory))


share("run2", lambda: [RUN2])
share("run4", lambda: [recipes.first_launch()])
# chapter 09's experiments as the tests size them: tensor parallelism and the 2 x 2 mesh with 2 timing
# rounds, FSDP2 memory, ZeRO stages 0/1/3, the pipeline at m = 1, 2, 4 with 2 rounds on a smaller model
share("chapter09_runs", lambda: (recipes.tensor_parallel_runs(rounds=2) + [recipes.fsdp_configs()]
                                 + recipes.zero_stages_measured()
                                 + recipes.pipeline_parallel(microbatches=(1, 2, 4), rounds=2, global_batch=16,
                                                             d_model=64, seq_len=32)))


@pytest.fixture(scope="session")
def run2(shared_runs):
    """A real 2-rank gloo run: 2 steps of the transformer, with the reference probe."""
    return shared_runs["run2"][0]


@pytest.fixture(scope="session")
def run4(shared_runs):
    """A real 4-rank gloo run: notebook 00's experiment (global batch 64)."""
    return shared_runs["run4"][0]


@pytest.fixture(scope="session")
def chapter09_runs(shared_runs):
    """Chapter 09's experiments (registered above), name -> Run."""
    return {r.spec.name: r for r in shared_runs["chapter09_runs"]}
