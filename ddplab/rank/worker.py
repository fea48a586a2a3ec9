"""One rank of a ddplab run: the entry point torchrun starts once per rank.

    torchrun --standalone --nnodes=1 --nproc-per-node=4 -m ddplab.rank.worker --spec runs/<name>-<hash>/spec.json
    torchrun ... -m ddplab.rank.worker --serve runs/.sessions/<id>     (a session of warm ranks)

(ddplab starts it through `launch.loopback`, torchrun with its stores on 127.0.0.1.) Given several
specs, the ranks run them in order (one launch, one `import torch`); an experiment with a smaller
world size runs on ranks 0..world_size-1 of its own process group while the other ranks wait for it
at a gate in the store (`_Gate`: outside any collective, so a long narrow experiment cannot run out
their collective timeout), then go on to the next experiment they belong to. With `--serve`, the
ranks join the process group once and then run job after job (`launch/session.py` writes
`job{n}.json`, a list of specs), each exactly as a cold launch would, on process groups made fresh
for the job.

For each experiment the worker runs the task its spec names (`rank/tasks/`; training is
`rank/tasks/train.py`) and writes what the task returns as `rank{r}.json` (the envelope and the
task's record, `record/`) and `rank{r}.pt` (tensors) into the run directory. The task logs every
phase it enters to `rank{r}.progress`, so the launcher can show progress and, if the ranks hang, say
which rank never reached which collective. A rank that fails writes `rank{r}.error.json` with its
traceback.
Used by every notebook's runs.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import importlib
import json
import os
import platform
import socket
import sys
import time
import traceback
from pathlib import Path

from .. import host, record
from ..rundir import (ProgressLog, error_file, fatal_file, rank_file, save_tensors_atomic, tensor_file,
                      write_json_atomic)
from ..spec import Experiment
from ..spec.tasks import COMMON_PHASES
from . import cells, clock, link, runtime
from .tasks import TaskContext, runner

SESSION_PHASES = {p.name: p for p in COMMON_PHASES}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--spec", nargs="+", help="run_dir/spec.json of each experiment, run in order")
    what.add_argument("--serve", help="a session directory: run the jobs written there until told to stop")
    args = parser.parse_args(argv)
    # first thing, before `import torch` (a second): a rank must never outlive torchrun, and torchrun
    # may already be gone (the launcher killed during start-up)
    host.die_with_parent()
    if not host.parent_is_torchrun():
        os._exit(1)
    import torch  # noqa: F401 - the second this takes is paid here, once per rank

    env = runtime.rank_env()
    if args.serve:
        code = serve(Path(args.serve), env)
    else:
        code = run_experiments([Path(p) for p in args.spec], env, os.environ.get("DDPLAB_LAUNCH_ID", ""))
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter finalization: gloo worker threads racing it abort a good run (notes, section 0)
    os._exit(code)


def run_experiments(spec_paths: list[Path], env, launch_id: str, warm: tuple | None = None) -> int:
    """Run one launch's experiments in order (or one job of a session: `warm` is its (backend,
    device), the process group already joined); 0, or 1 after writing this rank's error file."""
    import torch

    log = None
    groups = {}
    try:
        texts = [p.read_text() for p in spec_paths]
        if warm is not None:   # before parsing: a changed task class must be the one the spec is read with
            _fresh_user_modules(texts)
            _baseline()
        else:
            _import_task_modules(texts)
        exps = [Experiment.from_json(t) for t in texts]
        mine = [(p.parent, e) for p, e in zip(spec_paths, exps) if env.rank < e.world_size]
        timeout_s = max(e.timeout_s for e in exps)
        if mine:
            log = ProgressLog(mine[0][0], env.rank, mine[0][1].task.all_phases())
            _FATAL.watch(log.run_dir, env.rank)
        if warm is None:
            widest = max(exps, key=lambda e: e.world_size)  # the launcher checked they all agree
            # one GPU per rank on this host (several nodes: each host has its own GPUs)
            backend, device_type = host.choose_backend(widest.backend, widest.device, env.ranks_here,
                                                       host.cuda_device_count())
            if log:   # a rank past every experiment (nodes that do not divide the ranks) only takes part
                log.enter("init-process-group")
            if device_type == "cpu" and any(e.pin_cpus for e in exps):  # pinning is per process
                runtime.pin_to_core(env.slot)
            device = runtime.setup(backend, device_type, env, timeout_s)
        else:
            backend, device = warm
            if log:
                log.enter("init-process-group")
        # a session makes every group anew, with this job's timeout; a cold launch uses its own world
        groups = runtime.subgroups([e.world_size for e in exps], env.world_size, timeout_s, fresh=warm is not None)
        # every rank's events from here on share one time base, on one host or several
        aligned_ns = clock.align(env.node, device if device.type == "cuda" else None)
        gate = _Gate(launch_id)
        for i, (path, exp) in enumerate(zip(spec_paths, exps)):
            if env.rank >= exp.world_size:   # not in this one: wait for it outside any collective
                gate.wait(i, exp.world_size)
                continue
            run_dir = path.parent
            if run_dir != log.run_dir:
                log.close()
                log = ProgressLog(run_dir, env.rank, exp.task.all_phases())
                _FATAL.watch(run_dir, env.rank)
            t0 = time.time_ns()
            ctx = TaskContext(exp, env.rank, device, log, groups[exp.world_size], run_dir)
            link.activate(exp.link, exp.world_size, device)
            try:
                result, tensors = runner(exp.task)(ctx)
            finally:
                link.deactivate()
            if tensors:
                save_tensors_atomic(tensor_file(run_dir, env.rank), tensors)
            envelope = record.Envelope(
                task=exp.task.kind, rank=env.rank, local_rank=env.local_rank, world_size=exp.world_size,
                backend=backend, device=str(device), pid=os.getpid(), host=socket.gethostname(),
                torch_version=torch.__version__, python=platform.python_version(), spec_hash=exp.hash,
                launch_id=launch_id, t_start_ns=t0, t_end_ns=time.time_ns(), node=env.node,
                aligned_at_ns=aligned_ns)
            write_json_atomic(rank_file(run_dir, env.rank), record.dump(record.RankRecord(envelope, result)))
            gate.passed(i)
        if warm is None:
            if log:
                log.enter("teardown")
            runtime.teardown()
        else:
            runtime.destroy_groups(groups)
            _clean(device)
        if log:
            log.enter("done")
        code = 0
    except BaseException as e:  # noqa: BLE001 - every failure must reach the launcher as a file
        last = log.last if log else {"phase": "start", "step": -1}
        _write_error(log.run_dir if log else spec_paths[0].parent, env.rank, last["phase"], last["step"], e)
        code = 1
    if log:
        log.close()
    _FATAL.stop()
    return code


