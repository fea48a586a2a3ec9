"""Which experiment of a launch went wrong first, and why: the ranks' files (`watch.collect`), torchrun's
report and the faulthandler dumps of ranks that left no file (`deaths.py`), read by
`failures.diagnose`. Used by the cold launch and a session's job alike (`launch/cold.py`).

How a failure or a hang is diagnosed, in the order it happens (start here):

1. In each rank, as it runs: `rundir.ProgressLog.enter` appends every phase it enters, with its pid, host
   and start ticks (`processes.start_ticks`). A rank that raises writes its error file
   (`rank/worker.py` -> `rundir.write_rank_error`), then its testimony (`rank/witness.py`, `witness.write`:
   its stacks and torch's flight recorder), and asks its peers on this host for theirs (`witness.ask_peers`
   -> `processes.ask_witnesses`); a fatal signal leaves Python's faulthandler dump (`rundir.fatal_file`).
2. In the launcher, while torchrun runs (`launch/cold.py`, `_torchrun`): `watch.Watch.poll` reads the
   progress logs; `Watch.look_at_processes` notes a rank whose process is stopped (its state, through
   psutil; before a rank's first record, `processes.ranks_under` finds it by its name or RANK); when nothing
   moved for too long (`Watch.stalled`), `Watch.ask_witnesses` sends the witness signal to each rank
   process (`processes.ask_witnesses`: only that very process, `processes.is_live_rank`) and waits for
   the testimonies, then `torchrun.kill_tree` stops the run.
3. After torchrun ended, `first_failure` (here): `watch.collect` reads each experiment's progress, error
   and result files and picks the experiment with the earliest error of its own; `deaths.agent_death`
   says how torchrun itself ended if something outside killed it; `dead_ranks` reads what is known of
   ranks that left no file: torchrun's report in launch.log (`deaths.deaths_from`: exit codes, signals,
   native error lines, NCCL's watchdog timeouts, lost nodes) and NCCL's flight dumps (`deaths.flight_records`).
4. `failures.diagnose` (pure) decides, trying in order: a lost node ("node-lost"); torchrun killed from
   outside with no rank's own error first ("agent-died"); the earliest error that is neither a timeout nor
   a lost peer ("crash"); a hang, where the watchdog stopped the run, a rank was frozen or a collective
   timed out (`failures.diagnose_hang`: a frozen rank, else all ranks compiling ("compile-timeout"), else
   the ranks behind the lead phase; refined by NCCL's timeouts); NCCL's timeouts alone; a rank that left
   no word while its peers lost it ("missing-result"); a lost peer ("crash"); else "missing-result".
5. `testify` (here) puts torch's witnesses beside it: `witnesses.testimony` runs torch's flight-recorder
   analyzer over the testimonies (`witnesses.flight_verdict`) and shows where each asked rank was
   (`witnesses.stack`); `witnesses.verify_same_rank` checks that ddplab and torch blame the same rank(s).
   `failures.RunFailed` carries the diagnosis to the user.

A session's job takes the same path: `launch/session.py` calls `failures.diagnose` with `dead_ranks`, and
`launch/cells.py` asks for the testimonies when a `%%ddp` cell runs out of time. Each case, what it says
and the torch behaviour it rests on: docs/deaths.md; the process rules: `processes.py`.
"""

from __future__ import annotations

from pathlib import Path

from .. import deaths, failures, rundir
from .torchrun import _is_srun, kill_tree
from .watch import collect

LOG_TAIL_LINES = 25


