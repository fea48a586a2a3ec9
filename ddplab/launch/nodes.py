"""Where a launch's ranks run: one node, several simulated on this host, or the nodes of a SLURM allocation.

    DDPLAB_NODES=2 jupyter lab            # every run: 2 torchrun agents on this host, each a "node"
    DDPLAB_NODES=2 DDPLAB_NODE_LAUNCHER=srun ddplab run --world-size 8    # inside `salloc -N 2`

`Nodes(count, launcher)` decides the command `launch.torchrun.torchrun_argv` builds, and nothing else
changes: the notebooks' experiments, the watch, the diagnosis and the run directory are the same.

- `count=1` (the default): one torchrun agent, `--nnodes=1` (today's launch on one machine).
- `launcher="local"`, `count=N`: this module starts N torchrun agents on this host, `--nnodes=N` with
  the c10d rendezvous over loopback, the way two machines would meet: the CI's stand-in for a
  cluster. It binds the rendezvous socket itself and hands it to the first agent (no port race);
  the others join it as clients. Node ranks are decided by the rendezvous (join order), not by which
  agent started first.
- `launcher="srun"`: one `srun` starts one agent per node of the allocation (`--ntasks-per-node=1`),
  meeting at a c10d rendezvous hosted on the allocation's first node (`endpoint`, default that node
  and a port drawn from 29500-49499). Only inside an allocation of enough nodes (`check_here`).
  The run directory must be on a filesystem every node sees (a cluster's home or project space).

A launch of W ranks on N nodes runs ceil(W / N) ranks per node; ranks past W (when N does not divide
W) join the process group and sit the experiment out, as a rank outside a smaller experiment of
`run_many` does. Used by every launch (`launch/cold.py`, `launch/session.py`), `ddplab doctor --nodes`
and the SLURM batch script (`launch/slurm.py`).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from .. import host, processes

LAUNCHERS = ("local", "srun")
DEFAULT_JOIN_TIMEOUT_S = 120   # how long the agents wait for each other at the rendezvous


@dataclass(frozen=True)
class Nodes:
    count: int = 1
    launcher: str = "local"
    endpoint: str | None = None   # srun: host:port of the rendezvous (default: the allocation's first node)

    def __post_init__(self):
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"nodes: the node count must be a whole number of at least 1, got {self.count!r}")
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"nodes: launcher must be one of {', '.join(LAUNCHERS)}, got {self.launcher!r}")
        if self.endpoint is not None:
            _, _, port = str(self.endpoint).rpartition(":")
            if not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"nodes: endpoint must be host:port, got {self.endpoint!r}")

    @classmethod
    def from_env(cls, environ=None) -> "Nodes":
        """$DDPLAB_NODES (count), $DDPLAB_NODE_LAUNCHER (local or srun), $DDPLAB_RDZV_ENDPOINT; unset: one node."""
        env = os.environ if environ is None else environ
        raw = env.get("DDPLAB_NODES", "").strip() or "1"
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"DDPLAB_NODES: the node count must be a whole number of at least 1, got {raw!r}")
        launcher = env.get("DDPLAB_NODE_LAUNCHER", "").strip() or "local"
        if launcher not in LAUNCHERS:
            raise ValueError(f"DDPLAB_NODE_LAUNCHER: one of {', '.join(LAUNCHERS)}, got {launcher!r}")
        try:
            return cls(int(raw), launcher, env.get("DDPLAB_RDZV_ENDPOINT", "").strip() or None)
        except ValueError as e:
            raise ValueError(f"DDPLAB_RDZV_ENDPOINT: {str(e).removeprefix('nodes: ')}") from None

    @property
    def record(self) -> dict:
        """What a launch.json keeps of them."""
        return {"count": self.count, "launcher": self.launcher}

    @property
    def multi(self) -> bool:
        return self.count > 1 or self.launcher == "srun"

    def per_node(self, world_size: int) -> int:
        """Ranks each node runs for a launch of `world_size` ranks."""
        return -(-world_size // self.count)

    def total(self, world_size: int) -> int:
        """Ranks the launch starts: `world_size` rounded up to fill every node alike."""
        return self.per_node(world_size) * self.count

    def ranks_here(self, world_size: int) -> int:
        """How many of them run on this machine (what its cores, memory and GPUs must hold)."""
        return self.total(world_size) if self.launcher == "local" else self.per_node(world_size)

    def check_here(self, environ=None) -> None:
        """ValueError unless this machine can start these nodes' agents: srun needs SLURM, and an
        allocation of at least `count` nodes (outside one, srun would queue a new job and wait)."""
        import shutil

        if self.launcher != "srun":
            return
        env = os.environ if environ is None else environ
        if shutil.which("srun") is None:
            raise ValueError("nodes: the launcher 'srun' needs SLURM's srun on PATH: run inside an allocation "
                             "(salloc, or a batch script from `ddplab slurm`), or use DDPLAB_NODE_LAUNCHER=local")
        if not env.get("SLURM_JOB_ID"):
            raise ValueError("nodes: the launcher 'srun' runs inside a SLURM allocation, and $SLURM_JOB_ID is not "
                             "set: take one first (salloc -N <nodes>, or sbatch a script from `ddplab slurm`)")
        have = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
        if have and have.isdigit() and int(have) < self.count:
            raise ValueError(f"nodes: {self.count} nodes were asked for, and this allocation has {have} "
                             f"($SLURM_JOB_NUM_NODES)")

    def describe(self, world_size: int) -> str:
        if not self.multi:
            return f"{world_size} ranks"
        where = "on this host" if self.launcher == "local" else "via srun"
        return f"{self.total(world_size)} ranks ({self.count} nodes x {self.per_node(world_size)}, {where})"


def first_node(environ=None) -> str:
    """The allocation's first node (`scontrol show hostnames $SLURM_JOB_NODELIST`), where the rendezvous
    is hosted (its agent sees the endpoint is its own); this host where SLURM cannot say. A salloc
    shell may run on a login node, which no agent runs on."""
    env = os.environ if environ is None else environ
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if nodelist:
        try:
            out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                                 timeout=30)
            if out.returncode == 0 and out.stdout.split():
                return out.stdout.split()[0]
        except (OSError, subprocess.TimeoutExpired):
            pass
    return socket.gethostname()


# ---- the local agents: N torchrun agents on this host ---------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """`python -m ddplab.launch.nodes --agents N -- <launch.loopback's torchrun flags>`: start N agents
    that meet at one loopback rendezvous; exit with the first failing agent's code (the others are
    stopped then, as torchrun stops a failed rank's peers), or 0."""
    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, required=True)
    parser.add_argument("torchrun_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    flags = args.torchrun_args[1:] if args.torchrun_args[:1] == ["--"] else args.torchrun_args
    processes.die_with_parent()   # the agents die with this process, and it with the launcher
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host.LOOPBACK, 0))
    listener.listen(512)   # joiners queue here until the first agent's store serves the socket
    port = listener.getsockname()[1]
    procs = []
    try:
        for i in range(args.agents):
            hosting = i == 0
            agent = _agent_flags(flags, port, listener.fileno() if hosting else None)
            procs.append(subprocess.Popen([sys.executable, "-m", "ddplab.launch.loopback", *agent],
                                          pass_fds=(listener.fileno(),) if hosting else (),
                                          env={**os.environ, "DDPLAB_AGENT": str(i),
                                               "DDPLAB_AGENTS_HERE": str(args.agents)},
                                          preexec_fn=processes.die_with_parent))
        listener.close()   # the first agent holds its own copy of the socket
        return _wait_all(procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _agent_flags(flags: list[str], port: int, listen_fd: int | None) -> list[str]:
    """One agent's torchrun flags: the shared rendezvous endpoint, and the listening socket for the host."""
    target = flags.index("-m") if "-m" in flags else len(flags)   # what follows is the ranks' own command line
    out, conf = [], []
    for a in flags[:target]:
        if a.startswith("--rdzv-endpoint="):
            a = f"--rdzv-endpoint={host.LOOPBACK}:{port}"
        elif a.startswith("--rdzv-conf="):
            conf.append(a.split("=", 1)[1])
            continue
        out.append(a)
    if listen_fd is not None:
        conf.append(f"listen_fd={listen_fd}")
    if conf:
        out.append("--rdzv-conf=" + ",".join(conf))
    return out + flags[target:]


def _ranks_of(agent: subprocess.Popen) -> list[int]:
    """The global ranks an agent runs now (its children's RANK), read from their environment."""
    return sorted(processes.ranks_under(agent.pid))


def _wait_all(procs: list[subprocess.Popen]) -> int:
    ranks: dict[int, list[int]] = {}   # agent -> its ranks, as last seen (a killed agent's are gone with it)
    looked = 0.0
    while True:
        codes = [p.poll() for p in procs]
        failed = [c for c in codes if c not in (None, 0)]
        if time.monotonic() - looked > 0.25 and not failed:
            looked = time.monotonic()
            for i, p in enumerate(procs):
                ranks[i] = _ranks_of(p) or ranks.get(i, [])
        for i, c in enumerate(codes):
            if c is not None and c < 0:   # an agent killed by a signal: its node is lost, and its ranks with it
                how = signal.Signals(-c).name if -c in signal.Signals._value2member_map_ else f"signal {-c}"
                print(f"ddplab-nodes: node agent {i} was ended by {how}; its ranks: "
                      f"{', '.join(map(str, ranks.get(i, []))) or 'unknown'}", file=sys.stderr, flush=True)
        if failed:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)   # torchrun's agent stops its own ranks on SIGTERM
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
            return failed[0]
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
