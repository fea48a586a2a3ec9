"""A plain torchrun training script (not a ddplab task) with `ddplab.guard` added in one line, and each
silent DDP bug switchable, one scenario after another in the same process group:

    torchrun --nproc-per-node 2 guarded_training.py --scenarios clean same-data mean-loss ...
    ddplab.run_script(guarded_training.__file__, "--scenarios", "clean", "same-data", world_size=2)

clean              a DistributedSampler with set_epoch, DDP, cross-entropy, and every 10 steps a validation
                   pass on the same examples on every rank: nothing to find
weighted-right     odd ranks get half a batch, and the loss is summed, divided by the global count
accumulate-right   two micro-batches a step, the first inside no_sync
same-data          every rank builds its sampler as if it were rank 0 of 1
mean-loss          odd ranks get half a batch (half the labelled tokens for --model hf), loss averaged per rank
no-set-epoch       the sampler is never told the epoch
bn-unsynced        DDP(broadcast_buffers=False) around a model with BatchNorm
no-sync            both micro-batches inside no_sync
outside-ddp        a head the optimizer updates, outside the DDP model
stuck              rank 1 stops for a while before its optimizer step (the others name it)

Each scenario builds a fresh model, loader, optimizer and guard (on_problem="raise", every=1), trains,
and prints one JSON line per rank: {"scenario", "rank", "steps", "error": the GuardError's text or
null, "kinds": the problems' kinds, "notes": the notes' kinds}. `--model hf` trains a tiny Hugging
Face GPT-2 (transformers) instead of the small classifier.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ddplab.guard

SCENARIOS = ("clean", "weighted-right", "accumulate-right", "same-data", "mean-loss", "no-set-epoch", "bn-unsynced",
             "no-sync", "outside-ddp", "stuck")


def classifier() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))


def data(model: str, n: int = 203) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    if model == "hf":
        return TensorDataset(torch.randint(0, 64, (n, 12), generator=g))
    return TensorDataset(torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g))


def run(scenario: str, args, rank: int, world: int) -> dict:
    dataset = data(args.model)
    if scenario == "same-data":   # every rank builds the sampler as if it were rank 0 of 1
        sampler = DistributedSampler(dataset, num_replicas=1, rank=0, seed=0)
    else:
        sampler = DistributedSampler(dataset, seed=0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, drop_last=True)   # no batch of one for BatchNorm
    net = gpt2() if args.model == "hf" else classifier()
    model = DDP(net, **({"broadcast_buffers": False} if scenario == "bn-unsynced" else {}))
    params = list(model.parameters())
    head = None
    if scenario == "outside-ddp":   # a head the optimizer updates but DDP does not hold
        torch.manual_seed(0)
        head = nn.Linear(4, 4)
        params += list(head.parameters())
    optimizer = torch.optim.SGD(params, lr=0.05)
    wait = args.timeout if scenario == "stuck" else 120.0   # only the stuck rank is waited for briefly
    guard = None if args.unguarded else ddplab.guard.attach(model, optimizer, sampler=sampler, every=args.every,
                                                            timeout_s=wait)
    steps, error = 0, None
    micro = 2 if scenario in ("no-sync", "accumulate-right") else 1
    limit = 4 if scenario == "stuck" else args.clean_steps if scenario == "clean" else args.steps   # stuck: rank 1 too
    try:
        for epoch in range(10**6):
            if scenario != "no-set-epoch":
                sampler.set_epoch(epoch)
            for batch in loader:
                if scenario in ("mean-loss", "weighted-right") and rank % 2:
                    batch = [t[: len(t) // 2] for t in batch]   # odd ranks get half a batch
                for m in range(micro):
                    sync_off = scenario == "no-sync" or (scenario == "accumulate-right" and m < micro - 1)
                    with model.no_sync() if sync_off else contextlib.nullcontext():
                        loss = forward(model, head, batch, scenario, args.model, world)
                        if args.model != "hf" and guard is not None:
                            guard.loss(loss / micro)
                        (loss / micro).backward()
                if scenario == "stuck" and rank == 1 and steps == 3:
                    time.sleep(args.timeout + 3)   # rank 1 stops stepping for a while (its own slow code)
                optimizer.step()
                optimizer.zero_grad()
                steps += 1
                if scenario == "clean" and args.model != "hf" and steps % 10 == 5:
                    validate(model, dataset)   # the same examples on every rank, between two steps
                if steps >= limit:
                    raise StopIteration
    except StopIteration:
        found = []
    except ddplab.guard.GuardError as e:
        error, found = str(e), e.problems
    notes = [] if guard is None else [p for p in guard.problems if p.severity == "note"]
    if guard is not None:
        guard.close()
    return {"scenario": scenario, "rank": rank, "steps": steps, "error": error,
            "kinds": sorted({p.kind for p in found}), "notes": sorted({p.kind for p in notes})}


def validate(model, dataset) -> float:
    """A validation pass as many loops have one: every rank, the same examples, eval mode, no autograd."""
    model.eval()
    with torch.no_grad():
        x, y = dataset[:32]
        loss = F.cross_entropy(model(x), y).item()
    model.train()
    return loss


def forward(model, head, batch, scenario: str, kind: str, world: int) -> torch.Tensor:
    if kind == "hf":
        (ids,) = batch
        labels = ids.clone()
        if scenario == "mean-loss" and dist.get_rank() % 2:
            labels[:, 6:] = -100   # odd ranks' loss averages half as many tokens
        return model(input_ids=ids, labels=labels).loss
    x, y = batch
    out = model(x)
    if head is not None:
        out = head(out)
    if scenario == "weighted-right":   # sum, divided by the examples summed over ranks, times the world size
        n = torch.tensor(float(len(y)))
        dist.all_reduce(n)
        return F.cross_entropy(out, y, reduction="sum") * world / n
    return F.cross_entropy(out, y)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=["clean"])
    parser.add_argument("--model", choices=("classifier", "hf"), default="classifier")
    parser.add_argument("--steps", type=int, default=30, help="steps of every scenario but clean (a bug stops it sooner)")
    parser.add_argument("--clean-steps", type=int, default=30, help="steps of the clean scenario")
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=3.0, help="how long the others wait for the stuck rank")
    parser.add_argument("--unguarded", action="store_true",
                        help="attach no guard here (run under `-m ddplab.guard`, which attaches one to every DDP)")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for scenario in args.scenarios:
        print(json.dumps(run(scenario, args, rank, world)), flush=True)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
