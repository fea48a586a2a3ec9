"""What this machine offers a run, decided the same way in the launcher and in every rank (pure:
torch is imported only to count GPUs).

`choose_backend` lets the launcher refuse an impossible request (more NCCL ranks than GPUs) before
any process starts; `loopback_interface` names the interface a one-machine run talks over. The rules
about processes (which is which, die-with-parent, the witness signal) are `processes.py`'s.
Used by the launcher and the worker of every notebook's runs.
"""

from __future__ import annotations


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


LOOPBACK = "127.0.0.1"


def loopback_interface() -> str | None:
    """The name of the interface that holds 127.0.0.1 ("lo" on Linux, "lo0" on macOS), or None."""
    import socket

    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == LOOPBACK for a in addrs):
            return name
    return None
