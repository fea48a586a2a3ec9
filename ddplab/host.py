"""What this machine offers a run, decided the same way in the launcher and in every rank (pure:
torch is imported only to count GPUs).

`choose_backend` lets the launcher refuse an impossible request (more NCCL ranks than GPUs) before
any process starts; `die_with_parent` is the Linux hook that keeps a process from outliving the one
that started it (torchrun under the launcher, each rank under torchrun): no orphans.
Used by the launcher and the worker of every notebook's runs.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

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


def parent_is_torchrun() -> bool:
    """Is this process still the child of a torchrun agent? False once it was re-parented to init or to
    a subreaper (the agent died before `die_with_parent` was armed). True where /proc cannot tell."""
    ppid = os.getppid()
    if ppid == 1:
        return False
    try:
        with open(f"/proc/{ppid}/cmdline", "rb") as f:
            cmdline = f.read()
        # torchrun itself, or torchrun through ddplab's loopback entry (launch.loopback)
        return b"torch" in cmdline or b"ddplab.launch.loopback" in cmdline
    except OSError:
        return True


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
