"""A session's rank (`--serve`, the rank side of `launch/session.py`): join the process group once, then
run job after job as a cold launch would (`run_experiments`, the worker's, handed in), or a `%%ddp` cell; between jobs, put
back what a cold rank starts with (user modules imported afresh, torch's global settings, collected
garbage). Runs inside a rank.
"""

from __future__ import annotations

import gc
import importlib
import json
import sys
import time
from pathlib import Path

from ..rundir import ProgressLog, write_json_atomic, write_rank_error
from ..spec.tasks import COMMON_PHASES
from . import cells, runtime, witness
from .tasks import import_task_modules, task_module

SESSION_PHASES = {p.name: p for p in COMMON_PHASES}


def serve(session_dir: Path, env, run_experiments) -> int:
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
        import torch.distributed as dist

        # every rank up before the first job; and every rank's flight record then holds a collective of the
        # default group, which torch's analyzer needs to tell "never joined" from "no record" (witnesses.py)
        dist.barrier()
        _THREADS[0] = torch.get_num_threads()
        log.enter("done")   # ready for jobs
    except BaseException as e:  # noqa: BLE001
        write_rank_error(session_dir, env.rank, "init-process-group", -1, e)
        return 1
    finally:
        log.close()
    n, ns = 0, None
    while True:
        job = wait_for(session_dir / f"job{n}.json", cfg.get("idle_s"))
        if job.get("stop"):
            break
        if "cell" in job:   # a %%ddp cell: this rank's namespace lives from cell to cell (runs go cold after one)
            # a hung cell's testimony, if the launcher asks (all ranks), numbering its collectives from the cell's start
            witness.at(session_dir, env.rank, f"job{n}.", cells.group_seqs())
            if env.rank in job["ranks"]:
                ns = ns if ns is not None else cells.namespace(env, device)
                status = session_dir / f"job{n}.rank{env.rank}.cell.status"
                stream = session_dir / f"job{n}.rank{env.rank}.cell.stream"
                write_json_atomic(session_dir / f"job{n}.rank{env.rank}.cell.json",
                                  cells.run_cell(job["cell"], ns, status, stream))
            n += 1
            continue
        if run_experiments([Path(p) for p in job["specs"]], env, job["launch_id"], (cfg["backend"], device)):
            return 1
        (session_dir / f"job{n}.rank{env.rank}.done").write_text("")
        n += 1
    runtime.teardown()
    return 0


def wait_for(path: Path, idle_s: float | None = None) -> dict:
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


def fresh_user_modules(spec_texts: list[str]) -> None:
    """A user's model or task module, imported by an earlier job, is imported afresh: the file may
    have changed since, and module-level state must not leak from one experiment into the next.
    A task module is imported again at once (it registers its task class, which the spec is then
    read with); a model module when the model is built (a broken file fails in 'build', as cold)."""
    importlib.invalidate_caches()
    for text in spec_texts:
        d = json.loads(text)
        names = [d["model"].split(":")[0]] if ":" in str(d.get("model", "")) else []
        names += [m for m in [task_module(d)] if m]
        for name in names:
            if name.split(".")[0] in _NEVER_PURGED:
                continue
            for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                del sys.modules[loaded]
    import_task_modules(spec_texts)


def baseline() -> None:
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


def clean(device) -> None:
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
