"""Compilation is progress: while torch.compile compiles on this rank (Dynamo tracing a frame, and the
backend's work under it: Inductor's code generation, its C++ compiler, loading the generated module),
the rank's progress log says so, so the launcher's watchdog gives compile its own bound
(`launch/watch.py`) and never takes a long compile for a hang in a collective.

Dynamo calls its compile callbacks once around the outermost compile (`torch._dynamo.callback`), also
for a backward compiled lazily at its first run. Each call appends the phase the rank is in again,
with "compiling": true at the start and false at the end. Runs inside a rank (`rank/worker.py`).

torch._dynamo.reset() clears every registered callback (the compiled_ddp task resets before each block),
so `at` and `again` register ours whenever they are no longer among Dynamo's.
"""

from __future__ import annotations

import json
import time

from ..rundir import ProgressLog, progress_file

_log: list = []   # the progress log of the experiment this rank is on
_file: list = []  # this module's own handle on it (appending whole lines, as ProgressLog does)


def at(log: ProgressLog, rank: int) -> None:
    """Mark compiles in `log` (a new experiment's log replaces the last)."""
    stop()
    _log.append(log)
    _file.append(open(progress_file(log.run_dir, rank), "a", buffering=1))
    again()


def again() -> None:
    """Register the callbacks unless Dynamo still has them: call after torch._dynamo.reset(), which clears them."""
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:   # a torch without Dynamo's callbacks: compiles get the usual stall limit
        return
    if _started not in callback_handler.start_callbacks:
        callback_handler.register_start_callback(_started)
    if _ended not in callback_handler.end_callbacks:
        callback_handler.register_end_callback(_ended)


def stop() -> None:
    """Stop marking (the experiment's log is closed)."""
    if _file:
        _file.pop().close()
    _log.clear()


def _started(args) -> None:
    _mark(True)


def _ended(args) -> None:
    _mark(False)


def _mark(on: bool) -> None:
    if not _log or not _file:
        return
    rec = {**_log[0].last, "t_ns": time.time_ns(), "compiling": on}
    rec.setdefault("pid", _log[0].pid)
    _file[0].write(json.dumps(rec) + "\n")
