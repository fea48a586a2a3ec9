"""`ddplab doctor`: can ranks talk on this machine, and over which backend?

Reports versions (whether the lab was verified on this torch, and which of torch's behaviours that the
lab teaches differ here: `releases/`), the backends torch was built with and the GPUs it sees, then
starts real ranks with torchrun (`rank/smoke.py`); rank r all-reduces the tensor [r + 1], so every rank must end with
1 + 2 + ... + world size: two ranks on one node (3), two per node on several (`--nodes`, or
$DDPLAB_NODES): the check that the nodes can talk, each node's host named.
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

from . import releases
from .units import MIB

TIMEOUT_S = 120
RDZV_TIMEOUT_S = 10   # nodes that cannot meet are told so after this, not after torchrun's minutes


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


def check(say=print, nodes=None) -> bool:
    """Print the report; True if the all-reduce gave the expected sum on every rank (and over NCCL
    too, where the ranks had GPUs). On several `nodes` (default `Nodes.from_env()`), two ranks per
    node, so the sum crosses every node: the check that the nodes can talk."""
    import torch
    import torch.distributed as dist

    from .host import choose_backend
    from .launch.nodes import Nodes
    from .launch.torchrun import kill_tree, start, torchrun_argv, worker_env

    nodes = Nodes.from_env() if nodes is None else nodes
    nodes.check_here()
    say(f"python {platform.python_version()}, torch {torch.__version__}, {platform.system()} {platform.machine()}")
    for line in releases.report(torch.__version__):   # verified or not, and what behaves differently here
        say(line)
    backends = [b for b, ok in (("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available()),
                                ("mpi", dist.is_mpi_available())) if ok]
    say(f"distributed backends built in: {', '.join(backends) or 'none'}")
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = [torch.cuda.get_device_name(i) for i in range(n_gpu)]
    say(f"CUDA devices: {n_gpu}" + (f" ({', '.join(names)})" if names else ""))
    say(f"default backend for 2 ranks: {choose_backend('auto', 'auto', 2, n_gpu)[0]}")
    say(f"loopback TCP (gloo's transport on one host): {loopback_bandwidth_bytes_per_s() / 1e9:.2f} GB/s")
    world = nodes.total(2 * nodes.count)
    expected = world * (world + 1) / 2
    say(f"{nodes.describe(world)}, gloo all-reduce: rank r contributes [r + 1]; expected on every rank: {expected}")
    with tempfile.TemporaryDirectory(prefix="ddplab-doctor-") as tmp:
        argv = torchrun_argv(world, [tmp, socket.gethostname()], module="ddplab.rank.smoke", nodes=nodes,
                             rdzv_timeout_s=RDZV_TIMEOUT_S)
        proc = start(argv, worker_env(nodes=nodes), subprocess.PIPE, text=True)
        try:
            log, _ = proc.communicate(timeout=TIMEOUT_S)
        except BaseException:
            kill_tree(proc, Path(tmp))
            say(f"  the ranks did not finish within {TIMEOUT_S} s (or were interrupted)")
            if nodes.multi:
                say("  " + _unreachable_hint(argv))
            return False
        gathered = Path(tmp, "results.json")
        results = {res["rank"]: res for res in json.loads(gathered.read_text())} if gathered.exists() else {}
        ok = all(results.get(r, {}).get("value") == expected for r in range(world))
        nccl = [res["nccl_value"] for res in results.values() if "nccl_value" in res]
        if nccl:
            ok = ok and len(nccl) == world and all(v == expected for v in nccl)
        for line in report_lines(results, world, nodes.multi):
            say("  " + line)
        if not ok:
            say("  FAILED; torchrun said:\n" + "\n".join(log.splitlines()[-20:]))
            if nodes.multi and len(results) < world:
                say("  " + _unreachable_hint(argv))
        if ok:
            say("OK: every node's ranks can talk to every other node's" if nodes.multi else "OK: ranks can talk")
        else:
            say("NOT OK")
        return ok


def report_lines(results: dict, world: int, by_node: bool) -> list[str]:
    """One line per rank (one node), or per node with its host and ranks (several) (pure)."""
    def shown(res):
        return str(res["value"]) + (f" (nccl {res['nccl_value']})" if "nccl_value" in res else "")

    if not by_node:
        return [f"rank {r}: {shown(results[r]) if r in results else 'no result'}" for r in range(world)]
    lines = []
    for node in sorted({res["node"] for res in results.values()}):
        mine = sorted(r for r, res in results.items() if res["node"] == node)
        hosts = sorted({results[r]["host"] for r in mine})
        lines.append(f"node {node} ({', '.join(hosts)}): " + ", ".join(f"rank {r} {shown(results[r])}" for r in mine))
    missing = [r for r in range(world) if r not in results]
    if missing:
        lines.append(f"no result from rank(s) {', '.join(map(str, missing))}")
    return lines


def _unreachable_hint(argv: list[str]) -> str:
    endpoint = next((a.split("=", 1)[1] for a in argv if a.startswith("--rdzv-endpoint=")), "?")
    return (f"every node must reach the rendezvous at {endpoint} (a firewall or the wrong host name stops "
            f"it), and the ranks' sockets an interface the nodes share: set GLOO_SOCKET_IFNAME / "
            f"NCCL_SOCKET_IFNAME to it (ip addr shows the names)")
