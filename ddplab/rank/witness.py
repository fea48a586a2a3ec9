"""A rank's own testimony when a run goes wrong: every thread's Python stack at that moment, and torch's
flight recorder (the last collectives this process enqueued, each with its sequence number in its
process group; ProcessGroupGloo records them too on torch 2.13), written as JSON data to
`rank{r}.witness.json` of the run (`job{n}.rank{r}.witness.json` in a session). Runs inside a rank.

It is written
- when this rank fails (`rank.worker`: before its error file), and then it asks its peers on this host
  for theirs (SIGUSR2) and waits a moment for them, since torchrun stops them once this rank exits;
- when the launcher asks (SIGUSR2): its watchdog found the ranks stalled, or a `%%ddp` cell ran out of time.

The signal is blocked in every thread but one, which waits for it (`signal.sigwait`), so the testimony
is taken while the main thread is stuck inside a collective (gloo's wait releases the GIL) or in a loop
of its own. The first testimony of a run stands: it shows the rank at the moment it was asked.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from ..processes import WITNESS_SIGNAL, WITNESS_WAIT_S, ask_witnesses
from ..rundir import witness_file

SIGNAL = signal.Signals(WITNESS_SIGNAL)
FRAMES = 40              # innermost frames kept per thread
_where: tuple[Path, int, str] | None = None   # (directory, rank, file name prefix)
_seqs: dict | None = None   # a session's cell: each group's collectives before it began (`rank/cells.py`)
_lock = threading.Lock()


def block_signal() -> None:
    """Block SIGNAL in this thread, and so in every thread it starts later (call it first in a rank); a
    thread that unblocks it (a native library's own) gets a handler that does nothing, not the default
    action, which would end the rank."""
    signal.signal(SIGNAL, lambda *_: None)
    signal.pthread_sigmask(signal.SIG_BLOCK, {SIGNAL})


def start() -> None:
    """The thread that waits for SIGNAL and writes the testimony (once per process)."""
    def serve():
        while True:
            signal.sigwait({SIGNAL})
            try:
                write("asked")
            except Exception:  # noqa: BLE001 - a testimony that cannot be written must not end the rank
                pass
    threading.Thread(target=serve, name="ddplab-witness", daemon=True).start()


def at(directory, rank: int, prefix: str = "", seqs: dict | None = None) -> None:
    """Where this rank's testimony goes from now on (its current run, or a session's cell, with `seqs`:
    how many collectives each process group had run when the cell began)."""
    global _where, _seqs
    _where, _seqs = (Path(directory), rank, prefix), seqs


def _stacks() -> dict[str, list[dict]]:
    names = {t.ident: t.name for t in threading.enumerate()}
    out = {}
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():   # the writing thread: the witness's, or a failing rank's own (its traceback says where)
            continue
        frames = traceback.extract_stack(frame)[-FRAMES:]
        out[names.get(ident, str(ident))] = [{"file": f.filename, "line": f.lineno, "function": f.name,
                                              "code": f.line or ""} for f in frames]
    return out


def _flight() -> dict:
    """torch's flight recorder of this process as JSON data (collectives only, no C++ stacks)."""
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json

        raw = _dump_fr_trace_json(True, False)
        data = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        return {k: data.get(k) for k in ("version", "pg_config", "pg_status", "entries")}
    except Exception as e:  # noqa: BLE001 - said in the testimony, not raised
        return {"error": f"{type(e).__name__}: {e}"}


def write(why: str) -> Path | None:
    """Write this rank's testimony, unless this run already has one; its path (None: nowhere to write)."""
    where = _where
    if where is None:
        return None
    path = witness_file(*where)
    if not _lock.acquire(timeout=2.0):   # the other thread is writing it (a dump that blocks must not block this one)
        return path
    try:
        if path.exists():
            return path
        from ..rundir import write_json_atomic

        write_json_atomic(path, {"rank": where[1], "pid": os.getpid(), "t_ns": time.time_ns(), "why": why,
                                 "stacks": _stacks(), "flight": _flight(),
                                 **({"seqs_at_start": _seqs} if _seqs is not None else {})})
    finally:
        _lock.release()
    return path


def ask_peers(pids: dict[int, tuple], wait_s: float = WITNESS_WAIT_S) -> None:
    """Signal the peers (rank -> (pid, start ticks), on this host) for their testimony, and wait until each
    living one wrote it or `wait_s` passed (`processes.ask_witnesses`)."""
    where = _where
    if where is not None:
        ask_witnesses(pids, lambda r: witness_file(where[0], r, where[2]), wait_s)
