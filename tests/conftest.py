"""Shared fixtures: real runs launched once per session, and a leftover-process check."""

from __future__ import annotations

from pathlib import Path

import pytest

import ddplab
from ddplab import recipes
from ddplab.launch.failure_lab import orphans


def leftovers(run_dir) -> list[str]:
    """Command lines of any live process started for this run directory (or for a launch staged
    beside it, `rundir.staging_dir`): the failure lab's own orphan search."""
    return orphans(Path(run_dir))


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="session")
def run2(runs_dir):
    """A real 2-rank gloo run: 2 steps of the transformer, with the reference probe."""
    exp = ddplab.Experiment(name="t2", world_size=2, local_batch=4, seq_len=8, steps=2, probes=("reference",))
    return ddplab.run(exp, runs_dir / "t2", progress=False)


@pytest.fixture(scope="session")
def run4(runs_dir):
    """A real 4-rank gloo run: notebook 00's experiment (global batch 64)."""
    return ddplab.run(recipes.launch_and_ranks(), runs_dir / "t4", progress=False)


def ctrl_c_reaches_it() -> None:
    """`preexec_fn` for a process a test sends Ctrl-C to: SIGINT back to its default in the child.
    A command started in the background by a non-interactive shell (`cmd &`, as a CI script may be)
    ignores SIGINT, every process it starts inherits that, and Python then never raises
    KeyboardInterrupt: the test would wait for an interrupt that cannot arrive."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
