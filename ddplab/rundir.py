"""The run directory: the files that carry a run from the launcher to the ranks and back.

    runs/<name>-<hash>/
        spec.json              the Experiment, written by the launcher
        rank{r}.json           rank r's results, written atomically at the end
        rank{r}.pt             rank r's tensors (probes), loaded with weights_only=True
        rank{r}.progress       JSON lines: which phase of which step rank r entered, and when
        rank{r}.error.json     written by a rank that fails: its phase and traceback
        rank{r}.memory.pickle  CUDA allocator snapshot (the memory-snapshot probe; pytorch.org/memory_viz)
        rank{r}.memory-timeline.json  the profiler's memory timeline by category (the profile probe)
        traces/rank{r}.pt.trace.json  the profiler's chrome trace (the profile probe; every rank's in one
                               folder, nothing else there, as Holistic Trace Analysis reads it)
        checkpoint/            a saving run's checkpoint (the resume task, spec/resume.py): DCP's files and
                               each rank's rank{r}.state.pt
        checkpoint.seal.json   their digests under this account's key: a resume reads only a sealed
                               checkpoint (seal.py), since loading one unpickles it
        launch.log             torchrun's own output
        launch.json            the launcher's record: command, exit status, wall time, whether complete

Every stage hands the next a file, so a notebook can reload an old run, and a failed run keeps
whatever its ranks managed to write. A launch writes into a staging directory of its own
(`.<name>.<launch id>.partial` beside the final place) and `settle` moves it there when it ends: a
complete run replaces the old one; a failed one never destroys a complete one, it sits beside it. The schema of `rank{r}.json` is `record/`; the phases a
progress log may name are the task's (`spec.tasks`). Used by the launcher, the ranks and `results`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import traceback
from pathlib import Path

from . import processes

SPEC = "spec.json"
LOG = "launch.log"
LAUNCH = "launch.json"


def rank_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}.json"


def tensor_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}.pt"


def progress_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}.progress"


def error_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}.error.json"


def witness_file(directory: Path, rank: int, prefix: str = "") -> Path:
    """The rank's testimony (`rank/witness.py`: its stacks and torch's flight recorder, as JSON), written
    when it failed or when the launcher sent it `processes.WITNESS_SIGNAL`; a session's cell prefixes `job{n}.`."""
    return Path(directory) / f"{prefix}rank{rank}.witness.json"


def fatal_file(run_dir: Path, rank: int) -> Path:
    """Python's faulthandler dump of the rank's stacks: written by a rank a fatal signal (SIGABRT,
    SIGSEGV) killed; empty where a rank was ended otherwise (SIGTERM, SIGKILL) before it could remove it."""
    return run_dir / f"rank{rank}.fatal.txt"


def snapshot_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}.memory.pickle"


def trace_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "traces"


def trace_file(run_dir: Path, rank: int) -> Path:
    return trace_dir(run_dir) / f"rank{rank}.pt.trace.json"


def memory_timeline_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}.memory-timeline.json"


