"""The cold launch: `run(exp)` starts real torchrun ranks for an Experiment, watches them, and loads
what they wrote; `run_many(exps)` runs several experiments in one launch.

A launch costs seconds, mostly starting processes that import torch, so a sweep should pay it once: torchrun
starts as many ranks as the largest experiment needs, and the ranks work through the list, each
experiment on ranks 0..world_size-1 of its own process group, each into its own run directory (the
command is in `launch/torchrun.py`).

Every run is bounded twice: each rank's process group times out a collective after `timeout_s`, and
the launcher stops a run whose ranks record no progress for `timeout_s + STALL_GRACE_S` (or that does
not start within `startup_timeout_s`; a compiling rank has compile's own bound). On timeout, error or
KeyboardInterrupt it kills the whole process tree under the keeper (`launch/keeper.py`), torchrun, every
rank and what they started, and turns the ranks' files into a diagnosis naming the rank (`failures.py`).
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import time
import uuid
from pathlib import Path

from .. import failures, rundir, seal
from ..rundir import default_runs_dir
from ..results import Run, load_run
from ..spec import Experiment
from . import reuse, session
from .keeper import REPORT, children_stopped, warn_left
from .nodes import Nodes
from .preflight import check_launch
from .progress import Reporter
from .torchrun import interrupts_caught, kill_tree, start, sweep_dead, worker_argv, worker_env
from .diagnosis import first_failure
from .watch import Watch, compile_limit_s

STARTUP_TIMEOUT_S = 120.0
POLL_S = 0.1


def run_dir_for(exp: Experiment, runs_dir: Path | None = None) -> Path:
    return Path(runs_dir or default_runs_dir()) / f"{exp.name}-{exp.hash}"


def run(exp: Experiment, out=None, *, progress=True, startup_timeout_s: float = STARTUP_TIMEOUT_S,
        warm: bool | None = None) -> Run:
    """Run `exp` on real torchrun ranks and return the loaded `Run`; raise `RunFailed` naming the rank.

    `out` is the run directory (default `runs/<name>-<hash>`, under $DDPLAB_RUNS if set). `progress`:
    True shows per-rank progress bars, False nothing, a callable gets each status line (a widget's label).
    `warm`: run on the current session if it fits, else True starts a session and keeps it, False
    launches cold, None (default) starts one in a Jupyter kernel only (`launch/session.py`)."""
    if not isinstance(exp, Experiment):
        raise TypeError(f"run() takes an Experiment, got {type(exp).__name__}")
    run_dir = Path(out) if out is not None else run_dir_for(exp)
    return _launch([exp], [run_dir], run_dir, exp.name, progress, startup_timeout_s, warm)[0]


def run_many(exps: list[Experiment], out=None, *, name: str = "sweep", progress=True,
             startup_timeout_s: float = STARTUP_TIMEOUT_S, warm: bool | None = None) -> list[Run]:
    """Run several experiments in ONE torchrun launch, in order; return their `Run`s.

    `out` is the launch directory (default `runs/<name>-<hash of all specs>`); each experiment gets
    the run directory `<out>/<exp.name>-<exp.hash>` inside it. The first failure raises `RunFailed`.
    Every process group of the launch uses the largest `timeout_s`; a rank outside a smaller experiment
    waits for it at a gate in the store, outside any collective (`rank/worker.py`), so it may take as long
    as it needs."""
    exps = list(exps)
    if not exps or not all(isinstance(e, Experiment) for e in exps):
        raise ValueError("experiments: give a non-empty list of Experiment objects")
    hashes = [e.hash for e in exps]
    for i, h in enumerate(hashes):
        if h in hashes[:i]:
            raise ValueError(f"experiments: experiment {i} is identical to experiment {hashes.index(h)}")
    launch_dir = Path(out) if out is not None else (
        default_runs_dir() / f"{name}-{hashlib.sha256(''.join(hashes).encode()).hexdigest()[:10]}")
    return _launch(exps, [run_dir_for(e, launch_dir) for e in exps], launch_dir, name, progress, startup_timeout_s,
                   warm)


@dataclasses.dataclass
class Launch:
    """One launch as each of its steps sees it: the experiments, where their files go while it runs
    (`launch_dir`, `run_dirs`: a staging directory of its own) and when it ends (`final_launch_dir`,
    `final_dirs`), where it runs, how it is shown, and where an unfinished launch's files went."""

    exps: list[Experiment]
    name: str
    final_dirs: list[Path]
    final_launch_dir: Path
    launch_id: str
    launch_dir: Path
    run_dirs: list[Path]
    backend: str
    device: str
    nodes: Nodes
    reporter: Reporter
    startup_timeout_s: float
    warm: bool | None
    placed: list[Path] = dataclasses.field(default_factory=list)
    settled: bool = False

    @property
    def world_size(self) -> int:
        return max(e.world_size for e in self.exps)


@dataclasses.dataclass
class Ran:
    """What starting a launch gave back: torchrun's process (a session's), whether the watchdog stopped
    it or Ctrl-C did, its wall time, and the session it ran on (None: cold)."""

    proc: object
    watchdog: bool
    interrupted: bool
    wall_s: float
    argv: list[str]
    warm: session.Session | None
    watch: Watch


def _launch(exps, final_dirs, final_launch_dir: Path, name: str, progress,
            startup_timeout_s: float, warm: bool | None = None) -> list[Run]:
    nodes = Nodes.from_env()
    with children_stopped("a user's model factory, built here"):   # what it starts in this process goes
        backend, device = check_launch(exps, nodes)
    compile_limit_s()   # a bad $DDPLAB_COMPILE_LIMIT_S is refused before anything starts
    _keeps_its_sources(exps, final_launch_dir)
    rundir.check_destination(final_launch_dir)
    sweep_dead(final_launch_dir.parent, ".*.partial")   # staging directories of launchers killed earlier
    # every launch writes into a directory of its own, and takes the final place when it ends
    launch_id = uuid.uuid4().hex[:12]
    launch_dir = rundir.staging_dir(final_launch_dir, launch_id)
    launch = Launch(exps, name, final_dirs, final_launch_dir, launch_id, launch_dir,
                    [launch_dir / d.relative_to(final_launch_dir) for d in final_dirs], backend, device, nodes,
                    Reporter(progress), startup_timeout_s, warm)
    try:
        return _launch_in(launch)
    except OSError as e:   # the run's own files failed it (deleted, read-only, disk full): no bare OSError
        if not _dir_lost(launch_dir, e):
            raise
        diagnosis = failures.run_dir_lost(launch_dir, e)
        launch.reporter.finish(f"ddplab {name}: FAILED ({diagnosis.kind})")
        raise failures.RunFailed(diagnosis, launch.placed[0] if launch.placed else None) from None


def _keeps_its_sources(exps, final_launch_dir: Path) -> None:
    """A launch replaces its directory when it ends: refuse one that would replace a run it resumes from.
    The checkpoint (sealed, fitting) and a saving run's key are checked again here: they may have changed
    since the Experiment was built, and a spec rebuilt by `load_run` skipped the checks."""
    out = final_launch_dir.resolve()
    for exp in exps:
        source = getattr(exp.task, "resume_from", None)
        if source:
            exp.task.check_checkpoint(exp)
        if getattr(exp.task, "save_at", None) is not None:
            seal.check_key()
        if source and (Path(source).resolve() == out or out in Path(source).resolve().parents):
            raise ValueError(f"out: {final_launch_dir} holds the saving run {source} that {exp.name} resumes "
                             f"from, and the launch replaces it when it ends, checkpoint included; write the "
                             f"resume somewhere else")


def _dir_lost(launch_dir: Path, error: OSError) -> bool:
    """Is `error` the launch directory failing (gone, unwritable, full), not some other OSError?"""
    if not launch_dir.exists() or str(error.filename or "").startswith(str(launch_dir)):
        return True
    try:
        rundir.check_writable(launch_dir)
    except OSError:
        return True
    return False


def _launch_in(launch: Launch) -> list[Run]:
    """The launch in three steps: stage its files, start its ranks (cold, or a session's job) and follow
    them to the end, then collect what they wrote (or the diagnosis); an unfinished launch's files are
    kept whatever happens."""
    try:
        spec_paths = _stage(launch)
        ran = _start(launch, spec_paths)
        runs = _collect(launch, ran, spec_paths)
    finally:
        if not launch.settled and launch.launch_dir.exists():   # an error of ours, or Ctrl-C outside the watch
            try:
                launch.placed.append(rundir.settle(launch.launch_dir, launch.final_launch_dir, complete=False))
            except OSError:
                pass
    diverged = [f"{r.spec.name}: {why}" for r in runs for why in [r.diverged()] if why]
    launch.reporter.finish(f"ddplab {launch.name}: {_what(launch.exps, launch.world_size)} on {launch.backend}/"
                           f"{launch.device} in {ran.wall_s:.1f} s -> {rundir.shown(launch.final_launch_dir)}"
                           + "".join(f"\n  warning: {d}" for d in diverged))
    return [dataclasses.replace(r, path=final, launch={**r.launch, "complete": True})   # the same files, settled
            for r, final in zip(runs, launch.final_dirs)]


def _stage(launch: Launch) -> list[Path]:
    """Write every experiment's spec.json into its run directory and claim the launch directory; the
    specs' paths, in order."""
    for run_dir, exp in zip(launch.run_dirs, launch.exps):
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / rundir.SPEC).write_text(exp.to_json())
    rundir.claim(launch.launch_dir)   # if this process is killed, a later launch may delete what it left
    return [(d / rundir.SPEC).resolve() for d in launch.run_dirs]


