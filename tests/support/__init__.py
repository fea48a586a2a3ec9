"""What the tests share, in one place: the one shared launch (`share`, read through conftest's
`shared_runs`), and the process checks (`leftovers`, `ctrl_c_reaches_it`). `toy_task` (a task declared
outside ddplab) and `user_models` (model factories a spec names) are imported by the ranks too."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

import ddplab
from ddplab.launch.provoked import orphans

# ---- one launch for the healthy runs every selected test needs ------------------------------------
# A cold launch costs seconds of its own (torchrun's agent and its `import torch`, the ranks, the process group), so
# the test modules whose runs only need to succeed and be read register their experiments here at import
# (collection); the first test that needs any of them launches all of them at once (the widest first, so
# no rank idles in a collective while a narrower experiment runs). Runs that time things, fail on purpose
# or test the launcher itself keep launches of their own. Only the keys a selected test can reach are
# launched: a module's own keys when one of its tests was selected, a key named like a fixture when a
# selected test uses that fixture. If the shared launch fails, every key is launched on its own, so a
# broken experiment fails only the tests that read it, with its own diagnosis.
_SHARED: dict[str, tuple[str, object]] = {}

# the `run2` fixture's experiment (conftest): 2 steps of the transformer on 2 ranks, with the reference probe
RUN2 = ddplab.Experiment(name="t2", world_size=2, local_batch=4, seq_len=8, steps=2, probes=("reference",))


def share(key: str, make) -> None:
    """Register `make()` (a list of Experiments) under `key` for the session's shared launch."""
    _SHARED[key] = (sys._getframe(1).f_globals["__name__"], make)


class SharedRuns(dict):
    """key -> the Runs of its experiments, in order; a key whose launch failed raises its failure."""

    def __init__(self, runs: dict, failed: dict):
        super().__init__(runs)
        self.failed = failed

    def __getitem__(self, key):
        if key in self.failed:
            pytest.fail(f"the shared experiments {key!r} failed in their own launch:\n{self.failed[key]}",
                        pytrace=False)
        return super().__getitem__(key)


def reachable(items, conftest: str) -> dict[str, list]:
    """The registered keys some selected test can reach, each with its experiments."""
    modules = {getattr(getattr(i, "module", None), "__name__", None) for i in items}
    fixtures = {f for i in items for f in getattr(i, "fixturenames", ())}
    return {k: list(make()) for k, (module, make) in _SHARED.items()
            if (module in modules and module != conftest) or k in fixtures}


def launch_shared_once(groups: dict[str, list], out: Path, meeting: Path) -> SharedRuns:
    """`launch_shared`, once per pytest run however many pytest-xdist workers there are: every worker
    collects the same tests, so they all need the same keys; the first to get the lock in `meeting` (a
    folder every worker sees) launches them and writes where each key's run directories are, the others
    wait on the lock and load those directories. A key the index lacks is launched by the worker that
    needs it. Without xdist, `meeting` is this session's own folder and this is `launch_shared`."""
    import json

    from filelock import FileLock

    index = meeting / "shared-runs.json"
    with FileLock(str(meeting / "shared-runs.lock")):
        if not index.exists():
            shared = launch_shared(groups, out)
            partial = index.with_name(f".{index.name}.{os.getpid()}")
            partial.write_text(json.dumps({
                "runs": {k: [str(r.path) for r in runs] for k, runs in dict.items(shared)},
                "failed": {k: str(f) for k, f in shared.failed.items()}}))
            os.replace(partial, index)   # whole or absent, even if this worker dies writing it
            return shared
        written = json.loads(index.read_text())
    runs = {k: [ddplab.load_run(p) for p in paths] for k, paths in written["runs"].items() if k in groups}
    failed = {k: f for k, f in written["failed"].items() if k in groups}
    missing = {k: es for k, es in groups.items() if k not in runs and k not in failed}
    if missing:
        extra = launch_shared(missing, out)
        runs.update(dict.items(extra))
        failed.update(extra.failed)
    return SharedRuns(runs, failed)


def launch_shared(groups: dict[str, list], out: Path) -> SharedRuns:
    """ONE launch of every experiment of `groups` (an experiment registered twice runs once); if it
    fails, one launch per key, so each failure is reported by the keys it belongs to."""
    unique = sorted({e.hash: e for es in groups.values() for e in es}.values(), key=lambda e: -e.world_size)
    if not unique:
        return SharedRuns({k: [] for k in groups}, {})
    t0 = time.perf_counter()
    try:
        runs = dict(zip([e.hash for e in unique], ddplab.run_many(unique, out / "shared", progress=False)))
    except ddplab.RunFailed as e:
        said = f"shared launch failed ({e.diagnosis.kind}); launching each of {len(groups)} keys on its own"
        print(said)
        import warnings

        warnings.warn(f"{said}: {str(e.diagnosis)[:2000]}")   # in the run's warnings summary: it costs minutes
        done, failed = {}, {}
        for key, es in groups.items():
            try:
                done[key] = ddplab.run_many(es, out / f"shared-{key}", progress=False)
            except ddplab.RunFailed as own:
                failed[key] = own
        return SharedRuns(done, failed)
    print(f"shared launch: {len(unique)} experiments of {len(groups)} keys in {time.perf_counter() - t0:.1f} s")
    return SharedRuns({k: [runs[e.hash] for e in es] for k, es in groups.items()}, {})


def saved_tensors(run) -> list[dict]:
    """Every tensor each rank of `run` saved (its local and reduced gradients of each step), by a flat name:
    what two runs of one training compare bit for bit."""
    def flat(d, prefix=""):
        for k, v in d.items():
            yield from flat(v, f"{prefix}{k}/") if isinstance(v, dict) else [(prefix + str(k), v)]
    return [dict(flat(run.tensors(r))) for r in range(run.world_size)]


# ---- processes ------------------------------------------------------------------------------------------
def leftovers(run_dir) -> list[str]:
    """Command lines of any live process started for this run directory (or for a launch staged
    beside it, `rundir.staging_dir`): the orphan search after a provoked failure."""
    return orphans(Path(run_dir))


def launch_leftovers(run) -> list[str]:
    """`leftovers` of the launch `run` was part of: a launch of several experiments is staged beside its
    own folder (`launch.json`'s `launch_dir`), not beside each run's, so `leftovers(run.path)` would see
    none of its processes."""
    return leftovers(run.launch["launch_dir"])


def ctrl_c_reaches_it() -> None:
    """`preexec_fn` for a process a test sends Ctrl-C to: SIGINT back to its default in the child.
    A command started in the background by a non-interactive shell (`cmd &`, as a CI script may be)
    ignores SIGINT, every process it starts inherits that, and Python then never raises
    KeyboardInterrupt: the test would wait for an interrupt that cannot arrive."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
