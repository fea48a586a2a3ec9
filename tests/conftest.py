"""Shared fixtures: real runs launched once per session, and a leftover-process check."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import ddplab
from ddplab import recipes
from ddplab.launch.failure_lab import orphans


def leftovers(run_dir) -> list[str]:
    """Command lines of any live process started for this run directory (or for a launch staged
    beside it, `rundir.staging_dir`): the failure lab's own orphan search."""
    return orphans(Path(run_dir))


@pytest.fixture(scope="session", autouse=True)
def checkpoint_key(tmp_path_factory):
    """The tests seal checkpoints with a key of their own, never the account's (`ddplab/seal.py`); every
    launch inherits it."""
    key = tmp_path_factory.mktemp("key") / "checkpoint.key"
    old, os.environ["DDPLAB_KEY_FILE"] = os.environ.get("DDPLAB_KEY_FILE"), str(key)
    yield key
    if old is None:
        os.environ.pop("DDPLAB_KEY_FILE", None)
    else:
        os.environ["DDPLAB_KEY_FILE"] = old


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


# ---- one launch for the healthy runs of every collected module ------------------------------------
# A cold launch costs seconds of its own (torchrun, `import torch` on every rank, the process group), so
# the test modules whose runs only need to succeed and be read register their experiments here at
# import (collection); the first test that needs any of them launches all of them at once, and each
# module gets its own back in order. Runs that time things, fail on purpose or test the launcher itself
# keep launches of their own. Only the keys some selected test can reach are launched: a module's own
# keys when one of its tests was selected, conftest's when a selected test uses the fixture of that name.
_SHARED: dict[str, tuple[str, object]] = {}


def share(key: str, make) -> None:
    """Register `make()` (a list of Experiments) under `key` for the session's shared launch."""
    import sys

    _SHARED[key] = (sys._getframe(1).f_globals["__name__"], make)


@pytest.fixture(scope="session")
def shared_runs(runs_dir, request):
    """key -> the Runs of its experiments, in order, from ONE launch of every experiment a selected test
    can reach (an experiment registered twice runs once; the widest first, so no rank idles in a
    collective while a narrower experiment runs)."""
    import time

    items = request.session.items
    modules = {getattr(getattr(i, "module", None), "__name__", None) for i in items}
    fixtures = {f for i in items for f in getattr(i, "fixturenames", ())}
    groups = {k: list(make()) for k, (module, make) in _SHARED.items()
              if (module in modules and module != __name__) or k in fixtures}
    unique = sorted({e.hash: e for es in groups.values() for e in es}.values(), key=lambda e: -e.world_size)
    t0 = time.perf_counter()
    runs = dict(zip([e.hash for e in unique], ddplab.run_many(unique, runs_dir / "shared", progress=False)))
    print(f"shared launch: {len(unique)} experiments of {len(groups)} modules in {time.perf_counter() - t0:.1f} s")
    return {k: [runs[e.hash] for e in es] for k, es in groups.items()}


share("run2", lambda: [ddplab.Experiment(name="t2", world_size=2, local_batch=4, seq_len=8, steps=2,
                                         probes=("reference",))])
share("run4", lambda: [recipes.first_launch()])


@pytest.fixture(scope="session")
def run2(shared_runs):
    """A real 2-rank gloo run: 2 steps of the transformer, with the reference probe."""
    return shared_runs["run2"][0]


@pytest.fixture(scope="session")
def run4(shared_runs):
    """A real 4-rank gloo run: notebook 00's experiment (global batch 64)."""
    return shared_runs["run4"][0]


@pytest.fixture(scope="session")
def chapter09_runs(runs_dir):
    """Chapter 09's experiments as the tests size them, in ONE 4-rank launch (a launch costs seconds of
    its own): tensor parallelism and the 2 x 2 mesh with 2 timing rounds, FSDP2 memory, ZeRO stages 0/1/3,
    the pipeline at m = 1, 2, 4 with 2 rounds on a smaller model. name -> Run."""
    import time

    exps = (recipes.tensor_parallel_runs(rounds=2) + [recipes.fsdp_configs()] + recipes.zero_stages_measured()
            + recipes.pipeline_parallel(microbatches=(1, 2, 4), rounds=2, global_batch=16, d_model=64, seq_len=32))
    t0 = time.perf_counter()
    runs = ddplab.run_many(exps, runs_dir / "chapter-09", progress=False)
    print(f"chapter 09: one 4-rank launch of {len(runs)} experiments in {time.perf_counter() - t0:.1f} s")
    return {r.spec.name: r for r in runs}


def ctrl_c_reaches_it() -> None:
    """`preexec_fn` for a process a test sends Ctrl-C to: SIGINT back to its default in the child.
    A command started in the background by a non-interactive shell (`cmd &`, as a CI script may be)
    ignores SIGINT, every process it starts inherits that, and Python then never raises
    KeyboardInterrupt: the test would wait for an interrupt that cannot arrive."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
