"""Follow a launch from its ranks' files: how far each rank is, when the launch last moved, and what
every rank left behind when it ends (progress logs, error files, results). Reads files only.
Used by every launch (every notebook).
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from .. import failures, processes, rundir
from ..spec import Experiment
from .progress import describe

STALL_GRACE_S = 10.0
STILL_S = 1.0   # how long nothing moves before the watch looks at the ranks' process states
FROZEN = ("stopped", "tracing-stop")   # psutil's states of a process that SIGSTOP, Ctrl-Z or a debugger froze
# torch.compile's own bound: a rank compiling (its progress log says so, `rank/compiling.py`) makes progress
# however long nothing else moves; an inductor compile of a large model on a few cores takes minutes
COMPILE_LIMIT_S = 900.0


def compile_limit_s() -> float:
    """How long one compile may run: $DDPLAB_COMPILE_LIMIT_S (seconds, > 0) if set, else COMPILE_LIMIT_S."""
    given = os.environ.get("DDPLAB_COMPILE_LIMIT_S")
    if not given:
        return COMPILE_LIMIT_S
    try:
        limit = float(given)
    except ValueError:
        limit = float("nan")
    if not limit > 0 or limit == float("inf"):
        raise ValueError(f"DDPLAB_COMPILE_LIMIT_S: a number of seconds > 0 (got {given!r})")
    return limit


class Watch:
    """Reads every rank's progress log incrementally; knows how far the ranks are and when the launch
    last moved. A rank's steps done: the step of its latest phase, plus one if that phase ends a step."""

    def __init__(self, runs: list[tuple[Experiment, Path]]):
        self.runs = runs
        self.phases = [e.task.all_phases() for e, _ in runs]
        self.offsets: dict[Path, int] = {}
        self.last: dict[int, dict[int, dict]] = {i: {} for i in range(len(runs))}   # run index -> rank -> record
        self.steps_done: dict[int, dict[int, int]] = {i: {} for i in range(len(runs))}
        self.current = 0
        self.last_move = time.monotonic()
        self.started = False
        self.frozen: dict[int, str] = {}   # rank -> process state (a rank is one process for the whole launch)
        self.compiling: dict[int, float] = {}   # rank -> since when (monotonic) it compiles (torch.compile)
        self.agent_pid: int | None = None   # torchrun's agent: its children are the ranks, even before their first record
        self._looked = self._said = 0.0
        self.compile_limit_s = compile_limit_s()

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
                    self.frozen.pop(r, None)   # it moves again
                    if rec.get("compiling"):
                        self.compiling.setdefault(r, time.monotonic())
                    else:
                        self.compiling.pop(r, None)
                    phase = self.phases[i].get(rec["phase"])
                    done = rec.get("step", -1) + (1 if phase is not None and phase.ends_step else 0)
                    if rec["phase"] == "done":   # a finished rank did every step, whatever its last phase counted
                        done = exp.task.total_steps(exp)
                    self.steps_done[i][r] = max(self.steps_done[i].get(r, 0), done)
                moved = True
        self.current = self._current()
        if moved:
            self.last_move, self.started = time.monotonic(), True
        return moved

    def look_at_processes(self) -> None:
        """Once the launch has stood still for STILL_S, note every rank whose process is frozen (a
        stopped process writes nothing, and its peers wait in a collective as if it were slow).
        At most once a second; a rank that moves again is unmarked by `poll`."""
        now = time.monotonic()
        if now - self.last_move < STILL_S or now - self._looked < 1.0:
            return
        self._looked = now
        import psutil

        here = socket.gethostname()   # a rank on another node (srun) has a pid of that host's
        pids = {r: rec["pid"] for ranks in self.last.values() for r, rec in ranks.items()
                if "pid" in rec and rec.get("host", here) == here}
        pids.update({r: pid for r, pid in self._unrecorded_ranks().items() if r not in pids})
        for r, pid in pids.items():
            try:
                state = psutil.Process(pid).status()
            except psutil.Error:
                continue
            if state in FROZEN:
                self.frozen[r] = state

    def _unrecorded_ranks(self) -> dict[int, int]:
        """rank -> pid of the rank processes under torchrun (`agent_pid`: it, or the process above it), found
        before their first progress record (still importing torch, or joining): torchrun gives each its RANK."""
        if self.agent_pid is None:
            return {}
        return processes.ranks_under(self.agent_pid, processes.WORKER)   # not torchrun's own helpers, the keeper's

    def compile_news(self) -> bool:
        """True at most once a second while a rank compiles: its line should say for how long."""
        now = time.monotonic()
        if not self.compiling or now - self._said < 1.0:
            return False
        self._said = now
        return True

    def _compiling_said(self, r: int) -> str:
        """' (compiling 12 s)', or ' (still compiling 75 s; compile's bound 900 s)' once past the usual limit."""
        if r not in self.compiling:
            return ""
        took = time.monotonic() - self.compiling[r]
        if took > max(e.timeout_s for e, _ in self.runs) + STALL_GRACE_S:
            return f" (still compiling {took:.0f} s; compile's bound {self.compile_limit_s:g} s)"
        return f" (compiling {took:.0f} s)"

    def _current(self) -> int:
        """The experiment the launch is on: the first that has started and some rank of which has not
        written its result yet (ranks outside a smaller experiment wait at its gate, then start the next)."""
        started = [i for i in range(len(self.runs)) if self.last[i]]
        for i in started:
            exp, run_dir = self.runs[i]
            if not all(rundir.rank_file(run_dir, r).exists() for r in range(exp.world_size)):
                return i
        return started[-1] if started else 0

    def line(self, elapsed_s: float) -> str:
        exp, _ = self.runs[self.current]
        last, done = self.last[self.current], self.steps_done[self.current]
        phase = "starting"
        if last:
            r, rec = min(last.items(), key=lambda kv: failures.phase_key(kv[1], self.phases[self.current]))
            phase = _phase(rec) + self._compiling_said(r)
        name = exp.name if len(self.runs) == 1 else f"{self.current + 1}/{len(self.runs)} {exp.name}"
        return describe(name, exp.world_size, [done.get(r, 0) for r in sorted(last)], exp.task.total_steps(exp),
                        phase, elapsed_s, exp.task.step_unit)

    def ranks(self) -> tuple[int, Experiment, dict[int, tuple[int, str]]]:
        """The experiment the launch is on (its index, its spec) and, for each of its ranks, the steps
        done and the phase it is in ('starting' before its first record; a frozen process says so)."""
        i = self.current
        exp, _ = self.runs[i]
        last, done = self.last[i], self.steps_done[i]
        ranks = {}
        for r in range(exp.world_size):
            phase = _phase(last[r]) if r in last else "starting"
            ranks[r] = (done.get(r, 0), phase + (f" ({self.frozen[r]})" if r in self.frozen else "")
                        + self._compiling_said(r))
        return i, exp, ranks

    def ask_witnesses(self, wait_s: float = processes.WITNESS_WAIT_S) -> None:
        """Before the watchdog stops a stalled launch: ask every rank of the current experiment on this host
        for its testimony (its stacks and torch's flight recorder, `rank/witness.py`), and give them
        `wait_s` to write it."""
        _, run_dir = self.runs[self.current]
        processes.ask_witnesses(processes.rank_processes(self.last[self.current]),
                                lambda r: rundir.witness_file(run_dir, r), wait_s=wait_s)

    def limit_s(self, startup_timeout_s: float) -> float:
        """How long the launch may stand still: a collective's timeout and a grace, or the start-up bound;
        while a rank compiles, compile's own bound (compilation is progress)."""
        limit = max(e.timeout_s for e, _ in self.runs) + STALL_GRACE_S if self.started else startup_timeout_s
        return max(limit, self.compile_limit_s) if self.compiling else limit

    def stalled(self, startup_timeout_s: float) -> bool:
        return time.monotonic() - self.last_move > self.limit_s(startup_timeout_s)


def _phase(rec: dict) -> str:
    """A progress record's phase and its detail: 'backward', 'round ddp:1'."""
    return rec["phase"] + (f" {rec['detail']}" if rec.get("detail") else "")


def collect(run_dir: Path, world_size: int) -> tuple[dict, dict, set]:
    """Every rank's progress records, its error record (a rank that raised), and the ranks that
    wrote a result."""
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
