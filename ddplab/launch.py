"""`run(exp)`: start real torchrun ranks for an Experiment, watch them, and load what they wrote.

The command it builds (`torchrun_argv`) is, for a 4-rank experiment:

    python -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=4 --max-restarts=0 \\
        -m ddplab.worker --spec runs/<name>-<hash>/spec.json

`--standalone` lets torchrun pick a free port for its rendezvous; nothing here hard-codes one.
Every run is bounded twice: each rank's process group times out a collective after `timeout_s`,
and the launcher stops a run whose ranks record no progress for `timeout_s + STALL_GRACE_S`
(or that does not start within `startup_timeout_s`). On timeout, error or KeyboardInterrupt it
kills the whole process tree, torchrun and every rank, and turns the ranks' files into a diagnosis
naming the rank (`failures.py`). Used by every notebook and by `ddplab run`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from . import failures, rundir
from .progress import Reporter, describe
from .results import Run, load_run
from .spec import Experiment

STALL_GRACE_S = 10.0
STARTUP_TIMEOUT_S = 120.0
POLL_S = 0.1


def default_runs_dir() -> Path:
    """Where runs go unless told: $DDPLAB_RUNS, else ./runs."""
    return Path(os.environ.get("DDPLAB_RUNS", "runs"))


def run_dir_for(exp: Experiment, runs_dir: Path | None = None) -> Path:
    return Path(runs_dir or default_runs_dir()) / f"{exp.name}-{exp.hash}"


def torchrun_argv(exp: Experiment, run_dir: Path, python: str | None = None) -> list[str]:
    """The exact command that starts `exp.world_size` ranks of `ddplab.worker` (pure)."""
    return [python or sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            f"--nproc-per-node={exp.world_size}", "--max-restarts=0",
            "-m", "ddplab.worker", "--spec", str(Path(run_dir) / rundir.SPEC)]


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


def preflight(exp: Experiment) -> tuple[str, str]:
    """Refuse what cannot run here before starting anything; return (backend, device type)."""
    import torch

    from . import models, runtime

    cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    choice = runtime.choose_backend(exp.backend, exp.device, exp.world_size, cuda_devices)
    if exp.model not in ("transformer", "mlp"):
        models.check_model(models.build(exp), exp)
    return choice


def _procs_of(proc: subprocess.Popen, spec_path: Path) -> list:
    """torchrun, its descendants, and any process (re-parented or not) started for this spec."""
    import psutil

    found = {}
    try:
        root = psutil.Process(proc.pid)
        for p in [root, *root.children(recursive=True)]:
            found[p.pid] = p
    except psutil.NoSuchProcess:
        pass
    needle = str(spec_path)
    for p in psutil.process_iter(["cmdline"]):
        if needle in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid():
            found.setdefault(p.pid, p)
    return list(found.values())


def kill_tree(proc: subprocess.Popen, spec_path: Path) -> None:
    """SIGKILL torchrun and every rank of this run, and reap them: no orphans survive."""
    import psutil

    procs = _procs_of(proc, spec_path)
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


class _Watch:
    """Follows the ranks' progress logs incrementally; knows how far each rank is and when the run last moved."""

    def __init__(self, exp: Experiment, run_dir: Path):
        self.exp, self.run_dir = exp, run_dir
        self.offsets = [0] * exp.world_size
        self.last: dict[int, dict] = {}
        self.steps_done = [0] * exp.world_size
        self.last_move = time.monotonic()
        self.started = False

    def poll(self) -> bool:
        """Read what the ranks appended since the last poll; True if anything was."""
        moved = False
        for r in range(self.exp.world_size):
            f = rundir.progress_file(self.run_dir, r)
            if not f.exists():
                continue
            with open(f, "rb") as fh:
                fh.seek(self.offsets[r])
                chunk = fh.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]  # a half-written last line waits for the next poll
            if not complete:
                continue
            self.offsets[r] += len(complete)
            for line in complete.decode().splitlines():
                rec = json.loads(line)
                self.last[r] = rec
                self.steps_done[r] += rec["phase"] == "optimizer"
            moved = True
        if moved:
            self.last_move, self.started = time.monotonic(), True
        return moved

    def line(self, elapsed_s: float) -> str:
        up = sorted(self.last)
        done = [self.steps_done[r] for r in up]
        phase = min((self.last[r] for r in up), key=failures.phase_key)["phase"] if up else "starting"
        return describe(self.exp.name, self.exp.world_size, done, self.exp.steps, phase, elapsed_s)

    def stalled(self, startup_timeout_s: float) -> bool:
        limit = self.exp.timeout_s + STALL_GRACE_S if self.started else startup_timeout_s
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
    backend, device = preflight(exp)
    run_dir = Path(out) if out is not None else run_dir_for(exp)
    run_dir.mkdir(parents=True, exist_ok=True)
    rundir.clear(run_dir)
    spec_path = run_dir / rundir.SPEC
    spec_path.write_text(exp.to_json())
    argv = torchrun_argv(exp, run_dir)
    reporter = Reporter(progress)
    watch = _Watch(exp, run_dir)
    t0 = time.monotonic()
    watchdog = False
    with open(run_dir / rundir.LOG, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=worker_env(), start_new_session=True)
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
                kill_tree(proc, spec_path)
    wall_s = time.monotonic() - t0
    rundir.write_json_atomic(run_dir / rundir.LAUNCH, {
        "argv": argv, "returncode": proc.returncode, "wall_s": wall_s, "backend": backend, "device": device,
        "stopped_by_watchdog": watchdog})

    prog, errors, finished = _collect(run_dir, exp.world_size)
    if watchdog or errors or len(finished) < exp.world_size:
        if proc.returncode not in (0, None):
            kill_tree(proc, spec_path)  # torchrun stopped its ranks; sweep for any that escaped
        diagnosis = failures.diagnose(prog, errors, finished, exp.world_size, exp.timeout_s, watchdog)
        reporter.finish(f"ddplab {exp.name}: FAILED after {wall_s:.1f} s ({diagnosis.kind}, {failures.rank_list(diagnosis.ranks)})")
        raise failures.RunFailed(diagnosis, run_dir)
    result = load_run(run_dir)
    steps = f"{exp.steps} step" + ("s" if exp.steps != 1 else "")
    reporter.finish(f"ddplab {exp.name}: {exp.world_size} ranks x {steps} on {backend}/{device} "
                    f"in {wall_s:.1f} s -> {run_dir}")
    return result

