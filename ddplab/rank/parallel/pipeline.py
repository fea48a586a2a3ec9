"""Pipeline parallelism with torch's own `torch.distributed.pipelining` (notebook 09): the built-in
transformer cut into stages, one `PipelineStage` per rank, run by `ScheduleGPipe` or `Schedule1F1B`.

Stage s keeps blocks [s x n/p, (s + 1) x n/p) of the unsplit model, stage 0 also the embeddings, the
last stage the final norm and the head, under the unsplit model's parameter names. The schedule
sends each microbatch's activations to the next stage and its gradient back (point-to-point
send/recv in the stage's process group); nothing here schedules anything by hand.

The pipeline task meters each stage with `rank/probes/pipeline.py` (`StageRecorder`,
`LiveSavedBytes`). Runs inside a rank.
Reference: https://pytorch.org/docs/stable/distributed.pipelining.html
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.utils.checkpoint import checkpoint

SCHEDULE_CLASSES = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}


def stage_blocks(n_layers: int, stages: int, stage: int) -> list[int]:
    """The blocks stage `stage` holds: n_layers / stages consecutive ones."""
    per = n_layers // stages
    return list(range(stage * per, (stage + 1) * per))


class TransformerStage(nn.Module):
    """One stage of a `TinyTransformer`: token ids in (stage 0) or hidden states in, hidden states
    out (or logits, the last stage). Holds the unsplit model's own modules, so its parameter names
    (`blocks.2.attn.qkv.weight`) are the unsplit model's."""

    def __init__(self, full: nn.Module, stage: int, stages: int):
        super().__init__()
        self.first, self.last = stage == 0, stage == stages - 1
        self.checkpointing = full.checkpointing
        if self.first:
            self.tok_emb, self.pos_emb = full.tok_emb, full.pos_emb
        self.blocks = nn.ModuleDict({str(i): full.blocks[i] for i in stage_blocks(len(full.blocks), stages, stage)})
        if self.last:
            self.ln_f, self.head = full.ln_f, full.head

    def forward(self, x):
        if self.first:
            x = self.tok_emb(x) + self.pos_emb(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks.values():
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing else block(x)
        return self.head(self.ln_f(x)) if self.last else x


def token_mean_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over a microbatch's tokens (torch then divides the gradients by m)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def build_stage(module: nn.Module, stage: int, stages: int, device, group) -> PipelineStage:
    """A fresh PipelineStage around `module`: it learns its neighbours' shapes in its first step."""
    return PipelineStage(module, stage, stages, device, group=group)


def build_schedule(schedule: str, pipe_stage: PipelineStage, microbatches: int, loss_fn):
    """torch's `schedule` ("GPipe" or "1F1B") over `pipe_stage` for `microbatches`; torch divides the
    gradients by the microbatch count (scale_grads), matching a per-microbatch mean loss."""
    return SCHEDULE_CLASSES[schedule](pipe_stage, microbatches, loss_fn=loss_fn, scale_grads=True)
