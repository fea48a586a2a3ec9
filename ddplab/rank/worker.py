"""One rank of a ddplab run: the entry point torchrun starts once per rank.

    torchrun --standalone --nnodes=1 --nproc-per-node=4 -m ddplab.rank.worker --spec runs/<name>-<hash>/spec.json

(ddplab starts it through `launch.loopback`, torchrun with its stores on 127.0.0.1.) Given several specs, the ranks run them in order (one launch, one `import torch`); an experiment
with a smaller world size runs on ranks 0..world_size-1 of its own process group while the other
ranks go on to the next experiment they belong to.

For each experiment the worker runs the task its spec names (`rank/tasks/`; training is
`rank/tasks/train.py`) and writes what the task returns as `rank{r}.json` (the envelope and the
task's record, `record.py`) and `rank{r}.pt` (tensors) into the run directory. The task logs every
phase it enters to `rank{r}.progress`, so the launcher can show progress and, if the ranks hang, say
which rank never reached which collective. A rank that fails writes `rank{r}.error.json` with its
traceback.
Used by every notebook's runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import sys
import time
import traceback
from pathlib import Path

from .. import host, record
from ..rundir import ProgressLog, error_file, rank_file, save_tensors_atomic, tensor_file, write_json_atomic
from ..spec import Experiment
from . import runtime
from .tasks import TaskContext, runner


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", nargs="+", required=True, help="run_dir/spec.json of each experiment, run in order")
    spec_paths = [Path(p) for p in parser.parse_args(argv).spec]
    # first thing, before `import torch` (a second): a rank must never outlive torchrun, and torchrun
    # may already be gone (the launcher killed during start-up)
    host.die_with_parent()
    if not host.parent_is_torchrun():
        os._exit(1)
    import torch

    env = runtime.rank_env()
    log = None
    try:
        exps = [Experiment.from_json(p.read_text()) for p in spec_paths]
        mine = [(p.parent, e) for p, e in zip(spec_paths, exps) if env.rank < e.world_size]
        log = ProgressLog(mine[0][0], env.rank, mine[0][1].task.all_phases())
        widest = max(exps, key=lambda e: e.world_size)  # the launcher checked they all agree
        backend, device_type = host.choose_backend(widest.backend, widest.device, env.world_size,
                                                   host.cuda_device_count())
        log.enter("init-process-group")
        if device_type == "cpu" and any(e.pin_cpus for e in exps):  # pinning is per process
            runtime.pin_to_core(env.local_rank)
        timeout_s = max(e.timeout_s for e in exps)
        device = runtime.setup(backend, device_type, env, timeout_s)
        groups = runtime.subgroups([e.world_size for e in exps], env.world_size, timeout_s)
        for run_dir, exp in mine:
            if run_dir != log.run_dir:
                log.close()
                log = ProgressLog(run_dir, env.rank, exp.task.all_phases())
            t0 = time.time_ns()
            ctx = TaskContext(exp, env.rank, device, log, groups[exp.world_size], run_dir)
            result, tensors = runner(exp.task)(ctx)
            if tensors:
                save_tensors_atomic(tensor_file(run_dir, env.rank), tensors)
            envelope = record.Envelope(
                task=exp.task.kind, rank=env.rank, local_rank=env.local_rank, world_size=exp.world_size,
                backend=backend, device=str(device), pid=os.getpid(), host=socket.gethostname(),
                torch_version=torch.__version__, python=platform.python_version(), spec_hash=exp.hash,
                launch_id=os.environ.get("DDPLAB_LAUNCH_ID", ""), t_start_ns=t0, t_end_ns=time.time_ns())
            write_json_atomic(rank_file(run_dir, env.rank), record.dump(record.RankRecord(envelope, result)))
        log.enter("teardown")
        runtime.teardown()
        log.enter("done")
        code = 0
    except BaseException as e:  # noqa: BLE001 - every failure must reach the launcher as a file
        last = log.last if log else {"phase": "start", "step": -1}
        write_json_atomic(error_file(log.run_dir if log else spec_paths[0].parent, env.rank), {
            "rank": env.rank, "phase": last["phase"], "step": last["step"], "t_ns": time.time_ns(),
            "type": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()})
        traceback.print_exc()
        code = 1
    if log:
        log.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter finalization: gloo worker threads racing it abort a good run (notes, section 0)
    os._exit(code)


if __name__ == "__main__":
    main()
