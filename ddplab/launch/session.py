"""A session of warm ranks: torchrun starts the ranks once, and every run that fits is a job for them.

    with ddplab.Session(world_size=4):
        run = ddplab.run(exp)            # a job for the warm ranks: no torchrun, no `import torch`
        runs = ddplab.run_many(exps)     # one job, the experiments in order, as one launch would

A cold launch pays torchrun, `import torch` on every rank, the process group and DDP's lazy imports
each time (seconds) for a step that takes milliseconds (`bench/session_latency.py` measures both).
A session pays them once: its ranks (`rank.worker --serve`) join the process group, then run each
job the launcher writes into the session directory, on process groups made fresh for the job, and
write the same run directories a cold launch writes, so `load_run` and every view are unchanged.

Failure is diagnosed as in a cold run (the same files, `failures.diagnose`); then the session is torn
down (a rank that crashed or hung leaves the process group unusable) and the next run starts another
(or launches cold). Ctrl-C, a hang, closing it or the launcher's death stop the whole tree and all its
cells started (`launch/keeper.py`). One session is current at a time; `run` uses it when it `fits`.

When none fits, `run(exp, warm=...)` decides (`reuse.for_launch`): True starts a session sized to the
launch and keeps it for the next runs, False launches cold, None (the default) starts one in a
Jupyter kernel (a notebook runs many experiments) and launches cold elsewhere (a script or `ddplab
run` usually runs one); $DDPLAB_WARM=1 or 0 sets that default. A session `run` started itself is
replaced when a run needs more ranks or another backend; one you opened (`Session(...)`,
`%ddp_start`) is never closed behind your back: a run that does not fit it launches cold. Whatever
is still open when Python exits is closed then.
"""

from __future__ import annotations

import atexit
import errno
import shutil
import subprocess
import threading
import time
import uuid
from pathlib import Path

from .. import deaths, failures, rundir
from ..spec import Experiment
from .nodes import Nodes
from .preflight import check_launch
from .cells import run_cell
from .keeper import REPORT, left_running
from .torchrun import interrupts_caught, kill_tree, start, sweep_dead, torchrun_argv, worker_env
from .diagnosis import dead_ranks
from .watch import Watch, collect

STARTUP_TIMEOUT_S = 120.0
SESSION_TIMEOUT_S = 60.0   # the default group's bound: the start, new_group of each job, and %%ddp cells' collectives
POLL_S = 0.002           # how often the launcher looks for a warm job's or cell's end
WATCH_POLL_S = 0.1       # how often it reads the ranks' progress logs meanwhile (as a cold launch does)
PEERS_GRACE_S = 2.0      # after a rank of a warm job fails, how long its peers may take to say so
IDLE_S = 3600.0            # a session closes by itself after an hour without a job (a forgotten kernel)
# The launcher owns that clock (a timer that closes the session under LOCK, so no job can be sent while
# the ranks leave); the ranks' own idle limit is only a backstop for a launcher that cannot act, far later.
RANK_IDLE_BACKSTOP = lambda idle_s: 2 * idle_s + 60   # noqa: E731
LOCK = threading.RLock()   # one launch or cell at a time on the session (a widget's click may run on another thread)
_current: "Session | None" = None
_last_end: str | None = None   # why the last current session ended, for "no session" messages


def last_end() -> str | None:
    """Why the last session that was current ended (closed, idle, failed, its directory deleted), or None."""
    if _current is not None and not _current.alive() and _current.ended is None:
        return f"it died between cells: {_current.death()}"
    return _current.ended if _current is not None and not _current.alive() else _last_end


def current() -> "Session | None":
    """The open session, if any (and alive)."""
    return _current if _current is not None and _current.alive() else None


def close_current() -> None:
    """Close the current session, if any (at exit, its ranks would die with this process anyway)."""
    if _current is not None:
        _current.close()


atexit.register(close_current)


def forget(s: "Session", why: str = "it was stopped after a failed, hung or interrupted job") -> None:
    """`s` is no session to run in any more (torn down after a failed job)."""
    global _current, _last_end
    s.ended = s.ended or why
    if _current is s:
        _current, _last_end = None, s.ended