def write_json_atomic(path: Path, obj) -> None:
    """Write to a temporary file, then rename: a reader sees the whole file or none of it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def default_runs_dir() -> Path:
    """Where runs go unless told: $DDPLAB_RUNS, else ./runs."""
    return Path(os.environ.get("DDPLAB_RUNS", "runs"))


def check_writable(path: Path) -> None:
    """Raise the OSError that writing into `path` meets now (gone, read-only, disk full), if any."""
    probe = Path(path) / f".writable.{os.getpid()}"
    probe.write_text("")
    probe.unlink()


def save_tensors_atomic(path: Path, tensors: dict) -> None:
    """torch.save to a temporary file, then rename (loaded back with weights_only=True)."""
    import torch

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(tensors, tmp)
    os.replace(tmp, path)


def staging_dir(final: Path, launch_id: str) -> Path:
    """Where one launch writes until it is complete: beside its final place, named for the launch, so
    two launches never share a file (nor a command line that the process-tree kill matches)."""
    final = Path(final)
    return final.parent / f".{final.name}.{launch_id}.partial"


def final_dir(path: Path) -> Path:
    """Where `path`, inside a staging directory (`staging_dir`: the run's own, or its launch's), will be
    once its launch completes and `settle` has moved it; `path` itself if it is not staged."""
    parts = list(Path(path).parts)
    for i, part in enumerate(parts):
        if part.startswith(".") and part.endswith(".partial") and part.count(".") >= 3:
            parts[i] = part[1:-len(".partial")].rsplit(".", 1)[0]   # .<name>.<launch id>.partial -> <name>
    return Path(*parts)


def shown(path: Path) -> str:
    """`path` as a message shows it: relative to the current directory when it lies below it (a notebook's
    `runs/...`, no machine's layout in a stored output), else whole."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)


OWNER = ".owner.json"   # in a staging or session directory: the process that made it


def claim(directory: Path) -> None:
    """Record in `directory` (a launch's staging directory, a session's) the process that made it, so a
    later launch can tell it is dead once that process is gone (`owner_gone`)."""
    write_json_atomic(Path(directory) / OWNER, {"pid": os.getpid(), "host": socket.gethostname(),
                                               **(processes.identity(os.getpid()) or {})})


def owner_gone(directory: Path) -> bool:
    """True only if `directory`'s owner is provably gone (`processes.is_gone`: recorded on this host, in
    this boot and pid namespace, and no process with its pid has its start time now). No record, a
    damaged one, another host, boot or namespace we cannot see into: False (leave it be)."""
    try:
        return processes.is_gone(json.loads((Path(directory) / OWNER).read_text()))
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return False


def check_destination(final: Path) -> None:
    """Refuse, before anything starts, a destination a launch would replace but that is not a run: a
    launch replaces what is at its place, so that place must be new, empty, or an earlier run."""
    final = Path(final)
    if not final.name or final.name in (".", "..") or final.resolve() == Path.cwd().resolve():
        raise ValueError(f"out: {str(final)!r} names no directory of its own; give a run directory, e.g. runs/mine")
    if final.exists() and (not final.is_dir() or (any(final.iterdir()) and not is_run_dir(final))):
        raise ValueError(f"out: {final} already holds something that is not a ddplab run (no {SPEC} or {LAUNCH}); "
                         f"a run replaces what is at its place, so give a new or empty directory")


def is_run_dir(path: Path) -> bool:
    return (Path(path) / SPEC).exists() or (Path(path) / LAUNCH).exists()


def settle(staged: Path, final: Path, complete: bool) -> Path:
    """Move a finished launch's directory to its place; return where it went. A complete launch
    replaces what was at `final`; an incomplete one (failed, interrupted) takes `final` only if no
    complete run is there, and otherwise sits beside it as `<final>.failed-<launch id>`. Launches
    that settle into one place at once take turns (a lock file beside it)."""
    import fcntl

    staged, final = Path(staged), Path(final)
    (staged / OWNER).unlink(missing_ok=True)   # settled: no longer a staging directory
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not complete and _holds_complete_run(final):
            place = final.with_name(f"{final.name}.failed-{staged.name.split('.')[-2]}")
            os.replace(staged, place)
            return place
        if final.exists():
            old = final.with_name(f".{final.name}.{os.getpid()}.{time.time_ns()}.old")
            os.replace(final, old)
            os.replace(staged, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staged, final)
        return final


def _holds_complete_run(path: Path) -> bool:
    """A directory some launch completed: its launch record says every result loaded and agreed (a
    record from before that flag existed: the launch exited cleanly and no rank reported an error)."""
    try:
        launch = json.loads((Path(path) / LAUNCH).read_text())
    except (json.JSONDecodeError, OSError):
        return False
    if "complete" in launch:
        return launch["complete"] is True
    return launch.get("returncode") == 0 and not any(Path(path).rglob("rank*.error.json"))


class ProgressLog:
    """Append-only log of the phases a rank enters; the launcher reads it for progress and hangs.

    `phases` maps each phase name the task declared to its Phase; entering any other is a bug."""

    def __init__(self, run_dir: Path, rank: int, phases: dict):
        self.run_dir = Path(run_dir)
        self.phases = phases
        self._f = open(progress_file(run_dir, rank), "a", buffering=1)
        self.pid = os.getpid()   # the launcher looks at this process's state when the ranks stop moving
        self.host = socket.gethostname()   # ... on this host only: on other nodes the pid means nothing here
        self.start_ticks = processes.start_ticks(self.pid)   # so that a recycled pid is never taken for this rank
        self.last = {"phase": "start", "step": -1, "micro": 0}

    def enter(self, phase: str, step: int = -1, micro: int = 0, collective: str | None = None,
              detail: str | None = None) -> None:
        """Record that this rank enters `phase` (of step `step`, micro-step or position `micro`); the
        collective it will wait in (None: the phase's own, if any); `detail` names what it works on."""
        assert phase in self.phases, f"phase {phase!r} is not declared by the task"
        rec = {"t_ns": time.time_ns(), "phase": phase, "step": step, "micro": micro, "pid": self.pid,
               "start_ticks": self.start_ticks,
               "host": self.host}
        collective = collective if collective is not None else self.phases[phase].collective
        if collective:
            rec["collective"] = collective
        if detail:
            rec["detail"] = detail
        self.last = rec
        self._f.write(json.dumps(rec) + "\n")

    def close(self) -> None:
        self._f.close()


def read_progress(run_dir: Path, rank: int) -> list[dict]:
    """Every complete record in rank's progress log (a half-written last line is skipped)."""
    path = progress_file(run_dir, rank)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return records


def write_rank_error(run_dir: Path, rank: int, phase: str, step: int, e: BaseException) -> None:
    """This rank's error file (the launcher's diagnosis reads it), and the traceback on stderr."""
    write_json_atomic(error_file(run_dir, rank), {
        "rank": rank, "phase": phase, "step": step, "t_ns": time.time_ns(),
        "type": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()})
    traceback.print_exc()
