"""Failures provoked on purpose (notebook 08): launch an experiment whose fault must fail it, time
how long the launcher takes to say which rank failed and why, and look for processes it left.

    outcome = provoke(recipes.fault_runs()["extra-all-reduce"])
    outcome.diagnosis.ranks, outcome.seconds, outcome.orphans
Runs in the notebook's process; `tables.failures` turns the outcomes into the chapter's table.
"""

from __future__ import annotations

import time
from pathlib import Path


from ..failures import Provoked, RunFailed
from ..rundir import read_progress
from ..spec import Experiment
from .cold import run, run_dir_for
from .torchrun import processes_for

STARTUP_PHASES = ("start", "init-process-group")


def provoke(exp: Experiment, out=None) -> Provoked:
    """Run `exp` cold (a failed job would end a warm session anyway) and return what happened."""
    run_dir = Path(out) if out is not None else run_dir_for(exp)
    t0, wall0 = time.monotonic(), time.time_ns()
    failed_dir = None
    try:
        run(exp, run_dir, progress=False, warm=False)
        diagnosis = None
    except RunFailed as e:
        diagnosis, failed_dir = e.diagnosis, e.run_dir
    seconds = time.monotonic() - t0
    fault = exp.fault
    started = work_started_ns(Path(failed_dir), exp.world_size) if failed_dir else None
    startup_s = min(max(0.0, (started - wall0) / 1e9), seconds) if started else 0.0
    return Provoked(exp.name, fault.kind if fault else None, fault.rank if fault else None, diagnosis, seconds,
                    exp.timeout_s, orphans(run_dir), startup_s)


def provoke_each(exps, say=print) -> list[Provoked]:
    """`provoke` every experiment in turn, saying which fault is provoked as it starts and what the
    launcher said when it is done (a learner sees each fault as it happens, not all at the end)."""
    outcomes = []
    for exp in exps:
        fault = exp.fault
        say(f"{exp.name}: {fault.kind if fault else 'no fault'} on rank {fault.rank if fault else '-'}, collective "
            f"timeout {exp.timeout_s:g} s ...", flush=True)
        o = provoke(exp)
        d = o.diagnosis
        say(f"  {'the run did not fail' if d is None else f'{d.kind}, rank(s) {d.ranks} named'} after {o.seconds:.1f} s "
            f"({o.startup_s:.1f} s of it starting){f'; {len(o.orphans)} process(es) left' if o.orphans else ''}", flush=True)
        outcomes.append(o)
    return outcomes


def work_started_ns(run_dir: Path, world_size: int) -> int | None:
    """When the last rank began its task (wall ns): the first phase after start-up in each rank's
    progress log, the latest over ranks; None where a rank's log says nothing of it."""
    firsts = []
    for rank in range(world_size):
        t = next((r["t_ns"] for r in read_progress(run_dir, rank)
                  if r.get("phase") not in STARTUP_PHASES and isinstance(r.get("t_ns"), int)), None)
        if t is None:
            return None
        firsts.append(t)
    return max(firsts) if firsts else None


def orphans(run_dir: Path) -> list[str]:
    """Command lines of live processes started for this run directory (or a launch staged beside it)."""
    return processes_for(run_dir)