def _start(launch: Launch, spec_paths: list[Path]) -> Ran:
    """Run the experiments on a session's warm ranks if one is used (`reuse.for_launch`), else on a cold
    torchrun, and follow them until they end, stall or Ctrl-C stops them."""
    world_size, nodes, exps = launch.world_size, launch.nodes, launch.exps
    argv = worker_argv(world_size, spec_paths, nodes=nodes)
    starting = (f"ddplab {launch.name}: starting {nodes.describe(world_size)} "
                f"({exps[0].name if len(exps) == 1 else f'{len(exps)} experiments'}) on {launch.backend}/{launch.device}")
    t0 = time.monotonic()   # a session started for this launch counts in its wall time
    with session.LOCK:   # the session is this launch's until its job is done (clicks may come on other threads)
        warm = _session_for(exps, launch.backend, launch.device, launch.warm, launch.startup_timeout_s,
                            launch.reporter, launch.name)
        watch = Watch(list(zip(exps, launch.run_dirs)))
        if warm is not None:
            argv = warm.argv
            starting = starting.replace(f"starting {nodes.describe(world_size)}", f"{world_size} warm ranks")
            proc, watchdog, interrupted = warm.run_job(spec_paths, launch.launch_id, watch, launch.reporter, t0,
                                                       launch.startup_timeout_s, starting)
            (launch.launch_dir / rundir.LOG).write_text(warm.log_since_submit())
    if warm is None:
        with open(launch.launch_dir / rundir.LOG, "w") as log:
            env = {**worker_env(nodes=nodes, flight_dir=launch.launch_dir), "DDPLAB_LAUNCH_ID": launch.launch_id}
            proc, watchdog, interrupted = _torchrun(argv, env, log, watch, launch.reporter, t0, launch.startup_timeout_s,
                                                    spec_paths[0], starting, launch.launch_dir / REPORT)
        warn_left(launch.launch_dir / REPORT, f"{launch.name}: a rank", stacklevel=5)   # the keeper stopped them
    return Ran(proc, watchdog, interrupted, time.monotonic() - t0, argv, warm, watch)


