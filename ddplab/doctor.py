"""`ddplab doctor`: can ranks talk on this machine, and over which backend?

Reports versions, the backends torch was built with and the GPUs it sees, then starts two real
ranks with torchrun (`rank/smoke.py`); rank r all-reduces the tensor [r + 1], so both must end with
1 + 2 = 3.
Used by `ddplab doctor` and notebook 03 (the loopback ceiling).
"""

from __future__ import annotations

import json
import platform
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from .units import MIB

EXPECTED = 3.0  # sum over ranks r = 0, 1 of (r + 1)
TIMEOUT_S = 120


def loopback_bandwidth_bytes_per_s(total_bytes: int = 128 * MIB, chunk: int = MIB, tries: int = 3) -> float:
    """What one TCP connection over loopback carries per second here, best of `tries`: the ceiling
    for gloo between ranks on one host (one sender thread, one receiver thread)."""
    return max(_loopback_once(total_bytes, chunk) for _ in range(tries))


def _loopback_once(total_bytes: int, chunk: int) -> float:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    received = [0]

    def receive():
        conn, _ = server.accept()
        with conn:
            while received[0] < total_bytes:
                data = conn.recv(chunk)
                if not data:
                    break
                received[0] += len(data)

    thread = threading.Thread(target=receive)
    thread.start()
    payload = b"\0" * chunk
    with socket.create_connection(server.getsockname()) as client:
        start = time.perf_counter()
        for _ in range(total_bytes // chunk):
            client.sendall(payload)
        thread.join()
        seconds = time.perf_counter() - start
    server.close()
    return received[0] / seconds


def doctor(say=print) -> bool:
    """Print the report; True if the 2-rank all-reduce gave the expected result on both ranks."""
    import torch
    import torch.distributed as dist

    from .host import choose_backend
    from .launch.torchrun import kill_tree, start, torchrun_argv, worker_env

    say(f"python {platform.python_version()}, torch {torch.__version__}, {platform.system()} {platform.machine()}")
    backends = [b for b, ok in (("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available()),
                                ("mpi", dist.is_mpi_available())) if ok]
    say(f"distributed backends built in: {', '.join(backends) or 'none'}")
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = [torch.cuda.get_device_name(i) for i in range(n_gpu)]
    say(f"CUDA devices: {n_gpu}" + (f" ({', '.join(names)})" if names else ""))
    say(f"default backend for 2 ranks: {choose_backend('auto', 'auto', 2, n_gpu)[0]}")
    say(f"loopback TCP (gloo's transport on one host): {loopback_bandwidth_bytes_per_s() / 1e9:.2f} GB/s")
    say(f"2-rank gloo all-reduce: rank r contributes [r + 1]; expected on every rank: {EXPECTED}")
    with tempfile.TemporaryDirectory(prefix="ddplab-doctor-") as tmp:
        proc = start(torchrun_argv(2, [tmp], module="ddplab.rank.smoke"), worker_env(), subprocess.PIPE, text=True)
        try:
            log, _ = proc.communicate(timeout=TIMEOUT_S)
        except BaseException:
            kill_tree(proc, Path(tmp))
            say(f"  the ranks did not finish within {TIMEOUT_S} s (or were interrupted)")
            return False
        values = {}
        for r in range(2):
            f = Path(tmp, f"rank{r}.json")
            if f.exists():
                values[r] = json.loads(f.read_text())["value"]
        for r in range(2):
            say(f"  rank {r}: {values.get(r, 'no result')}")
        ok = all(values.get(r) == EXPECTED for r in range(2))
        if not ok:
            say("  FAILED; torchrun said:\n" + "\n".join(log.splitlines()[-20:]))
        say("OK: ranks can talk" if ok else "NOT OK")
        return ok