class _Gate:
    """Where a launch's experiments differ in width (notebook 09: 2-rank pipelines among 4-rank runs),
    a rank outside one experiment must not wait for the next inside a collective: the collective's
    timeout (`timeout_s`, for one collective) would run out while the narrower experiment is merely
    long (under load a 2-stage pipeline study outlasts 60 s), that rank would fail, and torchrun would
    stop the others mid-step. So each member marks the experiment done in the process group's store,
    and a rank outside it polls the count. Unbounded here, and bounded elsewhere: a member that fails
    ends the launch (torchrun stops every rank; a session's job is torn down), a member that hangs in a
    collective times out there, and one stuck anywhere else is stopped by the launcher's watchdog (no
    progress for timeout_s + its grace), which also covers a node whose agent left while the store
    lived on."""

    POLL_S = 0.05

    def __init__(self, launch_id: str):
        self.prefix = f"ddplab/gate/{launch_id or 'launch'}/"
        self._store = None

    def store(self):
        if self._store is None:
            from torch.distributed.distributed_c10d import _get_default_store

            self._store = _get_default_store()
        return self._store

    def passed(self, i: int) -> None:
        self.store().add(f"{self.prefix}{i}", 1)

    def wait(self, i: int, members: int) -> None:
        while self.store().add(f"{self.prefix}{i}", 0) < members:
            time.sleep(self.POLL_S)


class _FatalSignals:
    """If a fatal signal kills this rank (SIGABRT from a C++ check in gloo, SIGSEGV), Python's
    faulthandler writes every thread's stack to rank{r}.fatal.txt of the run it was in: what the
    launcher's diagnosis shows for a rank that could not write an error file. Removed again when the
    rank lives on (an empty file says nothing)."""

    def __init__(self):
        self.file = None

    def watch(self, run_dir: Path, rank: int) -> None:
        self.stop()
        self.file = open(fatal_file(run_dir, rank), "w")
        faulthandler.enable(self.file, all_threads=True)

    def stop(self) -> None:
        if self.file is None:
            return
        faulthandler.disable()
        self.file.close()
        path, self.file = Path(self.file.name), None
        if path.exists() and path.stat().st_size == 0:
            path.unlink()


_FATAL = _FatalSignals()


def _write_error(run_dir: Path, rank: int, phase: str, step: int, e: BaseException) -> None:
    """This rank's error file (the launcher's diagnosis reads it), and the traceback on stderr."""
    write_json_atomic(error_file(run_dir, rank), {
        "rank": rank, "phase": phase, "step": step, "t_ns": time.time_ns(),
        "type": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()})
    traceback.print_exc()


