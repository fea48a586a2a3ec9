"""What this machine offers a run, decided the same way in the launcher and in every rank (pure:
torch is imported only to count GPUs).

`choose_backend` lets the launcher refuse an impossible request (more NCCL ranks than GPUs) before
any process starts; `die_with_parent` is the Linux hook that keeps a process from outliving the one
that started it (torchrun under the launcher, each rank under torchrun): no orphans. `is_live_rank` and
`ask_witnesses`: which process is a rank of ours, and asking ranks for their testimony (`rank/witness.py`).
Used by the launcher and the worker of every notebook's runs.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1


def import_torch_frozen(*also: str):
    """`import torch` (and the modules named in `also`) for a process that starts once and lives for a
    launch (a rank, torchrun's agent): with the cyclic collector off during the imports, then
    everything they made frozen out of later collections (`gc.freeze`) and the collector back on. The
    imports make about a million objects that live as long as the process, so collecting during them
    only scans those objects again and again, and so does every later collection (a step's garbage).
    A rank passes "torch._dynamo", which DDP's constructor imports anyway (it asks dynamo for its
    optimize_ddp mode): a DDP rank's start then costs about 0.7x the CPU-seconds of plain imports
    (`python bench/rank_startup.py`)."""
    import gc
    import importlib

    gc.disable()
    try:
        import torch

        for name in also:
            importlib.import_module(name)
    finally:
        gc.freeze()
        gc.enable()
    return torch


def cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def choose_backend(backend: str, device: str, world_size: int, cuda_devices: int) -> tuple[str, str]:
    """(backend, device type) for a request; ValueError if it cannot run on `cuda_devices` GPUs."""
    if backend == "auto":
        backend = "nccl" if device != "cpu" and cuda_devices >= world_size else "gloo"
    if device == "auto":
        device = "cuda" if backend == "nccl" else "cpu"
    if backend == "nccl" and cuda_devices < world_size:
        raise ValueError(f"Experiment.backend: NCCL needs one GPU per rank; world_size is {world_size} "
                         f"but this machine has {cuda_devices} CUDA device(s). Use backend='gloo'.")
    if device == "cuda" and cuda_devices == 0:
        raise ValueError("Experiment.device: 'cuda' was asked for but this machine has no CUDA device")
    return backend, device


AGENTS = ("torch.distributed.run", "ddplab.launch.loopback")   # the modules a torchrun agent runs as (`-m`)


def parent_is_torchrun() -> bool:
    """Is this process still the child of a torchrun agent (torchrun, `python -m torch.distributed.run`, or
    ddplab's entry to it, `launch.loopback`)? False once it was re-parented to init or to a subreaper (the
    agent died before `die_with_parent` was armed): the keeper (`launch/keeper.py`) is one, and its own
    command line carries the agent's after `--`, which is not read. True where the parent cannot be read."""
    import psutil

    ppid = os.getppid()
    if ppid == 1:
        return False
    try:
        args = psutil.Process(ppid).cmdline()
    except psutil.Error:
        return True
    own = args[: args.index("--")] if "--" in args else args   # the program the parent itself runs
    return any(a in AGENTS or Path(a).name == "torchrun" for a in own)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send `sig` (SIGKILL) to this process when its parent dies (PR_SET_PDEATHSIG).
    Called by every rank, and in the launcher's child between fork and exec of torchrun (of srun with
    SIGTERM, which srun forwards to the agents on every node: a SIGKILLed srun could stop none)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)


LOOPBACK = "127.0.0.1"


def loopback_interface() -> str | None:
    """The name of the interface that holds 127.0.0.1 ("lo" on Linux, "lo0" on macOS), or None."""
    import socket

    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == LOOPBACK for a in addrs):
            return name
    return None


WITNESS_SIGNAL = 12   # SIGUSR2 on Linux: only a rank's witness thread takes it (rank/witness.py)
WORKER = "ddplab.rank.worker"
WITNESS_WAIT_S = 1.5   # how long the ranks asked may take to write their testimony before they are stopped


def is_live_rank(pid: int, start_ticks: int | None = None) -> bool:
    """`pid` is a living ddplab rank on this host: the module it runs (its first `-m`) is the worker, it is
    not a zombie, and (given the `start_ticks` its progress log recorded) it is that very process. torchrun's
    agent (whose own `-m` is the launcher, the worker coming later) and a process that took over a recycled
    pid are not, so the witness signal never reaches them (it would end them)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        state, started = fields[0], int(fields[19])   # fields 3 and 22, after the command in parentheses
    except (OSError, IndexError, ValueError):
        return False
    if start_ticks is not None and started != start_ticks:
        return False
    module = b""
    for i, a in enumerate(args[1:-1], start=1):   # the interpreter's options, up to `-m module` (or -c, or a script)
        if a == b"-m":
            module = args[i + 1]
        if a == b"-m" or a == b"-c" or not a.startswith(b"-"):
            break
    return module == WORKER.encode() and state not in ("Z", "X")


def ask_witnesses(pids: dict[int, tuple], directory: Path, prefix: str = "",
                  wait_s: float = WITNESS_WAIT_S) -> list[int]:
    """Send each rank process (rank -> (pid, start ticks), `rundir.rank_processes`) the witness signal, and wait until
    each living one wrote its testimony into `directory` or `wait_s` passed; the ranks asked. Only that very
    rank process is signalled (`is_live_rank`: the signal would end another). Used by a failing rank for its
    peers (`rank/witness.py`) and by the launcher (`launch/watch.py`, `launch/cells.py`)."""
    from .rundir import witness_file

    asked = {}
    for r, (pid, ticks) in pids.items():
        try:
            if is_live_rank(pid, ticks):
                os.kill(pid, WITNESS_SIGNAL)
                asked[r] = (pid, ticks)
        except OSError:
            pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if all(witness_file(directory, r, prefix).exists() or not is_live_rank(*who) for r, who in asked.items()):
            break
        time.sleep(0.01)
    return sorted(asked)