def first_failure(exps, run_dirs, launch_dir: Path, proc, timeout_s: float, watchdog: bool, spec_path: Path,
                   frozen: dict, flight_dir: Path, agent_watched: bool = False):
    """RunFailed for the experiment where the launch went wrong first, else None: the one holding the
    earliest error of its own (an exception that is neither a collective's timeout nor a lost peer,
    which are consequences of another rank's trouble): a rank may fail in a later experiment while
    torchrun then stops an earlier one's ranks, which leave no result; their silence is the
    consequence, the error the cause. Else the first experiment some rank of which failed or left no
    result (a rank stuck in experiment A makes the others time out in B: A is blamed).
    `frozen`: the ranks the watch saw frozen, and their process state; `flight_dir`: where NCCL's
    flight recorder dumped (the launch's directory, or its session's); `agent_watched`: `proc` is a cold
    launch's torchrun, which only something outside the launch can have ended by a signal unless the
    watchdog stopped it, or a session's that ended by itself during the job (`Session.died`; a session's
    job stops its torchrun itself on a failure, which says nothing of torchrun's own death)."""
    failed = []
    for exp, run_dir in zip(exps, run_dirs):
        prog, errors, finished = collect(run_dir, exp.world_size)
        if errors or len(finished) < exp.world_size:
            failed.append((exp, run_dir, prog, errors, finished))
    if not failed:
        return None
    if proc.returncode not in (0, None):
        kill_tree(proc, spec_path)  # torchrun stopped its ranks; sweep for any that escaped
    log = launch_dir / rundir.LOG
    agent = (deaths.agent_death(proc.returncode, log.read_text(errors="replace") if log.exists() else "")
             if agent_watched and not watchdog and not _is_srun(proc.args) else "")   # srun's code: its tasks' codes

    def first_cause_ns(f) -> float:   # one host's clock: across nodes the order is approximate
        times = [e.get("t_ns") for e in f[3].values() if not failures.is_timeout(e) and not failures.is_lost_peer(e)]
        return min((t for t in times if isinstance(t, int)), default=float("inf"))

    caused = [f for f in failed if first_cause_ns(f) < float("inf")]
    exp, run_dir, prog, errors, finished = min(caused, key=first_cause_ns) if caused else failed[0]
    diagnosis = failures.diagnose(prog, errors, finished, exp.world_size, timeout_s, watchdog,
                                  exp.task.all_phases(),
                                  {r: state for r, state in frozen.items() if r < exp.world_size},
                                  dead_ranks(run_dir, launch_dir, exp.world_size, finished | set(errors), flight_dir,
                                             agent))
    testify(diagnosis, run_dir, exp.world_size)
    if diagnosis.kind in ("missing-result", "agent-died"):  # no rank could explain itself: show what torchrun saw
        diagnosis.log_tail = "\n".join((launch_dir / rundir.LOG).read_text().splitlines()[-LOG_TAIL_LINES:])
    return failures.RunFailed(diagnosis, run_dir)


def testify(diagnosis, directory: Path, world_size: int, prefix: str = "") -> None:
    """Put torch's witnesses beside ddplab's diagnosis: its flight recorder analyzer's verdict on the ranks'
    records, and where each rank the launcher asked was (`witnesses`)."""
    from .. import witnesses

    try:
        said = witnesses.testimony(directory, world_size, prefix)
        if said is not None:
            diagnosis.flight, diagnosis.stacks = said
    except Exception as e:  # noqa: BLE001 - ddplab's diagnosis stands; torch's view is said to be missing
        diagnosis.flight = None
        diagnosis.summary += f" (torch's witnesses could not be read: {type(e).__name__}: {e})"


def dead_ranks(run_dir: Path, launch_dir: Path, world_size: int, accounted: set[int],
               flight_dir: Path | None = None, agent: str = "") -> deaths.Deaths | None:
    """What torchrun's report and the ranks' faulthandler dumps say of ranks that left no file, and how
    torchrun itself died if something outside ended it (`agent`, `deaths.agent_death`)."""
    silent = set(range(world_size)) - accounted
    if not silent:
        return None
    log = launch_dir / rundir.LOG
    stacks = {r: f.read_text() for r in silent if (f := rundir.fatal_file(run_dir, r)).exists() and f.stat().st_size}
    dead = deaths.deaths_from(log.read_text(errors="replace") if log.exists() else "", stacks)
    dead.flight = deaths.flight_records(flight_dir or launch_dir, world_size)
    dead.agent = agent
    return dead