def serve(session_dir: Path, env) -> int:
    """A session's rank: join the process group once, then run each job the launcher writes
    (`job{n}.json`: {"specs": [...], "launch_id": ...}, a `%%ddp` cell {"cell": code, "ranks": [...]},
    or {"stop": true}), and mark it done (`job{n}.rank{r}.done`, or the cell's `job{n}.rank{r}.cell.json`). A job that fails ends the rank (its error file says why): the launcher
    tears the session down and the next run starts a fresh one."""
    cfg = json.loads((session_dir / "session.json").read_text())
    log = ProgressLog(session_dir, env.rank, SESSION_PHASES)
    try:
        log.enter("init-process-group")
        if cfg["device"] == "cpu" and cfg["pin_cpus"]:
            runtime.pin_to_core(env.slot)
        device = runtime.setup(cfg["backend"], cfg["device"], env, cfg["timeout_s"])
        import torch

        _THREADS[0] = torch.get_num_threads()
        log.enter("done")   # ready for jobs
    except BaseException as e:  # noqa: BLE001
        _write_error(session_dir, env.rank, "init-process-group", -1, e)
        return 1
    finally:
        log.close()
    n, ns = 0, None
    while True:
        job = _wait_for(session_dir / f"job{n}.json", cfg.get("idle_s"))
        if job.get("stop"):
            break
        if "cell" in job:   # a %%ddp cell: this rank's namespace lives from cell to cell (runs go cold after one)
            if env.rank in job["ranks"]:
                ns = ns if ns is not None else cells.namespace(env, device)
                status = session_dir / f"job{n}.rank{env.rank}.cell.status"
                write_json_atomic(session_dir / f"job{n}.rank{env.rank}.cell.json", cells.run_cell(job["cell"], ns, status))
            n += 1
            continue
        if run_experiments([Path(p) for p in job["specs"]], env, job["launch_id"], (cfg["backend"], device)):
            return 1
        (session_dir / f"job{n}.rank{env.rank}.done").write_text("")
        n += 1
    runtime.teardown()
    return 0


def _wait_for(path: Path, idle_s: float | None = None) -> dict:
    """The job at `path`, once the launcher has written it (atomically): polled every millisecond
    for a second after the last job, then more slowly, so an idle session costs no CPU to speak of.
    After `idle_s` without one (a forgotten kernel), or once the session's directory is gone, a stop."""
    t0 = time.monotonic()
    while not path.exists():
        idle = time.monotonic() - t0
        if (idle_s is not None and idle > idle_s) or (idle > 1 and not path.parent.exists()):
            return {"stop": True}
        time.sleep(0.001 if idle < 1 else 0.005 if idle < 10 else 0.02)
    return json.loads(path.read_text())


def _fresh_user_modules(spec_texts: list[str]) -> None:
    """A user's model or task module, imported by an earlier job, is imported afresh: the file may
    have changed since, and module-level state must not leak from one experiment into the next.
    A task module is imported again at once (it registers its task class, which the spec is then
    read with); a model module when the model is built (a broken file fails in 'build', as cold)."""
    importlib.invalidate_caches()
    for text in spec_texts:
        d = json.loads(text)
        names = [d["model"].split(":")[0]] if ":" in str(d.get("model", "")) else []
        names += [m for m in [_task_module(d)] if m]
        for name in names:
            if name.split(".")[0] in _NEVER_PURGED:
                continue
            for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                del sys.modules[loaded]
    _import_task_modules(spec_texts)


def _task_module(spec: dict) -> str | None:
    """The module where a spec's own task is declared (`task.module`), if it names one."""
    task = spec.get("task")
    module = task.get("module") if isinstance(task, dict) else None
    return module if isinstance(module, str) and module else None


def _import_task_modules(spec_texts: list[str]) -> None:
    """Import the modules of the specs' own tasks, in order, once each: the rank runs what the launcher
    wrote for this launch (which had those modules imported), so the specs can be read; reading a spec
    never imports them."""
    for name in dict.fromkeys(filter(None, (_task_module(json.loads(t)) for t in spec_texts))):
        importlib.import_module(name)


def _baseline() -> None:
    """Put back what a cold rank starts with, in case an earlier job or `%%ddp` cell changed it:
    torch.distributed's debug level from the environment, autograd on, float32 as the default dtype, no deterministic-algorithms mode, the same threads."""
    import torch

    torch.set_grad_enabled(True)
    torch.distributed.set_debug_level_from_env()   # an experiment's distributed_debug lasts one job
    torch.set_default_dtype(torch.float32)
    torch.use_deterministic_algorithms(False)
    torch.set_num_threads(_THREADS[0])


_NEVER_PURGED = {"torch", "ddplab", "numpy", "builtins"}   # a factory may live there; it never changes mid-session
_THREADS = [1]   # torch's thread count when the session's rank started (serve sets it)


def _clean(device) -> None:
    """After a job (whose objects `runtime.destroy_groups` just collected): after the first job, what
    survived is the session's own (modules, torch's and DDP's lazily imported machinery), so it is
    frozen out of every later collection, which then costs milliseconds instead of a tenth of a
    second; later jobs' and cells' garbage stays collectable. CUDA's caches and peaks start from zero."""
    if not _FROZEN:
        gc.freeze()
        _FROZEN.append(True)
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


_FROZEN: list = []


if __name__ == "__main__":
    main()
