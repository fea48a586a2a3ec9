"""`ddplab doctor`'s check inside each rank: rank r all-reduces the tensor [r + 1], so every rank must
end with 1 + 2 + ... + world_size. The ranks then gather what each got, with its node and host, and
the first rank on the launching host writes it all to out_dir/results.json (out_dir is that host's:
on several machines the other nodes cannot see it). Where every node has a GPU for each of its ranks,
the same sum is also all-reduced over NCCL.
Runs inside a rank.

    torchrun --nnodes=1 --nproc-per-node=2 -m ddplab.rank.smoke <out_dir> <launching host>       (one node)
    torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d ... -m ddplab.rank.smoke <out_dir> <host>   (each node)

(ddplab starts it through `launch.torchrun.torchrun_argv`: loopback stores on one host, or srun.)
Used by `ddplab doctor` only.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from .. import host, processes
from . import runtime


def main(out_dir: str, launcher_host: str) -> None:
    torch = host.import_torch_frozen()
    import torch.distributed as dist

    processes.die_with_parent()
    env = runtime.rank_env()
    runtime.setup("gloo", "cpu", env, timeout_s=30)
    t = torch.tensor([env.rank + 1.0])
    dist.all_reduce(t)
    result = {"rank": env.rank, "value": t.item(), "node": env.node, "host": socket.gethostname(),
              "world_size": env.world_size}
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    enough = torch.tensor([int(dist.is_nccl_available() and gpus >= env.ranks_here)])
    dist.all_reduce(enough, op=dist.ReduceOp.MIN)   # NCCL only if every rank has a GPU of its own
    if enough.item():
        torch.cuda.set_device(env.slot % gpus)
        nccl = dist.new_group(backend="nccl")
        c = torch.tensor([env.rank + 1.0], device="cuda")
        dist.all_reduce(c, group=nccl)
        result["nccl_value"] = c.item()
    every: list = [None] * env.world_size
    dist.all_gather_object(every, result)
    if socket.gethostname() == launcher_host and env.slot == 0 and Path(out_dir).is_dir():   # one writer
        Path(out_dir, "results.json").write_text(json.dumps(every))
    runtime.teardown()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
