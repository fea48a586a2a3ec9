"""`ddplab doctor`'s check inside each rank: rank r all-reduces the tensor [r + 1], so every rank must
end with 1 + 2 + ... + world_size, and writes what it got, its node and its host to out_dir/rank{r}.json.
Where this host has a GPU for each of its ranks, the same sum is also all-reduced over NCCL.
Runs inside a rank.

    torchrun --nnodes=1 --nproc-per-node=2 -m ddplab.rank.smoke <out_dir>       (one node)
    torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d ... -m ddplab.rank.smoke <out_dir>   (on each node)

(ddplab starts it through `launch.torchrun.torchrun_argv`: loopback stores on one host, or srun.)
Used by `ddplab doctor` only.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from .. import host
from . import runtime


def main(out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    host.die_with_parent()
    env = runtime.rank_env()
    runtime.setup("gloo", "cpu", env, timeout_s=30)
    t = torch.tensor([env.rank + 1.0])
    dist.all_reduce(t)
    result = {"rank": env.rank, "value": t.item(), "node": env.node, "host": socket.gethostname(),
              "world_size": env.world_size}
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if dist.is_nccl_available() and gpus >= env.ranks_here:   # every rank has a GPU of its own: NCCL too
        torch.cuda.set_device(env.slot % gpus)
        nccl = dist.new_group(backend="nccl")
        c = torch.tensor([env.rank + 1.0], device="cuda")
        dist.all_reduce(c, group=nccl)
        result["nccl_value"] = c.item()
    Path(out_dir, f"rank{env.rank}.json").write_text(json.dumps(result))
    runtime.teardown()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
