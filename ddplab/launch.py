"""`run(exp)`: start real torchrun ranks for an Experiment, watch them, and load what they wrote.

The command it builds (`torchrun_argv`) is, for a 4-rank experiment:

    python -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=4 --max-restarts=0 \\
        -m ddplab.worker --spec runs/<name>-<hash>/spec.json

`run_many(exps)` runs several experiments in one launch (a launch costs seconds, mostly `import torch`
on every rank; a sweep should pay it once): torchrun starts as many ranks as the largest experiment
needs, and the ranks work through the list, each experiment on ranks 0..world_size-1 of its own
process group, each into its own run directory.

`--standalone` lets torchrun pick a free port for its rendezvous; nothing here hard-codes one.
Every run is bounded twice: each rank's process group times out a collective after `timeout_s`,
and the launcher stops a run whose ranks record no progress for `timeout_s + STALL_GRACE_S`
(or that does not start within `startup_timeout_s`). On timeout, error or KeyboardInterrupt it
kills the whole process tree, torchrun and every rank, and turns the ranks' files into a diagnosis
naming the rank (`failures.py`). Used by every notebook and by `ddplab run`.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from . import failures, rundir
from .progress import Reporter, describe
from .results import Run, load_run
from .spec import BUILTIN_MODELS, Experiment

STALL_GRACE_S = 10.0
STARTUP_TIMEOUT_S = 120.0
POLL_S = 0.1
LOG_TAIL_LINES = 25


def default_runs_dir() -> Path:
    """Where runs go unless told: $DDPLAB_RUNS, else ./runs."""
    return Path(os.environ.get("DDPLAB_RUNS", "runs"))


def run_dir_for(exp: Experiment, runs_dir: Path | None = None) -> Path:
    return Path(runs_dir or default_runs_dir()) / f"{exp.name}-{exp.hash}"


def torchrun_argv(world_size: int, spec_paths: list, python: str | None = None) -> list[str]:
    """The exact command that starts `world_size` ranks of `ddplab.worker` for these specs (pure)."""
    return [python or sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            f"--nproc-per-node={world_size}", "--max-restarts=0",
            "-m", "ddplab.worker", "--spec", *map(str, spec_paths)]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    """torchrun gets SIGKILL if the launcher dies without cleaning up (SIGTERM, a killed kernel);
    its ranks follow, since each rank dies with torchrun (runtime.die_with_parent)."""
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def worker_env(base: dict | None = None) -> dict:
    """The ranks' environment: the caller's, plus the current directory on PYTHONPATH (for a
    user's `module:factory` model) and one OpenMP thread per rank unless the caller chose."""
    env = dict(os.environ if base is None else base)
    paths = [os.getcwd(), str(Path(__file__).resolve().parent.parent)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default for several ranks, without its banner
    return env


def preflight(exps: list[Experiment]) -> tuple[str, str]:
    """Refuse what cannot run here before starting anything; return the launch's (backend, device type)."""
    import torch

    from . import models, runtime

    cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    choices = {runtime.choose_backend(e.backend, e.device, e.world_size, cuda_devices) for e in exps}
    if len(choices) > 1:
        raise ValueError(f"experiments: one launch runs on one backend and device, but these need "
                         f"{sorted(choices)}; run them in separate launches")
    backend, device = choices.pop()
    if device != "cuda" and any("memory-snapshot" in e.probes for e in exps):
        raise ValueError("Experiment.probes: 'memory-snapshot' needs the ranks on CUDA; this launch runs on the CPU")
    for e in exps:
        if e.model not in BUILTIN_MODELS and e.task == "train":
            models.check_model(models.build(e), e)
    return backend, device


def _procs_of(proc: subprocess.Popen, spec_path: Path) -> list:
    """torchrun (unless already reaped: its pid may be reused), its descendants, and any process,
    re-parented or not, whose command line carries this launch's absolute spec path."""
    import psutil

    found = {}
    if proc.returncode is None:
        try:
            root = psutil.Process(proc.pid)
            for p in [root, *root.children(recursive=True)]:
                found[p.pid] = p
        except psutil.Error:
            pass
    needle = str(Path(spec_path).resolve())
    for p in psutil.process_iter(["cmdline"]):
        try:
            if needle in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid():
                found.setdefault(p.pid, p)
        except psutil.Error:
            pass
    return list(found.values())


def kill_tree(proc: subprocess.Popen, spec_path: Path) -> None:
    """SIGKILL torchrun and every rank of this run, and reap them: no orphans survive."""
    import psutil

    procs = _procs_of(proc, spec_path)
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


class _Watch:
    """Follows every rank's progress log, incrementally; knows how far the ranks are and when the
    launch last moved."""

    def __init__(self, runs: list[tuple[Experiment, Path]]):
        self.runs = runs
        self.offsets: dict[Path, int] = {}
        self.last: dict[int, dict[int, dict]] = {i: {} for i in range(len(runs))}   # run index -> rank -> record
        self.steps_done: dict[int, dict[int, int]] = {i: {} for i in range(len(runs))}
        self.current = 0
        self.last_move = time.monotonic()
        self.started = False

    def poll(self) -> bool:
        """Read what the ranks appended since the last poll; True if anything was."""
        moved = False
        for i, (exp, run_dir) in enumerate(self.runs):
            for r in range(exp.world_size):
                f = rundir.progress_file(run_dir, r)
                if not f.exists():
                    continue
                with open(f, "rb") as fh:
                    fh.seek(self.offsets.get(f, 0))
                    chunk = fh.read()
                complete = chunk[: chunk.rfind(b"\n") + 1]  # a half-written last line waits for the next poll
                if not complete:
                    continue
                self.offsets[f] = self.offsets.get(f, 0) + len(complete)
                for line in complete.decode().splitlines():
                    rec = json.loads(line)
                    self.last[i][r] = rec
                    self.steps_done[i][r] = self.steps_done[i].get(r, 0) + (rec["phase"] == "optimizer")
                self.current, moved = max(self.current, i), True
        if moved:
            self.last_move, self.started = time.monotonic(), True
        return moved

    def line(self, elapsed_s: float) -> str:
        exp, _ = self.runs[self.current]
        last, done = self.last[self.current], self.steps_done[self.current]
        phase = min(last.values(), key=failures.phase_key)["phase"] if last else "starting"
        name = exp.name if len(self.runs) == 1 else f"{self.current + 1}/{len(self.runs)} {exp.name}"
        return describe(name, exp.world_size, [done.get(r, 0) for r in sorted(last)], exp.steps, phase, elapsed_s)

    def stalled(self, startup_timeout_s: float) -> bool:
        limit = max(e.timeout_s for e, _ in self.runs) + STALL_GRACE_S if self.started else startup_timeout_s
        return time.monotonic() - self.last_move > limit


def _collect(run_dir: Path, world_size: int) -> tuple[dict, dict, set]:
    progress = {r: rundir.read_progress(run_dir, r) for r in range(world_size)}
    errors = {}
    for r in range(world_size):
        f = rundir.error_file(run_dir, r)
        if f.exists():
            try:
                errors[r] = json.loads(f.read_text())
            except json.JSONDecodeError:
                pass
    finished = {r for r in range(world_size) if rundir.rank_file(run_dir, r).exists()}
    return progress, errors, finished


def run(exp: Experiment, out=None, *, progress: bool = True, startup_timeout_s: float = STARTUP_TIMEOUT_S) -> Run:
    """Run `exp` on real torchrun ranks and return the loaded `Run`; raise `RunFailed` naming the rank.

    `out` is the run directory (default `runs/<name>-<hash>`, under $DDPLAB_RUNS if set).
    """
    if not isinstance(exp, Experiment):
        raise TypeError(f"run() takes an Experiment, got {type(exp).__name__}")
    run_dir = Path(out) if out is not None else run_dir_for(exp)
    return _launch([exp], [run_dir], run_dir, exp.name, progress, startup_timeout_s)[0]


def run_many(exps: list[Experiment], out=None, *, name: str = "sweep", progress: bool = True,
             startup_timeout_s: float = STARTUP_TIMEOUT_S) -> list[Run]:
    """Run several experiments in ONE torchrun launch, in order; return their `Run`s.

    `out` is the launch directory (default `runs/<name>-<hash of all specs>`); each experiment gets
    the run directory `<out>/<exp.name>-<exp.hash>` inside it. The first failure raises `RunFailed`.
    Every process group of the launch uses the largest `timeout_s`; a rank outside a smaller
    experiment waits in the next experiment's first collective, so each smaller experiment must
    finish within that timeout.
    """
    exps = list(exps)
    if not exps or not all(isinstance(e, Experiment) for e in exps):
        raise ValueError("experiments: give a non-empty list of Experiment objects")
    hashes = [e.hash for e in exps]
    for i, h in enumerate(hashes):
        if h in hashes[:i]:
            raise ValueError(f"experiments: experiment {i} is identical to experiment {hashes.index(h)}")
    launch_dir = Path(out) if out is not None else (
        default_runs_dir() / f"{name}-{hashlib.sha256(''.join(hashes).encode()).hexdigest()[:10]}")
    return _launch(exps, [run_dir_for(e, launch_dir) for e in exps], launch_dir, name, progress, startup_timeout_s)


def _launch(exps, run_dirs, launch_dir: Path, name: str, progress: bool, startup_timeout_s: float) -> list[Run]:
    backend, device = preflight(exps)
    for run_dir, exp in zip(run_dirs, exps):
        run_dir.mkdir(parents=True, exist_ok=True)
        rundir.clear(run_dir)
        (run_dir / rundir.SPEC).write_text(exp.to_json())
    launch_dir.mkdir(parents=True, exist_ok=True)
    spec_paths = [(d / rundir.SPEC).resolve() for d in run_dirs]
    launch_id = uuid.uuid4().hex[:12]
    world_size = max(e.world_size for e in exps)
    argv = torchrun_argv(world_size, spec_paths)
    reporter = Reporter(progress)
    watch = _Watch(list(zip(exps, run_dirs)))
    t0 = time.monotonic()
    watchdog = False
    with open(launch_dir / rundir.LOG, "w") as log:
        env = {**worker_env(), "DDPLAB_LAUNCH_ID": launch_id}
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True,
                                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        try:
            while proc.poll() is None:
                time.sleep(POLL_S)
                if watch.poll():
                    reporter.update(watch.line(time.monotonic() - t0))
                if watch.stalled(startup_timeout_s):
                    watchdog = True
                    break
        finally:
            # reached on success, on a stall, and on KeyboardInterrupt or any other exception
            if proc.poll() is None or watchdog:
                kill_tree(proc, spec_paths[0])
    wall_s = time.monotonic() - t0
    record = {"argv": argv, "returncode": proc.returncode, "wall_s": wall_s, "backend": backend, "device": device,
              "stopped_by_watchdog": watchdog, "launch_dir": str(launch_dir), "experiments": len(exps),
              "launch_id": launch_id}
    for run_dir in {launch_dir, *run_dirs}:
        rundir.write_json_atomic(run_dir / rundir.LAUNCH, record)

    timeout_s = max(e.timeout_s for e in exps)  # what every process group of this launch waited (runtime.setup)
    for exp, run_dir in zip(exps, run_dirs):
        prog, errors, finished = _collect(run_dir, exp.world_size)
        if errors or len(finished) < exp.world_size:  # the first incomplete experiment is the one to explain
            if proc.returncode not in (0, None):
                kill_tree(proc, spec_paths[0])  # torchrun stopped its ranks; sweep for any that escaped
            diagnosis = failures.diagnose(prog, errors, finished, exp.world_size, timeout_s, watchdog)
            if diagnosis.kind == "missing-result":  # no rank could explain itself: show what torchrun saw
                diagnosis.log_tail = "\n".join((launch_dir / rundir.LOG).read_text().splitlines()[-LOG_TAIL_LINES:])
            reporter.finish(f"ddplab {exp.name}: FAILED after {wall_s:.1f} s "
                            f"({diagnosis.kind}, {failures.rank_list(diagnosis.ranks)})")
            raise failures.RunFailed(diagnosis, run_dir)
    runs = [load_run(d) for d in run_dirs]
    if len(exps) == 1:
        steps = f"{exps[0].steps} step" + ("s" if exps[0].steps != 1 else "")
        what = f"{world_size} ranks x {steps}"
    else:
        what = f"{len(exps)} experiments on up to {world_size} ranks"
    reporter.finish(f"ddplab {name}: {what} on {backend}/{device} in {wall_s:.1f} s -> {launch_dir}")
    return runs
