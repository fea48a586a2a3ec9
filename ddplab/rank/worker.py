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
import os
import platform
import socket
import sys
import time
from pathlib import Path

from .. import host, processes, record
from ..rundir import (ProgressLog, fatal_file, rank_file, read_progress, save_tensors_atomic, tensor_file,
                      write_json_atomic, write_rank_error)
from ..spec import Experiment
from . import clock, compiling, link, runtime, witness
from . import session
from .tasks import TaskContext, import_task_modules, runner

def main(argv=None) -> None:
    """A rank that torchrun started as `python -m ddplab.rank.worker`: run, then leave without finalizing."""
    code = run(argv)
    # skip interpreter finalization: gloo worker threads racing it abort a good run
    # (docs/ddp-internals.md, "Teardown at exit")
    os._exit(code)


def run(argv=None) -> int:
    """Everything a rank does, from its arguments to its exit code (a forked rank, `launch.loopback`, returns
    it to torchrun's agent, which leaves without finalizing too)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--spec", nargs="+", help="run_dir/spec.json of each experiment, run in order")
    what.add_argument("--serve", help="a session directory: run the jobs written there until told to stop")
    args = parser.parse_args(argv)
    # first thing, before `import torch` (a second): a rank must never outlive torchrun, and torchrun
    # may already be gone (the launcher killed during start-up)
    processes.die_with_parent()
    if not processes.parent_is_torchrun():
        os._exit(1)
    witness.block_signal()   # before any thread starts: only the witness thread takes the launcher's signal
    # the seconds `import torch` takes are paid here by a rank started as a new interpreter (a rank forked
    # from the agent has them imported: rank/forked.py); torch._dynamo too, with the collector off: DDP's
    # constructor and torch.distributed.pipelining import it, and most ranks run one of them
    host.import_torch_frozen("torch._dynamo")
    witness.start()

    env = runtime.rank_env()
    if args.serve:
        code = session.serve(Path(args.serve), env, run_experiments)
    else:
        code = run_experiments([Path(p) for p in args.spec], env, os.environ.get("DDPLAB_LAUNCH_ID", ""))
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def run_experiments(spec_paths: list[Path], env, launch_id: str, warm: tuple | None = None) -> int:
    """Run one launch's experiments in order (or one job of a session: `warm` is its (backend,
    device), the process group already joined); 0, or 1 after writing this rank's error file."""
    import torch

    log = None
    groups, extra = {}, {}
    try:
        texts = [p.read_text() for p in spec_paths]
        if warm is not None:   # before parsing: a changed task class must be the one the spec is read with
            session.fresh_user_modules(texts)
            session.baseline()
        else:
            import_task_modules(texts)
        exps = [Experiment.from_json(t) for t in texts]
        mine = [(p.parent, e) for p, e in zip(spec_paths, exps) if env.rank < e.world_size]
        timeout_s = max(e.timeout_s for e in exps)
        if mine:
            log = ProgressLog(mine[0][0], env.rank, mine[0][1].task.all_phases())
            _FATAL.watch(log.run_dir, env.rank)
            witness.at(log.run_dir, env.rank)
            compiling.at(log, env.rank)
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
        meshes = runtime.meshes(exps, device.type, timeout_s)   # every rank, also those outside a mesh
        extra = runtime.extra_groups(exps, timeout_s)            # the same
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
                witness.at(run_dir, env.rank)
                compiling.at(log, env.rank)
            t0 = time.time_ns()
            ctx = TaskContext(exp, env.rank, device, log, groups[exp.world_size], run_dir, meshes.get(i),
                              extra.get(i, []))
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
            runtime.destroy_groups(groups, extra)
            session.clean(device)
        if log:
            log.enter("done")
        code = 0
    except BaseException as e:  # noqa: BLE001 - every failure must reach the launcher as a file
        last = log.last if log else {"phase": "start", "step": -1}
        write_rank_error(log.run_dir if log else spec_paths[0].parent, env.rank, last["phase"], last["step"], e)
        if log:   # then its own testimony, and its peers' on this host, before torchrun stops them
            try:
                witness.write(f"{type(e).__name__} in {last['phase']}")
                witness.ask_peers(_peers(log.run_dir, env.rank, env.world_size))
            except Exception:  # noqa: BLE001 - the error file above is what the launcher needs
                pass
        code = 1
    compiling.stop()
    if log:
        log.close()
    _FATAL.stop()
    return code


def _peers(run_dir: Path, rank: int, world_size: int) -> dict[int, tuple]:
    """rank -> (pid, start ticks) of the other ranks of this run on this host, from their progress logs."""
    last = {r: recs[-1] for r in range(world_size) if r != rank and (recs := read_progress(run_dir, r))}
    return processes.rank_processes(last)


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


if __name__ == "__main__":
    main()
