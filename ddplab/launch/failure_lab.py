"""Failures provoked on purpose (notebook 08): launch an experiment whose fault must fail it, time
how long the launcher takes to say which rank failed and why, and look for processes it left.

    outcome = provoke(recipes.failure_lab()["extra-all-reduce"])
    outcome.diagnosis.ranks, outcome.seconds, outcome.orphans
Runs in the notebook's process; `tables.failures` turns the outcomes into the chapter's table.
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from ..failures import Provoked, RunFailed
from ..spec import Experiment
from .cold import run, run_dir_for


def provoke(exp: Experiment, out=None) -> Provoked:
    """Run `exp` cold (a failed job would end a warm session anyway) and return what happened."""
    run_dir = Path(out) if out is not None else run_dir_for(exp)
    t0 = time.monotonic()
    try:
        run(exp, run_dir, progress=False, warm=False)
        diagnosis = None
    except RunFailed as e:
        diagnosis = e.diagnosis
    seconds = time.monotonic() - t0
    fault = exp.fault
    return Provoked(exp.name, fault.kind if fault else None, fault.rank if fault else None, diagnosis, seconds,
                    exp.timeout_s, orphans(run_dir))


def orphans(run_dir: Path) -> list[str]:
    """Command lines of live processes started for this run directory (or a launch staged beside it)."""
    needles = (str(run_dir), f"{run_dir.parent}/.{run_dir.name}.")
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except psutil.Error:
            continue
        if any(n in cmd for n in needles) and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(cmd)
    return found