def _collect(launch: Launch, ran: Ran, spec_paths: list[Path]) -> list[Run]:
    """After the ranks: Ctrl-C said, or the launch record written, the first failure diagnosed (its
    files kept), or every run loaded and cross-checked and the launch moved to its final place."""
    exps, run_dirs, launch_dir, name = launch.exps, launch.run_dirs, launch.launch_dir, launch.name
    warm, wall_s = ran.warm, ran.wall_s
    if not ran.interrupted and launch_dir.exists():   # the bars' last state: what the ranks wrote since the last look
        ran.watch.poll()
        launch.reporter.watch(ran.watch, wall_s)
    if ran.interrupted:
        place, launch.settled = rundir.settle(launch_dir, launch.final_launch_dir, complete=False), True
        line = f"interrupted: {launch.world_size} ranks stopped after {wall_s:.1f} s ({name}; files in {place})"
        # the bars' place says the run was stopped; the sentence itself is the exception's, said once
        launch.reporter.finish(f"ddplab {name}: STOPPED (interrupted after {wall_s:.1f} s)")
        raise failures.Interrupted(line)
    record = {"argv": ran.argv, "returncode": ran.proc.returncode, "wall_s": wall_s, "backend": launch.backend,
              "device": launch.device, "stopped_by_watchdog": ran.watchdog, "launch_dir": str(launch.final_launch_dir),
              "experiments": len(exps), "launch_id": launch.launch_id, "complete": False,
              "session": warm.dir.name if warm else None,
              "nodes": (launch.nodes if warm is None else warm.nodes).record}
    for run_dir in {launch_dir, *run_dirs}:
        rundir.write_json_atomic(run_dir / rundir.LAUNCH, record)
    # what the ranks waited before the launch was judged stuck: the watchdog's limit, or the
    # collective's timeout that every process group of this launch had (runtime.setup)
    timeout_s = ran.watch.limit_s(launch.startup_timeout_s) if ran.watchdog else max(e.timeout_s for e in exps)
    rundir.check_writable(launch_dir)   # a run directory lost mid-run explains every missing file
    try:
        failure = first_failure(exps, run_dirs, launch_dir, ran.proc, timeout_s, ran.watchdog, spec_paths[0],
                                 ran.watch.frozen, warm.dir if warm is not None else launch_dir,
                                 agent_watched=warm is None or bool(warm.died))   # a session's torchrun died mid-job
        if failure:
            raise failure
        runs = [load_run(d) for d in run_dirs]
    except failures.RunFailed as e:   # a failed rank, or results that disagree: the files stay
        waited = ""   # where a hang's seconds went: the limit it ran out, and everything before it
        if e.diagnosis.kind == "hang":
            limit = "the launcher's watchdog limit" if ran.watchdog else "the collective's timeout"
            waited = (f"; {min(timeout_s, wall_s):.1f} s of it {limit}, the other {max(wall_s - timeout_s, 0):.1f} s "
                      "everything else: the start, the steps before the hang and the teardown after it")
        launch.reporter.finish(f"ddplab {name}: FAILED after {wall_s:.1f} s "
                               f"({e.diagnosis.kind}, {failures.rank_list(e.diagnosis.ranks)}{waited})")
        place, launch.settled = rundir.settle(launch_dir, launch.final_launch_dir, complete=False), True
        raise failures.RunFailed(e.diagnosis, place / Path(e.run_dir).relative_to(launch_dir)) from None
    for run_dir in {launch_dir, *run_dirs}:   # every rank's result loaded and cross-checked
        rundir.write_json_atomic(run_dir / rundir.LAUNCH, {**record, "complete": True})
    rundir.settle(launch_dir, launch.final_launch_dir, complete=True)
    launch.settled = True
    return runs


