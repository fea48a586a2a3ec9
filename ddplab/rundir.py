"""The run directory: the files that carry a run from the launcher to the ranks and back.

    runs/<name>-<hash>/
        spec.json              the Experiment, written by the launcher
        rank{r}.json           rank r's results, written atomically at the end
        rank{r}.pt             rank r's tensors (probes), loaded with weights_only=True
        rank{r}.progress       JSON lines: which phase of which step rank r entered, and when
        rank{r}.error.json     written by a rank that fails: its phase and traceback
        rank{r}.memory.pickle  CUDA allocator snapshot (the memory-snapshot probe; pytorch.org/memory_viz)
        launch.log             torchrun's own output
        launch.json            the launcher's record: command, exit status, wall time

Every stage hands the next a file, so a notebook can reload an old run, and a failed run keeps
whatever its ranks managed to write. The schema of `rank{r}.json` is `record.py`; the phases a
progress log may name are the task's (`spec.tasks`). Used by the launcher, the ranks and `results`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

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


def snapshot_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}.memory.pickle"


def write_json_atomic(path: Path, obj) -> None:
    """Write to a temporary file, then rename: a reader sees the whole file or none of it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def save_tensors_atomic(path: Path, tensors: dict) -> None:
    """torch.save to a temporary file, then rename (loaded back with weights_only=True)."""
    import torch

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(tensors, tmp)
    os.replace(tmp, path)


def clear(run_dir: Path) -> None:
    """Remove what an earlier run with the same spec left, so stale files can never pass as new."""
    run_dir = Path(run_dir)
    for pattern in ("rank*.json", "rank*.pt", "rank*.progress", "rank*.pickle", ".rank*", SPEC, LOG, LAUNCH):
        for f in run_dir.glob(pattern):
            f.unlink()


class ProgressLog:
    """Append-only log of the phases a rank enters; the launcher reads it for progress and hangs.

    `phases` maps each phase name the task declared to its Phase; entering any other is a bug."""

    def __init__(self, run_dir: Path, rank: int, phases: dict):
        self.run_dir = Path(run_dir)
        self.phases = phases
        self._f = open(progress_file(run_dir, rank), "a", buffering=1)
        self.last = {"phase": "start", "step": -1, "micro": 0}

    def enter(self, phase: str, step: int = -1, micro: int = 0, collective: str | None = None,
              detail: str | None = None) -> None:
        """Record that this rank enters `phase` (of step `step`, micro-step or position `micro`); the
        collective it will wait in (None: the phase's own, if any); `detail` names what it works on."""
        assert phase in self.phases, f"phase {phase!r} is not declared by the task"
        rec = {"t_ns": time.time_ns(), "phase": phase, "step": step, "micro": micro}
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
