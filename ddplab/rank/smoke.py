"""`ddplab doctor`'s check inside each of two ranks: rank r all-reduces the tensor [r + 1], so both must
end with 1 + 2 = 3, and write what they got to out_dir/rank{r}.json. Runs inside a rank.

    torchrun --standalone --nnodes=1 --nproc-per-node=2 -m ddplab.rank.smoke <out_dir>

(ddplab starts it through `launch.loopback`, torchrun with its stores on 127.0.0.1.)
Used by `ddplab doctor` only.
"""

from __future__ import annotations

import json
import os
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
    Path(out_dir, f"rank{env.rank}.json").write_text(json.dumps({"rank": env.rank, "value": t.item()}))
    runtime.teardown()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