class Session:
    """`world_size` warm ranks on `backend`/`device` ("auto": as a cold launch of that many ranks
    would choose). Opening one makes it current; `close()` (or leaving its `with` block) stops it.
    `implicit`: `run` started it (`reuse.for_launch`), so `run` may replace it."""

    poll_s = POLL_S   # how often the launcher looks for a job's or a cell's end (launch/cells.py reads it)

    def __init__(self, world_size: int = 4, backend: str = "auto", device: str = "auto", pin_cpus: bool = False,
                 runs_dir=None, startup_timeout_s: float = STARTUP_TIMEOUT_S, timeout_s: float = SESSION_TIMEOUT_S,
                 implicit: bool = False, on_start=None):
        # the spec's own validation: the same ValueError naming the field, before anything starts
        Experiment(world_size=world_size, backend=backend, device=device, pin_cpus=pin_cpus, timeout_s=timeout_s)
        self.nodes = Nodes.from_env()   # on several nodes, as many ranks as fill each node alike
        self.backend, self.device = check_launch([Experiment(world_size=world_size, backend=backend, device=device)],
                                              self.nodes)
        self.world_size, self.pin_cpus, self.timeout_s = self.nodes.total(world_size), pin_cpus, timeout_s
        sessions = Path(runs_dir or rundir.default_runs_dir()) / ".sessions"
        sweep_dead(sessions, "*")   # sessions of processes that are gone (a closed one removes its own)
        self.dir = (sessions / uuid.uuid4().hex[:12]).resolve()
        self.dir.mkdir(parents=True)
        rundir.claim(self.dir)
        rundir.write_json_atomic(self.dir / "session.json", {
            "world_size": self.world_size, "nodes": self.nodes.record, "backend": self.backend, "device": self.device,
            "pin_cpus": pin_cpus, "timeout_s": timeout_s, "idle_s": RANK_IDLE_BACKSTOP(IDLE_S)})
        self.argv = torchrun_argv(self.world_size, ["--serve", self.dir], nodes=self.nodes)
        self.died = ""   # once its ranks died under a %%ddp cell or a job: how (`death()`), else ""
        self.ended: str | None = None   # why it ended, once it has
        self._idle_timer: threading.Timer | None = None
        self.implicit, self.jobs = implicit, 0
        self.log_offset = 0   # where the current job's part of the session's log starts
        self.cell_status: dict[int, dict] = {}
        self.cell_witness = None   # after a cell that hung: (flight verdict, rank -> stack, rank -> where), launch/cells.py
        self.cells = 0   # %%ddp cells run: they may change a rank's global torch state, so runs then go cold
        self.proc = None
        self.stopped: list[str] = []   # what its cells and jobs started and left running, stopped at close
        close_current()   # one session at a time: the old one's ranks leave before the new ones start
        self._log = open(self.dir / rundir.LOG, "w")
        with interrupts_caught() as interrupted:   # a Ctrl-C now is a flag: the kill below cannot be cut short
            try:
                env = worker_env(nodes=self.nodes, flight_dir=self.dir)
                self.proc = start(self.argv, env, self._log, outlive_thread=True, report=self.dir / REPORT)
                self._wait_until_ready(startup_timeout_s, interrupted, on_start)
            except BaseException:   # a failed start: no rank may wait on for jobs
                self.kill()
                raise
        if interrupted:
            self.kill()
            raise failures.Interrupted(f"interrupted: the session's {world_size} ranks stopped while starting")
        global _current
        _current = self
        self._arm_idle()

    # -- the idle clock: the launcher's, so a job and the ranks' leaving never cross -------------------
    def _arm_idle(self) -> None:
        """(Re)start the idle clock now: IDLE_S from the end of the last job or cell."""
        self.last_active = time.monotonic()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._idle_timer = threading.Timer(IDLE_S, self._idle_close)
        self._idle_timer.daemon = True
        self._idle_timer.start()

    def _idle_close(self) -> None:
        with LOCK:   # no job or cell is running or can start while the ranks leave
            if not self.alive() or self.ended is not None:
                return
            if time.monotonic() - self.last_active < IDLE_S:   # a job ran meanwhile and re-armed the clock
                return
            self.close(why=f"it closed itself after {IDLE_S:g} s without a job")

    # -- life ------------------------------------------------------------------------------------
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def fits(self, exps: list[Experiment], backend: str, device: str) -> bool:
        """Can this session run these experiments as one launch would? Not once a `%%ddp` cell ran on
        it: a cell may change what a job depends on (default dtype, grad mode, global hooks, memory)."""
        return (self.alive() and self.ended is None and self.cells == 0 and self.dir.exists()
                and max(e.world_size for e in exps) <= self.world_size and self.nodes == Nodes.from_env()
                and (backend, device) == (self.backend, self.device)
                and all(e.pin_cpus == self.pin_cpus for e in exps))

    def _wait_until_ready(self, timeout_s: float, interrupted: list, on_start=None) -> None:
        """Until every rank says it is ready; `on_start(line)`, if given, hears where each rank is, twice a second."""
        t0 = time.monotonic()
        deadline, said = t0 + timeout_s, 0.0
        watch = Watch([(Experiment(world_size=self.world_size), self.dir)])   # sees a rank frozen while importing
        watch.agent_pid = self.proc.pid
        while not interrupted:
            progress, errors, _ = collect(self.dir, self.world_size)
            watch.poll(), watch.look_at_processes()
            if all(p and p[-1]["phase"] == "done" for p in progress.values()):
                return
            if on_start is not None and time.monotonic() - said >= 0.5:
                said = time.monotonic()
                on_start(f"starting {self.world_size} ranks ({said - t0:.1f} s): " + ", ".join(
                    f"rank {r} {'ready' if p and p[-1]['phase'] == 'done' else p[-1]['phase'] if p else 'in torchrun and import torch'}"
                    for r, p in sorted(progress.items())))
            if errors or self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                diagnosis = failures.diagnose(progress, errors, set(), self.world_size, timeout_s,
                                              time.monotonic() > deadline, watch.phases[0], watch.frozen,
                                              dead_ranks(self.dir, self.dir, self.world_size, set(errors)))
                diagnosis.summary = "The session's ranks could not start. " + diagnosis.summary
                raise failures.RunFailed(diagnosis, self.dir)
            time.sleep(0.05)

    def close(self, why: str = "it was closed") -> None:
        """Ask the ranks to leave (they tear their process group down), then make sure they did."""
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        forget(self, why)
        try:
            if self.alive():
                rundir.write_json_atomic(self.dir / f"job{self.jobs}.json", {"stop": True})
                self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):   # its directory is gone, or a rank would not leave
            pass
        finally:
            self.kill()
        if self.proc is None or self.proc.poll() is not None:   # its ranks are gone: so is what they read
            self.stopped = left_running(self.dir / REPORT)   # what the keeper stopped (launch/keeper.py)
            shutil.rmtree(self.dir, ignore_errors=True)

    def death(self) -> str:
        """How the session's processes died (`deaths.session_death`); "" while it is alive."""
        code = None if self.proc is None else self.proc.poll()
        return "" if code is None else deaths.session_death(code, self.log_since_submit(),
                                                             None if self.dir.exists() else self.dir)

    def forget(self, why: str) -> None:
        """This session is no session to run in any more (`forget`)."""
        forget(self, why)

    def kill(self) -> None:
        """Stop the whole process tree now (a failed job, a hang, Ctrl-C): no orphans."""
        if self.proc is not None:
            kill_tree(self.proc, self.dir)
        if not self._log.closed:
            self._log.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.kill()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the parent-death signal still holds
            pass

    def __repr__(self) -> str:
        return f"Session({self.world_size} ranks on {self.backend}/{self.device}, {self.jobs} jobs, {'alive' if self.alive() else 'closed'})"

    # -- jobs ------------------------------------------------------------------------------------
    def submit(self, spec_paths: list[Path], launch_id: str) -> int:
        """Hand the ranks one job; its number. The log offset marks where its output starts."""
        n = self.jobs
        self._log.flush()
        self.log_offset = (self.dir / rundir.LOG).stat().st_size
        rundir.write_json_atomic(self.dir / f"job{n}.json", {"specs": [str(p) for p in spec_paths],
                                                              "launch_id": launch_id})
        self.jobs += 1
        return n

    def run_job(self, spec_paths, launch_id: str, watch, reporter, t0: float, startup_timeout_s: float, starting: str):
        """Run a launch as one job of this session and follow it as `cold._torchrun` follows a cold
        launch (the same watch, progress line and watchdog). A job that fails, hangs or is
        interrupted poisons the session: it is torn down (the ranks' files stay for the diagnosis).
        Returns (torchrun's process, stopped by the watchdog, interrupted)."""
        watchdog, failed_at, finished = False, None, False
        with interrupts_caught() as interrupted:
            try:
                n = self.submit(spec_paths, launch_id)
                reporter.update(starting)
                last_poll = 0.0
                while not interrupted and self.alive():
                    if self.done(n):
                        finished = True
                        break
                    time.sleep(POLL_S)
                    now = time.monotonic()
                    if now - last_poll < WATCH_POLL_S:
                        continue
                    last_poll = now
                    if watch.poll():
                        reporter.watch(watch, now - t0)
                    watch.look_at_processes()
                    if not self.dir.exists() or not all(p.exists() for p in spec_paths):
                        break   # the session's or the run's directory was deleted under the ranks: stop them
                    if failed_at is None and any(rundir.error_file(p.parent, r).exists()
                                                 for p in spec_paths for r in range(self.world_size)):
                        failed_at = now   # a rank failed: its peers get a moment to write what they saw
                    if (failed_at is not None and now - failed_at > PEERS_GRACE_S) or watch.stalled(startup_timeout_s):
                        watchdog = failed_at is None
                        if watchdog:   # the ranks' stacks and flight records, before they are stopped
                            watch.ask_witnesses()
                        break
            finally:
                if finished:
                    self._arm_idle()
                else:   # `died`: how torchrun died if it ended by itself, not stopped here (cold.py asks)
                    self.died = "" if self.alive() else self.death()
                    self.kill()
                    forget(self, "its directory was deleted during a job" if not self.dir.exists() else
                                 self.died or "it was stopped after a failed, hung or interrupted job")
        if not interrupted and not finished:   # said as a cold launch says it, naming the directory that went
            if not self.dir.exists():
                raise failures.RunFailed(failures.session_dir_lost(self.dir), None)
            if gone := [p for p in spec_paths if not p.exists()]:
                raise FileNotFoundError(errno.ENOENT, "the run directory disappeared during the run", str(gone[0].parent))
        return self.proc, watchdog, bool(interrupted)

    def done(self, n: int) -> bool:
        return all((self.dir / f"job{n}.rank{r}.done").exists() for r in range(self.world_size))

    def execute(self, code: str, ranks: list[int] | None = None, live=None) -> dict[int, dict | None]:
        """Run `code` on `ranks` (default: all) as a `%%ddp` cell (`rank/cells.py`): rank -> its stdout,
        stderr, last value and error, or None for a rank that never finished (it hung: the session is
        then torn down, as after any hang). Ctrl-C stops the cell and the session. `live(printed, note)`
        sees what each rank printed while the cell runs (`launch/cells.py`)."""
        with LOCK:
            return run_cell(self, code, ranks, live)

    def _stop_for_lost_dir(self, when: str) -> None:
        """Its directory is gone (the ranks read their jobs there): stop them and say so."""
        self.kill()
        forget(self, "its directory was deleted")
        raise RuntimeError(f"this session's directory {self.dir} was deleted{when}, so its ranks were stopped: "
                           f"start a new one (%ddp_start)")

    def log_since_submit(self) -> str:
        try:
            with open(self.dir / rundir.LOG, "rb") as f:
                f.seek(self.log_offset)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return f"(the session's log went with its directory {self.dir})\n"
