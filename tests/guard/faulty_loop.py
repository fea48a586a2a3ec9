"""A plain DDP loop with ddplab.guard (every=1) and one fault, for tests/guard/test_guard_faults.py:

    torchrun --nproc-per-node 2 faulty_loop.py stops --at forward --sleep 600 --timeout 5
    torchrun --nproc-per-node 2 faulty_loop.py late-parameter

stops           rank 1 sleeps `--sleep` s in step 5: before its forward or its backward (the others then
                wait inside DDP's collectives and never reach the guard's optimizer hook), or before its
                optimizer step (the others wait in the guard's own check)
late-parameter  `net.late`, registered after DDP wrapped `net`, used in the forward and optimized

Each rank prints one JSON line at the end: {"rank", "steps", "error": the GuardError's text or null,
"kinds": the problems' kinds, "problems": every problem the guard recorded}. After a GuardError in
`stops` it exits 1, as an uncaught one would, so torchrun stops the rank still asleep.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import ddplab.guard


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(8, 4)

    def forward(self, x):
        out = self.body(x)
        late = getattr(self, "late", None)
        return out if late is None else out * late


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("fault", choices=("stops", "late-parameter"))
    parser.add_argument("--at", choices=("forward", "backward", "step"), default="forward")
    parser.add_argument("--sleep", type=float, default=600.0)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--on-problem", default="raise")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    net = Net()
    model = DDP(net)
    if args.fault == "late-parameter":
        net.late = nn.Parameter(torch.ones(4))   # after DDP(net): DDP's buckets never hold it
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = ddplab.guard.attach(model, optimizer, every=1, timeout_s=args.timeout, on_problem=args.on_problem)
    g = torch.Generator().manual_seed(rank)
    steps, error, kinds = 0, None, []
    try:
        for step in range(args.steps):
            stops = args.fault == "stops" and rank == 1 and step == 5
            if stops and args.at == "forward":
                time.sleep(args.sleep)
            x, y = torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
            loss = F.cross_entropy(model(x), y)
            if stops and args.at == "backward":
                time.sleep(args.sleep)
            loss.backward()
            if stops and args.at == "step":
                time.sleep(args.sleep)
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
    except ddplab.guard.GuardError as e:
        error, kinds = str(e), sorted({p.kind for p in e.problems})
    problems = [{"kind": p.kind, "step": p.step, "ranks": list(p.ranks), "message": p.message} for p in guard.problems]
    guard.close()
    print(json.dumps({"rank": rank, "steps": steps, "error": error, "kinds": kinds, "problems": problems}), flush=True)
    if error is not None and args.fault == "stops":
        raise SystemExit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