def _session_for(exps, backend, device, warm, startup_timeout_s, reporter: Reporter, name: str):
    """`reuse.for_launch`, with a failed or interrupted start said on the progress line."""
    try:
        return reuse.for_launch(exps, backend, device, warm, startup_timeout_s, reporter.update)
    except failures.Interrupted as e:
        reporter.finish(f"ddplab {name}: {e}")
        raise
    except failures.RunFailed as e:
        reporter.finish(f"ddplab {name}: FAILED: the session's ranks could not start ({e.diagnosis.kind})")
        raise


def _what(exps, world_size: int) -> str:
    if len(exps) > 1:
        return f"{len(exps)} experiments on up to {world_size} ranks"
    total, unit = exps[0].task.total_steps(exps[0]), exps[0].task.step_unit
    return f"{world_size} ranks x {total} {unit[:-1] if total == 1 else unit}"


def _torchrun(argv, env, log, watch: Watch, reporter: Reporter, t0: float, startup_timeout_s: float,
              spec_path: Path, starting: str, report: Path | None = None):
    """Start torchrun and follow its ranks until it exits, the launch stalls, or Ctrl-C; then kill the
    tree unless it exited by itself (`report`: what the ranks left running, stopped). Ctrl-C only raises
    a flag: no Ctrl-C can cut the kill short. Returns (torchrun's process, stopped by the watchdog, interrupted)."""
    watchdog = False
    with interrupts_caught() as interrupted:
        proc = start(argv, env, log, report=report)
        watch.agent_pid = proc.pid   # its children are the ranks: a rank frozen before its first record is seen
        try:
            reporter.update(starting)
            while proc.poll() is None and not interrupted:
                time.sleep(POLL_S)
                if watch.poll() or watch.compile_news():
                    reporter.watch(watch, time.monotonic() - t0)
                watch.look_at_processes()
                if watch.stalled(startup_timeout_s):
                    watchdog = True
                    watch.ask_witnesses()   # the ranks' stacks and flight records, before they are stopped
                    break
                if not spec_path.exists():   # the run directory was deleted or moved under the ranks
                    break
        finally:
            if proc.poll() is None or watchdog or not spec_path.exists():
                kill_tree(proc, spec_path)
    if not spec_path.exists() and not interrupted:
        raise FileNotFoundError(errno.ENOENT, "the run directory disappeared during the run", str(spec_path.parent))
    return proc, watchdog, bool(interrupted)
