"""torchrun with every rendezvous socket on loopback: `python -m ddplab.launch.loopback <torchrun flags>`.

`torchrun --standalone` hosts two TCP stores in its agent, the rendezvous store and the store the
ranks bootstrap from (MASTER_ADDR:MASTER_PORT), and `TCPStore` binds both to every interface (`::`),
whatever host name it is given: on a laptop on a cafe network, anyone could connect to a run. This
module is torchrun itself (`torch.distributed.run.main`, every flag of it) with one more rendezvous
backend registered through torchrun's own extension point, `ddplab-loopback`: the same dynamic c10d
rendezvous, whose two stores listen on a socket this module binds to 127.0.0.1 and hands to
`TCPStore(master_listen_fd=...)`. Together with `--local-addr=127.0.0.1` (MASTER_ADDR) and gloo's
sockets on the loopback interface (`launch.torchrun.worker_env`), a run listens on loopback only
(`tests/launch/test_loopback.py` lists the listening sockets of a live run).
On a machine without a GPU the agent also forks ddplab's ranks from itself instead of starting each as a
new interpreter (`forks_ranks`, `rank/forked.py`).
"""

from __future__ import annotations

import os
import socket
import sys
from datetime import timedelta

from ..host import LOOPBACK, import_torch_frozen
from ..processes import WORKER
from .torchrun import RENDEZVOUS_BACKEND as BACKEND

RANK_START_ENV = "DDPLAB_RANK_START"   # "exec": every rank a new interpreter, as torchrun starts a script
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"   # torch counts GPUs through NVML, creating no CUDA context


def loopback_store(timeout_s: float = 300.0, listen_fd: int | None = None):
    """A TCPStore server listening on 127.0.0.1 only: on a free port the kernel picks, or on the
    socket `listen_fd` that `launch.nodes` bound for several agents on this host."""
    import torch.distributed as dist

    if listen_fd is None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK, 0))
        sock.listen(512)
    else:
        sock = socket.socket(fileno=listen_fd)
    port = sock.getsockname()[1]
    # the store owns the listening fd from here on (detach: Python must not close it)
    return dist.TCPStore(LOOPBACK, port, is_master=True, multi_tenant=False, wait_for_workers=False,
                         timeout=timedelta(seconds=timeout_s), master_listen_fd=sock.detach())


def create_handler(params):
    """torchrun's c10d dynamic rendezvous over a loopback store, hosting the ranks' store on loopback too.
    One agent hosts the rendezvous store; with several agents on this host (`launch.nodes`) the
    others connect to it at the endpoint's port."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    class LoopbackRendezvousHandler(dr.DynamicRendezvousHandler):
        def _create_tcp_store_server(self, master_addr, master_port):
            return loopback_store()

        def get_backend(self) -> str:
            return BACKEND

    read_timeout = params.get_as_int("read_timeout", 60)
    listen_fd = params.get_as_int("listen_fd")
    port = int(params.endpoint.rpartition(":")[2] or 0)
    if listen_fd is not None or not port:   # this agent hosts the rendezvous (the only one, or the first)
        store = loopback_store(read_timeout, listen_fd)
    else:   # another agent on this host hosts it (launch.nodes): join as a client
        import torch.distributed as dist

        store = dist.TCPStore(LOOPBACK, port, is_master=False, timeout=timedelta(seconds=read_timeout))
    backend = C10dRendezvousBackend(store, params.run_id)
    handler = dr.create_handler(store, backend, params)
    # create_handler parses torchrun's timeouts and builds the stock handler: keep all of that,
    # and host the ranks' bootstrap store the loopback way
    handler.__class__ = LoopbackRendezvousHandler
    return handler


def register() -> None:
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(BACKEND, create_handler)


def forks_ranks(argv: list[str]) -> bool:
    """Does this agent (torchrun's arguments `argv`) fork ddplab's ranks rather than start each as a new
    interpreter? Only where the ranks run ddplab's worker (a user's script starts as torchrun starts it),
    on Linux, unless $DDPLAB_RANK_START=exec, and only on a machine with no GPU this process could touch: a
    CUDA context does not survive fork (torch's NVML check counts devices without creating one)."""
    from torch.distributed.run import parse_args

    args = parse_args(argv)
    runs_worker = args.module and not args.no_python and args.training_script == WORKER
    if not runs_worker or sys.platform != "linux" or os.environ.get(RANK_START_ENV, "fork") != "fork":
        return False
    import torch

    said = os.environ.get(NVML_CHECK)
    os.environ[NVML_CHECK] = "1"   # asked here only, never passed on to the ranks
    try:
        return not torch.cuda.is_available()
    finally:
        if said is None:
            del os.environ[NVML_CHECK]
        else:
            os.environ[NVML_CHECK] = said


def fork_workers() -> None:
    """Have torchrun's agent fork ddplab's worker (`rank.forked.fork_rank`) from itself, and start any other
    command as it does: torchrun's `SubprocessHandler._popen`, the one place it starts a rank, is replaced
    in this process only (`tests/rank/test_forked.py` reads that from the running torch)."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

    from ..rank.forked import fork_rank

    popen = SubprocessHandler._popen
    import_torch_frozen("torch._dynamo", "ddplab.rank.worker")   # what every rank imports first

    def _popen(self, args, env):
        if args[0] == sys.executable and list(args[1:4]) == ["-u", "-m", WORKER]:   # not $PYTHON_EXEC's
            return fork_rank(self, args, env)
        return popen(self, args, env)

    SubprocessHandler._popen = _popen


def main(argv: list[str] | None = None) -> None:
    import_torch_frozen()   # the agent lives for the launch, as a rank does (host.import_torch_frozen)
    register()
    if forks_ranks(sys.argv[1:] if argv is None else argv):
        fork_workers()
    from torch.distributed.run import main as torchrun_main

    torchrun_main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
