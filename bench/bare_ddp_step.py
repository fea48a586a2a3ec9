"""The bare baseline for bench/launch_overhead.py: the same 4-rank DDP step with nothing from ddplab.

    torchrun --standalone --nnodes=1 --nproc-per-node=4 bench/bare_ddp_step.py
"""

import gc
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
torch.manual_seed(0)
vocab, width = 64, 64
model = DDP(nn.Sequential(nn.Embedding(vocab, width), nn.Linear(width, width), nn.ReLU(),
                          nn.Linear(width, width), nn.ReLU(), nn.Linear(width, vocab)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randint(vocab, (1, 5))
loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
loss.backward()
opt.step()
del model, opt
gc.collect()
dist.destroy_process_group()
os._exit(0)  # same exit as ddplab.rank.worker: no interpreter finalization racing gloo threads
